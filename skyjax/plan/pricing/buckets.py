"""The exchange behind the backward, as plain data: which units form a bucket, how the
exchange's messages split by bucket on the wire, and when each bucket of a stage is ready to go
(docs/design.md, "Several pipelines").

A bucket is ``BUCKET_UNITS`` consecutive units by global index (unit ``u`` is in bucket
``u // BUCKET_UNITS``), cut at stage boundaries, so that every device derives any sender's
pieces from the units of a message alone. Under the exact exchange a stage with replicas runs
its step's last backward bucket by bucket, from its last units down
(``programs.buckets``), and as soon as a bucket's gradients are final sends the pieces of its
messages that carry its own gradients: phase 1 (``IN_GROUP``) and phase 2 (``BETWEEN``) where
its group of the unit is itself alone. The rest of the exchange runs after the backward, as it
did, in the same summing order: the bits do not change.

Pure numpy: the planner and the simulator import it; the runtime (``runtime.exchange``,
``runtime.pipeline``) follows it.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from skyjax.plan.pricing.exchange import BETWEEN, IN_GROUP, Message, Routing

BUCKET_UNITS = 1  # units per bucket: the smallest pieces, each sent as soon as it is final


def bucket_of(u: int, size: int = BUCKET_UNITS) -> int:
    """The bucket of unit ``u``."""
    return int(u) // int(size)


def stage_buckets(start: int, end: int, size: int = BUCKET_UNITS) -> list[tuple[int, int]]:
    """A stage's buckets ``[lo, hi)`` (global unit indices) in the order its last backward
    runs them: from its last units down."""
    out, hi = [], int(end)
    while hi > start:
        lo = max(int(start), bucket_of(hi - 1, size) * int(size))
        out.append((lo, hi))
        hi = lo
    return out


def pieces(units: Iterable[int], early: Iterable[int] = (),
           size: int = BUCKET_UNITS) -> list[tuple[int, ...]]:
    """How one message of ``units`` travels: the ``early`` units (the sender's own gradients,
    sent as their bucket is final) one piece per bucket, from the last bucket down, then the
    others in one piece; each piece's units in the message's order."""
    units = [int(u) for u in units]
    first = {int(u) for u in early} & set(units)
    out = []
    for b in sorted({bucket_of(u, size) for u in first}, reverse=True):
        out.append(tuple(u for u in units if u in first and bucket_of(u, size) == b))
    rest = tuple(u for u in units if u not in first)
    return out + ([rest] if rest else [])


def bucket_ready_s(start: int, end: int, backward_s: Sequence[float],
                   size: int = BUCKET_UNITS) -> list[tuple[tuple[int, int], float]]:
    """Per bucket of the stage ``[start, end)`` (its order, :func:`stage_buckets`): its units
    ``[lo, hi)`` and the seconds from the start of the stage's last backward until that
    bucket's gradients are final, ``backward_s[u]``: unit ``u``'s backward seconds (the
    profile's, indexed by global unit). The last bucket's is the whole backward."""
    t, out = 0.0, []
    for lo, hi in stage_buckets(start, end, size):
        t += float(np.sum(np.asarray(backward_s, float)[lo:hi]))
        out.append(((lo, hi), t))
    return out


def early_units(m: Message, order: dict[int, list[list[int]]]) -> tuple[int, ...]:
    """The units of ``m`` that carry its sender's own gradient (``order``: the routing's):
    phase 1's, and phase 2's where the sender's group of the unit is the sender alone."""
    if m.phase == IN_GROUP:
        return m.units
    if m.phase == BETWEEN:
        return tuple(u for u in m.units if [m.src] in order[u])
    return ()


def piece_bytes(r: Routing, gprefix: np.ndarray) -> dict[tuple[int, int], list[float]]:
    """Per directed device pair the gradient bytes of each piece the exact exchange sends,
    in the order it sends them (``exchange.message_bytes``, messages cut into pieces)."""
    out: dict[tuple[int, int], list[float]] = {}
    for m in r.messages:
        for p in pieces(m.units, early_units(m, r.order)):
            g = float(sum(gprefix[u + 1] - gprefix[u] for u in p))
            out.setdefault((m.src, m.dst), []).append(g)
    return out
