"""Pipeline schedules as plain data: per stage, the order in which it runs forward (F) and
backward (B) passes of micro-batches.

``actions(schedule, p, m)`` gives these lists:

* GPipe: F0 .. F(m-1), then B(m-1) .. B0 (all forwards, then backwards in reverse).
* 1F1B (PipeDream-flush): stage k runs w = min(p - k - 1, m) warm-up forwards, then alternates
  one forward and one backward, then drains the remaining backwards. At most min(m, p - k)
  micro-batches are in flight on stage k (GPipe: m).

The runtime executes them (``skyjax.runtime``) and the simulator replays them
(:mod:`skyjax.plan.simulate`), so both follow the same order by construction.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from skyjax.names import SCHEDULES


@dataclasses.dataclass(frozen=True)
class Action:
    """One pass of one micro-batch on a stage."""

    kind: str  # "F" or "B"
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"


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
