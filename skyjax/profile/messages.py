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
the peer arrives, interleaved so that drift hits all alike. The extras over the call alone
(robust times; 0 below the noise, as for calls after idle: :func:`extras`) are the device's cost
of sending and of receiving one message; ``message_s[d]``, which the cost model charges per
message call (one send and one receive per neighbour and action), is their mean. On an
accelerator, whose host thread waits while the device computes, it is about the ``send`` call.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp

from skyjax import cluster as cluster_lib
from skyjax.profile.options import robust_time
from skyjax.profile.wake import noise_floor

WIDTH, DEPTH = 256, 20  # the probe call: DEPTH tanh(x @ x) of WIDTH^2 (~8 ms on one CPU core)
MODES = ("alone", "send", "recv")


@jax.jit
def _call(x: jax.Array) -> jax.Array:
    for _ in range(DEPTH):
        x = jnp.tanh(x @ x)
    return x


def extras(samples: dict[str, list[float]]) -> dict[str, float]:
    """``{"send_s", "recv_s", "message_s"}`` from the call's seconds per mode (:data:`MODES`):
    the robust extra of a call after a send and during a receive over the call alone, each 0
    below the noise (``skyjax.profile.wake.noise_floor`` of the alone samples), and
    their mean, what the cost model charges per message call."""
    base = robust_time(samples["alone"])
    floor = noise_floor(samples["alone"])
    out = {}
    for mode in ("send", "recv"):
        extra = robust_time(samples[mode]) - base
        out[f"{mode}_s"] = float(extra) if extra > floor else 0.0
    out["message_s"] = (out["send_s"] + out["recv_s"]) / 2
    return out


def probe_message_costs(transport: Any, rank: int, cluster: cluster_lib.Cluster,
                        message_bytes: int, repeats: int, tag: int
                        ) -> tuple[dict[str, float] | None, int]:
    """This process's part in measuring every device's message costs (module doc): device ``r``'s
    turn (``rank`` = this process's device) pairs it with ``(r + 1) % n``, which receives what it
    sends and sends what it receives; the others wait at the turn's barriers. Every process calls
    it with the same arguments but ``rank``. Returns this device's :func:`extras` (None with one
    device) and the next free tag."""
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
    mine: dict[str, float] | None = None
    for turn in range(n):
        peer = (turn + 1) % n
        samples: dict[str, list[float]] = {m: [] for m in MODES}
        for r in range(max(repeats, 3) + 1):  # the first round is a warm-up
            for mode in MODES:
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
                elif rank == peer:
                    if mode == "send":
                        jax.block_until_ready(transport.recv(tag + 1, like, turn))
                    elif mode == "recv":
                        transport.send(tag + 1, msg, turn)
                tag += 2
        if rank == turn:
            mine = extras(samples)
    return mine, tag
