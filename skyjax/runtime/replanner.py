"""``allocation.strategy="dynamic"`` during training: observe the measured stage times, ask the
re-planning policy (``skyjax.plan.replan``, pure) whether another plan pays, agree on the answer
across processes, and rebuild the executor (units move with their optimizer state)."""

from __future__ import annotations

from typing import Any

import jax
from absl import logging

from skyjax import plan as plan_lib
from skyjax.plan import replan
from skyjax.plan.model.extension import ExtraCost
from skyjax.plan.replay.measured import measured_comm
from skyjax.profile.format import Profile
from skyjax.transport import group as distributed


def stage_busy(metrics: Any) -> list[float]:
    """Each stage's measured compute in one step (the sum of its forward and backward spans)."""
    busy: dict[int, float] = {}
    for r in metrics.results:
        for sp in r.spans:
            busy[sp.stage] = busy.get(sp.stage, 0.0) + sp.end - sp.start
    return [busy[k] for k in sorted(busy)]


def calibration_plan(profile: Profile, plan: plan_lib.Plan,
                     extra: ExtraCost | None = None) -> plan_lib.Plan:
    """The plan the calibration steps run on: ``even`` (every device busy, so every device's
    times get measured under the concurrency a pipeline really has), or ``plan`` where the even
    split does not fit in memory."""
    try:
        return plan_lib.plan(profile, "even", plan.schedule, plan.microbatches, extra=extra)
    except plan_lib.InfeasibleError as e:
        logging.warning("calibration runs on the planned blocks: the even split does not fit "
                        "(%s)", e)
        return plan


class Replanner:
    """Every ``every`` steps (0 = never), correct the profile with the measured stage times and
    switch plans when the new one is predicted more than ``MIN_GAIN`` faster. Process 0 decides;
    every process receives the decision through the key-value store under ``namespace``.

    ``calibrate_steps`` (``config.allocation.calibrate_steps``): once, after the first that many
    steps of this run (``start_step`` on), the same check with any gain: calibration from
    measured steps, before the planned blocks are taken up (the first of those steps compiles
    and is not measured)."""

    MIN_GAIN = 0.05

    def __init__(self, every: int, profile: Profile, plan: plan_lib.Plan,
                 namespace: str = "skyjax/replan", *, calibrate_steps: int = 0,
                 start_step: int = 0, strategy: str | None = None,
                 extra: ExtraCost | None = None):
        self.every = every
        self.extra = extra  # optional cost terms (skyjax.plan.model.extension)
        self.strategy = strategy or plan.strategy  # of the plans it switches to
        self.calibrate_at = start_step + calibrate_steps if calibrate_steps else 0
        self.profile, self.plan = profile, plan
        self.namespace = namespace
        self.busy: list[list[float]] = []  # per observed step: each stage's compute
        self.comm: list[list[float]] = []  # ... each stage's link waits
        self.history: list[dict] = []
        self._rebuilt_at = start_step

    def observes(self, step: int) -> bool:
        """Whether :meth:`observe` records ``step``: a step before the calibration's end or,
        re-planning every few steps, any step (the train loop measures it: its spans must be
        compute times)."""
        return bool(self.every or step < self.calibrate_at) and step > 0 \
            and step != self._rebuilt_at

    def observe(self, step: int, metrics: Any) -> None:
        """Records a step's stage compute and link waits (not a compiling step: the first, or
        one after a switch; nor one whose spans are dispatch times, ``metrics.measured``)."""
        if self.observes(step) and getattr(metrics, "measured", True) \
                and jax.process_index() == 0:
            self.busy.append(stage_busy(metrics))
            spans = metrics.spans
            self.comm.append(measured_comm(spans, len(self.plan.stages)))

    def maybe_switch(self, step: int, executor: Any) -> Any:
        """The executor to continue with after ``step`` (a rebuilt one if the plan changes)."""
        calibrating = bool(self.calibrate_at) and step + 1 == self.calibrate_at
        if not calibrating and (not self.every or (step + 1) % self.every):
            return executor
        info = None
        if jax.process_index() == 0 and self.busy:
            decision = replan.decide(
                self.profile, self.plan, replan.stage_busy_s(self.busy),
                replan.stage_busy_s(self.comm), self.extra)
            decision.candidate.strategy = self.strategy
            switch = decision.switch(0.0 if calibrating else self.MIN_GAIN)
            info = {"step": step + 1, "calibration": calibrating, "switch": switch,
                    **decision.to_json()}
            self.profile = decision.profile
            self.plan = decision.candidate if switch else decision.current
            logging.info("%s after step %d: measured/predicted per device %s; %s (%.1f%% "
                         "predicted gain)", "calibration" if calibrating else "re-plan", step + 1,
                         info["factors"], "switching plans" if switch else "keeping the plan",
                         100 * decision.gain)
        info = distributed.broadcast_json(info, f"{self.namespace}/{step}")
        self.busy, self.comm = [], []
        if info is None:
            return executor
        self.history.append(info)
        if not info["switch"]:
            return executor
        self._rebuilt_at = step + 1
        return executor.rebuild(plan_lib.Plan.from_json(info["candidate"]))
