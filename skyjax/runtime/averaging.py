"""Relaxed averaging across pipelines (``Plan.averaging``; :mod:`skyjax.relax`): what a stage
does instead of summing its replicas exactly (``PipelineStage.reduce_replicas``).

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

Neither residuals nor anchors are in checkpoints: a resumed relaxed run starts them afresh (zero
residual; anchor = the restored parameters, v = 0), so resuming changes a relaxed run's math
slightly, where an exact run resumes bit for bit.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from skyjax import codecs


@jax.jit
def _encode_with_feedback(grads: list, residual: list) -> tuple[list, list]:
    """(int8 code of grads + residual, the new residual)."""
    total = jax.tree.map(jnp.add, grads, residual)
    coded = codecs.encode("int8", total)
    return coded, jax.tree.map(jnp.subtract, total, codecs.decode("int8", coded, total))


@jax.jit
def _decode(coded: list, like: list) -> list:
    return codecs.decode("int8", coded, like)


@jax.jit
def _weighted_delta(anchor: list, params: list, weight) -> list:
    return jax.tree.map(lambda a, p: weight * (a - p), anchor, params)


@jax.jit
def _outer_update(anchor: list, momentum: list, delta: list, lr, mu) -> tuple[list, list]:
    """(new params = new anchor, new momentum): Nesterov SGD on the pseudo-gradient."""
    v = jax.tree.map(lambda m, d: mu * m + d, momentum, delta)
    new = jax.tree.map(lambda a, d, m: a - lr * (d + mu * m), anchor, delta, v)
    return new, v


def _copy(tree: Any) -> Any:
    return jax.tree.map(lambda x: x.copy(), tree)


class Int8Averaging:
    """Per stage: the int8 exchange with error feedback (module doc)."""

    name = "int8"
    own_norm = False  # the summed gradients: clipped by the global norm, as exact

    def __init__(self, stage: Any):
        self.residual = jax.tree.map(jnp.zeros_like, stage.state.grads)

    def grad_scale(self, stage: Any) -> float:
        return 1.0

    def reduce(self, stage: Any, step: int) -> None:
        coded, self.residual = _encode_with_feedback(stage.state.grads, self.residual)
        own = _decode(coded, stage.state.grads)
        got = stage.swap_with_peers(step, coded, _decode)
        stage.state.grads = stage.sum_replicas(own, got)

    def after_update(self, stage: Any, step: int) -> None:
        pass


class DilocoAveraging:
    """Per stage: inner steps on the pipeline's share, an outer step every H (module doc)."""

    name = "diloco"
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
        weight = jnp.float32(stage.program.microbatches / stage.program.loss_microbatches)
        delta = _weighted_delta(self.anchor, stage.state.params, weight)
        got = stage.swap_with_peers(step, delta)
        new, self.momentum = _outer_update(self.anchor, self.momentum,
                                           stage.sum_replicas(delta, got), self.lr, self.mu)
        stage.state.params = new
        self.anchor = _copy(new)


def make_averaging(plan: Any, stage: Any) -> Any:
    """The plan's relaxed averaging for one stage; None for exact (or one pipeline)."""
    if plan.num_pipelines < 2 or plan.averaging == "exact":
        return None
    if plan.averaging == "int8":
        return Int8Averaging(stage)
    if plan.averaging == "diloco":
        return DilocoAveraging(stage, plan.outer_every, plan.outer_lr, plan.outer_momentum)
    raise ValueError(f"plan.averaging: unknown mode {plan.averaging!r}")
