"""Predicted vs measured, per stage: which term of the cost model was wrong.

``stage_comparison(plan, profile, spans)`` puts side by side, for each stage of a plan, per step:

* ``compute_s``: the forward and backward actions (predicted: m x (unit times + call costs +
  message calls), :func:`skyjax.plan.simulate.stage_actions_s`, times ``slowdown``, the busy-time
  ratio that sharing a host's cores with the plan's other stages and calls after idle give the
  stage (the simulation's ``slowdown``, from :func:`skyjax.plan.sharing.replay_effect`), 1 where
  neither applies; measured: the sum
  of the step's F/B spans, the runtime's timed calls);
* ``comm_s``: the stage's messages out (activation to the next stage, gradient back from it),
  m x the one-way link delay twice (predicted); measured as, for every such message, the time
  from its producer's span end to its consumer's span start when the consumer was otherwise
  free (otherwise the wait is the consumer's backlog, not the link);
* ``idle_s``: the step's span (first action start to last action end) minus compute;
* ``update_s``: predicted only (the runtime does not time it separately).

It also replays the schedule with the *measured* action times and predicted links
(``replayed_step_s``): when the replay is close to the measured step but far from the predicted
one, the compute terms were wrong; when the measured step is far above the replay, the time went
into communication, synchronisation or the update. Where stages share a host's cores,
``contention_split`` (``contention``; the benchmark's report) splits a stage's actions over many
steps by whether another stage of its host computed beside them: their own cost apart from the
contention. Pure Python (no JAX): spans are
:class:`skyjax.trace.Span` records, as the runtime and the simulator both produce them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from skyjax.plan.sharing import cpu_shares, host_groups, stage_sharing
from skyjax.plan.simulate import simulate, simulate_plan
from skyjax.plan.stage_times import stage_actions_s
from skyjax.plan.types import Plan
from skyjax.profile.format import Profile
from skyjax.trace import Span


def measured_comm(spans: Sequence[Span], p: int) -> list[float]:
    """Per stage k < p - 1: the observed delay of its messages over link k (see module doc)."""
    out = [0.0] * max(p - 1, 0)
    for k, wait, _ in _message_waits(spans, p):
        out[k] += max(wait, 0.0)
    return out


def message_delays(spans: Sequence[Span], p: int) -> list[float]:
    """The delay of each message whose consumer was free when its producer ended: producer span
    end to consumer span start (the predicted one-way link delay, plus the sender's and the
    receiver's host work around the calls, and the receiver's wake-up)."""
    return [wait for _, wait, free in _message_waits(spans, p) if free]


def _message_waits(spans: Sequence[Span], p: int) -> list[tuple[int, float, bool]]:
    """(link k, consumer start - max(producer end, consumer's previous end), consumer free at
    the producer's end) of every message between the step's stages."""
    by = {(s.stage, s.kind, s.microbatch): s for s in spans}
    own: dict[int, list[Span]] = {}
    for s in sorted(spans, key=lambda s: s.start):
        own.setdefault(s.stage, []).append(s)
    prev_end = {}
    for k, lst in own.items():
        for a, b in zip(lst, lst[1:]):
            prev_end[(k, b.kind, b.microbatch)] = a.end
    out = []
    for k in range(p - 1):
        for (stage, kind, mb), s in by.items():
            if kind == "F" and stage == k + 1 and (k, "F", mb) in by:
                src = by[(k, "F", mb)]
            elif kind == "B" and stage == k and (k + 1, "B", mb) in by:
                src = by[(k + 1, "B", mb)]
            else:
                continue
            prev = prev_end.get((stage, kind, mb), src.end)
            out.append((k, s.start - max(src.end, prev), prev <= src.end))
    return out


def contention_split(plan: Plan, profile: Profile, steps: Sequence[Sequence[Span]],
                     overlap: float = 0.05) -> list[dict]:
    """Per stage, which part of its actions' error is their own and which is contention.

    For stages that share a host's cores (``skyjax.plan.sharing``), an action ran *alone*
    where no other stage of its host was in its CPU part during its own CPU part (a span's
    first ``cpu_shares`` of its time: an emulated device slowed k times computes, then
    sleeps), up to ``overlap`` of it. Per stage and kind (``"F"``, ``"B"``): the predicted
    uncontended action (``stage_actions_s``: unit times, call cost and message calls, as the
    model charges them, though a span times only the call), the median of the actions that ran
    alone and their count, and the median of all. Alone against predicted is the action's own
    cost (calls after idle, ``skyjax.plan.wake_cost``, included); all against alone is what the
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


def step_boundary_s(steps: Sequence[Sequence[Span]]) -> list[float]:
    """Between consecutive measured steps (each its F/B spans of every stage): the time from
    one step's last action end to the next step's first action start, which the cost model
    predicts as ``update_0 + sync_s`` (the gradient-norm all-reduce, the first stage's update,
    for a plan of one stage also the step's input put, and what else the runtime does between
    steps)."""
    return [min(s.start for s in b) - max(s.end for s in a)
            for a, b in zip(steps, steps[1:]) if a and b]


def stage_comparison(plan: Plan, profile: Profile, spans: Sequence[Span],
                     boundaries: Sequence[float] = (),
                     steps: Sequence[Sequence[Span]] = ()) -> dict:
    """Per-stage predicted vs measured compute, comm, idle (per step), the replayed step and
    the step boundary (module doc). ``spans``: one step's F/B spans of every stage (empty:
    predicted only); ``boundaries``: measured ``step_boundary_s`` of the plan (their median);
    ``steps``: more steps' spans of the plan, split by ``contention_split`` (``contention``)
    where two of its stages share a host's cores."""
    p, m = len(plan.stages), plan.microbatches
    fwd, bwd, link = stage_actions_s(plan, profile)
    sim = simulate_plan(plan, profile)
    slowdown = sim.slowdown  # sharing the host's cores and calls after idle, per stage
    stages = []
    busy = {k: 0.0 for k in range(p)}
    mf: dict[int, list[float]] = {k: [] for k in range(p)}
    mb: dict[int, list[float]] = {k: [] for k in range(p)}
    for s in spans:
        busy[s.stage] = busy.get(s.stage, 0.0) + s.end - s.start
        (mf if s.kind == "F" else mb).setdefault(s.stage, []).append(s.end - s.start)
    window = (max(s.end for s in spans) - min(s.start for s in spans)) if spans else 0.0
    comm = measured_comm(spans, p) if spans else None
    for k, st in enumerate(plan.stages):
        rec = {"stage": k, "device": st.device, "units": list(st.units),
               "predicted": {"compute_s": m * (fwd[k] + bwd[k]) * slowdown[k],
                             "slowdown": slowdown[k], "comm_s": 2 * m * link[k] if k < p - 1 else 0.0,
                             "idle_s": sim.idle_s[k], "update_s": st.update_s}}
        if spans:
            rec["measured"] = {"compute_s": busy.get(k, 0.0),
                               "comm_s": comm[k] if k < p - 1 else 0.0,
                               "idle_s": window - busy.get(k, 0.0)}
            pc = rec["predicted"]["compute_s"]
            rec["compute_error"] = (busy.get(k, 0.0) - pc) / busy[k] if busy.get(k) else None
        stages.append(rec)
    out = {"stages": stages, "simulated_step_s": sim.step_time_s,
           "step_boundary": {"predicted_s": plan.stages[0].update_s + float(profile.sync_s)}}
    if len(boundaries):
        out["step_boundary"].update(measured_s=float(np.median(boundaries)),
                                    steps=len(boundaries))
    if spans and all(mf.get(k) and mb.get(k) for k in range(p)):
        replay = simulate([sum(mf[k]) / len(mf[k]) for k in range(p)],
                          [sum(mb[k]) / len(mb[k]) for k in range(p)], link, plan.schedule, m,
                          update_s=[s.update_s for s in plan.stages], sync_s=profile.sync_s)
        out["replayed_step_s"] = replay.step_time_s
        out["measured_span_s"] = window
    if steps and stage_sharing(plan, profile) is not None:  # two stages share a host's cores
        out["contention"] = contention_split(plan, profile, steps)
    return out
