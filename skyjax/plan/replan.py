"""Re-planning from measured steps: correct the profile with the times the runtime measured, and
plan again. docs/design.md, "Calibration and re-planning", gives the correction and its reasons.

``corrected_profile`` scales each used device's unit and call times by what its stages measured
against what the plan predicted, after taking out the excess every call pays on a busy host,
and with link waits also grows the links' latency by their excess. ``decide`` plans the
corrected profile and compares that plan with the running one (its warm-ups kept), both priced as
they run on the same corrected profile (:mod:`skyjax.plan.as_run`); ``Decision.switch`` says to move when the gain exceeds ``min_gain`` and the blocks
differ, and the units (parameters and optimizer state) then move to their new devices. Pure
functions; the executors do the moving.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Sequence

import numpy as np

from skyjax.plan import planner
from skyjax.plan.pricing import cost
from skyjax.plan import as_run
from skyjax.plan.model import schedules
from skyjax.plan.model.extension import ExtraCost
from skyjax.plan.pricing.stage_times import stage_actions_s
from skyjax.plan.model.types import Plan
from skyjax.profile.format import Profile


@dataclasses.dataclass
class Decision:
    """The outcome of one re-planning check."""

    profile: Profile  # corrected with the measured times
    current: Plan  # the running plan, re-evaluated on the corrected profile
    candidate: Plan  # the best plan for the corrected profile
    factors: dict[int, float]  # device -> measured / predicted compute

    @property
    def gain(self) -> float:
        """Predicted fraction of step time saved by switching."""
        return 1.0 - self.candidate.step_time_s / self.current.step_time_s

    def switch(self, min_gain: float) -> bool:
        return self.gain > min_gain and _blocks(self.candidate) != _blocks(self.current)

    def to_json(self) -> dict:
        return {"gain": self.gain, "factors": {str(d): f for d, f in self.factors.items()},
                "current_step_time_s": self.current.step_time_s,
                "candidate_step_time_s": self.candidate.step_time_s,
                "candidate": self.candidate.to_json()}


def _blocks(plan: Plan) -> list[tuple[int, tuple[int, int]]]:
    return [(s.device, tuple(s.units)) for s in plan.stages]


def stage_busy_s(per_step_busy: Sequence[Sequence[float]]) -> list[float]:
    """Median over steps of each stage's measured compute per step."""
    return [statistics.median(col) for col in zip(*per_step_busy)]


def corrected_profile(profile: Profile, plan: Plan, busy_s: Sequence[float],
                      comm_s: Sequence[float] | None = None, extra: ExtraCost | None = None
                      ) -> tuple[Profile, dict[int, float]]:
    """``profile`` corrected by a plan's measured steps; also returns each used device's measured
    / predicted compute.

    Compute: a stage's prediction is its compute times the busy-time ratio that ``extra``'s terms
    give it (:mod:`skyjax.plan.model.extension`; 1 without), so that what is corrected is the
    device, not the plan's interference. Its excess is split into a host-wide cost per action,
    ``b``, and a per-device factor on the rest. ``b`` is the least excess per action of any stage
    (clipped at 0): what a busy host adds to every call whatever its size (dispatch, wake-ups, an
    emulated sleep's overshoot). It weighs the most on small stages, so a plain ratio measured on a
    one-unit stage would multiply the device's every unit by it (and a ratio measured on a big stage
    undercharge a small one). Each used device's unit and call times then scale by (measured -
    actions x b) / predicted, and every device's forward and backward call costs grow by ``b`` (the
    unused ones too: it is the host's).

    Devices that ``extra`` groups (``ExtraCost.calibration_groups``: processes sharing a host's
    cores) take one factor for the group instead, its stages' (measured - actions x b) summed
    over their predicted compute summed: their interference depends on which stages compute at
    once, so a stage's own ratio mixes its device's speed with the interference it happened to
    meet, while the group's total holds both (an idle device of the group takes it too).

    Links: with ``comm_s`` (measured link waits per step of each stage,
    ``skyjax.report.compare``), every link's latency grows by the mean excess per message seen on
    the plan's links: what a message really costs in the running pipeline beyond the idle
    ping-pong probe (one host-wide figure, so that links the plan does not use are corrected
    too). ``sync_s`` stays the profile's: what a measured step period leaves after the corrected
    compute and links (waits, calls after idle) grows with the plan's stages and messages, and
    made a per-step constant it over-charged plans with fewer stages."""
    forward, backward = profile.forward_s.copy(), profile.backward_s.copy()
    weight = None if profile.backward_weight_s is None else profile.backward_weight_s.copy()
    inp = None if profile.backward_input_s is None else profile.backward_input_s.copy()
    calls = {k: getattr(profile, k).copy() for k in ("forward_call_s", "backward_call_s")}
    actions = 2 * plan.microbatches  # a forward and a backward per micro-batch
    effect = extra.effect(plan, profile) if extra is not None else None
    ratio = effect[1] if effect is not None else [1.0] * len(plan.stages)
    pairs = [(st, st.compute_s * plan.microbatches * r, measured)
             for st, measured, r in zip(plan.stages, busy_s, ratio)
             if st.compute_s > 0 and measured > 0]
    b = max(0.0, min(((measured - predicted) / actions for _, predicted, measured in pairs),
                     default=0.0))
    groups = (extra.calibration_groups(profile) if extra is not None else None) or \
        [None] * len(profile.devices)
    host: dict[int, list[float]] = {}  # shared host group -> [sum of corrected measured, predicted]
    for st, predicted, measured in pairs:
        if groups[st.device] is not None:
            total = host.setdefault(groups[st.device], [0.0, 0.0])
            total[0] += measured - actions * b
            total[1] += predicted
    scale = {st.device: (measured - actions * b) / predicted for st, predicted, measured in pairs
             if groups[st.device] is None}
    scale.update({d: host[g][0] / host[g][1] for d, g in enumerate(groups) if g in host})
    for d, a in scale.items():
        forward[:, d] *= a
        backward[:, d] *= a
        for split in (weight, inp):
            if split is not None:
                split[:, d] *= a
        for v in calls.values():
            v[d] *= a
    factors = {st.device: measured / predicted for st, predicted, measured in pairs}
    for v in calls.values():
        v += b
    latency = profile.latency_s
    if comm_s is not None and len(plan.stages) > 1:
        link = stage_actions_s(plan, profile)[2]  # one-way delay of each of the plan's links
        excess = [(measured - 2 * plan.microbatches * link[k]) / (2 * plan.microbatches)
                  for k, measured in enumerate(list(comm_s)[: len(plan.stages) - 1])]
        extra = max(sum(excess) / len(excess), 0.0) if excess else 0.0
        latency = latency + extra * (1 - np.eye(len(latency)))
    fixed = dataclasses.replace(profile, forward_s=forward, backward_s=backward,
                                latency_s=latency, backward_weight_s=weight,
                                backward_input_s=inp, **calls)
    return fixed, factors


def _assignment(plan: Plan) -> list[tuple[int, int, int]]:
    return [(s.device, s.units[0], s.units[1]) for s in plan.stages]


def decide(profile: Profile, plan: Plan, busy_s: Sequence[float],
           comm_s: Sequence[float] | None = None, extra: ExtraCost | None = None) -> Decision:
    """Corrects the profile (compute; with ``comm_s`` also links: :func:`corrected_profile`)
    and compares the running plan with the best plan for it."""
    fixed, factors = corrected_profile(profile, plan, busy_s, comm_s, extra)
    current = cost.evaluate(fixed, _assignment(plan), plan.schedule, plan.microbatches,
                            strategy=plan.strategy, extra=extra)
    if any(s.warmup is not None for s in plan.stages):  # the running warm-ups, where they fit
        own = schedules.warmups(len(plan.stages), plan.microbatches,
                                [s.warmup for s in plan.stages])
        current = as_run.with_warmups(
            lambda m: cost.tables(fixed, plan.schedule, m), current, [own]) or current
    current = as_run.priced(current, fixed, extra)  # both priced as they run
    candidate = planner.plan(fixed, "optimal", plan.schedule, plan.microbatches, extra=extra)
    candidate.strategy = plan.strategy
    return Decision(fixed, current, candidate, factors)
