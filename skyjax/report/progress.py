"""Progress a person can read while a run goes on: step/total, loss, throughput and an ETA.

* :class:`Progress` (training): :meth:`~Progress.line` is the one log line per log step
  (``step 25/200 (12%)  loss 0.8123 ... ETA 4.6s``); on a terminal :meth:`~Progress.update` also
  redraws a live bar on stderr after every step. When stderr is not a terminal (log files,
  launchers prefixing ``[pK]``, SLURM output files, notebooks) there is no bar, only the lines,
  because carriage returns turn such files into one unreadable line.
* :class:`~skyjax.profile.eta.ProfileProgress` (profiling, kept beside the profiler whose lines
  it reads): ``device 5/8, ETA ...`` on each ``[profile] unit 37/483 ...`` line.

The ETA is the remaining steps times the median time of the last :data:`ETA_WINDOW` steps, the
first step left out: the median ignores the few steps that compile something (the first, often
the second) and keeps up when the pace changes. Pure Python; no JAX.
"""

from __future__ import annotations

import collections
import statistics
import sys
import time
from typing import Any, Callable, Sequence, TextIO

from skyjax.profile.eta import format_duration

BAR_WIDTH = 24
REDRAW_S = 0.2  # the live bar is redrawn at most this often
ETA_WINDOW = 50  # steps whose median time estimates the rest


def eta_s(done: int, total: int, step_s: Sequence[float]) -> float | None:
    """Seconds left for ``total - done`` items at the median of ``step_s`` (recent items' times,
    the first item's left out); None while there are none."""
    if done >= total:
        return 0.0
    if not step_s:
        return None
    return (total - done) * statistics.median(step_s)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """Progress of ``total`` training steps of ``batch_size`` examples each.

    ``live``: draw the bar (default: when ``stream`` is a terminal). ``clock``: seconds (tests
    pass a fake one)."""

    def __init__(self, total: int, batch_size: int, *, stream: TextIO | None = None,
                 live: bool | None = None, clock: Callable[[], float] = time.perf_counter):
        self.total, self.batch_size = int(total), int(batch_size)
        self.stream = stream if stream is not None else sys.stderr
        self.live = _is_terminal(self.stream) if live is None else live
        self.clock = clock
        self.done = 0
        self._last: float | None = None  # when the previous step ended
        self._step_s: collections.deque = collections.deque(maxlen=ETA_WINDOW)
        self._window = (0, clock())  # (steps done, time) at the previous log line
        self._drawn = 0.0
        self._loss: float | None = None

    def update(self, done: int, loss: float | None = None) -> None:
        """Step ``done`` (1-based) has finished; redraws the live bar on a terminal."""
        now = self.clock()
        if self._last is not None and done > 1 and done > self.done:
            self._step_s.append((now - self._last) / (done - self.done))
        self.done, self._last = done, now
        self._loss = loss if loss is not None else self._loss
        if self.live and (now - self._drawn >= REDRAW_S or done == self.total):
            self._drawn = now
            self.stream.write("\r" + self.bar() + "\033[K")
            self.stream.flush()

    def eta(self) -> float | None:
        return eta_s(self.done, self.total, self._step_s)

    def examples_per_s(self) -> float | None:
        """Throughput over the steps since the previous :meth:`line` (or the start)."""
        steps, since = self._window
        elapsed = self.clock() - since
        return (self.done - steps) * self.batch_size / elapsed if elapsed > 0 else None

    def bar(self) -> str:
        frac = self.done / self.total if self.total else 1.0
        filled = int(round(frac * BAR_WIDTH))
        loss = f"  loss {self._loss:.4f}" if self._loss is not None else ""
        return (f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] step {self.done}/{self.total}"
                f"{loss}  ETA {format_duration(self.eta())}")

    def line(self, record: dict) -> str:
        """The log line of a metrics record (``step``, ``loss``, ``accuracy``,
        ``learning_rate``, ``step_time_s``, optional ``examples_per_s``); starts a new
        throughput window and clears the live bar so the line is not drawn over it."""
        step = record.get("step", self.done)
        parts = [f"step {step}/{self.total} ({step / max(self.total, 1):.0%})"]
        if "loss" in record:
            parts.append(f"loss {record['loss']:.4f}")
        if "accuracy" in record:
            parts.append(f"accuracy {record['accuracy']:.3f}")
        if "learning_rate" in record:
            parts.append(f"lr {record['learning_rate']:.2e}")
        if record.get("examples_per_s"):
            parts.append(f"{record['examples_per_s']:.0f} examples/s")
        if "step_time_s" in record:
            parts.append(f"{record['step_time_s']:.3f} s/step")
        parts.append(f"ETA {format_duration(self.eta())}")
        self._window = (self.done, self.clock())
        self.clear()
        return "  ".join(parts)

    def clear(self) -> None:
        """Erases the live bar (before a log line, and at the end)."""
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()

    close = clear


# What skyjax.profile.units logs after timing a unit on a device (one line per device class).
