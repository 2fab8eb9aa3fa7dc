"""The cost model's term for calls after idle: a device's extra seconds per action after an
idle gap (profile.json ``devices[d]["wake_s"]``, measured by ``skyjax.hostmodel.wake``).

The analytic T has no gaps; the event replay of ``skyjax.hostmodel.sharing`` knows when each
action starts and so the gap before it: the wait since the stage's previous action ended, plus
that action's emulated sleep (a CPU device slowed k times computes for 1/k of its call and
sleeps the rest: the part ``sharing.cpu_shares`` does not count as CPU work). The extra grows
with the data an action touches (what left the caches while it waited): the profiler measures
it on the longest unit (``wake_s``) and on the shortest (``wake_light_s``), and a stage's table
lies between the two by its work (``wake_work_s``: their forward + backward seconds there);
a stage at least as heavy as the longest unit pays the longest unit's extra. Pure functions
over profile data; no JAX.
"""

from __future__ import annotations

import numpy as np

Table = tuple[np.ndarray, np.ndarray]


def wake_table(device: dict, work_s: float | None = None) -> Table | None:
    """A profile device record's extra per action after idle as (gaps, extras) with (0, 0)
    first, for a stage whose forward + backward take ``work_s`` on it (call costs included;
    None: the longest unit's); None where ``wake_s`` is absent, malformed or all zero (no cost
    after idle)."""
    heavy = _pairs(device.get("wake_s"))
    if heavy is None or not heavy[:, 1].any():
        return None
    gaps, extras = heavy[:, 0], heavy[:, 1]
    light = _pairs(device.get("wake_light_s"))
    work = _works(device.get("wake_work_s"))
    if work_s is not None and light is not None and work is not None:
        t = float(np.clip((work_s - work[0]) / (work[1] - work[0]), 0.0, 1.0))
        at = np.interp(gaps, np.concatenate([[0.0], light[:, 0]]),
                       np.concatenate([[0.0], light[:, 1]]))
        extras = at + t * (extras - at)
    return np.concatenate([[0.0], gaps]), np.concatenate([[0.0], extras])


def _pairs(value) -> np.ndarray | None:
    """``[[gap_s, extra_s], ...]`` sorted by gap; None where absent, empty or malformed."""
    try:
        arr = np.asarray(value, float).reshape(-1, 2)
    except (TypeError, ValueError):
        return None
    if not len(arr) or not np.isfinite(arr).all() or (arr < 0).any():
        return None
    return arr[np.argsort(arr[:, 0])]


def _works(value) -> tuple[float, float] | None:
    """``wake_work_s`` as (light, heavy) seconds; None unless finite with light < heavy."""
    try:
        light, heavy = (float(x) for x in value)
    except (TypeError, ValueError):
        return None
    ok = np.isfinite([light, heavy]).all() and 0 <= light < heavy
    return (light, heavy) if ok else None


def stage_work_s(profile, device: int, units: tuple[int, int]) -> float:
    """Forward + backward seconds of one micro-batch of ``units`` on ``device``, with its call
    costs: the currency of ``wake_work_s``."""
    a, b = units
    return float(profile.forward_s[a:b, device].sum() + profile.backward_s[a:b, device].sum()
                 + profile.forward_call_s[device] + profile.backward_call_s[device])


def wake_extra(table: Table | None, gap_s: float) -> float:
    """The extra seconds of an action after ``gap_s`` idle: linear between the measured gaps,
    the last one's beyond it (it is not extrapolated)."""
    if table is None or gap_s <= 0:
        return 0.0
    return float(np.interp(gap_s, table[0], table[1]))
