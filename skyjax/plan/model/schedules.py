"""Pipeline schedules as plain data: per stage, the order of its forward (F), backward (B) and,
under zero bubble, weight-gradient (W) passes of micro-batches. docs/design.md, "Schedules",
gives each schedule's order, the zero-bubble fill and the in-flight limits.

``actions(schedule, p, m)`` gives these lists: GPipe; 1F1B, with deeper warm-ups where a plan
asks for them (``warmups``); ZB-H1 and ZB-H2, the Ws filled in by replaying 1F1B's order
(``zero_bubble``). ``plan_lists`` builds them from a plan and its per-stage times, and both the
runtime (``skyjax.runtime``) and the simulator (:mod:`skyjax.plan.replay.simulate`) run what it
builds, so both follow the same order by construction.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from skyjax.names import SCHEDULES, ZERO_BUBBLE


@dataclasses.dataclass(frozen=True)
class Action:
    """One pass of one micro-batch on a stage: F, B (under zero bubble: input gradient only)
    or W (weight gradient)."""

    kind: str  # "F", "B" or "W"
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"


def actions(schedule: str, num_stages: int, microbatches: int,
            times: tuple[Sequence[Sequence[float]], Sequence[float]] | None = None,
            warmup: Sequence[int | None] | None = None) -> list[list[Action]]:
    """Per-stage action lists in execution order; ``times`` only for zero bubble
    (:func:`zero_bubble`), ``warmup`` only for 1F1B (:func:`warmups`)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {SCHEDULES}, got {schedule!r}")
    if num_stages < 1 or microbatches < 1:
        raise ValueError(f"need num_stages >= 1 and microbatches >= 1, got {num_stages}, "
                         f"{microbatches}")
    if warmup is not None and schedule != "1f1b":
        raise ValueError(f"warmup: only 1f1b takes per-stage warm-ups, not {schedule}")
    if schedule in ZERO_BUBBLE:
        return zero_bubble(schedule, num_stages, microbatches, times)
    m = microbatches
    warm_k = warmups(num_stages, m, warmup)
    out = []
    for k in range(num_stages):
        if schedule == "gpipe":
            out.append([Action("F", i) for i in range(m)] +
                       [Action("B", i) for i in reversed(range(m))])
            continue
        warm = warm_k[k]
        acts = [Action("F", i) for i in range(warm)]
        for i in range(m - warm):
            acts += [Action("F", warm + i), Action("B", i)]
        acts += [Action("B", i) for i in range(m - warm, m)]
        out.append(acts)
    return out


def warmups(num_stages: int, microbatches: int,
            warmup: Sequence[int | None] | None = None) -> list[int]:
    """1F1B's warm-up forwards per stage: ``warmup[k]`` where given (at most m), else
    min(p - k - 1, m); a ValueError unless they are at least 1F1B's and do not increase along
    the pipeline."""
    p, m = num_stages, microbatches
    own = [min(p - k - 1, m) for k in range(p)]
    if warmup is None:
        return own
    if len(warmup) != p:
        raise ValueError(f"warmup: expected {p} stages' warm-ups, got {len(warmup)}")
    out = [o if w is None else min(int(w), m) for o, w in zip(own, warmup)]
    if any(w < o for w, o in zip(out, own)) or any(a < b for a, b in zip(out, out[1:])):
        raise ValueError(f"warmup: {list(warmup)} must be at least 1F1B's {own} and not "
                         f"increase along the pipeline")
    return out


def inflight_limit(schedule: str, num_stages: int, microbatches: int,
                   warmup: Sequence[int | None] | None = None) -> list[int]:
    """Per stage the most micro-batches a schedule keeps between their F and their last
    backward pass (B, or W under zero bubble): its activation memory in micro-batches."""
    p, m = num_stages, microbatches
    if warmup is not None:
        return [min(m, w + 1) for w in warmups(p, m, warmup)]
    if schedule == "gpipe":
        return [m] * p
    if schedule == "zb-h1":
        return [min(m, p)] * p
    if schedule == "zb-h2":
        return [min(m, 2 * p)] * p
    return [min(m, p - k) for k in range(p)]


def zero_bubble(schedule: str, p: int, m: int,
                times: tuple[Sequence[Sequence[float]], Sequence[float]] | None = None
                ) -> list[list[Action]]:
    """The zero-bubble lists of the module doc: ``times`` = (per stage (f, b, w) seconds, per
    link k -> k + 1 its delay); default all ones, links 0."""
    stage_t = [tuple(map(float, t)) for t in times[0]] if times else [(1.0, 1.0, 1.0)] * p
    link = [float(x) for x in times[1]] if times else [0.0] * max(p - 1, 0)
    limit = inflight_limit(schedule, p, m)
    order = []  # per stage its F and B order: 1F1B's after ``warm`` forwards
    for k in range(p):
        warm = min(m, p - k - 1 if schedule == "zb-h1" else 2 * (p - k) - 2)
        acts = [Action("F", i) for i in range(warm)]
        for i in range(m - warm):
            acts += [Action("F", warm + i), Action("B", i)]
        order.append(acts + [Action("B", i) for i in range(m - warm, m)])
    out: list[list[Action]] = [[] for _ in range(p)]
    end: dict[tuple[str, int, int], float] = {}
    free, pos, held = [0.0] * p, [0] * p, [0] * p
    pending: list[list[int]] = [[] for _ in range(p)]

    def run(k: int, a: Action, start: float, seconds: float) -> None:
        out[k].append(a)
        free[k] = end[(a.kind, k, a.microbatch)] = start + seconds

    progress = True
    while progress:
        progress = False
        for k in range(p):
            f, b, w = stage_t[k]
            while pos[k] < len(order[k]):
                a = order[k][pos[k]]
                if a.kind == "F":
                    dep = 0.0 if k == 0 else end.get(("F", k - 1, a.microbatch))
                    dep = dep if dep is None or k == 0 else dep + link[k - 1]
                else:
                    dep = end.get(("F", k, a.microbatch)) if k == p - 1 else \
                        end.get(("B", k + 1, a.microbatch))
                    dep = dep if dep is None or k == p - 1 else dep + link[k]
                if dep is None:
                    break
                # Ws the memory bound forces first, then Ws that fill the wait for ``a``'s input
                while pending[k] and (a.kind == "F" and held[k] >= limit[k]
                                      or dep - free[k] > w / 2):
                    run(k, Action("W", pending[k].pop(0)), free[k], w)
                    held[k] -= 1
                run(k, a, max(free[k], dep), f if a.kind == "F" else b)
                held[k] += a.kind == "F"
                if a.kind == "B":
                    pending[k].append(a.microbatch)
                pos[k] += 1
                progress = True
    for k in range(p):
        out[k] += [Action("W", i) for i in pending[k]]
    return out


def inflight_peaks(lists: Sequence[Sequence[Action]]) -> list[int]:
    """Most micro-batches between their F and their last backward pass (B, or W where the
    list has Ws) on each stage."""
    peaks = []
    for acts in lists:
        last = "W" if any(a.kind == "W" for a in acts) else "B"
        cur = peak = 0
        for a in acts:
            cur += 1 if a.kind == "F" else -1 if a.kind == last else 0
            peak = max(peak, cur)
        peaks.append(peak)
    return peaks


def plan_lists(plan, pipeline: int = 0) -> list[list[Action]]:
    """The action lists of pipeline ``pipeline`` of ``plan``
    (:class:`skyjax.plan.model.types.Plan`), what the runtime runs and the simulator replays: under
    zero bubble the fill is built from each stage's ``passes_s`` (its F, B and W seconds) and half
    its ``comm_s`` per link (one way), where every stage has them; otherwise from unit times."""
    sub = plan.pipeline(pipeline)
    p, m = len(sub.stages), sub.microbatches
    times = None
    if plan.schedule in ZERO_BUBBLE and all(s.passes_s for s in sub.stages):
        times = ([s.passes_s for s in sub.stages], [s.comm_s / 2 for s in sub.stages[:-1]])
    warm = [s.warmup for s in sub.stages]
    return actions(plan.schedule, p, m, times,
                   warm if any(w is not None for w in warm) else None)
