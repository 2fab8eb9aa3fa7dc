"""A backward split in two (zero-bubble schedules): B, the input cotangent, which the previous
stage waits for, and W, the parameter gradients, which nothing waits for until the update.

:func:`split_backward` traces a stage's whole backward (cotangent in; parameter gradients and
input cotangent out) to one flat jaxpr (calls and rematerialised regions inlined) and cuts its
equations in two: B holds every equation the input cotangent needs; W every other equation the
parameter gradients need. What W reads of B's values (the cotangents at each matmul's output,
activations B recomputed) and of the backward's inputs other than parameters (the residuals
the weight gradients read) is B's second output, *pending*, kept from B until W. Each equation
runs once, in B or in W, on the same inputs as in the whole backward: the same operations, so
the same gradients (up to how XLA fuses each program; float32 runs agree to ~1e-7), and B + W
cost about what the backward costs. Reason for cutting the jaxpr rather than calling the
pullback twice: ``jax.vjp`` has no partial pullback; asking it for the input cotangent alone
drops the weight-gradient matmuls (half the work), but asking it for the parameter gradients
alone recomputes the whole cotangent chain through the stage.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
from jax.extend import core as jcore

_CALLS = ("jit", "pjit", "closed_call", "core_call", "remat2", "checkpoint")


def _inner(eqn) -> tuple[Any, list] | None:
    """(jaxpr, consts) of a call-like equation to inline; None for a plain primitive."""
    if eqn.primitive.name not in _CALLS:
        return None
    inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
    if isinstance(inner, jcore.ClosedJaxpr):
        return inner.jaxpr, list(inner.consts)
    return inner, []


def _bind(eqn, invals: list) -> list:
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
    return list(out) if eqn.primitive.multiple_results else [out]


def _read(env: dict, v) -> Any:
    return v.val if isinstance(v, jcore.Literal) else env[v]


def _eval_inlined(jaxpr, consts: Sequence[Any], args: Sequence[Any]) -> list:
    """Evaluates ``jaxpr``, entering call-like equations instead of binding them (traced under
    ``make_jaxpr`` this gives a flat jaxpr)."""
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        invals = [_read(env, v) for v in eqn.invars]
        inner = _inner(eqn)
        outs = _eval_inlined(inner[0], inner[1], invals) if inner else _bind(eqn, invals)
        env.update(zip(eqn.outvars, outs))
    return [_read(env, v) for v in jaxpr.outvars]


def _needed(eqns: list, wanted: Sequence[Any], have: set) -> list[int]:
    """Indices of the equations the ``wanted`` variables depend on, not looking past ``have``."""
    producer = {v: i for i, e in enumerate(eqns) for v in e.outvars}
    todo = [v for v in wanted if not isinstance(v, jcore.Literal)]
    seen: set = set()
    while todo:
        v = todo.pop()
        if v in have or v not in producer or producer[v] in seen:
            continue
        seen.add(producer[v])
        todo += [x for x in eqns[producer[v]].invars if not isinstance(x, jcore.Literal)]
    return sorted(seen)


@dataclasses.dataclass
class Split:
    """The two halves of one backward's flat jaxpr (:func:`split_backward`)."""

    consts: list
    invars: list  # the backward's inputs, flattened
    b_eqns: list
    w_eqns: list
    b_out: list  # the input cotangent's leaves
    pending: list  # what W reads of B's values and of the inputs (not parameters)
    w_out: list  # the parameter gradients' leaves
    num_params: int  # the first invars are the parameters' leaves
    b_tree: Any
    w_tree: Any

    def _env(self, values: Sequence[Any]) -> dict:
        env = dict(zip(self.jaxpr_consts, self.consts))
        env.update(zip(self.invars, values))
        return env

    def input_grad(self, leaves: Sequence[Any]) -> tuple[Any, list]:
        """B: (the input cotangent, pending) from the backward's flattened inputs."""
        env = self._env(leaves)
        for e in self.b_eqns:
            env.update(zip(e.outvars, _bind(e, [_read(env, v) for v in e.invars])))
        return (jax.tree.unflatten(self.b_tree, [_read(env, v) for v in self.b_out]),
                [_read(env, v) for v in self.pending])

    def weight_grad(self, param_leaves: Sequence[Any], pending: Sequence[Any]) -> Any:
        """W: the parameter gradients from the parameters' leaves and B's pending values."""
        env = dict(zip(self.jaxpr_consts, self.consts))
        env.update(zip(self.invars[:self.num_params], param_leaves))
        env.update(zip(self.pending, pending))
        for e in self.w_eqns:
            env.update(zip(e.outvars, _bind(e, [_read(env, v) for v in e.invars])))
        return jax.tree.unflatten(self.w_tree, [_read(env, v) for v in self.w_out])

    jaxpr_consts: list = dataclasses.field(default_factory=list)


def split_backward(fn: Callable, params: Any, *rest: Any) -> Split:
    """Splits ``fn(params, *rest) -> (parameter gradients, input cotangent)`` (shapes or arrays
    as arguments) into B and W (module doc)."""
    leaves, tree = jax.tree.flatten((params, *rest))
    num_params = len(jax.tree.leaves(params))
    out_shape = jax.eval_shape(lambda *xs: fn(*jax.tree.unflatten(tree, xs)), *leaves)
    w_tree, b_tree = jax.tree.structure(out_shape[0]), jax.tree.structure(out_shape[1])
    whole = jax.make_jaxpr(lambda *xs: jax.tree.leaves(fn(*jax.tree.unflatten(tree, xs))))(
        *leaves)
    flat = jax.make_jaxpr(lambda *xs: _eval_inlined(whole.jaxpr, whole.consts, xs))(*leaves)
    jaxpr = flat.jaxpr
    n_w = w_tree.num_leaves
    w_out, b_out = list(jaxpr.outvars[:n_w]), list(jaxpr.outvars[n_w:])
    eqns = list(jaxpr.eqns)
    inputs = set(jaxpr.invars) | set(jaxpr.constvars)
    b_idx = _needed(eqns, b_out, inputs)
    b_defined = {v for i in b_idx for v in eqns[i].outvars}
    w_idx = _needed(eqns, w_out, inputs | b_defined)
    w_defined = {v for i in w_idx for v in eqns[i].outvars}
    params_in = set(jaxpr.invars[:num_params]) | set(jaxpr.constvars)
    pending, seen = [], set()
    for v in [x for i in w_idx for x in eqns[i].invars] + w_out:
        if (isinstance(v, jcore.Literal) or v in seen or v in w_defined or v in params_in):
            continue
        seen.add(v)
        pending.append(v)
    return Split(list(flat.consts), list(jaxpr.invars), [eqns[i] for i in b_idx],
                 [eqns[i] for i in w_idx], b_out, pending, w_out, num_params, b_tree, w_tree,
                 jaxpr_consts=list(jaxpr.constvars))
