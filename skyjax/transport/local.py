"""Stages as threads of one process: ``send`` is an asynchronous ``jax.device_put`` onto the
receiver's device, dropped into a mailbox keyed by (tag, src, dst); collectives meet in a shared
dictionary under one condition variable.

Neither end waits for the arrays' values: ``send`` takes arrays whose computation may still be
running (the copy is queued after it), and ``recv`` returns arrays that may still be in flight (a
jitted call on them waits on the device). A caller that times its compute blocks on them first
(``skyjax.runtime.pipeline``)."""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Sequence

import jax

from skyjax.transport.base import (DEFAULT_TIMEOUT_S, LinkClock, TransportError,
                                           TransportTimeout, check_like, ordered_sum)
from skyjax.tree import tree_nbytes


class LocalTransport:
    """Stages as threads of one process; ``devices[k]`` is stage ``k``'s device.

    ``links``: optional ``LinkEmulation``, indexed by stage, or by ``link_ids[stage]`` when given
    (e.g. the cluster device of each stage). ``timeout_s``: how long ``recv`` and the collectives
    wait before raising :class:`TransportTimeout`. ``for_stage(k)`` is stage ``k``'s handle.
    """

    def __init__(self, devices: Sequence[jax.Device], links: Any | None = None, *,
                 link_ids: Sequence[int] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.devices = list(devices)
        self.num_stages = len(self.devices)
        self.timeout_s = timeout_s
        self._clock = LinkClock(links, link_ids, time.monotonic)
        self._cond = threading.Condition()
        self._mail: dict[tuple[int, int, int], collections.deque] = collections.defaultdict(
            collections.deque)
        self._rounds: dict[tuple, dict] = {}
        self._aborted: BaseException | str | None = None
        self._stop = threading.Event()  # set with _aborted: ends the link clock's waits too
        self._handles = [LocalStageLink(self, k) for k in range(self.num_stages)]

    def for_stage(self, k: int) -> "LocalStageLink":
        return self._handles[k]

    def abort(self, reason: BaseException | str = "aborted") -> None:
        """Wake every waiting ``recv``/collective with a :class:`TransportError` (e.g. when one
        stage thread failed, so the others do not wait for their timeout), a ``recv`` waiting
        out its emulated link's delay included."""
        with self._cond:
            self._aborted = reason
            self._stop.set()
            self._cond.notify_all()

    def idle(self) -> bool:
        """Whether no message waits undelivered and no collective round is open."""
        with self._cond:
            return not self._mail and not self._rounds

    def post(self, tag: int, src: int, dst: int, moved: Any) -> None:
        """Drops ``moved`` (already on ``dst``'s device) into the (tag, src, dst) mailbox, due
        when the emulated link would deliver it."""
        due = self._clock.due(src, dst, tree_nbytes(moved))
        with self._cond:
            self._mail[(tag, src, dst)].append((due, moved))
            self._cond.notify_all()

    def take(self, tag: int, src: int, dst: int, like: Any, what: str) -> Any:
        """The oldest tree in the (tag, src, dst) mailbox, checked against ``like``, once its
        emulated link has delivered it; waits up to ``timeout_s``."""
        key = (tag, src, dst)
        with self._cond:
            box = self._mail[key]
            try:
                self._wait(lambda: len(box) > 0, what)
            except TransportError:
                if not box:
                    self._mail.pop(key, None)
                raise
            due, tree = box.popleft()
            if not box:
                del self._mail[key]
        check_like(tree, like, what)
        if not self._clock.wait_until(due, self._stop):
            raise TransportError(f"{what}: transport aborted ({self._aborted})")
        return tree

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        """Wait (holding ``self._cond``) until ``ready()``; raise on timeout or abort."""
        deadline = time.monotonic() + self.timeout_s
        while not ready():
            if self._aborted is not None:
                raise TransportError(f"{what}: transport aborted ({self._aborted})")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransportTimeout(f"{what}: nothing after {self.timeout_s:g} s")
            self._cond.wait(left)

    def collect(self, kind: str, tag: int, stage: int, value: Any, n: int,
                wait_all: bool) -> list | None:
        """Stage ``stage``'s ``value`` for round ``n`` of collective ``kind`` on ``tag``; with
        ``wait_all``, every stage's value in stage order once all have arrived."""
        key = (kind, tag, n)
        with self._cond:
            r = self._rounds.setdefault(key, {"values": {}, "left": self.num_stages})
            r["values"][stage] = value
            self._cond.notify_all()
            if not wait_all:
                return None
            p = self.num_stages
            try:
                self._wait(lambda: len(r["values"]) == p,
                           f"stage {stage}: {kind} tag {tag} (stages arrived: "
                           f"{sorted(r['values'])} of {p})")
            finally:
                r["left"] -= 1  # the last one out, or a gather's stage 0, cleans up
                if r["left"] == 0 or kind == "gather":
                    self._rounds.pop(key, None)
            return [r["values"][k] for k in range(p)]


class LocalStageLink:
    """Stage ``k``'s view of a :class:`LocalTransport` (the ``Transport`` protocol)."""

    def __init__(self, owner: LocalTransport, k: int):
        self._t = owner
        self.stage_index = k
        self.num_stages = owner.num_stages
        self.device = owner.devices[k]
        self._counts: collections.Counter = collections.Counter()

    def _next(self, *key) -> int:
        n = self._counts[key]
        self._counts[key] += 1
        return n

    def send(self, tag: int, tree: Any, dst: int) -> None:
        t = self._t
        if not 0 <= dst < t.num_stages or dst == self.stage_index:
            raise ValueError(f"stage {self.stage_index}: bad destination stage {dst}")
        t.post(tag, self.stage_index, dst, jax.device_put(tree, t.devices[dst]))

    def recv(self, tag: int, like: Any, src: int) -> Any:
        return self._t.take(tag, src, self.stage_index, like,
                            f"stage {self.stage_index} receiving tag {tag} from stage {src}")

    def allreduce_sum(self, value: float, tag: int) -> float:
        n = self._next("allreduce", tag)
        values = self._t.collect("allreduce", tag, self.stage_index, float(value), n, True)
        return ordered_sum(values)

    def gather_to_first(self, obj: dict, tag: int) -> list | None:
        n = self._next("gather", tag)
        return self._t.collect("gather", tag, self.stage_index, obj, n,
                               wait_all=self.stage_index == 0)

    def barrier(self, tag: int) -> None:
        n = self._next("barrier", tag)
        self._t.collect("barrier", tag, self.stage_index, None, n, True)
