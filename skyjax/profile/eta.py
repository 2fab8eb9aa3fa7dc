"""The profiler's progress: its log callable wrapped so that each ``[profile] unit i/n ...`` line
also says which device of how many and an ETA. Kept beside the profiler, whose lines it reads.
Pure Python; no JAX."""

from __future__ import annotations

import re
import time
from typing import Callable, Sequence

from absl import logging as absl_logging


def format_duration(s: float | None) -> str:
    """``"4.6s"``, ``"3m05s"``, ``"2h07m"``; ``"--"`` when unknown."""
    if s is None or s != s or s < 0:
        return "--"
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


_UNIT_LINE = re.compile(r"\[profile\] unit (\d+)/(\d+) .* on (\S+)")


class ProfileProgress:
    """A profiler ``log`` callable that passes every message on to ``log`` and appends
    ``device d/D, ETA ...`` to the per-unit timing lines (``[profile] unit i/n NAME on DEVICE
    ...``). ``device_names``: the cluster's devices in order. The ETA assumes the units left
    take as long as the mean unit so far; identical units are reused and take no time, so early
    on it errs long."""

    def __init__(self, log: Callable[[str], None], device_names: Sequence[str], *,
                 clock: Callable[[], float] = time.perf_counter):
        self.log, self.clock = log, clock
        self.index = {name: d for d, name in enumerate(device_names)}
        self.num_devices = len(device_names)
        self.start = clock()

    @absl_logging.skip_log_prefix  # absl's log prefix names the profiler's line, not this one
    def __call__(self, msg: str) -> None:
        m = _UNIT_LINE.match(msg)
        if m:
            done, total, device = int(m.group(1)), int(m.group(2)), m.group(3)
            d = self.index.get(device)
            where = f"device {d + 1}/{self.num_devices}" if d is not None else f"device {device}"
            elapsed = self.clock() - self.start
            left = (total - done) * elapsed / done if done else None
            msg = f"{msg} | {where}, ETA {format_duration(left)}"
        self.log(msg)


def fmt_s(s: float) -> str:
    """Seconds, aligned for a column: ms below 10 s."""
    return f"{s * 1e3:8.2f} ms" if s < 10 else f"{s:8.2f} s "
