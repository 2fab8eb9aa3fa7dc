"""What a person watching a run sees, for the orchestration (``skyjax.train``) to call: per log
step, the extra numbers of the metrics record (throughput, each stage's compute and idle time;
they reach ``metrics.jsonl`` and TensorBoard through :class:`skyjax.report.outputs.Outputs`); at the end,
``plan.png`` and ``timeline.png`` (:mod:`skyjax.report.plots`), drawn by process 0."""

from __future__ import annotations

import os
from typing import Any, Sequence

from absl import logging

from skyjax.plan.model.types import Plan
from skyjax.profile.format import Profile
from skyjax.report.progress import Progress
from skyjax.runtime.replanner import stage_busy

PLAN_PNG, TIMELINE_PNG = "plan.png", "timeline.png"


def step_extras(last: Any, step_time_s: float, progress: Progress) -> dict:
    """``examples_per_s`` (over the steps since the previous log line), and per stage
    ``stage_compute_s`` (its forward + backward spans in the last step) and ``stage_idle_s``
    (the step time minus that: bubbles, waiting for messages, the optimizer update); not for
    a step whose spans are dispatch times (``last.measured`` False)."""
    busy = stage_busy(last) if last is not None and getattr(last, "measured", True) else []
    out: dict[str, Any] = {"examples_per_s": progress.examples_per_s()}
    if busy:
        out["stage_compute_s"] = busy
        out["stage_idle_s"] = [max(step_time_s - b, 0.0) for b in busy]
    return out


def peak_memory(devices: Sequence[Any], plan: Plan) -> list[float | None]:
    """Each stage's device's peak bytes in use, where the backend reports it (GPU / TPU, and
    only for devices this process can see); None elsewhere (CPU)."""
    out: list[float | None] = []
    for s in plan.stages:
        try:
            stats = devices[s.device].memory_stats() or {}
        except Exception:  # noqa: BLE001 - not addressable here, or no statistics
            stats = {}
        peak = stats.get("peak_bytes_in_use")
        out.append(float(peak) if peak is not None else None)
    return out


def write_pictures(workdir: str, plan: Plan, profile: Profile, last_step: Any,
                   devices: Sequence[Any] = ()) -> list[str]:
    """``workdir/plan.png`` (with the last step's measured stage times and, where known, peak
    memory) and ``workdir/timeline.png`` (the last step, its exchange included and drawn as
    long as the step, above the simulated schedule). A
    picture that cannot be drawn is a warning, not an error: the run's results are written."""
    from skyjax.report import plots

    spans = last_step.spans if last_step else []
    window = getattr(last_step, "window", None)
    written = []
    try:
        measured = plots.measure_stages(spans, len(plan.stages), plan.microbatches, window) \
            if spans else None
        if measured is not None and devices:
            measured.memory_bytes = peak_memory(devices, plan)
        written.append(plots.save(plots.plan_figure(plan, profile, measured),
                                  os.path.join(workdir, PLAN_PNG)))
        drawn = last_step.timeline_spans if spans else None  # with the exchange's spans
        written.append(plots.save(plots.timeline_figure(plan, profile, drawn, window),
                                  os.path.join(workdir, TIMELINE_PNG)))
    except Exception as e:  # noqa: BLE001 - e.g. matplotlib missing or a full disk
        logging.warning("could not draw %s in %s: %s: %s", PLAN_PNG if not written else
                        TIMELINE_PNG, workdir, type(e).__name__, e)
    return written


def train_progress(config: Any, is_chief: bool) -> Progress:
    """The training loop's :class:`~skyjax.report.progress.Progress`; the live bar only on process 0
    (and only on a terminal)."""
    return Progress(int(config.train.steps), int(config.data.batch_size),
                    live=None if is_chief else False)
