"""Timing every device in several passes spread over the profile, keeping each unit's median.

A profile times each device for a few seconds, one device after another on a shared host
(:mod:`skyjax.profile.distributed`). On a host whose speed moves, a shared VM above all, such a
window can catch a slow period that the others miss, and the device then looks slower for the
whole run. ``Options.passes`` (``profile.passes``) times every device that many times, the order
of the devices reversed each pass, so that the device timed last in one pass is timed first in
the next, and keeps per unit and device the median of the passes: one pass in a slow (or a
fast) period is outvoted.

The median, not the fastest pass: the run that follows does not pick its moments either, it runs
at the host's typical speed, and the fastest pass under-predicts it. (Within a pass,
:func:`~skyjax.profile.options.robust_time` still keeps the fastest half of the repeats: there a
slow sample is another process's burst inside one call.)

The calls-after-idle extras (:mod:`skyjax.hostmodel.wake`) are differences measured within one
pass and the CPU-share figures describe a call, not a speed: both come from the first pass,
which alone measures them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

TIMES = ("forward_s", "backward_s", "update_s")  # [U, D] seconds: the passes' median per unit


def pass_order(num_devices: int, p: int) -> list[int]:
    """The devices' turns in pass ``p``: in order, reversed on every other pass."""
    order = list(range(num_devices))
    return order[::-1] if p % 2 else order


def median_pass(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """One :func:`skyjax.profile.units.measure_units` result from several passes of it: per
    unit and device the median of ``TIMES``, per device the median of each fixed call cost
    (``overheads``); NaN (a device not measured here) stays NaN. Everything else (unit records,
    CPU shares, calls after idle) is the first pass's; ``compile_s`` adds up; ``pass_work_s``
    ``[D][P]``: per device and pass its measured units' forward + backward seconds (how far
    the host's speed moved between passes; None for a device not measured here)."""
    first = passes[0]
    work = [np.asarray(r["forward_s"], float) + np.asarray(r["backward_s"], float)
            for r in passes]
    pass_work = [[float(np.nansum(w[:, d])) if not np.all(np.isnan(w[:, d])) else None
                  for w in work] for d in range(work[0].shape[1])]
    if len(passes) == 1:
        return {**first, "pass_work_s": pass_work}
    out = dict(first)
    out["pass_work_s"] = pass_work
    for key in (*TIMES, "backward_weight_s", "backward_input_s"):  # W, B: zero-bubble runs
        if first.get(key) is None:
            continue
        out[key] = _median([np.asarray(r[key], float) for r in passes])
    out["overheads"] = {key: _median([np.asarray(r["overheads"][key], float) for r in passes]
                                     ).tolist() for key in first["overheads"]}
    out["compile_s"] = float(sum(r["compile_s"] for r in passes))
    return out


def _median(arrays: list[np.ndarray]) -> np.ndarray:
    """Elementwise median over the passes, ignoring NaN where another pass has a value (all
    NaN stays NaN: a device not measured here)."""
    stacked = np.stack(arrays)
    out = np.full(stacked.shape[1:], np.nan)
    seen = ~np.all(np.isnan(stacked), axis=0)
    out[seen] = np.nanmedian(stacked[:, seen], axis=0)
    return out
