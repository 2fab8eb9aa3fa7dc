"""An event simulation of a pipeline schedule, to check the cost model and to draw a step.

``simulate`` runs the per-stage action lists of :func:`skyjax.plan.model.schedules.actions`: each
stage executes its list in order; F(k, i) waits for F(k-1, i) plus the link delay, B(k, i) for
B(k+1, i) plus the link delay. It returns the step time, per-stage busy and idle time, peak
in-flight micro-batches and a Chrome / Perfetto trace (built by :mod:`skyjax.spans`, like the
runtime's measured one, so the two line up).

Relation to the cost model T = sum t_k + (m - 1) max t_k + update_0 + sync_s
(:mod:`skyjax.plan.pricing.cost`), t_k = f_k + b_k + 2 c_k, where f_k / b_k are a stage's forward /
backward actions (unit times + call cost + message calls, :func:`stage_actions_s`) and c_k the
one-way link delay. Updates: stage k starts the step update_k after the boundary and the step
ends sync_s after its last action, so update_0 adds to every step and a later stage's update
only where it outlasts the fill that reaches it.

* ``overlap_comm=False`` charges both transfers over link k to stage k (the activation send after
  F and the gradient receive before B), as the cost model does. Then on balanced pipelines (all
  stages equal except the last, which has no link) simulation and model agree exactly, for GPipe
  and 1F1B. For GPipe in general the simulation gives sum_k (f_k + b_k + 2 c_k) + (m - 1) (max_k
  (f_k + c_k) + max_k (b_k + c_k)): equal to the model when the slowest forward and the slowest
  backward are on the same stage (e.g. backward proportional to forward, as with slowed-down
  devices), larger otherwise. 1F1B on unbalanced pipelines can differ either way by a little
  (its steady state interleaves F and B of different micro-batches); tests bound the difference.
* ``overlap_comm=True`` (default; transfers run beside compute) gives, on balanced pipelines,
  (m + p - 1)(f + b) + 2 c (p - 1): the model's T minus 2 c (m - 1). The model is then pessimistic
  by the comm it cannot hide; with c = 0 all three agree.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from skyjax.plan.model.schedules import Action, actions, inflight_peaks, plan_lists
from skyjax.plan.model.extension import ExtraCost
from skyjax.names import PEER_MODES
from skyjax.plan.replay.exchange_run import bucketed, exchange_of, exchange_step, unit_ready_s
from skyjax.plan.replay.peer_run import peer_step
from skyjax.plan.pricing.stage_times import (stage_actions_s, stage_input_s, stage_latency_s,
                                             stage_weight_s, tied_message_s, with_tied_message)
from skyjax.plan.model.types import Plan
from skyjax.profile.format import Profile
from skyjax.spans import Span, link_events, stage_events, trace_json


@dataclasses.dataclass
class SimResult:
    step_time_s: float
    busy_s: list[float]
    idle_s: list[float]
    peak_inflight: list[int]
    trace: dict  # Chrome trace: stages on pid 0, link transfers (overlapped comm) on pid 1
    spans: list[Span]  # every action, stage by stage, in execution order; times from 0
    # per stage, the busy-time ratio that extra cost terms give it (simulate_plan with
    # ``extra``; 1 without, and from simulate)
    slowdown: list[float] | None = None


def _durations(forward_s, backward_s, comm_s, overlap: bool):
    """Per-stage forward and backward durations and per-link delays (one more, 0, for the last
    stage); without overlap each link's delay is folded into the stage before it."""
    p = len(forward_s)
    link = [float(c) for c in comm_s] + [0.0]
    if overlap:
        return list(map(float, forward_s)), list(map(float, backward_s)), link
    fwd = [float(forward_s[k]) + link[k] for k in range(p)]
    bwd = [float(backward_s[k]) + link[k] for k in range(p)]
    return fwd, bwd, [0.0] * p


def simulate(forward_s: Sequence[float], backward_s: Sequence[float], comm_s: Sequence[float],
             schedule: str, microbatches: int, *, overlap_comm: bool = True,
             names: Sequence[str] | None = None, update_s: Sequence[float] | None = None,
             sync_s: float = 0.0, weight_s: Sequence[float] | None = None,
             lists: Sequence[Sequence[Action]] | None = None,
             latency_s: Sequence[float] | None = None) -> SimResult:
    """Event simulation of the schedule's action lists (see module doc).

    forward_s / backward_s: seconds per micro-batch of each stage's whole block; comm_s[k]: one-way
    delay over the link from stage k to k + 1 (len p - 1). ``update_s[k]``: stage k's optimizer
    update, which follows the previous step's gradient-norm all-reduce: in the steady state stage
    k starts ``update_s[k]`` after the step boundary, and the step ends ``sync_s`` after its last
    action (the all-reduce), so the result is the period of back-to-back steps.
    ``latency_s[k]``: the part of ``comm_s[k]`` that is latency; the rest is the link's bytes,
    which it carries one message at a time per direction (a message departs when the link is
    free). None: all latency (no queue).
    """
    p, m = len(forward_s), microbatches
    if len(backward_s) != p or len(comm_s) != max(p - 1, 0):
        raise ValueError(f"need {p} backward times and {max(p - 1, 0)} link delays, got "
                         f"{len(backward_s)} and {len(comm_s)}")
    w = [float(x) for x in weight_s] if weight_s is not None else [0.0] * p
    if lists is None:
        lists = actions(schedule, p, m, ([(float(forward_s[k]), float(backward_s[k]), w[k])
                                          for k in range(p)], [float(c) for c in comm_s]))
    fwd, bwd, delay = _durations(forward_s, backward_s, comm_s, overlap_comm)
    # a link's delay is its latency and its bytes; the bytes hold the link (one message at a
    # time per direction), the latency does not (transport.base.LinkClock)
    lat = ([min(float(x), d) for x, d in zip(latency_s, delay)] if latency_s is not None
           and overlap_comm else list(delay[: p - 1]))
    link_free: dict[tuple[str, int], float] = {}
    arrive: dict[tuple[str, int, int], float] = {}

    def send(kind: str, k: int, to: int, i: int, ready: float) -> None:
        link = min(k, to)
        transfer = delay[link] - lat[link]
        depart = max(ready, link_free.get((kind, link), 0.0))
        link_free[(kind, link)] = depart + transfer
        arrive[(kind, to, i)] = depart + transfer + lat[link]

    end: dict[tuple[str, int, int], float] = {}
    spans: list[list[Span]] = [[] for _ in range(p)]
    pos = [0] * p
    free = [float(x) for x in update_s] if update_s is not None else [0.0] * p
    remaining = sum(len(a) for a in lists)
    while remaining:
        progress = False
        for k in range(p):
            while pos[k] < len(lists[k]):
                a = lists[k][pos[k]]
                if a.kind == "W":  # its B ran earlier on this stage
                    dep, dur = 0.0, w[k]
                elif a.kind == "F":
                    dep = 0.0 if k == 0 else arrive.get(("F", k, a.microbatch))
                    dur = fwd[k]
                else:
                    dep = end.get(("F", k, a.microbatch)) if k == p - 1 else \
                        arrive.get(("B", k, a.microbatch))
                    dur = bwd[k]
                if dep is None:
                    break
                start = max(free[k], dep)
                free[k] = end[(a.kind, k, a.microbatch)] = start + dur
                if a.kind == "F" and k < p - 1:
                    send("F", k, k + 1, a.microbatch, start + dur)
                elif a.kind == "B" and k > 0:
                    send("B", k, k - 1, a.microbatch, start + dur)
                spans[k].append(Span(k, a.kind, a.microbatch, start, start + dur))
                pos[k] += 1
                remaining -= 1
                progress = True
        if not progress:
            raise RuntimeError("schedule deadlocked")  # cannot happen for gpipe / 1f1b
    step = max(free) + float(sync_s)
    busy = [sum(s.end - s.start for s in sp) for sp in spans]
    flat = [s for sp in spans for s in sp]
    events = stage_events(flat, pid=0, name="stages", stage_names=names, origin=0.0)
    if overlap_comm:
        events += link_events(flat, delay[: p - 1], pid=1, name="links")
    return SimResult(step_time_s=step, busy_s=busy, idle_s=[step - b for b in busy],
                     peak_inflight=inflight_peaks(lists), trace=trace_json(events), spans=flat)


def simulate_plan(plan: Plan, profile: Profile, *, overlap_comm: bool = True,
                  extra: ExtraCost | None = None) -> SimResult:
    """Simulate a plan on its profile (:func:`stage_actions_s`), with each stage's update and the
    synchronisation at the step boundary; with ``extra`` (:mod:`skyjax.plan.model.extension`) the
    step time and busy times also carry what its terms add (not drawn in the trace). Several
    pipelines: ``_simulate_pipelines``."""
    if plan.num_pipelines > 1:
        if extra is not None:
            raise ValueError("simulate_plan: extra cost terms model one pipeline")
        return _simulate_pipelines(plan, profile, overlap_comm)
    fwd, bwd, link = stage_actions_s(plan, profile)
    w = stage_weight_s(plan, profile)
    names = [profile.devices[s.device]["name"] for s in plan.stages]
    out = simulate(fwd, stage_input_s(plan, profile, bwd, w), link, plan.schedule,
                   plan.microbatches,
                   overlap_comm=overlap_comm, names=names,
                   update_s=[s.update_s for s in plan.stages], sync_s=float(profile.sync_s),
                   weight_s=w, lists=plan_lists(plan), latency_s=stage_latency_s(plan, profile))
    tied = tied_message_s(plan, profile)
    if tied:  # the tied weights' gradients swapped by the first and last stage after their last
        ends = [max((x.end for x in out.spans if x.stage == k), default=0.0)
                for k in (0, len(plan.stages) - 1)]
        sync = float(profile.sync_s)
        out.step_time_s = with_tied_message(out.step_time_s - sync, *ends, tied) + sync
        out.idle_s = [out.step_time_s - b for b in out.busy_s]
    effect = extra.effect(plan, profile) if extra is not None else None
    out.slowdown = [1.0] * len(plan.stages)
    if effect is not None:
        out.step_time_s += effect[0]
        out.slowdown = effect[1]
        out.busy_s = [b * r for b, r in zip(out.busy_s, effect[1])]
        out.idle_s = [out.step_time_s - b for b in out.busy_s]
    return out


def _simulate_pipelines(plan: Plan, profile: Profile, overlap_comm: bool) -> SimResult:
    """Each pipeline simulated on its own with its m_i micro-batches (no sync_s); then each
    device's gradient exchange from the end of its own last action, as the runtime runs it
    (:mod:`skyjax.plan.replay.exchange_run`), then sync_s. Stages (busy, idle, peaks, trace
    rows) are in the plan's flat order, micro-batches carry their global index, and the
    exchange's phases are drawn on their devices' rows."""
    runs, ids = [], []
    for i in range(plan.num_pipelines):
        sub = plan.pipeline(i)
        fwd, bwd, link = stage_actions_s(sub, profile)
        w = stage_weight_s(sub, profile)
        runs.append((simulate(fwd, stage_input_s(sub, profile, bwd, w), link, plan.schedule,
                              sub.microbatches, overlap_comm=overlap_comm,
                              update_s=[s.update_s for s in sub.stages], weight_s=w,
                              lists=plan_lists(plan, i),
                              latency_s=stage_latency_s(sub, profile)),
                     link, plan.first_microbatch(i)))
        ids.append(plan.stage_ids(i))
    n = len(plan.stages)
    busy, peaks = [0.0] * n, [0] * n
    spans: list[Span] = []
    events: list[dict] = []
    names = [profile.devices[s.device]["name"] for s in plan.stages]
    ready: dict[int, float] = {}
    last_b: dict[int, tuple[float, float]] = {}  # device -> its last backward's (start, end)
    for (r, link, first), own in zip(runs, ids):
        for k, g in enumerate(own):
            busy[g], peaks[g] = r.busy_s[k], r.peak_inflight[k]
            ready[plan.stages[g].device] = r.step_time_s if not r.spans else max(
                (s.end for s in r.spans if s.stage == k), default=0.0)
            b = [s for s in r.spans if s.stage == k and s.kind == "B"]
            if b:
                last_b[plan.stages[g].device] = (b[-1].start, b[-1].end)
        mine = [Span(own[s.stage], s.kind, s.microbatch + first, s.start, s.end)
                for s in r.spans]
        spans += mine
        if overlap_comm:  # pipeline link k is drawn on the row of its sender, own[k]
            local = [dataclasses.replace(s, microbatch=s.microbatch + first) for s in r.spans]
            for e in link_events(local, link, pid=1, name="links"):
                if e["ph"] == "M" and any(x["ph"] == "M" for x in events):
                    continue
                events.append(dict(e, tid=own[e["tid"]]) if "tid" in e else e)
    stage_of = {s.device: g for g, s in enumerate(plan.stages)}
    early = (unit_ready_s(plan, profile, last_b)
             if bucketed(plan) and len(last_b) == len(plan.stages) else None)
    done, exchange = (peer_step(plan, ready, profile, stage_of) if plan.averaging in PEER_MODES
                      else exchange_step(exchange_of(plan), ready, profile, stage_of, early))
    # then each pipeline's tied weights' message (an upper bound: after the last exchange)
    tied = max(tied_message_s(plan.pipeline(i), profile) for i in range(plan.num_pipelines))
    step = max(done, max(r.step_time_s for r, _, _ in runs)) + tied + float(profile.sync_s)
    spans += exchange
    events = stage_events(spans, pid=0, name="stages", stage_names=names, origin=0.0) + events
    return SimResult(step_time_s=step, busy_s=busy, idle_s=[step - b for b in busy],
                     peak_inflight=peaks, trace=trace_json(events), spans=spans,
                     slowdown=[1.0] * n)
