"""The peer modes' exchange as the runtime runs it (:mod:`skyjax.runtime.decentralized`), event
by event: what the simulator replays after each device's own last action for a plan whose
averaging is ``decentral``, ``decentral-int8`` or ``async`` (docs/design.md, "The simulator").

Each device sends its messages from the end of its own last action (``ready[d]``), without
blocking, one message at a time per directed link (its bytes over the bandwidth, then the latency;
float32, or for ``decentral-int8`` int8's bytes, each message sent once the sender has coded
it, its coding seconds in turn after ``ready[d]``), and is done when the last message
addressed to it has arrived.

* ``decentral``: step t's pair messages (:func:`skyjax.plan.pricing.peers.pair_messages`); the
  step ends at the last arrival (or the compute); the price is the mean over the schedule's
  period of those steps.
* ``async``: the direct exchange of every replica's parameters, launched at ``ready[d]`` once
  every k steps (k = the plan's staleness), is needed k steps later: with X the longest time
  from a device's launch to its last arrival, the step is max(compute + sync_s, X / k): the
  exchange lengthens it only where it outlasts k steps.
  Its links are not shared with the hand-offs of the steps it overlaps (not priced).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from skyjax.plan.data_parallel.pipelines import grad_prefix
from skyjax.plan.model.types import Plan
from skyjax.plan.pricing.exchange import BETWEEN, Message, routing
from skyjax.plan.pricing.peers import pair_messages, peer_wire, period
from skyjax.profile.format import Profile
from skyjax.spans import EXCHANGE_PHASE, Span


def replay(messages: Sequence[Message], ready: dict[int, float], profile: Profile,
           wire: float = 1.0, coder_s: np.ndarray | None = None) -> dict[int, float]:
    """Each device's end: its ``ready`` time, or its last message's arrival (module doc);
    ``wire``, ``coder_s``: :func:`skyjax.plan.pricing.peers.peer_wire`'s."""
    gprefix = grad_prefix(profile)
    lat, bw = np.asarray(profile.latency_s, float), np.asarray(profile.bandwidth_Bps, float)
    at, free, coded = dict(ready), {}, dict(ready)
    for m in messages:
        g = float(sum(gprefix[u + 1] - gprefix[u] for u in m.units))
        hold = g * wire / float(bw[m.src, m.dst])
        if coder_s is not None:
            coded[m.src] += float(coder_s[m.src]) * g
        depart = max(coded[m.src], free.get((m.src, m.dst), 0.0))
        free[m.src, m.dst] = depart + hold
        at[m.dst] = max(at[m.dst], depart + hold + float(lat[m.src, m.dst]))
    return at


def _chains(plan: Plan) -> list[list[tuple[int, int, int]]]:
    return [[(s.device, *s.units) for s in plan.pipeline(i).stages]
            for i in range(plan.num_pipelines)]


def _spans(at: dict[int, float], ready: dict[int, float], stage_of: dict[int, int]) -> list[Span]:
    return [Span(stage_of[d], EXCHANGE_PHASE[BETWEEN], -1, ready[d], at[d])
            for d in sorted(at) if at[d] > ready[d]]


def peer_step(plan: Plan, ready: dict[int, float], profile: Profile,
              stage_of: dict[int, int]) -> tuple[float, list[Span]]:
    """The step's end before sync_s as the peer mode sets it (the simulator takes the larger
    of it and the compute, then adds sync_s) and the spans of step 0's exchange."""
    chains = _chains(plan)
    if plan.averaging == "async":
        at = replay(routing(chains, None).messages, ready, profile)
        x = max(at[d] - ready[d] for d in at)
        least = x / max(int(plan.staleness), 1)
        return least - float(profile.sync_s), _spans(at, ready, stage_of)
    ends, spans = [], []
    wire = peer_wire(plan.averaging, profile)
    for t in range(period(plan.num_pipelines, plan.peer_schedule)):
        at = replay(pair_messages(chains, t, plan.peer_schedule), ready, profile, *wire)
        ends.append(max(at.values()))
        if t == 0:
            spans = _spans(at, ready, stage_of)
    return float(sum(ends) / len(ends)), spans


def peer_coding(plan: Plan, profile: Profile
                ) -> tuple[tuple[int, ...], float, np.ndarray | None]:
    """(coded phases, wire bytes per gradient byte, coding seconds per gradient byte [D]) of a
    peer mode's messages, as ``replay.coding.plan_coding`` gives them for the others:
    ``decentral-int8``'s one phase in int8, the others' float32. Their routes are the direct
    exchange's (every pair of owners that may meet; a decentral pair's message carries what
    the direct exchange's does)."""
    wire, coder = peer_wire(plan.averaging, profile)
    return ((BETWEEN,) if coder is not None else ()), wire, coder
