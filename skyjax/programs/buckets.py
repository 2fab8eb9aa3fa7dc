"""A backward cut into buckets of units (the exchange behind the backward): the stage's last
backward of a step runs as one program per bucket, from its last units down, so that each
bucket's gradient sums are final, and can go to the replicas, while the rest of the backward
still computes (as DDP's buckets do; docs/design.md, "Several pipelines").

:func:`split_buckets` traces a stage's whole backward (cotangent in; parameter gradients and
input cotangent out) to one flat jaxpr, as :mod:`.split` does, and cuts its equations by
bucket: bucket 0 (the stage's last units) holds every equation its units' parameter gradients
need; bucket j every equation bucket j's gradients need that no earlier bucket ran; the last
bucket also the input cotangent's. What a later bucket reads of an earlier one's values is
handed on (``carried``). Each equation runs once, on the inputs it has in the whole backward.
Each program adds its units' gradients into their sums, as the whole backward does.

Bits: every equation runs as in the whole backward, but XLA compiles each program on its own,
and a fusion that spans two buckets in the whole program may round differently.
:func:`same_bits` checks a split against the whole backward on given inputs; the stage takes
the bucketed backward only where it does (``StageProgram.bucketed``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
from jax.extend import core as jcore

from skyjax.programs.split import _bind, _eval_inlined, _needed, _read


@dataclasses.dataclass
class Bucket:
    """One program of a bucketed backward: its equations, what it reads from earlier buckets
    (``imports``, in their ``carried`` order), what it hands on, its gradient leaves."""

    units: tuple[int, int]  # [lo, hi) of the stage's units (local indices)
    eqns: list
    imports: list  # variables defined by earlier buckets that it reads
    exports: list  # variables it defines (or imports) that later buckets read
    grads: list  # the parameter gradients' leaves of its units, in tree order
    carry: list  # the input cotangent's leaves (the last bucket only)


@dataclasses.dataclass
class BucketSplit:
    """A backward cut by buckets (:func:`split_buckets`)."""

    consts: list
    jaxpr_consts: list
    invars: list  # the backward's inputs, flattened: parameters, residuals, cotangent
    buckets: list[Bucket]
    unit_trees: list  # per unit its gradient's tree structure
    carry_tree: Any  # the input cotangent's

    def run(self, j: int, leaves: Sequence[Any], carried: Sequence[Any]
            ) -> tuple[list, list, Any]:
        """Bucket ``j``: (its units' parameter gradients, one tree each, the values it hands
        on, the input cotangent or None) from the backward's flattened inputs and what bucket
        ``j - 1`` handed on."""
        b = self.buckets[j]
        env = dict(zip(self.jaxpr_consts, self.consts))
        env.update(zip(self.invars, leaves))
        env.update(zip(b.imports, carried))
        for e in b.eqns:
            env.update(zip(e.outvars, _bind(e, [_read(env, v) for v in e.invars])))
        flat = [_read(env, v) for v in b.grads]
        grads, i = [], 0
        for u in range(*b.units):
            n = self.unit_trees[u].num_leaves
            grads.append(jax.tree.unflatten(self.unit_trees[u], flat[i:i + n]))
            i += n
        carry = (jax.tree.unflatten(self.carry_tree, [_read(env, v) for v in b.carry])
                 if b.carry else None)
        return grads, [_read(env, v) for v in b.exports], carry


def split_buckets(fn: Callable, bounds: Sequence[tuple[int, int]], params: Any,
                  *rest: Any) -> BucketSplit:
    """Cuts ``fn(params, *rest) -> (per-unit parameter gradients, input cotangent)`` (shapes
    or arrays as arguments) into ``bounds``' buckets, in the order given (the last units first;
    together they cover every unit once). The last bucket also computes the input cotangent."""
    leaves, tree = jax.tree.flatten((params, *rest))
    out_shape = jax.eval_shape(lambda *xs: fn(*jax.tree.unflatten(tree, xs)), *leaves)
    unit_trees = [jax.tree.structure(g) for g in out_shape[0]]
    carry_tree = jax.tree.structure(out_shape[1])
    whole = jax.make_jaxpr(lambda *xs: jax.tree.leaves(fn(*jax.tree.unflatten(tree, xs))))(
        *leaves)
    flat = jax.make_jaxpr(lambda *xs: _eval_inlined(whole.jaxpr, whole.consts, xs))(*leaves)
    jaxpr = flat.jaxpr
    eqns = list(jaxpr.eqns)
    starts = [0]
    for t in unit_trees:
        starts.append(starts[-1] + t.num_leaves)
    w_out, b_out = jaxpr.outvars[:starts[-1]], jaxpr.outvars[starts[-1]:]
    have = set(jaxpr.invars) | set(jaxpr.constvars)
    picked: list[tuple[tuple[int, int], list[int], list, list]] = []
    for j, (lo, hi) in enumerate(bounds):
        wanted = list(w_out[starts[lo]:starts[hi]])
        carry = list(b_out) if j == len(bounds) - 1 else []
        idx = _needed(eqns, wanted + carry, have)
        have |= {v for i in idx for v in eqns[i].outvars}
        picked.append(((lo, hi), idx, wanted, carry))
    if sorted(u for (lo, hi), *_ in picked for u in range(lo, hi)) != list(range(len(unit_trees))):
        raise ValueError(f"buckets {list(bounds)} do not cover units 0..{len(unit_trees) - 1} "
                         "once each")
    inputs = set(jaxpr.invars) | set(jaxpr.constvars)
    reads = []  # per bucket the non-input variables it reads (equations and outputs)
    for _, idx, wanted, carry in picked:
        mine = {v for i in idx for v in eqns[i].outvars}
        seen, need = set(), []
        for v in [x for i in idx for x in eqns[i].invars] + wanted + carry:
            if isinstance(v, jcore.Literal) or v in seen or v in mine or v in inputs:
                continue
            seen.add(v)
            need.append(v)
        reads.append(need)
    buckets, carried = [], []  # carried: what the previous bucket handed on, in order
    for j, ((lo, hi), idx, wanted, carry) in enumerate(picked):
        later = {v for r in reads[j + 1:] for v in r}
        mine = {v for i in idx for v in eqns[i].outvars}
        exports = [v for v in carried if v in later]
        exports += [v for i in idx for v in eqns[i].outvars if v in later and v not in exports]
        buckets.append(Bucket((lo, hi), [eqns[i] for i in idx], list(carried), exports,
                              wanted, carry))
        missing = [v for v in reads[j] if v not in carried and v not in mine]
        if missing:
            raise AssertionError(f"bucket {j} reads values no earlier bucket hands on: {missing}")
        carried = exports
    return BucketSplit(list(flat.consts), list(jaxpr.constvars), list(jaxpr.invars), buckets,
                       unit_trees, carry_tree)


def bucket_bounds(num_units: int, size: int = 1) -> list[tuple[int, int]]:
    """Buckets of ``size`` units from the last down: ``[(n - size, n), ...]``, the first
    units' bucket possibly smaller."""
    out, hi = [], num_units
    while hi > 0:
        out.append((max(0, hi - size), hi))
        hi -= size
    return out
