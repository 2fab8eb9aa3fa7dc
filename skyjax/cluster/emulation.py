"""Emulated heterogeneity on the real execution path: slow devices and slow links.

So that the profiler *measures* a slow device the same way the runtime experiences it, never
reading the factor from the config:

* :func:`timed_call` runs a (jitted) call to completion, then sleeps ``(slowdown - 1) x elapsed``;
  the profiler and the runtime's stages both call it. Emulation needs the call's real end, so
  an emulated call always blocks; :func:`actions_block` is the runtime's rule for whether a
  stage's calls block at all (``config.pipeline.sync_actions``).
* :class:`LinkEmulation` gives the delay ``latency + bytes / bandwidth`` of a transfer; the
  transports (``skyjax.transport``) and the profiler's link probes wait it out.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
import weakref
from typing import Any, Callable

import numpy as np

from skyjax.names import SYNC_ACTIONS

# The last part of an emulated sleep is spun (yielding the GIL) for precision: time.sleep
# overshoots by ~50-100 us on Linux, which would distort the slow-down of sub-millisecond calls.
_SPIN_S = 2e-4

def precise_sleep(seconds: float, stop: threading.Event | None = None) -> bool:
    """Sleeps ``seconds`` with ~10 us precision (coarse sleep, then a short GIL-yielding spin).
    ``stop``: the coarse part waits on it instead, and returns False as soon as it is set (its
    run is stopping: a declared or emulated wait of hours ends with it, in any thread); True
    when the wait was not cut short."""
    if seconds <= 0:
        return True
    deadline = time.perf_counter() + seconds
    if seconds > _SPIN_S:
        if stop is None:
            time.sleep(seconds - _SPIN_S)
        elif stop.wait(min(seconds - _SPIN_S, threading.TIMEOUT_MAX)):
            return False
    while time.perf_counter() < deadline:
        time.sleep(0)
    return True


def block(tree: Any) -> Any:
    """``jax.block_until_ready`` that tolerates non-array leaves."""
    import jax

    return jax.block_until_ready(tree)


def _shapes(args: tuple) -> tuple:
    """The shapes a program is called with (with the function, it names the program). Shapes
    only, not ``skyjax.tree.tree_avals``: that costs ~2 ms for a stage's ~500 leaves, and is
    paid on every call of an emulated device."""
    import jax  # only once a program runs

    return tuple(getattr(x, "shape", None) for x in jax.tree.leaves(args))


# Fastest run seen of each program in this process (see timed_call): function -> shapes -> s.
# Weakly keyed, so a freed function (e.g. of a replaced executor) cannot lend its times.
_BEST_S: "weakref.WeakKeyDictionary[Callable, dict[tuple, float]]" = weakref.WeakKeyDictionary()


def actions_block(setting: str, platform: str, emulated: bool) -> bool:
    """Whether a pipeline stage's calls wait for their result (``config.pipeline.sync_actions``).

    ``emulated`` (a slow-down above 1 or emulated links): always, whatever ``setting``, since
    the emulation times the real end of each call and holds messages back from it. Otherwise
    ``"on"``: always; ``"off"``: never; ``"auto"``: on CPU only, where the host is the device
    (waiting costs nothing, and the spans are compute times), not on ``gpu``/``tpu``, whose
    queue then holds the next call while the current one runs."""
    if setting not in SYNC_ACTIONS:
        raise ValueError(f"config.pipeline.sync_actions={setting!r} is not one of "
                         f"{', '.join(map(repr, SYNC_ACTIONS))}")
    if emulated or setting == "on":
        return True
    return setting == "auto" and platform == "cpu"


def timed_call(fn: Callable, *args: Any, slowdown: float = 1.0, sync: bool = True,
               **kwargs: Any) -> tuple[Any, float]:
    """Runs ``fn(*args, **kwargs)`` to completion and returns ``(result, seconds)``.

    ``sync=False`` (ignored with ``slowdown > 1``): returns once the call is dispatched, without
    waiting for its result; ``seconds`` is then the dispatch time, not the compute time.

    With ``slowdown > 1`` the call then sleeps ``(slowdown - 1) x t``, so a device emulated as k
    times slower really takes k times as long; ``seconds`` is the total wall time (compute +
    emulation). ``t`` is the fastest run of the same program seen so far in this process (this
    one included): an emulated device is k times slower than this host *uncontended*, so when
    emulated devices share the host's cores the contention is not multiplied by k. The first
    call of a program (it compiles) is not slowed down. The one emulation used by both the
    profiler and the runtime.
    """
    # the emulation's own bookkeeping is not the device's time: done before the clock starts
    key = _shapes(args) if slowdown > 1 else None
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    if sync or slowdown > 1:
        result = block(result)
    elapsed = time.perf_counter() - start
    if slowdown > 1:
        try:
            seen = _BEST_S.setdefault(fn, {})
        except TypeError:  # not weakly referenceable: no memory, slowed by this run's own time
            seen = None
        best = seen.get(key) if seen is not None else elapsed
        if seen is not None:
            seen[key] = elapsed if best is None else min(best, elapsed)
        if best is not None:
            precise_sleep((slowdown - 1.0) * min(best, elapsed))
            elapsed = time.perf_counter() - start
    return result, elapsed


@dataclasses.dataclass
class LinkEmulation:
    """Emulated links: ``latency_s[src][dst]`` seconds plus ``bytes / bandwidth_Bps[src][dst]``.

    A bandwidth that is ``inf``, ``0`` or negative means no per-byte cost (not emulated).
    """

    latency_s: Any
    bandwidth_Bps: Any

    def __post_init__(self):
        self.latency_s = np.asarray(self.latency_s, dtype=np.float64)
        self.bandwidth_Bps = np.asarray(self.bandwidth_Bps, dtype=np.float64)

    @property
    def active(self) -> bool:
        bw = self.bandwidth_Bps
        return bool(np.any(self.latency_s > 0) or np.any(np.isfinite(bw) & (bw > 0)))

    def delay(self, src: int, dst: int, nbytes: int) -> float:
        """Seconds a transfer of ``nbytes`` from ``src`` to ``dst`` is held back (no sleeping)."""
        if src == dst:
            return 0.0
        seconds = float(self.latency_s[src, dst])
        bw = float(self.bandwidth_Bps[src, dst])
        if math.isfinite(bw) and bw > 0:
            seconds += nbytes / bw
        return seconds

    def wait(self, src: int, dst: int, nbytes: int) -> float:
        """Sleeps :meth:`delay` seconds; returns them."""
        seconds = self.delay(src, dst, nbytes)
        precise_sleep(seconds)
        return seconds
