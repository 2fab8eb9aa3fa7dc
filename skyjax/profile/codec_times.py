"""What each hand-off codec (:mod:`skyjax.codecs`) costs: its bytes per unit output, from shapes,
and each device's encode + decode time, measured.

The runtime runs a codec inside the stage programs (the sender's forward encodes, the
receiver's forward decodes; backward the other way round), so a device spends one encode and
one decode per link and micro-batch. The profiler times that pair on the largest unit output,
jitted, with the device's emulated slow-down, and keeps it per byte of the uncoded message: the
cost model charges ``seconds_per_byte[d] * output_bytes`` at each end of a coded link
(:mod:`skyjax.plan.pricing.cost`).

The top-k compressions of the averagings' exchange (``relax.outer_compression``,
:mod:`skyjax.compress`) are timed the same way, on a float32 vector of the largest output's size:
their ``seconds_per_byte`` is one encode (with its residual) and one decode per gradient byte,
their ``output_bytes`` each unit output's bytes in that compression.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from skyjax import cluster as cluster_lib
from skyjax import codecs, compress
from skyjax.profile.options import robust_time
from skyjax.topk_wire import FRACTION
from skyjax.tree import tree_nbytes


def output_likes(chain: Sequence[Any], carry: Any) -> list[Any]:
    """ShapeDtypeStructs of each unit's output carry."""
    c = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), carry)
    out = []
    for unit in chain:
        c = jax.eval_shape(lambda p, x, u=unit: u.apply(p, x, None, False), unit.params, c)
        out.append(c)
    return out


def _topk_round_trip(name: str, fraction: float, big: Any) -> Any:
    """One encode with a residual and one decode of the compression ``name``, jitted."""
    bits = compress.bits_of(name)

    def run(t):
        flat = jnp.concatenate([x.reshape(-1) for x in jax.tree.leaves(t)
                                if jnp.issubdtype(x.dtype, jnp.floating)])
        payload, _, residual = compress.topk_lowbit_encode(flat, fraction, bits,
                                                           jnp.zeros_like(flat))
        return compress.topk_lowbit_decode(payload, flat, fraction, bits), residual

    return jax.jit(run)


def measure_codecs(names: Sequence[str], likes: Sequence[Any],
                   targets: Sequence[tuple[Any, float]], repeats: int,
                   fraction: float = FRACTION) -> dict[str, dict]:
    """Per codec: ``output_bytes`` (per entry of ``likes``, on the wire) and
    ``seconds_per_byte`` (per target ``(jax device, slowdown)``)."""
    big = max(likes, key=tree_nbytes)
    raw = float(tree_nbytes(big))
    rng = np.random.default_rng(0)
    sample = jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(s.dtype)
                          if np.issubdtype(s.dtype, np.floating) else np.ones(s.shape, s.dtype),
                          big)
    out = {}
    for name in names:
        if name == "none":
            continue
        if name in compress.BITS:
            round_trip = _topk_round_trip(name, fraction, big)
        else:
            round_trip = jax.jit(lambda t, n=name: codecs.decode(n, codecs.encode(n, t), big))
        inputs = [jax.device_put(sample, dev) for dev, _ in targets]
        for x in inputs:
            cluster_lib.block(round_trip(x))  # compile
        # the targets' repeats interleaved, so that a burst of load on the host falls on all
        times: list[list[float]] = [[] for _ in targets]
        for _ in range(max(repeats, 7)):
            for (_, slowdown), x, seen in zip(targets, inputs, times):
                seen.append(cluster_lib.timed_call(round_trip, x, slowdown=slowdown)[1])
        rates = [robust_time(t) / raw if raw else 0.0 for t in times]
        coded = ([compress.tree_payload_bytes(x, fraction, compress.bits_of(name)) for x in likes]
                 if name in compress.BITS else [codecs.encoded_bytes(name, x) for x in likes])
        out[name] = {"output_bytes": coded,
                     "seconds_per_byte": rates}
    return out
