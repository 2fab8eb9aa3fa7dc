"""Link latency and bandwidth between devices, measured by ping-pong on the runtime's own path.

One probe (:func:`ping_pong`): a message of each of two sizes goes to the peer and back through a
send/recv pair (the :class:`~skyjax.transport.Transport` protocol), one untimed warm-up
trip, then ``link_repeats`` timed ones; half the robust round trip is the one-way time, and
:func:`fit_link` puts ``t = latency + bytes / bandwidth`` through the two sizes. The pair is

* in one process (:func:`probe_links`): a two-device
  :class:`~skyjax.transport.LocalTransport` (``jax.device_put`` held back by the cluster's
  :class:`~skyjax.cluster.LinkEmulation`), both ends driven by this thread;
* across processes (:func:`probe_links_across`): the runtime's transport, the near end timing
  and the far end answering (:func:`echo`), every unordered pair in turn.
"""

from __future__ import annotations

import time
from typing import Any, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from skyjax import cluster as cluster_lib
from skyjax.profile.options import Log, Options, robust_time

MAX_BANDWIDTH_Bps = 1e13  # reported when a transfer's time does not grow with its size


class Endpoint(Protocol):
    """The point-to-point half of the runtime's ``Transport``: what a probe goes through."""

    def send(self, tag: int, tree: Any, dst: int) -> None: ...

    def recv(self, tag: int, like: Any, src: int) -> Any: ...


def fit_link(sizes: Sequence[int], one_way_s: Sequence[float]) -> tuple[float, float]:
    """``(latency_s, bandwidth_Bps)`` of ``t = latency + bytes / bandwidth`` through two points."""
    (s1, s2), (t1, t2) = sizes, one_way_s
    if t2 > t1 and s2 > s1:
        bw = min((s2 - s1) / (t2 - t1), MAX_BANDWIDTH_Bps)
    else:
        bw = MAX_BANDWIDTH_Bps
    return max(t1 - s1 / bw, 0.0), float(bw)


def _message_like(size: int) -> jax.ShapeDtypeStruct:
    """The probe message of ``size`` bytes (float32, at least one element)."""
    return jax.ShapeDtypeStruct((max(size // 4, 1),), jnp.float32)


def echo(far: Endpoint, size: int, peer: int, tag: int, repeats: int) -> None:
    """The far end of a :func:`ping_pong` by ``peer``: returns each of its messages
    (``repeats`` timed ones after the warm-up) on ``tag + 1``."""
    like = _message_like(size)
    for _ in range(max(repeats, 1) + 1):
        y = jax.block_until_ready(far.recv(tag, like, peer))
        far.send(tag + 1, y, peer)


def ping_pong(near: Endpoint, peer: int, size: int, device: Any, tag: int, repeats: int,
              far: tuple[Endpoint, int] | None = None) -> float:
    """One-way seconds of a ``size``-byte message from ``near`` to ``peer``: half the robust
    round-trip time after one untimed warm-up trip. The message starts on ``device``.

    ``far = (endpoint, near's id there)`` when the peer's end lives in this thread (it then
    answers in line); otherwise the peer runs :func:`echo` with the same ``size``, ``tag`` and
    ``repeats``."""
    like = _message_like(size)
    x = jax.device_put(jnp.zeros(like.shape, like.dtype), device)
    times = []
    for r in range(max(repeats, 1) + 1):
        tic = time.perf_counter()
        near.send(tag, x, peer)
        if far is not None:
            endpoint, me = far
            endpoint.send(tag + 1, jax.block_until_ready(endpoint.recv(tag, like, me)), me)
        jax.block_until_ready(near.recv(tag + 1, like, peer))
        if r:  # the first round trip is a warm-up
            times.append(time.perf_counter() - tic)
    return robust_time(times) / 2


# ------------------------------------------------------------------------------ one process

def link_classes(cluster: cluster_lib.Cluster, dedup: bool) -> dict[tuple, list[tuple[int, int]]]:
    """Unordered device pairs grouped by what determines their link (kinds, processes, same
    JAX device, emulated parameters both ways)."""
    groups: dict[tuple, list[tuple[int, int]]] = {}
    lat, bw = cluster.link_latency_s, cluster.link_bandwidth_Bps
    for i in range(cluster.num_devices):
        for j in range(i + 1, cluster.num_devices):
            a, b = cluster.devices[i], cluster.devices[j]
            if dedup:
                key = (a.kind, b.kind, a.process_index == b.process_index,
                       cluster.jax_devices[i] == cluster.jax_devices[j],
                       float(lat[i, j]), float(bw[i, j]), float(lat[j, i]), float(bw[j, i]))
            else:
                key = (i, j)
            groups.setdefault(key, []).append((i, j))
    return groups


def probe_links(cluster: cluster_lib.Cluster, options: Options, log: Log
                ) -> tuple[np.ndarray, np.ndarray, dict]:
    """Latency and bandwidth ``[D, D]`` of the cluster's devices in this process, one probe per
    link class (:func:`link_classes`). The third result has the path used and the raw one-way
    times per probed pair."""
    from skyjax.transport import LocalTransport

    n = cluster.num_devices
    lat = np.zeros((n, n))
    bw = np.full((n, n), MAX_BANDWIDTH_Bps)
    raw = {}
    sizes = tuple(int(s) for s in options.link_sizes)
    for pairs in link_classes(cluster, options.dedup_devices).values():
        i, j = pairs[0]
        pair = LocalTransport([cluster.jax_devices[i], cluster.jax_devices[j]],
                              cluster.links if cluster.emulate_links else None,
                              link_ids=[i, j], timeout_s=60.0)
        near, far = pair.for_stage(0), pair.for_stage(1)
        one_way = [ping_pong(near, 1, size, cluster.jax_devices[i], 0, options.link_repeats,
                             far=(far, 0)) for size in sizes]
        latency, bandwidth = fit_link(sizes, one_way)
        raw[f"{cluster.devices[i].name}<->{cluster.devices[j].name}"] = one_way
        for a, b in pairs:
            lat[a, b] = lat[b, a] = latency
            bw[a, b] = bw[b, a] = bandwidth
        log(f"[profile] link {cluster.devices[i].name} <-> {cluster.devices[j].name}"
            f"{f' (+{len(pairs) - 1} alike)' if len(pairs) > 1 else ''}: latency "
            f"{latency * 1e6:.1f} us, bandwidth {bandwidth / 1e9:.3g} GB/s")
    return lat, bw, {"path": "LocalTransport", "one_way_s": raw}


# ------------------------------------------------------------------------ across processes

def probe_links_across(transport: Any, rank: int, cluster: cluster_lib.Cluster,
                       options: Options, tag: int) -> tuple[dict[str, list[float]], int]:
    """This process's part in probing every unordered device pair ``(i, j)`` through
    ``transport`` (one process per device, ``rank`` = this one's device): the pair's turn starts
    at a barrier, ``i`` times, ``j`` echoes, the others wait. Returns the one-way times this
    process measured, ``{"i,j,size": [seconds]}``, and the next free tag."""
    n = cluster.num_devices
    sizes = tuple(int(s) for s in options.link_sizes)
    one_way: dict[str, list[float]] = {}
    for i in range(n):
        for j in range(i + 1, n):
            transport.barrier(tag)
            tag += 1
            for size in sizes:
                if rank == i:
                    one_way[f"{i},{j},{size}"] = [ping_pong(
                        transport, j, size, cluster.jax_devices[i], tag, options.link_repeats)]
                elif rank == j:
                    echo(transport, size, i, tag, options.link_repeats)
                tag += 2
    sync, tag = _time_sync(transport, options.link_repeats, tag)
    one_way[f"sync,{rank}"] = [sync]
    return one_way, tag


def _time_sync(transport: Any, repeats: int, tag: int) -> tuple[float, int]:
    """Seconds of the step's end-of-step synchronisation when every process arrives at once (a
    barrier first); robust time after a warm-up. What the runtime pays there every step: the
    gradient-norm ``allreduce_sum``, then the gather of the step's metrics and spans to process
    0 (``DistributedExecutor.train_step``; a payload of the same size as at m = 16)."""
    payload = {"losses": [0.0] * 16, "accuracies": [0.0] * 16, "wall_s": 0.0,
               "spans": [{"stage": 0, "kind": "F", "microbatch": i, "start": 0.0, "end": 0.0}
                         for i in range(32)]}
    times = []
    for r in range(max(repeats, 3) + 1):
        transport.barrier(tag)
        tic = time.perf_counter()
        transport.allreduce_sum(0.0, tag + 1)
        transport.gather_to_first(payload, tag + 1)
        if r:
            times.append(time.perf_counter() - tic)
        tag += 2
    return robust_time(times), tag


def sync_seconds(one_way: dict[str, list[float]]) -> float:
    """The synchronisation time from :func:`probe_links_across`'s gathered records (the
    slowest process's view; 0 when none was measured, e.g. in one process)."""
    vals = [v[0] for k, v in one_way.items() if k.startswith("sync,")]
    return float(max(vals)) if vals else 0.0


def link_matrices(n: int, sizes: Sequence[int], one_way: dict[str, list[float]]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric latency and bandwidth ``[n, n]`` from :func:`probe_links_across`'s gathered
    one-way times."""
    sizes = tuple(int(s) for s in sizes)
    lat = np.zeros((n, n))
    bw = np.full((n, n), MAX_BANDWIDTH_Bps)
    for i in range(n):
        for j in range(i + 1, n):
            ts = [one_way[f"{i},{j},{s}"][0] for s in sizes]
            lat[i, j], bw[i, j] = fit_link(sizes, ts)
            lat[j, i], bw[j, i] = lat[i, j], bw[i, j]
    return lat, bw
