"""The non-finite guard: a step whose loss or gradient norm is NaN or infinite stops the run at
that step, before it is checkpointed (``skyjax.train.train_loop``); ``skyjax.main`` turns
:class:`NonFiniteError` into one line and the exit status ``skyjax.names.EXIT_NON_FINITE``.

It reads only what the trainer already has on the host each step (the last stage's mean loss,
and the global gradient norm the stages agree on for clipping): no extra device sync.
"""

from __future__ import annotations

import math
from typing import Any, Callable


class NonFiniteError(RuntimeError):
    """Training produced a NaN or infinite loss, gradient norm or parameter."""


def _finite(x: float | None) -> bool:
    return x is None or math.isfinite(x)


def stage_names(executor: Any) -> list[str]:
    """``"units [a, b) on device d"`` of every stage of an executor's plan."""
    return [f"units [{p.start}, {p.end}) on device {p.device}"
            for p in getattr(executor, "places", [])]


def check_step(step: int, metrics: Any, names: Callable[[], list[str]] | None = None,
               last_checkpoint: Callable[[], int | None] | None = None) -> None:
    """Raises :class:`NonFiniteError` when step ``step`` (0-based) of ``metrics`` (a
    ``StepMetrics``) has a non-finite loss or gradient norm, naming the step, both values and
    the stage that produced it: with a finite loss, the last stage in pipeline order whose own
    gradient norm is not finite (gradients flow backwards: the stages before it inherit its
    NaN), else the last stage, which computes the loss."""
    loss, norm = metrics.loss, getattr(metrics, "grad_norm", None)
    if not getattr(metrics, "has_loss", True):
        loss = None  # a process that does not gather the loss (distributed, not process 0)
    if _finite(loss) and _finite(norm):
        return
    stages = names() if names is not None else []
    kept = last_checkpoint() if last_checkpoint is not None else None
    where = ""
    results = list(getattr(metrics, "results", []) or [])
    if not _finite(loss) and stages:
        where = f" (the loss is computed on stage {len(stages) - 1}, {stages[-1]})"
    elif stages and len(results) == len(stages):  # local: each stage's own gradient norm
        bad = [k for k, r in enumerate(results)
               if not _finite(getattr(r, "grad_sq_norm", None))]
        if bad:
            where = f" on stage {bad[-1]} ({stages[bad[-1]]})"
    norm_text = "n/a (config.train.grad_clip_norm=0)" if norm is None else f"{norm:g}"
    loss_text = "n/a" if loss is None else f"{loss:g}"
    kept_text = ("no checkpoint kept" if kept is None
                 else f"the last good checkpoint is step {kept}")
    raise NonFiniteError(f"step {step + 1}: loss {loss_text}, gradient norm {norm_text}{where}: "
                         f"training diverged, stopped before checkpointing it; {kept_text} "
                         f"(lower config.train.learning_rate, or check the data and the "
                         f"pretrained weights)")
