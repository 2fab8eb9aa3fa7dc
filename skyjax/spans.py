"""Chrome / Perfetto trace events (chrome://tracing, ui.perfetto.dev), built in one place.

Both the simulator (``skyjax.plan.replay.simulate``) and the runtime (measured spans of a step) describe
a step as :class:`Span` records; :func:`stage_events` turns either into one trace row per stage,
so that a measured step and its simulation line up in the same viewer. Pure Python.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

_US = 1e6


@dataclasses.dataclass
class Span:
    """One forward (``"F"``) or backward (``"B"``) action of a stage on a micro-batch, from
    ``start`` to ``end`` seconds (wall-clock when measured, from 0 when simulated)."""

    stage: int
    kind: str
    microbatch: int
    start: float
    end: float

    @property
    def label(self) -> str:
        return f"{self.kind}{self.microbatch}"


def stage_events(spans: Iterable[Span], *, pid: int = 0, name: str = "stages",
                 stage_names: Sequence[str] | None = None, origin: float | None = None
                 ) -> list[dict]:
    """A process row ``name`` with one thread per stage and one complete event per span; times
    are shifted so that ``origin`` (default: the earliest start) is 0."""
    spans = list(spans)
    if origin is None:
        origin = min((s.start for s in spans), default=0.0)
    events = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}]
    for k in sorted({s.stage for s in spans}):
        label = f"stage {k}" + (f" ({stage_names[k]})" if stage_names else "")
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": k,
                       "args": {"name": label}})
    for s in spans:
        events.append({"name": s.label, "cat": "forward" if s.kind == "F" else "backward",
                       "ph": "X", "pid": pid, "tid": s.stage, "ts": (s.start - origin) * _US,
                       "dur": (s.end - s.start) * _US,
                       "args": {"stage": s.stage, "microbatch": s.microbatch}})
    return events


def link_events(spans: Iterable[Span], delay_s: Sequence[float], *, pid: int = 1,
                name: str = "links") -> list[dict]:
    """Transfers that follow each action on its link (forward: to the next stage, backward: to
    the previous), ``delay_s[k]`` seconds on link k -> k + 1; nothing when all delays are 0."""
    if not any(delay_s):
        return []
    events = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}]
    for s in spans:
        link = s.stage if s.kind == "F" else s.stage - 1
        if 0 <= link < len(delay_s) and delay_s[link] > 0:
            events.append({"name": f"send {s.label}", "cat": "comm", "ph": "X", "pid": pid,
                           "tid": link, "ts": s.end * _US, "dur": delay_s[link] * _US})
    return events


def trace_json(events: list[dict]) -> dict:
    """The file's top-level object."""
    return {"traceEvents": events, "displayTimeUnit": "ms"}
