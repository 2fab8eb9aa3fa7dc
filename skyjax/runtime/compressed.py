"""The relaxed averagings with their exchange in top-k plus 2 or 4 bits (``relax.
outer_compression``; :mod:`skyjax.compress`), each replica keeping what was not sent as its
error-feedback residual (SparseLoCo on DiLoCo's outer deltas, CocktailSGD on gradients).

Each mode is its uncompressed one (:mod:`skyjax.runtime.averaging`) with the coder swapped:

* ``int8`` + top-k: every owner sends ``encode(g + r)`` per unit of its stage, keeps
  ``r = (g + r) - decode(...)``, and sums the decoded replicas, its own decoded too, in
  pipeline order: every owner holds the same bits.
* ``diloco`` + top-k: at the outer step each owner sends its weighted pseudo-gradient plus its
  residual in top-k, keeps what was dropped, and every owner sums the decoded deltas in pipeline
  order and takes the outer Nesterov step from them (one model again).
* ``int8-across`` and ``diloco-across`` + top-k: phase 2 (between link groups) carries the
  representatives' partial sums in top-k, the residual kept at the representative, as
  ``int8-across`` keeps its int8 residual; phases 1 and 3 stay exact.

The residual is one tree per unit shaped like its params (``STATE`` ``residual``, each
pipeline's own), so checkpoints save and restore it with the rest (:mod:`skyjax.checkpoint.
relaxed`, under the mode name ``<mode>+<compression>``) and a resumed run equals the
uninterrupted one. Memory: DiLoCo's two copies plus the residual, three; the int8 modes' one
copy (the residual replaces int8's).
"""

from __future__ import annotations

from typing import Any

import jax

from skyjax import compress
from skyjax.runtime import averaging
from skyjax.plan.pricing.exchange import BACK, BETWEEN
from skyjax.runtime.averaging import (DIRECT, DilocoAcrossAveraging, DilocoAveraging,
                                      Int8AcrossAveraging, Int8Averaging, _outer_step,
                                      _weighted_delta)
from skyjax.runtime.replicas import sum_replicas, swap_with_peers

_encode = jax.jit(compress.topk_lowbit_encode, static_argnums=(1, 2))
_decode = jax.jit(compress.topk_lowbit_decode, static_argnums=(2, 3))


def mode_name(averaging: str, compression: str) -> str:
    """The name a plan's averaging state goes by: ``averaging``, or ``averaging+compression``
    where compressed."""
    return averaging if compression in ("", "none") else f"{averaging}+{compression}"


class TopkCoder:
    """Per unit: top-k plus ``bits`` bits of ``fraction`` of each chunk, with a residual."""

    def __init__(self, compression: str, fraction: float):
        self.bits, self.fraction = compress.bits_of(compression), float(fraction)

    def encode(self, trees: list, residuals: list) -> tuple[list, list, list]:
        """(payloads, what they decode to, the new residuals), one per unit."""
        out = [_encode(t, self.fraction, self.bits, r) for t, r in zip(trees, residuals)]
        return [o[0] for o in out], [o[1] for o in out], [o[2] for o in out]

    def decode(self, payloads: list, like: list) -> list:
        return [_decode(p, x, self.fraction, self.bits) for p, x in zip(payloads, like)]


class _AcrossCoder:
    """Phase 2's coder of the ``-across`` modes (``runtime.exchange.Routes.run``): the
    representatives' partial sums plus their residuals in top-k."""

    def encode(self, units: list[int], partials: list) -> tuple[list, list]:
        if not units:
            return [], []
        at = [u - self.first for u in units]
        codes, decoded, kept = self.coder.encode(partials, [self.residual[j] for j in at])
        residual = list(self.residual)
        for j, r in zip(at, kept):
            residual[j] = r
        self.residual = residual
        return codes, decoded

    def decode(self, coded: list, like: list) -> list:
        return self.coder.decode(coded, like)


class TopkInt8Averaging(Int8Averaging):
    """``int8`` with its gradients in top-k (module doc)."""

    def __init__(self, stage: Any, coder: TopkCoder):
        super().__init__(stage)
        self.coder = coder

    def reduce(self, stage: Any, step: int) -> None:
        t0 = stage.clock()
        coded, own, self.residual = self.coder.encode(stage.state.grads, self.residual)
        got = swap_with_peers(stage, step, coded, self.coder.decode)
        stage.state.grads = sum_replicas(stage, own, got)
        stage.record_span(DIRECT, t0)


class TopkDilocoAveraging(DilocoAveraging):
    """``diloco`` with its outer deltas in top-k (module doc)."""

    STATE = ("anchor", "momentum", "residual")  # the residual each pipeline's own

    def __init__(self, stage: Any, every: int, lr: float, momentum: float, coder: TopkCoder):
        super().__init__(stage, every, lr, momentum)
        self.coder = coder
        self.residual = jax.tree.map(jax.numpy.zeros_like, stage.state.params)

    def after_update(self, stage: Any, step: int) -> None:
        if (step + 1) % self.every:
            return
        t0 = stage.clock()
        weight = jax.numpy.float32(stage.program.microbatches / stage.program.loss_microbatches)
        delta = _weighted_delta(self.anchor, stage.state.params, weight)
        coded, own, self.residual = self.coder.encode(delta, self.residual)
        got = swap_with_peers(stage, step, coded, self.coder.decode)
        total = sum_replicas(stage, own, got)
        stage.record_span(DIRECT, t0)
        _outer_step(self, stage, total)


class TopkInt8AcrossAveraging(_AcrossCoder, Int8AcrossAveraging):
    """``int8-across`` with phase 2 in top-k (module doc)."""

    def __init__(self, stage: Any, coder: TopkCoder):
        Int8AcrossAveraging.__init__(self, stage)
        self.coder = coder


class TopkDilocoAcrossAveraging(_AcrossCoder, DilocoAcrossAveraging):
    """``diloco-across`` with the outer step's phase 2 in top-k (module doc)."""

    STATE = ("anchor", "momentum", "residual")  # the residual at the representatives

    def __init__(self, stage: Any, spec: Any, coder: TopkCoder):
        DilocoAcrossAveraging.__init__(self, stage, spec)
        self.coder, self.first = coder, stage.first_unit
        self.residual = jax.tree.map(jax.numpy.zeros_like, stage.state.params)

    def after_update(self, stage: Any, step: int) -> None:
        if self.norm_groups is None or (step + 1) % self.every:
            return
        weight = jax.numpy.float32(self.share / stage.program.loss_microbatches)
        delta = _weighted_delta(self.anchor, stage.state.params, weight)
        total = stage.role.routes.run(stage, step, delta, phases=(BETWEEN, BACK), coder=self)
        _outer_step(self, stage, total)


CLASSES = {"int8": TopkInt8Averaging, "diloco": TopkDilocoAveraging,
           "int8-across": TopkInt8AcrossAveraging, "diloco-across": TopkDilocoAcrossAveraging}


def state_class(name: str) -> type | None:
    """The class of a plan's averaging state by its name (:func:`mode_name`): a compressed
    mode's here, another's :func:`skyjax.runtime.averaging.state_class`."""
    mode, _, compression = name.partition("+")
    if not compression:
        return averaging.state_class(mode)
    return CLASSES.get(mode) if compression in compress.BITS else None


def make_averaging(spec: Any, stage: Any) -> Any:
    """A stage's averaging state for ``spec`` (made with the stage): compressed where
    ``spec.compression`` names a compression, else :func:`skyjax.runtime.averaging.
    make_averaging`."""
    if spec is None or spec.compression == "none":
        return averaging.make_averaging(spec, stage)
    coder = TopkCoder(spec.compression, spec.topk)
    if spec.mode == "int8":
        return TopkInt8Averaging(stage, coder)
    if spec.mode == "diloco":
        return TopkDilocoAveraging(stage, spec.outer_every, spec.outer_lr, spec.outer_momentum,
                                   coder)
    if spec.mode == "int8-across":
        return TopkInt8AcrossAveraging(stage, coder)
    return TopkDilocoAcrossAveraging(stage, spec, coder)
