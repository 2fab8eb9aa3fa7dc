"""What each hand-off codec (:mod:`skyjax.codecs`) costs: its bytes per unit output, from shapes,
and each device's encode + decode time, measured.

The runtime runs a codec inside the stage programs (the sender's forward encodes, the
receiver's forward decodes; backward the other way round), so a device spends one encode and
one decode per link and micro-batch. The profiler times that pair on the largest unit output,
jitted, with the device's emulated slow-down, and keeps it per byte of the uncoded message: the
cost model charges ``seconds_per_byte[d] * output_bytes`` at each end of a coded link
(:mod:`skyjax.plan.pricing.cost`).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from skyjax import cluster as cluster_lib
from skyjax import codecs
from skyjax.profile.options import robust_time
from skyjax.tree import tree_nbytes


def output_likes(chain: Sequence[Any], carry: Any) -> list[Any]:
    """ShapeDtypeStructs of each unit's output carry."""
    c = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), carry)
    out = []
    for unit in chain:
        c = jax.eval_shape(lambda p, x, u=unit: u.apply(p, x, None, False), unit.params, c)
        out.append(c)
    return out


def measure_codecs(names: Sequence[str], likes: Sequence[Any],
                   targets: Sequence[tuple[Any, float]], repeats: int) -> dict[str, dict]:
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
        out[name] = {"output_bytes": [codecs.encoded_bytes(name, like) for like in likes],
                     "seconds_per_byte": rates}
    return out
