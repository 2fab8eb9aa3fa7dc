"""Pipeline schedules as explicit per-stage action lists, and an event simulation of them.

``actions(schedule, p, m)`` gives, per stage, the order in which it runs forward (F) and backward
(B) passes of micro-batches:

* GPipe: F0 .. F(m-1), then B(m-1) .. B0 (all forwards, then backwards in reverse).
* 1F1B (PipeDream-flush): stage k runs w = min(p - k - 1, m) warm-up forwards, then alternates
  one forward and one backward, then drains the remaining backwards. At most min(m, p - k)
  micro-batches are in flight on stage k (GPipe: m).

``simulate`` runs those lists: each stage executes its list in order; F(k, i) waits for F(k-1, i)
plus the link delay, B(k, i) for B(k+1, i) plus the link delay. It returns the step time, per-stage
busy and idle time, peak in-flight micro-batches and a Chrome / Perfetto trace.

Relation to the cost model T = sum t_k + (m - 1) max t_k (allocator.py), t_k = f_k + b_k + 2 c_k:

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

from skyjax.names import SCHEDULES


@dataclasses.dataclass(frozen=True)
class Action:
    kind: str  # "F" or "B"
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"


@dataclasses.dataclass
class SimResult:
    step_time_s: float
    busy_s: list[float]
    idle_s: list[float]
    peak_inflight: list[int]
    trace: dict
    spans: list[list[tuple[Action, float, float]]]  # per stage: (action, start, end)


def actions(schedule: str, num_stages: int, microbatches: int) -> list[list[Action]]:
    """Per-stage action lists in execution order."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {SCHEDULES}, got {schedule!r}")
    if num_stages < 1 or microbatches < 1:
        raise ValueError(f"need num_stages >= 1 and microbatches >= 1, got {num_stages}, "
                         f"{microbatches}")
    m = microbatches
    out = []
    for k in range(num_stages):
        if schedule == "gpipe":
            out.append([Action("F", i) for i in range(m)] +
                       [Action("B", i) for i in reversed(range(m))])
            continue
        warm = min(num_stages - k - 1, m)
        acts = [Action("F", i) for i in range(warm)]
        for i in range(m - warm):
            acts += [Action("F", warm + i), Action("B", i)]
        acts += [Action("B", i) for i in range(m - warm, m)]
        out.append(acts)
    return out


def inflight_peaks(lists: Sequence[Sequence[Action]]) -> list[int]:
    """Most micro-batches between their F and B on each stage."""
    peaks = []
    for acts in lists:
        cur = peak = 0
        for a in acts:
            cur += 1 if a.kind == "F" else -1
            peak = max(peak, cur)
        peaks.append(peak)
    return peaks


def _durations(forward_s, backward_s, comm_s, overlap: bool):
    p = len(forward_s)
    link = [float(c) for c in comm_s] + [0.0]
    if overlap:
        return list(map(float, forward_s)), list(map(float, backward_s)), link
    fwd = [float(forward_s[k]) + link[k] for k in range(p)]
    bwd = [float(backward_s[k]) + link[k] for k in range(p)]
    return fwd, bwd, [0.0] * p


def simulate(forward_s: Sequence[float], backward_s: Sequence[float], comm_s: Sequence[float],
             schedule: str, microbatches: int, *, overlap_comm: bool = True,
             names: Sequence[str] | None = None) -> SimResult:
    """Event simulation of the schedule's action lists (see module doc).

    forward_s / backward_s: seconds per micro-batch of each stage's whole block; comm_s[k]: one-way
    delay over the link from stage k to k + 1 (len p - 1).
    """
    p, m = len(forward_s), microbatches
    if len(backward_s) != p or len(comm_s) != max(p - 1, 0):
        raise ValueError(f"need {p} backward times and {max(p - 1, 0)} link delays, got "
                         f"{len(backward_s)} and {len(comm_s)}")
    lists = actions(schedule, p, m)
    fwd, bwd, delay = _durations(forward_s, backward_s, comm_s, overlap_comm)
    end: dict[tuple[str, int, int], float] = {}
    spans: list[list[tuple[Action, float, float]]] = [[] for _ in range(p)]
    pos, free = [0] * p, [0.0] * p
    remaining = sum(len(a) for a in lists)
    while remaining:
        progress = False
        for k in range(p):
            while pos[k] < len(lists[k]):
                a = lists[k][pos[k]]
                if a.kind == "F":
                    dep = 0.0 if k == 0 else end.get(("F", k - 1, a.microbatch))
                    dep = dep if k == 0 or dep is None else dep + delay[k - 1]
                    dur = fwd[k]
                else:
                    dep = end.get(("F", k, a.microbatch)) if k == p - 1 else \
                        end.get(("B", k + 1, a.microbatch))
                    dep = dep if k == p - 1 or dep is None else dep + delay[k]
                    dur = bwd[k]
                if dep is None:
                    break
                start = max(free[k], dep)
                free[k] = end[(a.kind, k, a.microbatch)] = start + dur
                spans[k].append((a, start, start + dur))
                pos[k] += 1
                remaining -= 1
                progress = True
        if not progress:
            raise RuntimeError("schedule deadlocked")  # cannot happen for gpipe / 1f1b
    step = max(free)
    busy = [sum(e - s for _, s, e in sp) for sp in spans]
    trace = chrome_trace(spans, delay, overlap_comm, names)
    return SimResult(step_time_s=step, busy_s=busy, idle_s=[step - b for b in busy],
                     peak_inflight=inflight_peaks(lists), trace=trace, spans=spans)


def chrome_trace(spans: list[list[tuple[Action, float, float]]], delay: Sequence[float],
                 overlap_comm: bool, names: Sequence[str] | None = None) -> dict:
    """Chrome trace JSON (chrome://tracing, ui.perfetto.dev): one thread per stage; with
    overlapped comm, link transfers on a second process."""
    us = 1e6
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "stages"}}]
    for k, sp in enumerate(spans):
        label = f"stage {k}" + (f" ({names[k]})" if names else "")
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": k,
                       "args": {"name": label}})
        for a, s, e in sp:
            events.append({"name": str(a), "cat": "forward" if a.kind == "F" else "backward",
                           "ph": "X", "pid": 0, "tid": k, "ts": s * us, "dur": (e - s) * us,
                           "args": {"microbatch": a.microbatch}})
    if overlap_comm and any(delay):
        events.append({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "links"}})
        for k, sp in enumerate(spans):
            for a, s, e in sp:
                link = k if a.kind == "F" else k - 1
                if 0 <= link < len(spans) - 1 and delay[link] > 0:
                    events.append({"name": f"send {a}", "cat": "comm", "ph": "X", "pid": 1,
                                   "tid": link, "ts": e * us, "dur": delay[link] * us})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def simulate_plan(plan, profile, *, overlap_comm: bool = True) -> SimResult:
    """Simulate an allocator.Plan on its profile: per-stage forward / backward sums, one-way link
    delay = comm_s / 2."""
    fwd, bwd = [], []
    for s in plan.stages:
        a, b = s.units
        fwd.append(float(profile.forward_s[a:b, s.device].sum()))
        bwd.append(float(profile.backward_s[a:b, s.device].sum()))
    comm = [s.comm_s / 2 for s in plan.stages[:-1]]
    names = [profile.devices[s.device]["name"] for s in plan.stages]
    return simulate(fwd, bwd, comm, plan.schedule, plan.microbatches, overlap_comm=overlap_comm,
                    names=names)
