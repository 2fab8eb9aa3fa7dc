"""``allocation.strategy="dynamic"`` during training: observe the measured stage times, ask the
re-planning policy (``skyjax.plan.replan``, pure) whether another plan pays, agree on the answer
across processes, and rebuild the executor (units move with their optimizer state)."""

from __future__ import annotations

import statistics
from typing import Any

import jax
from absl import logging

from skyjax import plan as plan_lib
from skyjax.plan import replan
from skyjax.plan.compare import measured_comm
from skyjax.profile.format import Profile
from skyjax.runtime import distributed


def stage_busy(metrics: Any) -> list[float]:
    """Each stage's measured compute in one step (the sum of its forward and backward spans)."""
    busy: dict[int, float] = {}
    for r in metrics.results:
        for sp in r.spans:
            busy[sp.stage] = busy.get(sp.stage, 0.0) + sp.end - sp.start
    return [busy[k] for k in sorted(busy)]


class Replanner:
    """Every ``every`` steps (0 = never), correct the profile with the measured stage times and
    switch plans when the new one is predicted more than ``MIN_GAIN`` faster. Process 0 decides;
    every process receives the decision through the key-value store under ``namespace``."""

    MIN_GAIN = 0.05

    def __init__(self, every: int, profile: Profile, plan: plan_lib.Plan,
                 namespace: str = "skyjax/replan"):
        self.every = every
        self.profile, self.plan = profile, plan
        self.namespace = namespace
        self.busy: list[list[float]] = []  # per observed step: each stage's compute
        self.comm: list[list[float]] = []  # ... each stage's link waits
        self.step_s: list[float] = []  # ... the step's period
        self.history: list[dict] = []
        self._rebuilt_at = -1

    def observe(self, step: int, metrics: Any, step_s: float | None = None) -> None:
        """Records a step's stage compute and link waits, and its period ``step_s`` (not a
        compiling step: the first, or one after a switch)."""
        if self.every and step > 0 and step != self._rebuilt_at and jax.process_index() == 0:
            self.busy.append(stage_busy(metrics))
            spans = [sp for r in metrics.results for sp in r.spans]
            self.comm.append(measured_comm(spans, len(self.plan.stages)))
            if step_s is not None:
                self.step_s.append(step_s)

    def maybe_switch(self, step: int, executor: Any) -> Any:
        """The executor to continue with after ``step`` (a rebuilt one if the plan changes)."""
        if not self.every or (step + 1) % self.every:
            return executor
        info = None
        if jax.process_index() == 0 and self.busy:
            decision = replan.decide(
                self.profile, self.plan, replan.stage_busy_s(self.busy),
                replan.stage_busy_s(self.comm),
                statistics.median(self.step_s) if self.step_s else None)
            switch = decision.switch(self.MIN_GAIN)
            info = {"step": step + 1, "switch": switch, **decision.to_json()}
            self.profile = decision.profile
            self.plan = decision.candidate if switch else decision.current
            logging.info("re-plan after step %d: measured/predicted per device %s; %s (%.1f%% "
                         "predicted gain)", step + 1, info["factors"],
                         "switching plans" if switch else "keeping the plan", 100 * decision.gain)
        info = distributed.broadcast_json(info, f"{self.namespace}/{step}")
        self.busy, self.comm, self.step_s = [], [], []
        if info is None:
            return executor
        self.history.append(info)
        if not info["switch"]:
            return executor
        self._rebuilt_at = step + 1
        return executor.rebuild(plan_lib.Plan.from_json(info["candidate"]))
