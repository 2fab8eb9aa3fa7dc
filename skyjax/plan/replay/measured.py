"""What a measured step's spans say about its links: each message's delay from its producer's end
to its consumer's start. The online re-planner (``skyjax.runtime.replanner``) feeds them to
``skyjax.plan.replan``; the report compares them with the plan. Pure Python; no JAX."""

from __future__ import annotations

from typing import Sequence

from skyjax.spans import Span


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
