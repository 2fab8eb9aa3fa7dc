"""What a message costs the stages that exchange it while they compute: ``message_s``.

A pipeline stage sends its output and computes its next action at once, and it has the receive
of that next action's input posted (``Transport.prefetch``) while it computes. The transport's
threads then serve the pull and copy the message on the same host as the stage's compute, and
on a CPU device they take from it: here, with one core per process, a 132 kB message slowed the
next ~12 ms call by ~0.6 ms when sent before it and by ~0.25 ms when received during it. The link
probe (:mod:`skyjax.profile.links`) times messages with both ends idle and sees none of this.

:func:`probe_message_costs`, every process in turn: its device's call (a fixed jitted program
through the device's emulated slow-down, :func:`cluster.timed_call`) alone, right after a
``send`` of one message of the model's largest activation to a peer, and while a message from
the peer arrives, interleaved round by round so that drift hits all alike. The extras over the
call alone are the device's cost of sending and of receiving one message (:func:`extras`): per
round the difference to the same round's call alone, their median, 0 unless it stands out of
its own noise (twice its standard error, and 2 % of the call). ``message_s[d]``, which the cost
model charges per message call (one send and one receive per neighbour and action), is their
mean. The rounds are paired because a slowed device's single calls spread by more than a send
costs: in a standalone probe of the shipped four-process config a send cost ~1 ms (medians
1.0-1.3 ms over 30 rounds) on all four devices and a receive ~0, where the spread of the calls
alone (up to 3.4 ms on the device slowed 6x) had hidden the send on every device in most
profiles. Even paired, 20 rounds of a slowed device may not tell it: devices of one host and
kind pool their rounds (:func:`pool_by_host`). On an accelerator, whose host thread waits while
the device computes, it is about the ``send`` call.

The same rounds time how late the sent message arrives (the peer's receive posted ahead; clocks
matched by ping-pong, :func:`clock_offset`): a computing sender keeps its transfer thread from
its core, sometimes for a scheduler tick. The mean delay beyond the idle link and ``message_s``
(:func:`delay_extra`) goes into the links' latency (:func:`loaded_latency`), where the cost model
and the simulator charge every message.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from skyjax import cluster as cluster_lib
from skyjax.profile.options import robust_time
from skyjax.hostmodel.wake import NOISE_FLOOR

WIDTH, DEPTH = 256, 20  # the probe call: DEPTH tanh(x @ x) of WIDTH^2 (~8 ms on one CPU core)
MODES = ("alone", "send", "recv")
# Rounds per link repeat (20 by default). On the shipped four-process config a ~1 ms send stood
# out of its standard error in 5 of 12 devices' probes of 10 rounds, in 36 of 52 of 20 rounds
# (the rest, nearly all slowed devices, are what pool_by_host is for).
ROUNDS_PER_REPEAT = 4


@jax.jit
def _call(x: jax.Array) -> jax.Array:
    for _ in range(DEPTH):
        x = jnp.tanh(x @ x)
    return x


def extras(samples: dict[str, list[float]]) -> dict[str, Any]:
    """``{"send_s", "recv_s", "message_s"}`` from the call's seconds per mode (:data:`MODES`,
    one sample of each per round, in the same order): the extra of a call after a send and
    during a receive over the call alone (:func:`paired_extra`), and their mean, what the cost
    model charges per message call. Also what :func:`pool_by_host` pools: the rounds'
    differences (``send_diffs_s``, ``recv_diffs_s``) and the call alone (``call_s``)."""
    out: dict[str, Any] = {f"{mode}_s": paired_extra(samples["alone"], samples[mode])
                           for mode in ("send", "recv")}
    out["message_s"] = (out["send_s"] + out["recv_s"]) / 2
    out["call_s"] = robust_time(samples["alone"])
    for mode in ("send", "recv"):
        out[f"{mode}_diffs_s"] = (np.asarray(samples[mode], float)
                                  - np.asarray(samples["alone"], float)).tolist()
    return out


def paired_extra(alone: list[float], other: list[float]) -> float:
    """The median over rounds of ``other - alone`` (seconds; the same round's pair, so the
    host's drift cancels) where it stands out of the noise (:func:`significant_median`, with
    ``NOISE_FLOOR`` of the call alone: below it a difference is not a cost), else 0."""
    diff = np.asarray(other, float) - np.asarray(alone, float)
    return significant_median(diff, NOISE_FLOOR * robust_time(alone)) if diff.size else 0.0


def significant_median(diff: Any, floor_s: float) -> float:
    """The median of ``diff`` if it exceeds both ``floor_s`` and twice its standard error
    (robust: ``1.25 x 1.48 MAD / sqrt(n)``, the median's under normal noise), else 0."""
    diff = np.asarray(diff, float)
    if diff.size == 0:
        return 0.0
    median = float(np.median(diff))
    stderr = 1.2533 * 1.4826 * float(np.median(np.abs(diff - median))) / np.sqrt(diff.size)
    return median if median > max(2.0 * stderr, floor_s) else 0.0


def pool_by_host(costs: list[dict | None], devices: list[dict]) -> list[dict | None]:
    """Each device's ``costs[d]`` (:func:`extras`) with ``send_s`` / ``recv_s`` / ``message_s``
    pooled over the devices of its host and kind (``devices[d]["host"]``, ``["kind"]``): the
    :func:`significant_median` of all their rounds' differences, over ``NOISE_FLOOR`` of the
    group's shortest call. A send is the host's work (the transport's call and threads), the
    same for every device there, while a device slowed 3-6x times calls that spread by more
    than it: its own figure came out 0 in one or two of four devices in most profiles here,
    the pooled one in none. The device's own figures stay as ``own_send_s`` / ``own_recv_s``;
    a device alone on its host (or kind) keeps its own. Updated in place and returned."""
    groups: dict[tuple, list[int]] = {}
    for d, c in enumerate(costs):
        if c and c.get("send_diffs_s") is not None:
            groups.setdefault((devices[d].get("host"), devices[d].get("kind")), []).append(d)
    for members in groups.values():
        if len(members) < 2:
            continue
        floor = NOISE_FLOOR * min(float(costs[d]["call_s"]) for d in members)
        pooled = {mode: significant_median(
            np.concatenate([costs[d][f"{mode}_diffs_s"] for d in members]), floor)
            for mode in ("send", "recv")}
        for d in members:
            c = costs[d]
            c["own_send_s"], c["own_recv_s"] = c["send_s"], c["recv_s"]
            c["send_s"], c["recv_s"] = pooled["send"], pooled["recv"]
            c["message_s"] = (pooled["send"] + pooled["recv"]) / 2
    return costs


def clock_offset(pings: list[tuple[float, float, float, float]]) -> float:
    """The peer's clock minus this one's, from ping-pongs ``(t0, t1, t2, t3)``: sent at ``t0``
    (here), received at ``t1`` and answered at ``t2`` (the peer's clock), back at ``t3`` (here).
    NTP's estimate ``((t1 - t0) + (t2 - t3)) / 2`` from the ping with the shortest round trip
    (the least queueing, so the most symmetric one): off by at most half its round trip."""
    t0, t1, t2, t3 = min(pings, key=lambda p: (p[3] - p[0]) - (p[2] - p[1]))
    return ((t1 - t0) + (t2 - t3)) / 2


def delay_extra(delays: list[float], idle_one_way_s: float, message_s: float) -> float:
    """What a message sent by a computing device takes beyond the cost model's idle link and
    its ``message_s``: the mean of ``delays`` (send start to the consumer's ``recv`` returning;
    the mean, not a robust time: the tail, a transfer thread waiting for the sender's compute
    to give up its core, is what a pipeline pays on average) less both, 0 when below."""
    return max(float(np.mean(delays)) - idle_one_way_s - message_s, 0.0) if delays else 0.0


def loaded_latency(latency: np.ndarray, bandwidth: np.ndarray, costs: list[dict | None],
                   message_bytes: int) -> np.ndarray:
    """The links' latency as the pipeline's messages see it: the idle ping-pong fit
    (``latency``, ``bandwidth``) plus, for the link between devices ``d`` and ``e``, the mean of
    their :func:`delay_extra` (each device's ``costs[d]``: its messages' ``delays_s`` to its
    ``peer``, beyond that link's idle one-way time for ``message_bytes`` and its ``message_s``).
    The mean of the two directions keeps the matrix symmetric and the cost model's
    ``2 latency`` per stage boundary (one message each way) exact; each device's figure is
    written back to its ``costs[d]["delay_extra_s"]``."""
    n = len(latency)
    extra = np.zeros(n)
    for d, c in enumerate(costs):
        if not c or not c.get("delays_s"):
            continue
        e = int(c["peer"])
        idle = float(latency[d, e]) + (message_bytes / bandwidth[d, e] if bandwidth[d, e] > 0
                                       else 0.0)
        extra[d] = c["delay_extra_s"] = delay_extra(c["delays_s"], idle, c["message_s"])
    out = latency + (extra[:, None] + extra[None, :]) / 2
    np.fill_diagonal(out, np.diag(latency))
    return out


def _stamps(values: list[float], base: float) -> np.ndarray:
    return np.asarray([v - base for v in values], np.float32)  # ~1 us over minutes


def probe_message_costs(transport: Any, rank: int, cluster: cluster_lib.Cluster,
                        message_bytes: int, repeats: int, tag: int
                        ) -> tuple[dict[str, Any] | None, int]:
    """This process's part in measuring every device's message costs (module doc): device ``r``'s
    turn (``rank`` = this process's device) pairs it with ``(r + 1) % n``, which receives what it
    sends and sends what it receives; the others wait at the turn's barriers. Every process calls
    it with the same arguments but ``rank``. Returns this device's :func:`extras` (None with one
    device), with ``delays_s`` (seconds from each send's start to the peer's ``recv`` returning,
    the receive posted ahead, the sender computing: clocks matched by :func:`clock_offset`) and
    ``peer``, and the next free tag."""
    n = cluster.num_devices
    if n < 2:
        return None, tag
    dev = cluster.jax_devices[rank]
    like = jax.ShapeDtypeStruct((max(int(message_bytes) // 4, 1),), jnp.float32)
    msg = jax.device_put(jnp.zeros(like.shape, like.dtype), dev)
    x = jax.device_put(jnp.full((WIDTH, WIDTH), 1.0 / WIDTH, jnp.float32), dev)
    slowdown = cluster.devices[rank].slowdown
    for _ in range(2):  # compiles, then sets the emulation's reference time
        cluster_lib.timed_call(_call, x, slowdown=slowdown)
    prefetch = getattr(transport, "prefetch", None)
    rounds = max(repeats, 3)
    stamp_like = jax.ShapeDtypeStruct((rounds,), jnp.float32)
    ping_like = jax.ShapeDtypeStruct((1,), jnp.float32)
    reply_like = jax.ShapeDtypeStruct((2,), jnp.float32)
    mine: dict[str, Any] | None = None
    for turn in range(n):
        peer = (turn + 1) % n
        samples: dict[str, list[float]] = {m: [] for m in MODES}
        sent: list[float] = []  # the turn's send starts (its clock)
        arrived: list[float] = []  # the peer's recv returns (its clock)
        base = time.perf_counter()  # each process's own origin for the stamps it sends
        for r in range(rounds + 1):  # the first round is a warm-up
            for mode in MODES:
                if rank == peer and mode == "send" and prefetch is not None:
                    prefetch(tag + 1, like, turn)  # posted ahead, as the pipeline's consumer
                transport.barrier(tag)
                if rank == turn:
                    if mode == "recv" and prefetch is not None:
                        prefetch(tag + 1, like, peer)  # as the pipeline posts its next input
                    tic = time.perf_counter()
                    if mode == "send":
                        transport.send(tag + 1, msg, peer)
                    cluster_lib.timed_call(_call, x, slowdown=slowdown)
                    seconds = time.perf_counter() - tic
                    if mode == "recv":
                        jax.block_until_ready(transport.recv(tag + 1, like, peer))
                    if r:
                        samples[mode].append(seconds)
                        if mode == "send":
                            sent.append(tic)
                elif rank == peer:
                    if mode == "send":
                        jax.block_until_ready(transport.recv(tag + 1, like, turn))
                        if r:
                            arrived.append(time.perf_counter())
                    elif mode == "recv":
                        transport.send(tag + 1, msg, turn)
                tag += 2
        # the two clocks, from idle ping-pongs; then the peer's arrival stamps
        pings = []
        for _ in range(rounds):
            if rank == turn:
                if prefetch is not None:
                    prefetch(tag + 1, reply_like, peer)
                transport.barrier(tag)
                t0 = time.perf_counter()
                transport.send(tag, jnp.zeros(ping_like.shape, ping_like.dtype), peer)
                t12 = np.asarray(transport.recv(tag + 1, reply_like, peer), np.float64)
                pings.append((t0 - base, float(t12[0]), float(t12[1]), time.perf_counter() - base))
            elif rank == peer:
                if prefetch is not None:
                    prefetch(tag, ping_like, turn)
                transport.barrier(tag)
                jax.block_until_ready(transport.recv(tag, ping_like, turn))
                t1 = time.perf_counter()  # received; then answered (t2) at once
                stamps = _stamps([t1, time.perf_counter()], base)
                transport.send(tag + 1, jax.device_put(stamps, dev), turn)
            else:
                transport.barrier(tag)
            tag += 2
        if rank == peer:
            transport.send(tag, jax.device_put(_stamps(arrived, base), dev), turn)
        elif rank == turn:
            stamps = np.asarray(transport.recv(tag, stamp_like, peer), np.float64)
            offset = clock_offset(pings)
            mine = extras(samples)
            mine["delays_s"] = [float(a - offset - (s - base)) for a, s in zip(stamps, sent)]
            mine["peer"] = peer
        tag += 1
    return mine, tag
