"""What every transport shares: the :class:`Transport` protocol, its errors, the link clock of
the emulation, and the shape checks a received message must pass.

Messages are matched by (src, dst, tag, n): the n-th send with a tag on a link pairs with the n-th
receive with that tag, so tags may arrive out of order and may be reused (which tag means what:
``skyjax.transport.tags``).

Link emulation (``skyjax.cluster.LinkEmulation``, ``.delay(src, dst, nbytes)``): a message is not
handed to ``recv`` before ``start + latency + bytes / bandwidth``, where ``start`` is the send time,
or later when the link is still busy with earlier messages (one message at a time per directed link:
bandwidth serialises, latency overlaps). The sender computes the due time (it alone uses the link);
the receiver sleeps until it. Across processes the due time is wall-clock (``time.time()``): exact
on one host, as good as NTP across hosts.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import jax
import numpy as np

from skyjax.cluster import precise_sleep

DEFAULT_TIMEOUT_S = 600.0


class TransportError(RuntimeError):
    """A message that cannot be delivered (shape mismatch, aborted transport, ...)."""


class TransportTimeout(TransportError, TimeoutError):
    """A ``recv`` or collective that waited longer than the transport's timeout."""


@runtime_checkable
class Transport(Protocol):
    """What one stage uses to talk to the others (stage indices, not devices or processes)."""

    stage_index: int
    num_stages: int

    def send(self, tag: int, tree: Any, dst: int) -> None:
        """Start sending ``tree`` to stage ``dst``; returns at once."""

    def recv(self, tag: int, like: Any, src: int) -> Any:
        """The tree sent with ``tag`` by ``src``, on this stage's device (blocks).
        ``like``: a pytree of ``jax.ShapeDtypeStruct`` (anything with shape and dtype)."""

    def allreduce_sum(self, value: float, tag: int) -> float:
        """Sum over all stages (same float on every stage: summed in stage order)."""

    def gather_to_first(self, obj: dict, tag: int) -> list | None:
        """Stage 0 gets ``[obj of stage 0, ..., obj of stage p-1]``; the others get None."""

    def barrier(self, tag: int) -> None:
        """Returns once every stage has reached the barrier with this tag."""


class LinkClock:
    """Due times of messages on emulated links (one message at a time per directed link).

    ``links``: a ``LinkEmulation`` (or None: no emulation), indexed by stage, or by
    ``link_ids[stage]`` when given. ``clock``: ``time.monotonic`` in one process, ``time.time``
    across processes (the due time travels to the receiver).
    """

    def __init__(self, links: Any | None, link_ids: Sequence[int] | None,
                 clock: Callable[[], float] = time.monotonic):
        self.links = links
        self.link_ids = list(link_ids) if link_ids is not None else None
        self.clock = clock
        self._free_at: dict[tuple[int, int], float] = {}
        self._lock = threading.Lock()

    def due(self, src: int, dst: int, nbytes: int) -> float:
        """When a message sent now may be received (0.0 without emulation)."""
        if self.links is None:
            return 0.0
        a, b = (src, dst) if self.link_ids is None else (self.link_ids[src], self.link_ids[dst])
        latency = float(self.links.delay(a, b, 0))
        transmit = max(0.0, float(self.links.delay(a, b, nbytes)) - latency)
        if latency <= 0 and transmit <= 0:
            return 0.0
        now = self.clock()
        with self._lock:
            start = max(now, self._free_at.get((src, dst), 0.0))
            self._free_at[(src, dst)] = start + transmit
        return start + transmit + latency

    def wait_until(self, due: float, stop: threading.Event | None = None) -> bool:
        """Sleeps until ``due``; False where ``stop`` was set first (the wait cut short)."""
        return not due or precise_sleep(due - self.clock(), stop)


def check_like(tree: Any, like: Any, what: str) -> None:
    """Raise :class:`TransportError` unless ``tree`` has the shapes and dtypes of ``like``
    (``like=None``: anything goes)."""
    if like is None:
        return
    got = [(tuple(x.shape), np.dtype(x.dtype)) for x in jax.tree.leaves(tree)]
    want = [(tuple(x.shape), np.dtype(x.dtype)) for x in jax.tree.leaves(like)]
    if got != want:
        raise TransportError(f"{what}: received {got}, expected {want}")


def ordered_sum(values: Sequence[float]) -> float:
    """Sum in stage order, so that every stage gets the very same float."""
    total = 0.0
    for v in values:
        total += float(v)
    return total
