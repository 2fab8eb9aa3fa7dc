"""How the pipelines' replicated gradients travel: the exchange's routing, as plain data.

Every unit has one owner per pipeline (the stage holding it). Owners fall into link groups
(regions, ``Plan.exchange_groups``; a device in no group is a group of its own). Per unit:

1. *in its group*: every owner but the group's representative sends its gradient to the
   representative, which sums its group's gradients in pipeline order (the group's partial sum);
2. *between groups*: each representative sends its partial sum to the other groups'
   representatives of the unit, and each sums the partial sums in group order (groups ordered by
   their first pipeline), so every representative computes the same additions in one order;
3. *back*: each representative sends the total to the other owners of its group.

Every owner then holds the same sum, bit for bit. With every group of one device only step 2
runs: each owner sends its gradient to every other and sums them in pipeline order (the direct
exchange, bit for bit what it was). Representatives are chosen per unit, balancing the
gradient bytes a device represents, preferring the previous unit's representative so that
messages bundle (a message is one (phase, sender, receiver) with all the units it carries); the
plan records them (``Plan.exchange_reps``), so the runtime routes from the plan alone.

Cost (:func:`routing_s`): a device's sends in a phase go one after another, each ``latency +
bytes / bandwidth`` (plus coding), the phases one after another:

  AR = sum over phases of max_d sum over d's messages in the phase of c(message)

the direct exchange's AR when every group is one device. Averaging per link class
(``skyjax.relax``) runs some phases relaxed: ``int8-across`` sends phase 2's partial sums in the
int8 codec (``coded``), ``diloco-across`` runs phases 1 and 3 every step and phases 2 and 3 at
its outer step (``phases``). ``routing`` and ``routing_s`` are what
the planner (``pipelines.best_exchange``), the declared times (``plan.declared``) and the
runtime (``runtime.exchange``) share.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

PHASES = 3  # in the group, between groups, back


@dataclasses.dataclass(frozen=True)
class Message:
    phase: int  # 0, 1, 2 (module doc)
    src: int  # device
    dst: int  # device
    units: tuple[int, ...]


@dataclasses.dataclass
class Routing:
    """Per unit its owners' groups in summing order, each a list of devices in pipeline order
    (``order[u][g][0]`` is not necessarily the representative: ``rep[u][g]`` is), and the
    bundled messages in phase order."""

    order: dict[int, list[list[int]]]
    rep: dict[int, list[int]]
    messages: list[Message]

    def of(self, device: int) -> list[Message]:
        """The messages ``device`` sends or receives, in phase order."""
        return [m for m in self.messages if device in (m.src, m.dst)]


def group_labels(groups: Sequence[Sequence[int]] | None, devices: Sequence[int]) -> dict[int, int]:
    """A group label per device: the index of the group listing it, else a label of its own."""
    out = {int(d): -1 - int(d) for d in devices}
    for g, members in enumerate(groups or ()):
        for d in members:
            out[int(d)] = g
    return out


def routing(chains: Sequence[Sequence[tuple[int, int, int]]],
            groups: Sequence[Sequence[int]] | None,
            weights: Sequence[float] | None = None,
            given: Sequence[Sequence[int]] | None = None) -> Routing:
    """The routing of pipelines given as chains of (device, start, end) in pipeline order.
    ``given[u]``: the representatives of unit u's groups in summing order, as a plan records
    them (``Plan.exchange_reps``); else chosen balancing ``weights`` per unit (the gradient
    bytes; None: 1 each), a device keeping the previous unit's groups while within half a mean
    unit of the least loaded (so messages bundle)."""
    if len(chains) < 2:
        return Routing({}, {}, [])
    label = group_labels(groups, [d for c in chains for d, _, _ in c])
    units = max(b for c in chains for _, _, b in c)
    owner = [[0] * units for _ in chains]
    for i, chain in enumerate(chains):
        for d, a, b in chain:
            for u in range(a, b):
                owner[i][u] = d
    w = [1.0] * units if weights is None else [float(x) for x in weights]
    slack = 0.5 * sum(w) / max(units, 1)
    load: dict[int, float] = {}
    order: dict[int, list[list[int]]] = {}
    rep: dict[int, list[int]] = {}
    prev: dict[int, int] = {}  # group label -> the previous unit's representative
    bundles: dict[tuple[int, int, int], list[int]] = {}
    for u in range(units):
        byg: dict[int, list[int]] = {}
        for i in range(len(chains)):
            byg.setdefault(label[owner[i][u]], []).append(owner[i][u])
        order[u] = list(byg.values())  # dicts keep insertion order: groups by first pipeline
        reps = []
        for j, (g, members) in enumerate(byg.items()):
            if given is not None:
                r = int(given[u][j])
                if r not in members:
                    raise ValueError(f"exchange_reps[{u}][{j}]: device {r} does not own unit "
                                     f"{u} (its group's owners: {members})")
            else:
                keep = prev.get(g)
                r = min(members, key=lambda d: load.get(d, 0.0) + (0 if d == keep else slack))
            load[r] = load.get(r, 0.0) + w[u]
            prev[g] = r
            reps.append(r)
            for d in members:
                if d != r:
                    bundles.setdefault((0, d, r), []).append(u)
                    bundles.setdefault((2, r, d), []).append(u)
        for r in reps:
            for q in reps:
                if q != r:
                    bundles.setdefault((1, r, q), []).append(u)
        rep[u] = reps
    msgs = [Message(p, s, d, tuple(us)) for (p, s, d), us in sorted(bundles.items())]
    return Routing(order, rep, msgs)


def routing_s(r: Routing, gprefix: np.ndarray, latency: np.ndarray, bandwidth: np.ndarray,
              wire: float = 1.0, coder_s: np.ndarray | None = None,
              phases: Sequence[int] = (0, 1, 2), coded: Sequence[int] = (0, 1, 2)
              ) -> tuple[float, dict[int, float]]:
    """AR of a routing (module doc) over the ``phases`` that run, and each sending device's
    seconds summed over them. ``gprefix`` [U+1]: prefix sums of a unit's gradient bytes;
    ``wire``: bytes on the wire per gradient byte and ``coder_s`` [D]: a sender's coding seconds
    per gradient byte, in the ``coded`` phases (the others send float32)."""
    per_phase = [dict() for _ in range(PHASES)]
    for m in r.messages:
        if m.phase not in phases:
            continue
        g = float(sum(gprefix[u + 1] - gprefix[u] for u in m.units))
        bw = float(bandwidth[m.src, m.dst])
        w = wire if m.phase in coded else 1.0
        cost = float(latency[m.src, m.dst]) + g * w / bw if bw > 0 else math.inf
        if coder_s is not None and m.phase in coded:
            cost += float(coder_s[m.src]) * g
        ph = per_phase[m.phase]
        ph[m.src] = ph.get(m.src, 0.0) + cost
    total = sum(max(ph.values()) for ph in per_phase if ph)
    per: dict[int, float] = {}
    for ph in per_phase:
        for d, s in ph.items():
            per[d] = per.get(d, 0.0) + s
    return float(total), per


def pipeline_groups(chains: Sequence[Sequence[tuple[int, int, int]]],
                    groups: Sequence[Sequence[int]] | None) -> list[int] | None:
    """Per pipeline the index of its link group, groups numbered by their first pipeline; None
    when a pipeline's devices lie in several groups (``diloco-across`` needs each pipeline in
    one group: the group's pipelines are then one data-parallel replica set)."""
    label = group_labels(groups, [d for c in chains for d, _, _ in c])
    seen: dict[int, int] = {}
    out = []
    for chain in chains:
        mine = {label[d] for d, _, _ in chain}
        if len(mine) != 1:
            return None
        out.append(seen.setdefault(mine.pop(), len(seen)))
    return out


def message_bytes(r: Routing, gprefix: np.ndarray) -> dict[tuple[int, int], list[float]]:
    """Per directed device pair the gradient bytes of each of its messages, in phase order."""
    out: dict[tuple[int, int], list[float]] = {}
    for m in r.messages:
        g = float(sum(gprefix[u + 1] - gprefix[u] for u in m.units))
        out.setdefault((m.src, m.dst), []).append(g)
    return out
