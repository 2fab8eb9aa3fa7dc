"""Chrome / Perfetto trace events (chrome://tracing, ui.perfetto.dev), built in one place.

Both the simulator (``skyjax.plan.replay.simulate``) and the runtime (measured spans of a step) describe
a step as :class:`Span` records; :func:`stage_events` turns either into one trace row per stage,
so that a measured step and its simulation line up in the same viewer. Pure Python.

Kinds: the passes ``"F"``, ``"B"`` and (zero bubble) ``"W"`` of a micro-batch, and, with several
pipelines, what a stage does after its passes, with ``microbatch`` -1: the gradient exchange's
phases (:data:`EXCHANGE_KINDS`, numbered as ``skyjax.plan.pricing.exchange``'s; the direct
exchange, every device a group of its own, is phase 2) and a relaxed averaging's outer step
(:data:`OUTER`: its own update; the exchange it runs is drawn as its phases).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

_US = 1e6

PASSES = ("F", "B", "W")  # a micro-batch's forward, backward (input gradient), weight gradient
# the exchange between pipelines, by phase (skyjax.plan.pricing.exchange's IN_GROUP, BETWEEN,
# BACK)
EXCHANGE_KINDS = {"X1": "exchange in group", "X2": "exchange between groups",
                  "X3": "exchange back"}
EXCHANGE_PHASE = {1: "X1", 2: "X2", 3: "X3"}  # a phase's number -> its kind
OUTER = "O"  # a relaxed averaging's outer step (DiLoCo): its update from the exchanged deltas
KIND_NAMES = {"F": "forward", "B": "backward", "W": "weight gradient", **EXCHANGE_KINDS,
              OUTER: "outer step"}


@dataclasses.dataclass
class Span:
    """One action of a stage from ``start`` to ``end`` seconds (wall-clock when measured, from 0
    when simulated): a pass (``"F"``, ``"B"``, ``"W"``) on micro-batch ``microbatch``, or, with
    ``microbatch`` -1, an exchange phase (:data:`EXCHANGE_KINDS`) or an outer step
    (:data:`OUTER`)."""

    stage: int
    kind: str
    microbatch: int
    start: float
    end: float

    @property
    def is_pass(self) -> bool:
        """A forward, backward or W pass of a micro-batch (not the exchange or an outer
        step)."""
        return self.kind in PASSES

    @property
    def label(self) -> str:
        if not self.is_pass:
            return KIND_NAMES.get(self.kind, self.kind)
        return f"{self.kind}{self.microbatch}"


def passes(spans: Iterable[Span]) -> list[Span]:
    """The micro-batches' passes among ``spans`` (what compute per stage, hand-offs and the
    re-planner read)."""
    return [s for s in spans if s.is_pass]


def category(kind: str) -> str:
    """A kind's trace category: forward, backward (B and W), exchange or outer step."""
    if kind == "F":
        return "forward"
    if kind in EXCHANGE_KINDS:
        return "exchange"
    return "outer step" if kind == OUTER else "backward"


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
        events.append({"name": s.label, "cat": category(s.kind),
                       "ph": "X", "pid": pid, "tid": s.stage, "ts": (s.start - origin) * _US,
                       "dur": (s.end - s.start) * _US,
                       "args": {"stage": s.stage, "microbatch": s.microbatch} if s.is_pass
                       else {"stage": s.stage, "kind": s.kind}})
    return events


STEP_TID = -1  # the row of a process that holds the step itself (step_event)


def step_event(start: float, end: float, *, pid: int, origin: float = 0.0) -> list[dict]:
    """A row "step" in process ``pid`` with one complete event from ``start`` to ``end``: the
    step's whole length, of which the stages' rows show what fills it."""
    return [{"name": "thread_name", "ph": "M", "pid": pid, "tid": STEP_TID,
             "args": {"name": "step"}},
            {"name": "step", "cat": "step", "ph": "X", "pid": pid, "tid": STEP_TID,
             "ts": (start - origin) * _US, "dur": (end - start) * _US, "args": {}}]


def link_events(spans: Iterable[Span], delay_s: Sequence[float], *, pid: int = 1,
                name: str = "links") -> list[dict]:
    """Transfers that follow each action on its link (forward: to the next stage, backward: to
    the previous), ``delay_s[k]`` seconds on link k -> k + 1; nothing when all delays are 0."""
    if not any(delay_s):
        return []
    events = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}]
    for s in passes(spans):
        link = s.stage if s.kind == "F" else s.stage - 1
        if 0 <= link < len(delay_s) and delay_s[link] > 0:
            events.append({"name": f"send {s.label}", "cat": "comm", "ph": "X", "pid": pid,
                           "tid": link, "ts": s.end * _US, "dur": delay_s[link] * _US})
    return events


def trace_json(events: list[dict]) -> dict:
    """The file's top-level object."""
    return {"traceEvents": events, "displayTimeUnit": "ms"}
