"""The cost model's term for calls after idle: a device's extra seconds per action after an
idle gap (profile.json ``devices[d]["wake_s"]``, measured by ``skyjax.profile.wake``).

The analytic T has no gaps; the event replay of ``skyjax.plan.sharing`` knows when each
action starts and so the gap before it: the wait since the stage's previous action ended, plus
that action's emulated sleep (a CPU device slowed k times computes for 1/k of its call and
sleeps the rest: the part ``sharing.cpu_shares`` does not count as CPU work). Pure functions
over profile data; no JAX.
"""

from __future__ import annotations

import numpy as np

Table = tuple[np.ndarray, np.ndarray]


def wake_table(device: dict) -> Table | None:
    """A profile device record's ``wake_s`` as (gaps, extras) with (0, 0) first; None where
    absent, malformed or all zero (no cost after idle)."""
    pairs = device.get("wake_s")
    try:
        arr = np.asarray(pairs, float).reshape(-1, 2)
    except (TypeError, ValueError):
        return None
    if not len(arr) or not np.isfinite(arr).all() or (arr < 0).any() or not arr[:, 1].any():
        return None
    arr = arr[np.argsort(arr[:, 0])]
    return np.concatenate([[0.0], arr[:, 0]]), np.concatenate([[0.0], arr[:, 1]])


def wake_extra(table: Table | None, gap_s: float) -> float:
    """The extra seconds of an action after ``gap_s`` idle: linear between the measured gaps,
    the last one's beyond it (it is not extrapolated)."""
    if table is None or gap_s <= 0:
        return 0.0
    return float(np.interp(gap_s, table[0], table[1]))

