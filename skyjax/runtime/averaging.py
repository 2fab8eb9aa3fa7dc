"""Relaxed averaging across pipelines (``Plan.averaging``; :mod:`skyjax.relax`): what a stage
does instead of summing its replicas exactly (``runtime.replicas.reduce_replicas``).

* ``int8``: each owner sends its gradients of a shared unit in the int8 codec
  (:mod:`skyjax.codecs`) and sums the decoded replicas in pipeline order, its own decoded too,
  so every owner still holds the same sum, bit for bit. Error feedback: what rounding dropped,
  (g + r) - decode(encode(g + r)), is kept per unit (r) and added to the next step's gradients.
  Each step's error is then carried, not lost: the sum of the applied gradients over steps
  differs from the exact sum by the last residual only, which stays within one rounding step,
  so the bias does not grow with the number of steps (BAGUA's ByteGrad, 1-bit Adam's
  compensation). The residual costs one copy of the stage's shared gradients.
* ``diloco``: no exchange per step; each pipeline's stages update on their own share, its
  gradients scaled to the share's mean (m / m_i) and clipped by the pipeline's own norm. Every
  ``outer_every`` steps, the owners of a unit average the pseudo-gradients, anchor - params,
  weighted by share (m_i / m), in pipeline order, and take one Nesterov SGD step from the
  anchor: v = mu v + delta; params = anchor - lr (delta + mu v) (DiLoCo; PyTorch's Nesterov).
  Every replica then holds the same parameters; the inner optimizer states stay per pipeline.
  The anchor and v cost two copies of the stage's parameters.
* ``int8-across`` and ``diloco-across``: the same, relaxed between link groups (regions) only,
  on the exact exchange's routes (``runtime.exchange``). ``int8-across``: the owners sum at their
  group's representative exactly; the representative sends its partial sum plus its residual
  in the int8 codec, keeps what rounding dropped as the unit's residual, and sums the decoded
  partial sums, its own decoded too, in group order; the total goes back exactly. Every owner
  holds the same bits. ``diloco-across``: each region's pipelines sum their gradients exactly
  every step (no exchange between groups), scaled to the region's mean (m / m_g, m_g its
  pipelines' micro-batches) and clipped by the region's norm; every ``outer_every`` steps the
  representatives exchange w_g (anchor - params), w_g = m_g / m, sum them in group order and
  send the sum back, and every owner takes the outer Nesterov step as ``diloco``. With one
  group both are the exact exchange, bit for bit.

* ``decentral`` and ``async`` (the peer modes): :mod:`skyjax.runtime.decentralized`, which
  ``state_class`` and ``make_averaging`` hand them to.

Each exchange is recorded on the stage as spans of the step (``PipelineStage.record_span``):
the direct exchanges of ``int8`` and ``diloco`` as phase 2 (every device a group of its own),
the routed ones by ``runtime.exchange``, and an outer step's own update as
``skyjax.spans.OUTER`` (blocked on where the step is measured, so that it spans the compute).

The state travels as per-unit trees (``export_state`` / ``import_state``, named by ``STATE``;
``SHARED``: the names equal on every replica; ``REPLICAS_DIFFER``: whether a replica's params
and optimizer state may differ from pipeline 0's), so checkpoints save and restore it
(:mod:`skyjax.checkpoint.relaxed`) and a resumed relaxed run equals the uninterrupted one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from skyjax import codecs
from skyjax.names import PEER_MODES
from skyjax.plan.pricing.exchange import BACK, BETWEEN, IN_GROUP, pipeline_groups
from skyjax.runtime.replicas import sum_replicas, swap_with_peers
from skyjax.spans import EXCHANGE_PHASE, OUTER

DIRECT = EXCHANGE_PHASE[BETWEEN]  # the direct exchange's kind: every device a group of its own


@jax.jit
def encode_with_feedback(grads: list, residual: list) -> tuple[list, list]:
    """(int8 code of grads + residual, the new residual)."""
    total = jax.tree.map(jnp.add, grads, residual)
    coded = codecs.encode("int8", total)
    return coded, jax.tree.map(jnp.subtract, total, codecs.decode("int8", coded, total))


@jax.jit
def decode_int8(coded: list, like: list) -> list:
    """What int8 ``coded`` decodes to, shaped as ``like``."""
    return codecs.decode("int8", coded, like)


@jax.jit
def _weighted_delta(anchor: list, params: list, weight) -> list:
    return jax.tree.map(lambda a, p: weight * (a - p), anchor, params)


@jax.jit
def outer_update(anchor: list, momentum: list, delta: list, lr, mu) -> tuple[list, list]:
    """(new params = new anchor, new momentum): Nesterov SGD on the pseudo-gradient."""
    v = jax.tree.map(lambda m, d: mu * m + d, momentum, delta)
    new = jax.tree.map(lambda a, d, m: a - lr * (d + mu * m), anchor, delta, v)
    return new, v


def _copy(tree: Any) -> Any:
    return jax.tree.map(lambda x: x.copy(), tree)


class _StateTrees:
    """Export and import of an averaging's state: each name of ``STATE`` is an attribute holding
    one tree per unit of the stage, in order (shaped like the unit's params)."""

    STATE: tuple[str, ...] = ()
    SHARED: tuple[str, ...] = ()  # equal on every replica of a unit
    REPLICAS_DIFFER = False  # a replica's params and optimizer state may differ from pipeline 0's

    def export_state(self) -> dict[str, list]:
        """``{name: [tree per unit of the stage]}`` (the arrays held, not copies)."""
        return {name: list(getattr(self, name)) for name in self.STATE}

    def import_state(self, state: dict[str, list]) -> None:
        """Replaces the named parts (host or device arrays, shaped as exported) on the device
        and in the dtype of what they replace."""
        for name, trees in state.items():
            held = getattr(self, name)
            setattr(self, name, jax.tree.map(
                lambda x, h: jax.device_put(x, next(iter(h.devices()))).astype(h.dtype),
                list(trees), list(held)))


def state_class(mode: str) -> type | None:
    """The class a stage of a plan with averaging ``mode`` holds, by its ``name`` (None: exact,
    no state; ``mode+compression``: :func:`skyjax.runtime.compressed.state_class`)."""
    if mode in PEER_MODES:
        from skyjax.runtime import decentralized
        return decentralized.state_class(mode)
    return {getattr(c, "name", None): c for c in _StateTrees.__subclasses__()}.get(mode)


def local_stages(executor: Any) -> list:
    """The stages an executor runs in this process: every stage (local executor), its own
    (distributed), none (a process the plan leaves idle)."""
    stages = getattr(executor, "stages", None)
    if stages is not None:
        return list(stages)
    stage = getattr(executor, "stage", None)
    return [] if stage is None else [stage]


class Int8Averaging(_StateTrees):
    """Per stage: the int8 exchange with error feedback (module doc)."""

    name = "int8"
    STATE = ("residual",)  # each pipeline's own
    own_norm = False  # the summed gradients: clipped by the global norm, as exact

    def __init__(self, stage: Any):
        self.residual = jax.tree.map(jnp.zeros_like, stage.state.grads)

    def grad_scale(self, stage: Any) -> float:
        return 1.0

    def reduce(self, stage: Any, step: int) -> None:
        t0 = stage.clock()
        coded, self.residual = encode_with_feedback(stage.state.grads, self.residual)
        own = decode_int8(coded, stage.state.grads)
        got = swap_with_peers(stage, step, coded, decode_int8)
        stage.state.grads = sum_replicas(stage, own, got)
        stage.record_span(DIRECT, t0)

    def after_update(self, stage: Any, step: int) -> None:
        pass


class DilocoAveraging(_StateTrees):
    """Per stage: inner steps on the pipeline's share, an outer step every H (module doc)."""

    name = "diloco"
    STATE = SHARED = ("anchor", "momentum")
    REPLICAS_DIFFER = True  # params between outer steps, inner optimizer states always
    own_norm = True  # every pipeline clips its inner steps by its own norm

    def __init__(self, stage: Any, every: int, lr: float, momentum: float):
        self.every, self.lr, self.mu = int(every), float(lr), float(momentum)
        self.anchor = _copy(stage.state.params)
        self.momentum = jax.tree.map(jnp.zeros_like, stage.state.params)

    def grad_scale(self, stage: Any) -> float:
        """Each micro-batch's loss weighs 1/m (the global batch): m / m_i makes the pipeline's
        gradient its own share's mean."""
        return stage.program.loss_microbatches / stage.program.microbatches

    def reduce(self, stage: Any, step: int) -> None:
        pass

    def after_update(self, stage: Any, step: int) -> None:
        if (step + 1) % self.every:
            return
        t0 = stage.clock()
        weight = jnp.float32(stage.program.microbatches / stage.program.loss_microbatches)
        delta = _weighted_delta(self.anchor, stage.state.params, weight)
        got = swap_with_peers(stage, step, delta)
        total = sum_replicas(stage, delta, got)
        stage.record_span(DIRECT, t0)
        _outer_step(self, stage, total)


class Int8AcrossAveraging(_StateTrees):
    """Per stage: the exchange through the link groups (``runtime.exchange``), the groups'
    partial sums in the int8 codec between them, with error feedback at the representatives
    (module doc)."""

    name = "int8-across"
    STATE = ("residual",)  # per unit, non-zero where the stage represents it across groups
    own_norm = False  # the summed gradients: clipped by the global norm, as exact

    def __init__(self, stage: Any):
        self.first = stage.first_unit
        self.residual = jax.tree.map(jnp.zeros_like, stage.state.grads)

    def grad_scale(self, stage: Any) -> float:
        return 1.0

    def reduce(self, stage: Any, step: int) -> None:
        stage.state.grads = stage.role.routes.run(stage, step, stage.state.grads, coder=self)

    def encode(self, units: list[int], partials: list) -> tuple[list, list]:
        """(int8 codes of the units' partial sums + residuals, what they decode to); keeps the
        new residuals."""
        if not units:
            return [], []
        at = [u - self.first for u in units]
        coded, kept = encode_with_feedback(partials, [self.residual[j] for j in at])
        residual = list(self.residual)
        for j, r in zip(at, kept):
            residual[j] = r
        self.residual = residual
        return coded, decode_int8(coded, partials)

    def decode(self, coded: list, like: list) -> list:
        return decode_int8(coded, like)

    def after_update(self, stage: Any, step: int) -> None:
        pass


class DilocoAcrossAveraging(_StateTrees):
    """Per stage: its region's pipelines one exact data-parallel group every step, DiLoCo's
    outer step between the regions every H steps (module doc)."""

    name = "diloco-across"
    STATE = SHARED = ("anchor", "momentum")
    REPLICAS_DIFFER = True  # params of different regions between outer steps

    def __init__(self, stage: Any, spec: AveragingSpec):
        groups = list(spec.groups)
        self.norm_groups = groups if len(set(groups)) > 1 else None  # one group: exact
        self.own_norm = self.norm_groups is not None
        self.share = sum(x for x, g in zip(spec.shares, groups) if g == groups[stage.pipeline])
        self.every, self.lr, self.mu = (int(spec.outer_every), float(spec.outer_lr),
                                        float(spec.outer_momentum))
        self.anchor = _copy(stage.state.params)
        self.momentum = jax.tree.map(jnp.zeros_like, stage.state.params)

    def grad_scale(self, stage: Any) -> float:
        """m / m_g: the region's summed gradients become its share's mean (1: one group)."""
        return stage.program.loss_microbatches / self.share

    def reduce(self, stage: Any, step: int) -> None:
        stage.state.grads = stage.role.routes.run(stage, step, stage.state.grads,
                                                  phases=(IN_GROUP, BACK))

    def after_update(self, stage: Any, step: int) -> None:
        if self.norm_groups is None or (step + 1) % self.every:
            return
        weight = jnp.float32(self.share / stage.program.loss_microbatches)
        delta = _weighted_delta(self.anchor, stage.state.params, weight)
        total = stage.role.routes.run(stage, step, delta, phases=(BETWEEN, BACK))
        _outer_step(self, stage, total)


def _outer_step(averaging: Any, stage: Any, total: list) -> None:
    """The outer Nesterov step of a DiLoCo ``averaging`` from the summed pseudo-gradients
    ``total``: the stage's new params and anchor; recorded as an :data:`OUTER` span."""
    t0 = stage.clock()
    new, averaging.momentum = outer_update(averaging.anchor, averaging.momentum, total,
                                           averaging.lr, averaging.mu)
    stage.state.params = new
    averaging.anchor = _copy(new)
    if stage._blocking:  # a measured step: the span is the update's compute, not its dispatch
        jax.block_until_ready((new, averaging.anchor))
    stage.record_span(OUTER, t0)


def replica_groups(plan: Any) -> list[int]:
    """Per pipeline its link group (``plan.exchange_groups``), groups numbered by their first
    pipeline: the replica groups of ``diloco-across``."""
    chains = [[(s.device, *s.units) for s in plan.pipeline(i).stages]
              for i in range(plan.num_pipelines)]
    groups = pipeline_groups(chains, plan.exchange_groups)
    if groups is None:
        raise ValueError("plan.averaging='diloco-across' needs every pipeline's devices in one "
                         "of plan.exchange_groups")
    return groups


def norm_groups(plan: Any) -> list[int] | None:
    """Per pipeline the group whose stages clip by one norm; None: one global norm."""
    if plan.num_pipelines < 2:
        return None
    if plan.averaging == "diloco" or plan.averaging in PEER_MODES:
        return list(range(plan.num_pipelines))
    if plan.averaging == "diloco-across":
        groups = replica_groups(plan)
        return groups if len(set(groups)) > 1 else None
    return None


@dataclasses.dataclass(frozen=True)
class AveragingSpec:
    """What a stage's relaxed averaging takes from the plan (part of its ``StageRole``): the
    mode, the outer step's settings, each pipeline's share and, for ``diloco-across``, each
    pipeline's replica group."""

    mode: str
    outer_every: int
    outer_lr: float
    outer_momentum: float
    shares: tuple[int, ...]
    groups: tuple[int, ...] | None = None
    compression: str = "none"  # relax.outer_compression (skyjax.runtime.compressed)
    topk: float = 0.0  # its fraction kept
    peer_schedule: str = ""  # decentral's (skyjax.runtime.decentralized)
    staleness: int = 0  # async's k


def averaging_spec(plan: Any) -> AveragingSpec | None:
    """The plan's relaxed averaging as its stages run it; None for exact (or one pipeline)."""
    if plan.num_pipelines < 2 or plan.averaging == "exact":
        return None
    if state_class(plan.averaging) is None:
        raise ValueError(f"plan.averaging: unknown mode {plan.averaging!r}")
    groups = tuple(replica_groups(plan)) if plan.averaging == "diloco-across" else None
    return AveragingSpec(plan.averaging, plan.outer_every, plan.outer_lr, plan.outer_momentum,
                         tuple(plan.pipeline_shares()), groups, plan.outer_compression,
                         plan.outer_topk, plan.peer_schedule, plan.staleness)


def make_averaging(spec: AveragingSpec | None, stage: Any) -> Any:
    """A stage's averaging state for ``spec`` (made with the stage); None for exact."""
    if spec is None:
        return None
    if spec.mode in PEER_MODES:
        from skyjax.runtime import decentralized
        return decentralized.make(spec, stage)
    if spec.mode == "int8":
        return Int8Averaging(stage)
    if spec.mode == "diloco":
        return DilocoAveraging(stage, spec.outer_every, spec.outer_lr, spec.outer_momentum)
    if spec.mode == "int8-across":
        return Int8AcrossAveraging(stage)
    return DilocoAcrossAveraging(stage, spec)
