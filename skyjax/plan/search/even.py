"""The ``even`` strategy: the baseline the optimal planner is measured against.

It uses every device in profile order with unit counts as equal as possible, the remainder to the
first stages; with more devices than units, only the first U devices. No search: the result is
priced by :func:`skyjax.plan.pricing.cost.evaluate` like any other assignment.
"""

from __future__ import annotations

from typing import Sequence


def even_assignment(num_units: int, devices: Sequence[int]) -> list[tuple[int, int, int]]:
    """Equal unit counts over the devices in order, the remainder to the first stages; with
    more devices than units only the first num_units devices are used."""
    devices = list(devices)[:num_units]
    base, extra = divmod(num_units, len(devices))
    out, pos = [], 0
    for k, d in enumerate(devices):
        n = base + (1 if k < extra else 0)
        out.append((d, pos, pos + n))
        pos += n
    return out
