"""A rehearsal's calls and links: they take the times a profile of another cluster declares
(``config.rehearse``; the figures come from ``skyjax.plan.replay.rehearsal``, the run's object
is ``skyjax.runtime.rehearsal.Rehearsal``).

* :func:`rehearsed_call` runs a call to completion, then waits until ``seconds`` after its
  start: the real model computes inside the declared time and the call waits out the rest. A
  call whose real compute is longer (an *overrun*) is not cut short; the run's
  :class:`RehearsalLedger` counts it, so the run can say by how much the host fell behind the
  declared cluster.
* :class:`WaitStop` ends every declared wait early, in whichever thread waits, once its run
  stops (a stage failed, or the run was interrupted): a wait of hours is no reason to keep a
  stopped run alive.
* :class:`RehearsalLinks` is a ``LinkEmulation`` whose messages weigh the bytes the profiled
  model sends on that link, not the rehearsing model's, so a small BERT's hand-offs take
  BERT-large's time; the transports' link clock waits it out as for any emulated link.

Unlike ``cluster.slowdowns`` (which multiplies this host's measured compute, contention
included), nothing here depends on how fast this host is, as long as it keeps up: that is what
lets one host rehearse 64 devices.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
import weakref
from typing import Any, Callable

import numpy as np

from skyjax.cluster.emulation import LinkEmulation, block


@dataclasses.dataclass
class RehearsalLedger:
    """What a rehearsal's calls in this process did: per call the real compute and how late it
    ended against its declared end (its host overhead: a wake-up's overshoot, a thread waiting
    for the interpreter); overruns (real compute over the declared time) by count, total and
    largest. A program's first call compiles: it is not recorded (:meth:`first_call`)."""

    calls: int = 0
    real_s: float = 0.0
    real_max_s: float = 0.0
    late_s: float = 0.0
    late_max_s: float = 0.0
    overruns: int = 0
    overrun_s: float = 0.0
    overrun_max_s: float = 0.0
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)
    # programs called before (not weakly referenceable ones: never first)
    _seen: "weakref.WeakSet[Callable]" = dataclasses.field(default_factory=weakref.WeakSet,
                                                           repr=False)

    def record(self, real_s: float, declared_s: float, total_s: float) -> None:
        late = max(0.0, total_s - max(real_s, declared_s))
        with self._lock:
            self.calls += 1
            self.real_s += real_s
            self.real_max_s = max(self.real_max_s, real_s)
            self.late_s += late
            self.late_max_s = max(self.late_max_s, late)
            if real_s > declared_s:
                self.overruns += 1
                self.overrun_s += real_s - declared_s
                self.overrun_max_s = max(self.overrun_max_s, real_s - declared_s)

    def first_call(self, fn: Callable) -> bool:
        """Whether this is ``fn``'s first call (it compiles), remembering it."""
        with self._lock:
            try:
                first = fn not in self._seen
                self._seen.add(fn)
            except TypeError:  # not weakly referenceable: every call counts
                first = False
        return first

    def to_json(self) -> dict:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                    if not f.name.startswith("_")}



def merge(records: list[dict]) -> dict:
    """One summary of several processes' :meth:`RehearsalLedger.to_json` records: the totals,
    the largest, and per call the mean real compute and lateness (the host overhead per action)."""
    calls = sum(r["calls"] for r in records)
    out = {
        "calls": calls,
        "real_mean_s": sum(r["real_s"] for r in records) / calls if calls else 0.0,
        "real_max_s": max((r["real_max_s"] for r in records), default=0.0),
        "overhead_mean_s": sum(r["late_s"] for r in records) / calls if calls else 0.0,
        "overhead_max_s": max((r["late_max_s"] for r in records), default=0.0),
        "overruns": sum(r["overruns"] for r in records),
        "overrun_total_s": sum(r["overrun_s"] for r in records),
        "overrun_max_s": max((r["overrun_max_s"] for r in records), default=0.0),
    }
    return out


class Stopped(RuntimeError):
    """A declared wait cut short: its run is stopping (:class:`WaitStop`)."""


class WaitStop:
    """What ends a run's declared waits early. :meth:`set` (with the reason: the failure, or
    the interrupt) wakes every thread waiting in :meth:`wait` at once, and every later wait
    ends at once too: the local executor sets it when a stage fails or its main thread is
    interrupted, so that its stage threads end instead of waiting out their declared times
    (hours at a large time scale, and the run's cleanup joins them). Waits in a main thread end
    by the signal's own ``KeyboardInterrupt`` as well."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: str | None = None

    def set(self, reason: BaseException | str = "stopped") -> None:
        if self.reason is None:
            self.reason = str(reason) or type(reason).__name__
        self._event.set()

    def wait(self, seconds: float) -> None:
        """Waits ``seconds`` (one timed wait, no spin: many stage threads share the host, and a
        spin would take their cores); raises :class:`Stopped` once :meth:`set`."""
        if seconds > 0 and self._event.wait(min(seconds, threading.TIMEOUT_MAX)):
            raise Stopped(f"a declared wait of {seconds:.6g} s stopped ({self.reason})")


def rehearsed_call(fn: Callable, *args: Any, seconds: float, ledger: RehearsalLedger,
                   stop: WaitStop | None = None, **kwargs: Any) -> tuple[Any, float]:
    """Runs ``fn(*args, **kwargs)`` to completion, then waits until ``seconds`` after its start;
    returns ``(result, wall seconds)``, recorded in ``ledger`` unless it is the program's first
    call (it compiles). The wait is one timed wait (no spin: many stage threads share the host,
    and a spin would take their cores); its overshoot is recorded as overhead. ``stop``: the
    wait ends with :class:`Stopped` as soon as it is set."""
    start = time.perf_counter()
    result = block(fn(*args, **kwargs))
    real = time.perf_counter() - start
    if seconds > real:
        rehearsed_wait(seconds - real, stop)
    total = time.perf_counter() - start
    if not ledger.first_call(fn):
        ledger.record(real, seconds, total)
    return result, total


def rehearsed_wait(seconds: float, stop: WaitStop | None = None) -> None:
    """A declared span with no call in it (the step's synchronisation); ``stop`` as for
    :func:`rehearsed_call`."""
    if seconds <= 0:
        return
    if stop is None:
        time.sleep(seconds)
    else:
        stop.wait(seconds)


class RehearsalLinks(LinkEmulation):
    """Links of a rehearsed cluster: a message from ``src`` to ``dst`` takes ``latency +
    wire_bytes / bandwidth + coding_s`` whatever it really carries (``nbytes`` 0 asks for the
    latency alone, as the link clock does). Pairs with no declared bytes (none planned between
    them) carry what they really carry."""

    def __init__(self, latency_s: Any, bandwidth_Bps: Any, wire_bytes: Any = None,
                 coding_s: Any = None):
        super().__init__(latency_s, bandwidth_Bps)
        n = self.latency_s.shape[0]
        self.wire_bytes = np.zeros((n, n)) if wire_bytes is None else np.asarray(wire_bytes,
                                                                                 float)
        self.coding_s = np.zeros((n, n)) if coding_s is None else np.asarray(coding_s, float)

    @property
    def active(self) -> bool:
        return True

    def delay(self, src: int, dst: int, nbytes: int) -> float:
        if src == dst:
            return 0.0
        seconds = float(self.latency_s[src, dst])
        if nbytes <= 0:
            return seconds
        declared = float(self.wire_bytes[src, dst])
        bw = float(self.bandwidth_Bps[src, dst])
        if math.isfinite(bw) and bw > 0:
            seconds += (declared if declared > 0 else nbytes) / bw
        return seconds + float(self.coding_s[src, dst])
