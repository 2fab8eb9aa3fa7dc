"""A lost process with several pipelines: its pipeline is dropped, the global batch re-split
among the others, and the step runs again, without a restart and without losing a step.

Why a retried step is the same math (docs/design.md, "A lost process loses its pipeline"): a
step commits at its gradient-norm all-reduce, which runs every step when there are several
pipelines (``PipelineStage.update``). Every process reads the same keys there and a key that is
there is read even after a loss (``transport.group.kv_get``), so either every survivor passed
it, updated, and meets the loss in a later step, or none did: then no parameter or optimizer
state moved, the step's partial gradients are dropped with the old executor, and the step runs
again from the same state on the plan of the survivors (``plan.pipeline_split.without_devices``:
every survivor derives it from the same plan and profile, without a message), over renewed
transports (``TransferServerTransport.renew``: a new namespace, and a new transfer server in
every survivor, since the lost process may have died pulling from one). Dropout keys are
per example and batches a function of the step, so the retried step computes what an
uninterrupted run computes. Losing process 0 (the coordination service), or the last pipeline,
ends the run as before: exit 75, and ``skyjax.launch --max_restarts`` restarts the survivors
from the last checkpoint.
"""

from __future__ import annotations

from typing import Any

from absl import logging

from skyjax.plan.as_run import priced
from skyjax.plan.data_parallel.split import without_devices
from skyjax.profile.format import Profile
from skyjax.transport import group
from skyjax.transport.watchdog import PeerLost


class Recovery:
    """Called with the executor and the ``PeerLost`` of a failed step; returns the executor of
    the surviving pipelines, or raises the error when the run cannot go on without a restart.
    ``history``: one record per recovery (``summary.json`` ``recoveries``)."""

    def __init__(self, profile: Profile):
        self.profile = profile
        self.history: list[dict] = []

    def __call__(self, executor: Any, error: PeerLost, step: int) -> Any:
        watchdog = group.watchdog()
        lost = watchdog.lost_process if watchdog is not None else None
        if (lost in (None, 0) or not hasattr(executor, "without")
                or executor.plan.num_pipelines < 2):
            raise error
        plan = without_devices(self.profile, executor.plan, sorted(watchdog.gone | {lost}))
        if plan is None:
            raise error
        plan = priced(plan, self.profile)  # its prediction: the step as it runs
        watchdog.forgive(lost)
        gone = sorted(watchdog.gone)
        executor = executor.without(plan, gone, len(self.history) + 1)
        record = {"step": step + 1, "lost_process": lost, "pipelines": plan.num_pipelines,
                  "shares": plan.pipeline_shares(),
                  "devices": [s.device for s in plan.stages],
                  "predicted_step_time_s": plan.step_time_s}
        self.history.append(record)
        logging.warning("process %d lost in step %d: its pipeline is dropped; the step runs "
                        "again on %d pipeline(s), micro-batches %s, devices %s (predicted step "
                        "%.4f s)", lost, step + 1, plan.num_pipelines, plan.pipeline_shares(),
                        record["devices"], plan.step_time_s)
        return executor
