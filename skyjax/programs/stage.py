"""Stage programs: the jitted forward, backward and optimizer update of one block of units.

A stage owns a contiguous block of units on one device. Per micro-batch it runs ``forward``, which
returns the block's output and the residuals of the ``jax.vjp`` pullback (exactly what backward
needs, nothing recomputed; parameters among them are not copied but passed to backward again),
and later ``backward``, which applies the pullback to the incoming
cotangent, accumulates parameter gradients and returns the cotangent for the previous stage. The
last stage's forward ends in the loss, so its backward needs no incoming cotangent. After the last
micro-batch, ``update`` applies optax with gradients already scaled for global-norm clipping
(the optimizer comes from ``skyjax.optim.make_optimizer(config.train, clip=False)``: a stage cannot
clip alone, it sees only its share of the norm).

Hand-off codecs (:mod:`skyjax.codecs`, chosen per link by the planner): ``in_codec`` is the
link from the previous stage, ``out_codec`` the one to the next. The forward decodes its input
and encodes its output, the backward decodes the incoming cotangent and encodes the one it sends
back, inside the same jitted programs (no extra dispatch; on an emulated slow device the codec
is as slow as the rest). The pullback is taken at the decoded input, so the codec is outside
differentiation (a straight-through estimator, as in SWARM and AQ-SGD).

Each program is compiled once per shape (``compile_counts`` lets tests prove it). The loss and
eval outputs are ``skyjax.metrics``'.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from skyjax import codecs
from skyjax.metrics import classification_loss, eval_outputs
from skyjax.models.bert import Carry, Params, Unit, apply_units
from skyjax.models.units import in_compute_dtype
from skyjax.programs.buckets import split_buckets
from skyjax.programs.split import split_backward
from skyjax.tree import tree_avals, tree_shapes

Residuals = list[jax.Array]


@dataclasses.dataclass
class StageState:
    """What a stage keeps across steps: per-unit params and optimizer states, gradient sums."""

    params: list[Params]
    opt_state: Any
    grads: list[Params]


class StageProgram:
    """Jitted programs for the block ``chain``; ``is_last`` adds the loss to the forward.

    Only the units' ``apply`` and parameter shapes are kept (``chain`` with shape leaves): the
    parameters live in :class:`StageState` on the device, and a program that held the units as
    given would keep the host copy they were made from alive for the whole run."""

    def __init__(self, chain: list[Unit], *, is_last: bool, microbatches: int,
                 optimizer: optax.GradientTransformation | None = None, train: bool = True,
                 loss_microbatches: int | None = None, in_codec: str = "none",
                 out_codec: str = "none", in_like: Carry | None = None):
        self.chain = [dataclasses.replace(u, params=tree_shapes(u.params)) for u in chain]
        self.in_codec, self.out_codec = in_codec, out_codec
        self.in_like = in_like  # the raw input carry's shapes (decoding needs them)
        if in_codec != "none" and in_like is None:
            raise ValueError(f"in_codec {in_codec!r} needs in_like (the input carry's shapes)")
        self.is_last = is_last
        self.microbatches = microbatches  # this pipeline's micro-batches per step
        # the global batch's micro-batches: each one's mean loss weighs 1 / loss_microbatches, so
        # the gradients of every pipeline's share add up to the global batch's mean
        self.loss_microbatches = loss_microbatches or microbatches
        self.optimizer = optimizer
        self.train = train
        self.compile_counts = {"forward": 0, "backward": 0, "update": 0}  # (+ B and W's)
        self._pullbacks: dict[tuple, tuple[jax.tree_util.PyTreeDef, list, Any]] = {}
        self._splits: dict[tuple, Any] = {}  # the backward's B / W split per residual shapes
        self.forward = jax.jit(self._forward)
        self.backward = jax.jit(self._backward, donate_argnums=(3,))
        # zero-bubble schedules: the backward in two programs (skyjax.programs.split)
        self.backward_input = jax.jit(self._backward_input)
        self.backward_weight = jax.jit(self._backward_weight, donate_argnums=(2,))
        # the exchange behind the backward: the backward by buckets (skyjax.programs.buckets)
        self._buckets: dict[tuple, Any] = {}
        self.backward_bucket = jax.jit(self._backward_bucket, static_argnums=(0, 1),
                                       donate_argnums=(6,))
        self.update = jax.jit(self._update, donate_argnums=(0, 1, 2))
        self.evaluate = jax.jit(self._evaluate)

    # -- pure functions (traced once per shape) -------------------------------------------------

    def _block(self, params: list[Params], carry: Carry, rng, labels):
        out = apply_units(self.chain, params, carry, rng, self.train)
        if not self.is_last:
            return out, None
        loss, accuracy = classification_loss(out["logits"], labels)
        return loss / self.loss_microbatches, (loss, accuracy)

    def _forward(self, params: list[Params], carry: Carry, rng, labels=None):
        self.compile_counts["forward"] += 1
        carry = codecs.decode(self.in_codec, carry, self.in_like)
        # differentiated at the parameters in the compute dtype (cast outside the pullback), so
        # that the cast copies are recognised below as parameters and not kept per micro-batch
        params = self._computing(params)
        out, pullback, aux = jax.vjp(lambda p, c: self._block(p, c, rng, labels), params, carry,
                                     has_aux=True)
        leaves, treedef = jax.tree.flatten(pullback)
        # Residuals that *are* parameters (e.g. a kernel, for the input cotangent) are not kept
        # per micro-batch: backward takes them from the params it is given.
        param_leaves = jax.tree.leaves(params)
        slots = [next((j for j, p in enumerate(param_leaves) if r is p), None) for r in leaves]
        residuals = [r for r, j in zip(leaves, slots) if j is None]
        out_like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), out)
        self._pullbacks[tree_avals(residuals)] = (treedef, slots, out_like)
        return (aux if self.is_last else codecs.encode(self.out_codec, out)), residuals

    def _backward(self, params: list[Params], residuals: Residuals, cotangent,
                  grads: list[Params]):
        self.compile_counts["backward"] += 1
        d_params, d_carry = self._gradients(params, residuals, cotangent)
        return _accumulate(grads, d_params), d_carry

    def _backward_input(self, params: list[Params], residuals: Residuals, cotangent):
        """B: the cotangent for the previous stage (encoded) and what W needs of this
        micro-batch (``pending``); the residuals W does not read are freed with the call."""
        self.compile_counts["backward_input"] = self.compile_counts.get("backward_input", 0) + 1
        key = tree_avals(residuals)
        if key not in self._splits:
            shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  (params, residuals, cotangent))
            self._splits[key] = split_backward(self._gradients, *shapes)
        d_carry, pending = self._splits[key].input_grad(jax.tree.leaves(
            (params, residuals, cotangent)))
        self._splits[tree_avals(pending)] = self._splits[key]
        return d_carry, pending

    def _backward_weight(self, params: list[Params], pending: list, grads: list[Params]):
        """W: adds this micro-batch's parameter gradients to ``grads``."""
        self.compile_counts["backward_weight"] = self.compile_counts.get("backward_weight",
                                                                         0) + 1
        split = self._splits[tree_avals(pending)]
        return _accumulate(grads, split.weight_grad(jax.tree.leaves(params), pending))

    def _backward_bucket(self, bounds: tuple[tuple[int, int], ...], j: int,
                         params: list[Params], residuals: Residuals, cotangent,
                         carried: list, grads: list[Params]):
        """Bucket ``j`` of the backward cut by ``bounds`` (the stage's local ``[lo, hi)``
        buckets in their order): adds its units' gradients to ``grads`` (theirs alone) and
        returns (them, what later buckets read, the encoded input cotangent or None)."""
        self.compile_counts["backward_bucket"] = self.compile_counts.get("backward_bucket",
                                                                         0) + 1
        key = (bounds, tree_avals(residuals))
        if key not in self._buckets:
            shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  (params, residuals, cotangent))
            self._buckets[key] = split_buckets(self._gradients, bounds, *shapes)
        d_params, carried, d_carry = self._buckets[key].run(
            j, jax.tree.leaves((params, residuals, cotangent)), carried)
        return _accumulate(grads, d_params), carried, d_carry

    def _gradients(self, params: list[Params], residuals: Residuals, cotangent):
        """The pullback of a forward: (parameter gradients in the compute dtype, the encoded
        cotangent for the previous stage)."""
        treedef, slots, out_like = self._pullbacks[tree_avals(residuals)]
        param_leaves, kept = jax.tree.leaves(self._computing(params)), iter(residuals)
        leaves = [next(kept) if j is None else param_leaves[j] for j in slots]
        pullback = jax.tree.unflatten(treedef, leaves)
        if self.is_last:
            cotangent = jnp.ones((), jnp.float32)
        else:  # integer outputs (the attention mask) take float0 zeros as cotangents
            cotangent = codecs.decode(self.out_codec, cotangent, float_entries(out_like))
            cotangent = {k: cotangent[k] if k in cotangent else np.zeros(v.shape, jax.dtypes.float0)
                         for k, v in out_like.items()}
        d_params, d_carry = pullback(cotangent)  # in the compute dtype; summed in float32
        return d_params, codecs.encode(self.in_codec, float_entries(d_carry))

    def _computing(self, params: list[Params]) -> list[Params]:
        """Per unit, ``params`` in the dtype the unit computes in (``skyjax.models.units``)."""
        return [in_compute_dtype(p, u.compute_dtype) for u, p in zip(self.chain, params)]

    def _update(self, params: list[Params], opt_state: list[Any], grads: list[Params], scale):
        """One optax step per unit (same math as one step over the block: AdamW is elementwise
        and clipping is already in ``scale``), so a unit's state can move to another stage."""
        self.compile_counts["update"] += 1
        new_params, new_state = [], []
        for p, s, g in zip(params, opt_state, grads):
            updates, s = self.optimizer.update(jax.tree.map(lambda x: x * scale, g), s, p)
            new_params.append(optax.apply_updates(p, updates))
            new_state.append(s)
        return new_params, new_state, jax.tree.map(jnp.zeros_like, grads)

    def _evaluate(self, params: list[Params], carry: Carry, labels=None, weights=None):
        """Eval-mode forward; the last stage returns per-example (loss, prediction, label,
        weight), see ``skyjax.metrics.eval_outputs``."""
        out = apply_units(self.chain, params, carry, None, False)
        if not self.is_last:
            return out
        return eval_outputs(out["logits"], labels, weights)

    # -- helpers ---------------------------------------------------------------------------------

    def init_state(self, params: list[Params], opt_state: list[Any] | None = None) -> StageState:
        """State for ``params`` (already on the device): the given per-unit optimizer states
        (e.g. moved here by re-planning) or fresh ones, and zero gradients."""
        if opt_state is None and self.optimizer is not None:
            opt_state = [self.optimizer.init(p) for p in params]
        grads = jax.tree.map(jnp.zeros_like, params)
        leaves = jax.tree.leaves(params)
        if leaves:  # committed to the stage's device like the update's outputs: else the
            # second step's update compiles again (uncommitted inputs are another cache entry)
            device = next(iter(leaves[0].devices()))
            opt_state, grads = jax.device_put((opt_state, grads), device)
        return StageState(params, opt_state, grads)


def _accumulate(grads: list[Params], d_params: list[Params]) -> list[Params]:
    """``grads + d_params``, summed in the gradients' dtype (float32)."""
    return jax.tree.map(lambda g, d: jnp.add(g, d.astype(g.dtype)), grads, d_params)


def float_entries(tree: Carry) -> Carry:
    """The floating-point entries of a carry (arrays or ShapeDtypeStructs): the ones that have
    cotangents; integer ones (the attention mask, float0 cotangents) have nothing to send back."""
    return {k: v for k, v in tree.items() if jnp.issubdtype(v.dtype, jnp.floating)}
