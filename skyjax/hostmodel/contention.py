"""Which part of a shared host's stage's measured actions is their own cost and which is
contention: the split ``summary.json``'s ``stage_comparison.contention`` reports. Pure Python;
no JAX."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from skyjax.hostmodel.sharing import cpu_shares, host_groups
from skyjax.plan.pricing.stage_times import stage_actions_s
from skyjax.plan.model.types import Plan
from skyjax.profile.format import Profile
from skyjax.spans import Span


def contention_split(plan: Plan, profile: Profile, steps: Sequence[Sequence[Span]],
                     overlap: float = 0.05) -> list[dict]:
    """Per stage, which part of its actions' error is their own and which is contention.

    For stages that share a host's cores (``skyjax.hostmodel.sharing``), an action ran *alone*
    where no other stage of its host was in its CPU part during its own CPU part (a span's
    first ``cpu_shares`` of its time: an emulated device slowed k times computes, then
    sleeps), up to ``overlap`` of it. Per stage and kind (``"F"``, ``"B"``): the predicted
    uncontended action (``stage_actions_s``: unit times, call cost and message calls, as the
    model charges them, though a span times only the call), the median of the actions that ran
    alone and their count, and the median of all. Alone against predicted is the action's own
    cost (calls after idle, ``skyjax.hostmodel.wake_cost``, included); all against alone is what the
    other stages' compute cost it. The model predicts both together as the stage's
    ``slowdown`` (``stage_comparison``). ``steps``: each step's spans, as measured."""
    fwd, bwd, _ = stage_actions_s(plan, profile)
    p = len(plan.stages)
    groups = host_groups(profile) or [None] * profile.num_devices
    shares = cpu_shares(profile)
    host = [groups[st.device] for st in plan.stages]
    share = [shares[st.device] for st in plan.stages]
    runs: dict[tuple[int, str], tuple[list[float], list[float]]] = {}
    for step in steps:
        cpu = [(s, s.start + share[s.stage] * (s.end - s.start)) for s in step]  # CPU part ends
        for s, own_end in cpu:
            shared = sum(max(0.0, min(own_end, e) - max(s.start, o.start)) for o, e in cpu
                         if o.stage != s.stage and host[o.stage] is not None
                         and host[o.stage] == host[s.stage])
            alone, every = runs.setdefault((s.stage, s.kind), ([], []))
            every.append(s.end - s.start)
            if shared <= overlap * (own_end - s.start):
                alone.append(s.end - s.start)
    out = []
    for k in range(p):
        rec = {"stage": k, "device": plan.stages[k].device}
        for kind, predicted in (("F", fwd[k]), ("B", bwd[k])):
            alone, every = runs.get((k, kind), ([], []))
            rec[kind] = {"predicted_s": predicted,
                         "alone_s": float(np.median(alone)) if alone else None,
                         "alone_count": len(alone),
                         "all_s": float(np.median(every)) if every else None}
        out.append(rec)
    return out
