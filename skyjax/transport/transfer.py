"""One stage per process under ``jax.distributed``: :class:`TransferServerTransport`.

Arrays move point to point with ``jax.experimental.transfer``: the sender offers them with
``await_pull``, the receiver pulls them over its cached connection to the sender's transfer
server. Both ends derive the pull id from (namespace, src, dst, tag, n), so no per-message control
traffic is needed; a 16-byte header travels with the arrays (due time for link emulation, a
checksum of shapes and dtypes: a pull with a wrong dtype would otherwise silently reinterpret the
bytes). The jax.distributed key-value store is used only to exchange server addresses and for the
host-scalar collectives (``allreduce_sum``, ``gather_to_first``, ``barrier``; once per step).
A pull has no working deadline (jax 0.10), so ``recv`` polls for readiness to time out, and asks
the peer watchdog (``watchdog.py``) every 0.5 s whether the sender's process is lost.
"""

from __future__ import annotations

import collections
import hashlib
import pickle
import queue
import threading
import time
import zlib
from typing import Any, Sequence

import jax
import numpy as np

from skyjax.transport.polling import poll_pause
from skyjax.transport.base import (DEFAULT_TIMEOUT_S, LinkClock, TransportError,
                                           TransportTimeout, ordered_sum)
from skyjax.transport.server import ServerOptions, replace_server, transfer_server
from skyjax.tree import tree_nbytes

_LOW31 = (1 << 31) - 1  # header words are int32: values are split / masked to 31 bits
_CHECK_S = 0.5  # how often a waiting receive asks the peer watchdog


def _avals(leaves: Sequence[Any]) -> list[tuple[tuple[int, ...], str]]:
    return [(tuple(int(d) for d in x.shape), np.dtype(x.dtype).name) for x in leaves]


def _avals_crc(leaves: Sequence[Any]) -> int:
    """The header's checksum of the shapes and dtypes (part of the wire format)."""
    return zlib.crc32(repr(_avals(leaves)).encode()) & _LOW31


# How a failed pull reads when its sender's connection went away (a killed process): a closed or
# reset connection, or a socket that is no longer connected ("recv() failed errno: 107 err:
# Transport endpoint is not connected"), lower case.
_BROKEN_LINK = ("connection", "socket", "not connected", "broken pipe", "errno", "eof")


def link_broke(error: BaseException | str) -> bool:
    """Whether a failed transfer's error says the link to the sender broke (the sender may be
    gone: the watchdog is asked before the error is raised) rather than, e.g., a shape that
    differs from the sender's."""
    text = str(error).lower()
    return any(marker in text for marker in _BROKEN_LINK)


def _wait_ready(leaves: list, timeout_s: float, check: Any = None,
                cpu_device: bool = False) -> bool:
    """Wait until every array in ``leaves`` is ready; False after ``timeout_s``. ``check()`` is
    called every ~0.5 s (the peer watchdog: it raises when the sender's process is lost).

    Polls ``is_ready()`` (:func:`poll_pause` between looks): a pull has no working deadline in
    jax 0.10, and a thread blocked in ``block_until_ready`` would keep the process from exiting
    (or abort it, as a daemon thread) when the sender never comes.
    """
    start = time.monotonic()
    checked = start
    pause = 0.0
    while not all(x.is_ready() for x in leaves):
        now = time.monotonic()
        waited = now - start
        if waited > timeout_s:
            return False
        if check is not None and now - checked > _CHECK_S:
            checked = now
            check()
        time.sleep(pause)
        pause = poll_pause(pause, waited, cpu_device)
    return True


class TransferServerTransport:
    """One stage per process under ``jax.distributed`` (see the module docstring).

    ``device``: this stage's (local) device. ``server``: how this process's transfer server
    starts (address, ports, buffers; :class:`~skyjax.transport.server.ServerOptions`, default:
    the address of the route to the coordinator, any free port).
    ``namespace``: key-value store prefix; use a new one for every transport created in a run
    (e.g. after re-planning). ``links``/``link_ids``: as for ``LocalTransport``.
    """

    def __init__(self, stage_index: int, num_stages: int, device: jax.Device,
                 links: Any | None = None, *, link_ids: Sequence[int] | None = None,
                 server: ServerOptions | None = None, namespace: str = "skyjax",
                 timeout_s: float = DEFAULT_TIMEOUT_S, client: Any = None):
        from skyjax.transport import group as distributed

        if not 0 <= stage_index < num_stages:
            raise ValueError(f"stage_index {stage_index} not in [0, {num_stages})")
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.device = device
        self.timeout_s = timeout_s
        self.ns = self._base_ns = namespace
        self.live = list(range(num_stages))  # the processes collectives wait for (renew)
        self._client = client if client is not None else distributed.key_value_client()
        self._sharding = jax.sharding.SingleDeviceSharding(device)
        self._options = server
        self.server = transfer_server(device, server)  # the server peers pull from
        self.address = self.server.address()
        self._client.key_value_set(f"{self.ns}/addr/{stage_index}", self.address)
        self._conns: dict[int, Any] = {}
        self._retired: list = []  # connections of servers renew replaced (never destroyed)
        self._broken: str | None = None
        self._headers: dict[int, jax.Array] = {}
        self._last_key: str | None = None
        self._counts: collections.Counter = collections.Counter()
        self._pulls: dict[tuple[int, int], collections.deque] = {}  # (src, tag) -> pulls ahead
        self._lock = threading.Lock()
        self._clock = LinkClock(links, link_ids, time.time)
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

    def _get(self, key: str, what: str, as_bytes: bool = False):
        from skyjax.transport import group as distributed

        try:
            return distributed.kv_get(key, self.timeout_s, what, self._client, as_bytes)
        except TransportError:  # PeerLost: the watchdog named the lost process
            raise
        except TimeoutError as e:
            raise TransportTimeout(str(e)) from None
        except Exception as e:  # noqa: BLE001
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

    def connection(self, src: int):
        """This process's connection to stage ``src``'s transfer server (made on first use)."""
        conn = self._conns.get(src)
        if conn is None:
            addr = self._get(f"{self.ns}/addr/{src}",
                             f"stage {self.stage_index}: address of stage {src}")
            conn = self._conns[src] = self.server.connect(addr)
        return conn

    def renew(self, attempt: int, live: Sequence[int]) -> None:
        """Start afresh after a lost process (``skyjax.runtime.recovery``): messages and
        collectives in a new namespace, so that a message of the failed step that was never
        received cannot pair with the retried step's; counters, pulls ahead and a broken state
        cleared; collectives among ``live`` processes only.

        And a new transfer server, its address published in the new namespace (peers connect
        to it on their first pull from this process): the lost process may have died while it
        pulled from this one, which can leave the old server unable to send again
        (:func:`~skyjax.transport.server.replace_server`). Every survivor renews, so every
        link of the retried step runs between new servers. A peer that renews later is waited
        for at its address, as for a message."""
        server = replace_server(self.device, self._options)
        with self._lock:
            self.ns = f"{self._base_ns}/retry{attempt}"
            self._retired.extend(self._conns.values())
            self._conns.clear()
            self.server, self.address = server, server.address()
            self._counts.clear()
            self._pulls.clear()
            self._broken, self._last_key = None, None
            self.live = sorted(live)
        self._client.key_value_set(f"{self.ns}/addr/{self.stage_index}", self.address)

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
        n = self._next("sent", dst, tag)  # counted per direction: a tag may travel both ways
        due_us = int(self._clock.due(self.stage_index, dst, tree_nbytes(leaves)) * 1e6)
        self.server.await_pull(self._uuid(self.stage_index, dst, tag, n),
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

    def prefetch(self, tag: int, like: Any, src: int) -> None:
        """Start the pull of the next message ``tag`` from ``src`` now; the matching ``recv``
        then only waits for it. A pull is a round trip to the sender's server: posted ahead
        (the pipeline posts the next action's input while it computes) it overlaps compute,
        instead of adding a round trip that, on busy hosts, costs a few milliseconds."""
        if self._broken:
            return
        pulled, flat, treedef = self._pull(tag, like, src)
        self._pulls.setdefault((src, tag), collections.deque()).append((pulled, flat, treedef))

    def _pull(self, tag: int, like: Any, src: int) -> tuple[list, list, Any]:
        n = self._next("received", src, tag)
        flat, treedef = jax.tree.flatten(like)
        avals = [jax.ShapeDtypeStruct((4,), np.int32, sharding=self._sharding)] + [
            jax.ShapeDtypeStruct(tuple(x.shape), x.dtype, sharding=self._sharding) for x in flat]
        pulled = self.connection(src).pull(self._uuid(src, self.stage_index, tag, n), avals)
        return pulled, flat, treedef

    def recv(self, tag: int, like: Any, src: int) -> Any:
        what = f"stage {self.stage_index} receiving tag {tag} from stage {src}"
        if self._broken:
            raise TransportError(f"{what}: transport unusable after an earlier failure "
                                 f"({self._broken})")
        ahead = self._pulls.get((src, tag))
        pulled, flat, treedef = ahead.popleft() if ahead else self._pull(tag, like, src)
        from skyjax.transport import group as distributed

        if not _wait_ready(pulled, self.timeout_s, lambda: distributed.check_peers(what),
                           cpu_device=self.device.platform == "cpu"):
            self._broken = f"{what}: nothing after {self.timeout_s:g} s"
            raise TransportTimeout(self._broken)
        try:
            jax.block_until_ready(pulled)  # raises a failed transfer's error
        except Exception as e:  # noqa: BLE001 - e.g. shapes that differ from the sender's
            if link_broke(e):  # the sender may be gone: a loss the trainer can act on
                distributed.confirm_loss(what)
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
        me = self.stage_index
        if not to_all and me != 0:
            self._client.key_value_set_bytes(f"{base}/{me}", payload)
            return None
        if to_all:
            self._client.key_value_set_bytes(f"{base}/{me}", payload)
        what = f"stage {me}: {kind} tag {tag}"
        values = [payload if k == me else self._get(f"{base}/{k}", f"{what} (from stage {k})",
                                                    as_bytes=True) for k in self.live]
        if to_all:
            # Every stage calls the collectives in the same order (or they deadlock), so once all
            # have written this one's value, all have read our key of the previous one.
            if self._last_key is not None:
                self._trash.put(self._last_key)
            self._last_key = f"{base}/{me}"
        else:
            for k in self.live[1:]:
                self._trash.put(f"{base}/{k}")
        return values

    def allreduce_sum(self, value: float, tag: int) -> float:
        values = self._exchange("allreduce", tag, repr(float(value)).encode(), True)
        return ordered_sum([float(v.decode()) for v in values])

    def gather_to_first(self, obj: dict, tag: int) -> list | None:
        values = self._exchange("gather", tag, pickle.dumps(obj), False)
        return None if values is None else [pickle.loads(v) for v in values]

    def barrier(self, tag: int) -> None:
        self._exchange("barrier", tag, b"", True)

    def close(self) -> None:
        """Stop the key clean-up thread (after it has deleted what it was given)."""
        self._trash.put(None)
        self._trash_thread.join(timeout=10)
