"""Which devices the searches may treat alike: device classes and link groups.

* A device class holds interchangeable devices: same forward/backward times and memory, and
  swapping two of them leaves both link matrices (latency, bandwidth) unchanged
  (``device_classes``). The exact search counts devices per class instead of permuting them.
* A link group holds devices whose links are interchangeable, typically a region
  (``link_groups``): comm then depends on the groups of two neighbours only. The heuristic keeps
  groups contiguous in its device orders. More groups than it can handle (e.g. noisy measured
  links) are coarsened (``coarse_groups``), and each group pair is charged its worst link
  (``worst_link``), so costs computed per group bound the true ones from above.

Swap-invariance is an equivalence, so both partitions compare each device with one
representative per class only.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from skyjax.plan.pricing.cost import Tables

_INF = math.inf


def _swap_invariant(mats: Sequence[np.ndarray], d: int, e: int) -> bool:
    """Whether exchanging devices d and e leaves every matrix unchanged."""
    n = mats[0].shape[0]
    rest = np.ones(n, bool)
    rest[[d, e]] = False
    for m in mats:
        if not (np.array_equal(m[d, rest], m[e, rest]) and np.array_equal(m[rest, d], m[rest, e])
                and m[d, e] == m[e, d]):
            return False
    return True


def _partition(keys: list[bytes], mats: Sequence[np.ndarray]) -> list[list[int]]:
    """Classes of devices with equal keys that are pairwise swap-invariant under mats.

    Swap-invariance is transitive, so each device is compared with one representative per class.
    Sorted off-diagonal rows/columns enter the key so that unequal devices rarely meet.
    """
    n = len(keys)
    off = ~np.eye(n, dtype=bool)
    sig = [keys[d] for d in range(n)]
    for m in mats:
        rows = np.sort(m[off].reshape(n, n - 1), axis=1) if n > 1 else np.zeros((n, 0))
        cols = np.sort(m.T[off].reshape(n, n - 1), axis=1) if n > 1 else np.zeros((n, 0))
        sig = [s + rows[d].tobytes() + cols[d].tobytes() for d, s in enumerate(sig)]
    buckets: dict[bytes, list[list[int]]] = {}
    classes: list[list[int]] = []
    for d in range(n):
        for cls in buckets.setdefault(sig[d], []):
            if _swap_invariant(mats, cls[0], d):
                cls.append(d)
                break
        else:
            cls = [d]
            buckets[sig[d]].append(cls)
            classes.append(cls)
    return classes


def device_classes(t: Tables) -> list[list[int]]:
    """Interchangeable devices: same times, fixed costs (calls, messages, updates) and memory,
    swap-invariant links (the exact DP prices a class by one representative)."""
    keys = [b"".join(np.asarray(x, float).tobytes() for x in (
        t.work[:, d], t.memory[d], t.fixed[d], t.in_msg[d], t.update_call[d],
        t.update_prefix[d], t.alone[d], t.codec_rate[:, d])) for d in range(t.num_devices)]
    return _partition(keys, [t.latency, t.bandwidth])


def link_groups(t: Tables) -> list[list[int]]:
    """Devices whose links are interchangeable (e.g. one region): comm depends on groups only."""
    return _partition([b""] * t.num_devices, [t.latency, t.bandwidth])


def labels(parts: list[list[int]], n: int) -> np.ndarray:
    """Part index of each of n devices (the inverse of a partition)."""
    out = np.empty(n, dtype=np.int64)
    for i, members in enumerate(parts):
        out[members] = i
    return out


def worst_link(t: Tables, src: Sequence[int], dst: Sequence[int]) -> tuple[float, float]:
    """Largest latency and least bandwidth from a device of src to another of dst: exact for
    link groups (uniform), an upper bound on comm for coarsened groups. (0, 0) if no pair."""
    lat = t.latency[np.ix_(src, dst)]
    bw = t.bandwidth[np.ix_(src, dst)]
    other = np.asarray(src)[:, None] != np.asarray(dst)[None, :]
    if not other.any():
        return 0.0, 0.0
    return float(lat[other].max()), float(bw[other].min())


def coarse_groups(t: Tables, limit: int) -> list[list[int]]:
    """At most `limit` groups of devices joined by cheap links: a nearest-neighbour path over
    the devices, cut at its `limit` - 1 most expensive hops (single linkage along the path)."""
    ref = float(np.median(t.output_bytes)) if t.num_units else 0.0
    with np.errstate(divide="ignore"):
        cost = 2 * (t.latency + ref / t.bandwidth)
    cost = np.minimum(cost, cost.T)
    n = t.num_devices
    path, left = [int(np.argmin(t.prefix[:, -1]))], np.ones(n, bool)
    left[path[0]] = False
    hops = []
    while left.any():
        row = np.where(left, cost[path[-1]], _INF)
        nxt = int(np.argmin(row)) if np.isfinite(row).any() else int(np.flatnonzero(left)[0])
        hops.append(row[nxt])
        path.append(nxt)
        left[nxt] = False
    cuts = sorted(np.argsort(-np.asarray(hops), kind="stable")[: limit - 1] + 1)
    return [sorted(path[a:b]) for a, b in zip([0] + cuts, cuts + [n])]

