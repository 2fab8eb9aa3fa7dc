"""What a plan is: stages of (device, block of units) with their predicted costs, as plan.json.

A plan is stages k = 0..p-1, each a distinct device d_k and a non-empty block of units
[a_k, b_k), covering all units in order (docs/design.md). ``Plan.to_json`` / ``Plan.from_json`` are
the plan.json object that ``python -m skyjax.plan --out`` writes and training reads back.
Plain data: the numbers come from :mod:`skyjax.plan.cost`.
"""

from __future__ import annotations

import dataclasses


class InfeasibleError(ValueError):
    """No plan fits; the message names the tightest device and the bytes that do not fit."""


@dataclasses.dataclass
class Stage:
    """One pipeline stage: a device, its units [start, end) and their predicted per-micro-batch
    compute (forward + backward, call costs included), comm (message calls, and the transfers
    to the next stage and back), memory, and what it does once per step at the boundary before
    its first action: the optimizer update (a plan of one stage also puts the step's inputs
    then: ``skyjax.plan.cost.Tables.alone``)."""

    device: int
    units: tuple[int, int]
    compute_s: float
    comm_s: float
    memory_bytes: int
    update_s: float = 0.0

    @property
    def time_s(self) -> float:
        """t_k = compute + comm: the stage's share of every micro-batch."""
        return self.compute_s + self.comm_s

    def to_json(self) -> dict:
        out = {"device": self.device, "units": list(self.units), "compute_s": self.compute_s,
               "comm_s": self.comm_s, "memory_bytes": self.memory_bytes}
        if self.update_s:  # only profiles with fixed costs (version 2) measure it
            out["update_s"] = self.update_s
        return out


@dataclasses.dataclass
class Plan:
    """Stages in pipeline order and the predicted step time T. ``exact``: T is optimal under the
    cost model; otherwise ``lower_bound_s`` (when searched) bounds the optimum from below.
    ``extra_s``: the part of T that extra cost terms add (:mod:`skyjax.plan.extension`, e.g. the
    optional shared-host model; 0 under the core model); the searches and their bounds work on
    ``analytic_s``, T without it."""

    strategy: str
    schedule: str
    microbatches: int
    stages: list[Stage]
    step_time_s: float
    bottleneck_s: float
    exact: bool
    lower_bound_s: float | None = None
    device_names: list[str] | None = None
    extra_s: float = 0.0

    @property
    def analytic_s(self) -> float:
        """T without the extra terms: what the searches optimise and the bounds bound."""
        return self.step_time_s - self.extra_s

    def to_json(self) -> dict:
        out = {"strategy": self.strategy, "schedule": self.schedule,
               "microbatches": self.microbatches, "stages": [s.to_json() for s in self.stages],
               "step_time_s": self.step_time_s, "bottleneck_s": self.bottleneck_s,
               "exact": self.exact}
        if self.lower_bound_s is not None:
            out["lower_bound_s"] = self.lower_bound_s
        if self.device_names is not None:
            out["device_names"] = list(self.device_names)
        if self.extra_s:
            out["extra_s"] = self.extra_s
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Plan":
        stages = [Stage(int(s["device"]), (int(s["units"][0]), int(s["units"][1])),
                        float(s["compute_s"]), float(s["comm_s"]), int(s["memory_bytes"]),
                        float(s.get("update_s", 0.0)))
                  for s in d["stages"]]
        return cls(d["strategy"], d["schedule"], int(d["microbatches"]), stages,
                   float(d["step_time_s"]), float(d["bottleneck_s"]), bool(d["exact"]),
                   d.get("lower_bound_s"), d.get("device_names"),
                   float(d.get("extra_s", d.get("replay_penalty_s", 0.0))))
