"""Moving activations and gradients between pipeline stages.

One small interface (:class:`Transport`), two implementations:

- :class:`LocalTransport`: every stage is a thread of one process. ``send`` is an asynchronous
  ``jax.device_put`` onto the receiver's device, dropped into a mailbox keyed by (tag, src, dst).
- :class:`TransferServerTransport`: one process per stage under ``jax.distributed``. Arrays move
  point to point with ``jax.experimental.transfer``: the sender offers them with ``await_pull``,
  the receiver pulls them over its cached connection to the sender's transfer server. Both ends
  derive the pull id from (namespace, src, dst, tag, n), so no per-message control traffic is
  needed; a 16-byte header travels with the arrays (due time for link emulation, a checksum of
  shapes and dtypes: a pull with a wrong dtype would otherwise silently reinterpret the bytes).
  The jax.distributed key-value store is used only to exchange server addresses and for the
  host-scalar collectives (``allreduce_sum``, ``gather_to_first``, ``barrier``; once per step).
  A pull has no working deadline (jax 0.10), so ``recv`` polls for readiness to time out.

Messages are matched by (src, dst, tag, n): the n-th send with a tag on a link pairs with the n-th
receive with that tag, so tags may arrive out of order and may be reused.

Link emulation (``skyjax.cluster.LinkEmulation``, ``.delay(src, dst, nbytes)``): a message is not
handed to ``recv`` before ``start + latency + bytes / bandwidth``, where ``start`` is the send time,
or later when the link is still busy with earlier messages (one message at a time per directed link:
bandwidth serialises, latency overlaps). The sender computes the due time (it alone uses the link);
the receiver sleeps until it. Across processes the due time is wall-clock (``time.time()``): exact
on one host, as good as NTP across hosts.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import math
import os
import pickle
import queue
import threading
import time
import zlib
from typing import Any, Protocol, Sequence, runtime_checkable

import jax
import numpy as np

from skyjax import env_vars

log = logging.getLogger(__name__)

try:
    from skyjax.cluster import LinkEmulation, precise_sleep
except ModuleNotFoundError as e:  # pragma: no cover - cluster.py is part of the package
    if e.name != "skyjax.cluster":
        raise

    @dataclasses.dataclass
    class LinkEmulation:  # type: ignore[no-redef]
        """Minimal stand-in: ``latency_s[src][dst] + nbytes / bandwidth_Bps[src][dst]``."""

        latency_s: Any
        bandwidth_Bps: Any

        def delay(self, src: int, dst: int, nbytes: int) -> float:
            if src == dst:
                return 0.0
            bw = float(np.asarray(self.bandwidth_Bps)[src, dst])
            extra = nbytes / bw if math.isfinite(bw) and bw > 0 else 0.0
            return float(np.asarray(self.latency_s)[src, dst]) + extra

    def precise_sleep(seconds: float) -> None:  # type: ignore[no-redef]
        deadline = time.perf_counter() + seconds
        if seconds > 0.002:
            time.sleep(seconds - 0.002)
        while time.perf_counter() < deadline:
            time.sleep(0)

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


# ------------------------------------------------------------------------------- link emulation

def tree_nbytes(tree: Any) -> int:
    """Bytes of the arrays (or ShapeDtypeStructs) in ``tree``; other leaves count 0."""
    return int(sum(np.dtype(x.dtype).itemsize * math.prod(x.shape)
                   for x in jax.tree.leaves(tree) if hasattr(x, "dtype")))


class _LinkClock:
    """Due times of messages on emulated links (one message at a time per directed link)."""

    def __init__(self, links: Any | None, link_ids: Sequence[int] | None,
                 clock=time.monotonic):
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

    def wait_until(self, due: float) -> None:
        if due:
            precise_sleep(due - self.clock())


_LOW31 = (1 << 31) - 1


def _avals(leaves) -> list[tuple[tuple[int, ...], str]]:
    return [(tuple(int(d) for d in x.shape), np.dtype(x.dtype).name) for x in leaves]


def _avals_crc(leaves) -> int:
    return zlib.crc32(repr(_avals(leaves)).encode()) & _LOW31


def _check_like(tree: Any, like: Any, what: str) -> None:
    if like is None:
        return
    got = [(tuple(x.shape), np.dtype(x.dtype)) for x in jax.tree.leaves(tree)]
    want = [(tuple(x.shape), np.dtype(x.dtype)) for x in jax.tree.leaves(like)]
    if got != want:
        raise TransportError(f"{what}: received {got}, expected {want}")


# --------------------------------------------------------------------------------------- local

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
        self._clock = _LinkClock(links, link_ids, time.monotonic)
        self._cond = threading.Condition()
        self._mail: dict[tuple[int, int, int], collections.deque] = collections.defaultdict(
            collections.deque)
        self._rounds: dict[tuple, dict] = {}
        self._aborted: BaseException | str | None = None
        self._handles = [_LocalStage(self, k) for k in range(self.num_stages)]

    def for_stage(self, k: int) -> "_LocalStage":
        return self._handles[k]

    def abort(self, reason: BaseException | str = "aborted") -> None:
        """Wake every waiting ``recv``/collective with a :class:`TransportError` (e.g. when one
        stage thread failed, so the others do not wait for their timeout)."""
        with self._cond:
            self._aborted = reason
            self._cond.notify_all()

    def _wait(self, ready, what: str) -> None:
        """Wait (holding ``self._cond``) until ``ready()``; raise on timeout or abort."""
        deadline = time.monotonic() + self.timeout_s
        while not ready():
            if self._aborted is not None:
                raise TransportError(f"{what}: transport aborted ({self._aborted})")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransportTimeout(f"{what}: nothing after {self.timeout_s:g} s")
            self._cond.wait(left)

    def _collect(self, kind: str, tag: int, stage: int, value: Any, n: int,
                 wait_all: bool) -> list | None:
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


class _LocalStage:
    """Stage ``k``'s view of a :class:`LocalTransport` (the :class:`Transport` protocol)."""

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
        moved = jax.device_put(tree, t.devices[dst])
        due = t._clock.due(self.stage_index, dst, tree_nbytes(moved))
        with t._cond:
            t._mail[(tag, self.stage_index, dst)].append((due, moved))
            t._cond.notify_all()

    def recv(self, tag: int, like: Any, src: int) -> Any:
        t = self._t
        key = (tag, src, self.stage_index)
        what = f"stage {self.stage_index} receiving tag {tag} from stage {src}"
        with t._cond:
            box = t._mail[key]
            try:
                t._wait(lambda: len(box) > 0, what)
            except TransportError:
                if not box:
                    t._mail.pop(key, None)
                raise
            due, tree = box.popleft()
            if not box:
                del t._mail[key]
        _check_like(tree, like, what)
        t._clock.wait_until(due)
        return jax.block_until_ready(tree)

    def allreduce_sum(self, value: float, tag: int) -> float:
        n = self._next("allreduce", tag)
        values = self._t._collect("allreduce", tag, self.stage_index, float(value), n, True)
        return _ordered_sum(values)

    def gather_to_first(self, obj: dict, tag: int) -> list | None:
        n = self._next("gather", tag)
        return self._t._collect("gather", tag, self.stage_index, obj, n,
                                wait_all=self.stage_index == 0)

    def barrier(self, tag: int) -> None:
        n = self._next("barrier", tag)
        self._t._collect("barrier", tag, self.stage_index, None, n, True)


def _ordered_sum(values: Sequence[float]) -> float:
    total = 0.0
    for v in values:  # stage order: every stage gets the very same float
        total += float(v)
    return total


# --------------------------------------------------------------------------------- distributed

_POLL_MAX_S, _SPIN_S = 200e-6, 2e-3


def _wait_ready(leaves: list, timeout_s: float) -> bool:
    """Wait until every array in ``leaves`` is ready; False after ``timeout_s``.

    Polls ``is_ready()`` (sleep(0) for 2 ms, then at most 200 us between looks): a pull has no
    working deadline in jax 0.10, and a thread blocked in ``block_until_ready`` would keep the
    process from exiting (or abort it, as a daemon thread) when the sender never comes.
    """
    start = time.monotonic()
    pause = 0.0  # first 2 ms: sleep(0) (~50-70 us with timer slack); then back off
    while not all(x.is_ready() for x in leaves):
        waited = time.monotonic() - start
        if waited > timeout_s:
            return False
        time.sleep(pause)
        if waited > _SPIN_S:
            pause = min(max(pause * 2, 10e-6), _POLL_MAX_S)
    return True


_servers: dict[tuple[int, str], Any] = {}
_servers_lock = threading.Lock()


def _transfer_server(device: jax.Device, host: str):
    """One transfer server per (device, host) in this process."""
    from jax.experimental import transfer

    with _servers_lock:
        key = (device.id, host)
        if key not in _servers:
            srv = transfer.start_transfer_server(device.client, f"{host}:0", [f"{host}:0"])
            _servers[key] = srv
        return _servers[key]


class TransferServerTransport:
    """One stage per process under ``jax.distributed`` (see the module docstring).

    ``device``: this stage's (local) device. ``host``: the address other processes reach this
    one at (default ``$SKYJAX_TRANSFER_HOST`` or 127.0.0.1; on a cluster the node's IP).
    ``namespace``: key-value store prefix; use a new one for every transport created in a run
    (e.g. after re-planning). ``links``/``link_ids``: as for :class:`LocalTransport`.
    """

    def __init__(self, stage_index: int, num_stages: int, device: jax.Device,
                 links: Any | None = None, *, link_ids: Sequence[int] | None = None,
                 host: str | None = None, namespace: str = "skyjax",
                 timeout_s: float = DEFAULT_TIMEOUT_S, client: Any = None):
        from skyjax.runtime import distributed

        if not 0 <= stage_index < num_stages:
            raise ValueError(f"stage_index {stage_index} not in [0, {num_stages})")
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.device = device
        self.timeout_s = timeout_s
        self.ns = namespace
        self._client = client if client is not None else distributed.key_value_client()
        self._sharding = jax.sharding.SingleDeviceSharding(device)
        host = host or os.environ.get(env_vars.TRANSFER_HOST) or "127.0.0.1"
        self._server = _transfer_server(device, host)
        self.address = self._server.address()
        self._client.key_value_set(f"{self.ns}/addr/{stage_index}", self.address)
        self._conns: dict[int, Any] = {}
        self._broken: str | None = None
        self._headers: dict[int, jax.Array] = {}
        self._last_key: str | None = None
        self._counts: collections.Counter = collections.Counter()
        self._lock = threading.Lock()
        self._clock = _LinkClock(links, link_ids, time.time)
        self._trash: queue.Queue = queue.Queue()
        self._trash_thread = threading.Thread(target=self._delete_keys, daemon=True,
                                              name=f"skyjax-kv-gc-{stage_index}")
        self._trash_thread.start()

    # -- plumbing
    def _next(self, *key) -> int:
        with self._lock:
            n = self._counts[key]
            self._counts[key] += 1
            return n

    def _ms(self) -> int:
        return max(1, int(self.timeout_s * 1000))

    def _get(self, key: str, what: str, as_bytes: bool = False):
        try:
            if as_bytes:
                return self._client.blocking_key_value_get_bytes(key, self._ms())
            return self._client.blocking_key_value_get(key, self._ms())
        except Exception as e:  # jax raises JaxRuntimeError(DEADLINE_EXCEEDED: ...)
            if "DEADLINE_EXCEEDED" in str(e) or "timed out" in str(e):
                raise TransportTimeout(f"{what}: nothing after {self.timeout_s:g} s "
                                       f"(key {key})") from None
            raise TransportError(f"{what}: key-value store failed: {e}") from e

    def _delete_keys(self) -> None:
        while True:
            key = self._trash.get()
            if key is None:
                return
            try:
                self._client.key_value_delete(key)
            except Exception:  # noqa: BLE001 - shutting down, or already gone
                pass

    def _conn(self, src: int):
        conn = self._conns.get(src)
        if conn is None:
            addr = self._get(f"{self.ns}/addr/{src}",
                             f"stage {self.stage_index}: address of stage {src}")
            conn = self._conns[src] = self._server.connect(addr)
        return conn

    # -- point to point
    def _uuid(self, src: int, dst: int, tag: int, n: int) -> int:
        """The pull id of the n-th message with ``tag`` on link src -> dst (both ends agree)."""
        h = hashlib.blake2b(f"{self.ns}|{src}|{dst}|{tag}|{n}".encode(), digest_size=8)
        return int.from_bytes(h.digest(), "little") & ((1 << 63) - 1)

    def send(self, tag: int, tree: Any, dst: int) -> None:
        if not 0 <= dst < self.num_stages or dst == self.stage_index:
            raise ValueError(f"stage {self.stage_index}: bad destination stage {dst}")
        leaves = jax.tree.leaves(tree)
        if not all(isinstance(x, jax.Array) and x.sharding == self._sharding for x in leaves):
            leaves = jax.device_put(leaves, self.device)
        n = self._next("msg", dst, tag)
        due_us = int(self._clock.due(self.stage_index, dst, tree_nbytes(leaves)) * 1e6)
        self._server.await_pull(self._uuid(self.stage_index, dst, tag, n),
                                [self._header(due_us, _avals_crc(leaves)), *leaves])

    def _header(self, due_us: int, crc: int) -> jax.Array:
        """[due time (us, two int32 words), checksum of the avals, 0] on this device; cached
        while there is no due time (a host-to-device copy costs ~0.1 ms)."""
        if due_us:
            return jax.device_put(np.array([due_us >> 31, due_us & _LOW31, crc, 0], np.int32),
                                  self.device)
        header = self._headers.get(crc)
        if header is None:
            header = self._headers[crc] = jax.device_put(np.array([0, 0, crc, 0], np.int32),
                                                         self.device)
        return header

    def recv(self, tag: int, like: Any, src: int) -> Any:
        what = f"stage {self.stage_index} receiving tag {tag} from stage {src}"
        if self._broken:
            raise TransportError(f"{what}: transport unusable after an earlier failure "
                                 f"({self._broken})")
        n = self._next("msg", src, tag)
        flat, treedef = jax.tree.flatten(like)
        avals = [jax.ShapeDtypeStruct((4,), np.int32, sharding=self._sharding)] + [
            jax.ShapeDtypeStruct(tuple(x.shape), x.dtype, sharding=self._sharding) for x in flat]
        pulled = self._conn(src).pull(self._uuid(src, self.stage_index, tag, n), avals)
        if not _wait_ready(pulled, self.timeout_s):
            self._broken = f"{what}: nothing after {self.timeout_s:g} s"
            raise TransportTimeout(self._broken)
        try:
            jax.block_until_ready(pulled)  # raises a failed transfer's error
        except Exception as e:  # noqa: BLE001 - e.g. shapes that differ from the sender's
            raise TransportError(f"{what}: transfer failed (expected {_avals(flat)}; does the "
                                 f"sender's tree match?): {e}") from e
        header = np.asarray(pulled[0])
        if int(header[2]) != _avals_crc(flat):
            raise TransportError(f"{what}: the sender's shapes/dtypes differ from the expected "
                                 f"{_avals(flat)}")
        self._clock.wait_until((int(header[0]) << 31 | int(header[1])) / 1e6)
        return jax.tree.unflatten(treedef, pulled[1:])

    # -- host-scalar collectives through the key-value store
    def _exchange(self, kind: str, tag: int, payload: bytes, to_all: bool) -> list | None:
        n = self._next(kind, tag)
        base = f"{self.ns}/{kind}/{tag}/{n}"
        me, p = self.stage_index, self.num_stages
        if not to_all and me != 0:
            self._client.key_value_set_bytes(f"{base}/{me}", payload)
            return None
        if to_all:
            self._client.key_value_set_bytes(f"{base}/{me}", payload)
        what = f"stage {me}: {kind} tag {tag}"
        values = [payload if k == me else self._get(f"{base}/{k}", f"{what} (from stage {k})",
                                                    as_bytes=True) for k in range(p)]
        if to_all:
            # Every stage calls the collectives in the same order (or they deadlock), so once all
            # have written this one's value, all have read our key of the previous one.
            if self._last_key is not None:
                self._trash.put(self._last_key)
            self._last_key = f"{base}/{me}"
        else:
            for k in range(1, p):
                self._trash.put(f"{base}/{k}")
        return values

    def allreduce_sum(self, value: float, tag: int) -> float:
        values = self._exchange("allreduce", tag, repr(float(value)).encode(), True)
        return _ordered_sum([float(v.decode()) for v in values])

    def gather_to_first(self, obj: dict, tag: int) -> list | None:
        values = self._exchange("gather", tag, pickle.dumps(obj), False)
        return None if values is None else [pickle.loads(v) for v in values]

    def barrier(self, tag: int) -> None:
        self._exchange("barrier", tag, b"", True)

    def close(self) -> None:
        """Stop the key clean-up thread (after it has deleted what it was given)."""
        self._trash.put(None)
        self._trash_thread.join(timeout=10)
