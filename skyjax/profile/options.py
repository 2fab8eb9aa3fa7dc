"""How hard and how robustly the profiler measures: :class:`Options`, :func:`robust_time` and
:func:`evict_caches`.

Shared by the unit timings (:mod:`skyjax.profile.unit_timing`), the stage calls
(:mod:`skyjax.profile.stage_calls`) and the link probes (:mod:`skyjax.profile.links`), which
must agree on what "the" time of a few repeats is.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from skyjax.names import ZERO_BUBBLE
from skyjax.profile.extension import CORE, ExtraProbes
from skyjax.relax import Relaxation

Log = Callable[[str], None]


@dataclasses.dataclass
class Options:
    """How hard to measure. ``repeats``: most timed repetitions per unit and device;
    ``budget_s``: timing budget per unit class and device class, which lowers the repeats of big
    units down to ``min_repeats``; ``dedup_units`` / ``dedup_devices``: measure identical units /
    devices once; ``link_sizes``: the two message sizes of the link probes (bytes);
    ``link_repeats``: timed round trips per size; ``memory_analysis``: record the compiled
    programs' ``memory_analysis()``; ``host``: extra probes (:mod:`skyjax.profile.extension`;
    the shared-host model's, ``skyjax.hostmodel.probes()``, on an emulated cluster sharing a
    host's cores; None on real accelerators), which may have processes time their devices one
    after another in ``passes`` passes and record more per device; without them every process
    times its own device at once, in one pass."""

    repeats: int = 5
    min_repeats: int = 3
    budget_s: float = 3.0
    dedup_units: bool = True
    dedup_devices: bool = True
    link_sizes: tuple[int, int] = (1 << 10, 1 << 20)
    link_repeats: int = 5
    memory_analysis: bool = True
    passes: int = 1
    host: ExtraProbes | None = None
    codecs: tuple[str, ...] = ()  # hand-off codecs to time (skyjax.codecs; the relaxation's)
    # also time each unit's backward split in B and W (profile.backward_weight_s): for runs whose
    # schedule is a zero-bubble one or "auto" (it costs every unit's backward once more per repeat)
    weight: bool = False

    @property
    def probes(self) -> ExtraProbes:
        """The probes the profiler calls: ``host``, or the core profiler's (no extra probes)."""
        return CORE if self.host is None else self.host

    @property
    def concurrent(self) -> bool:
        """Every process times its own device at the same time."""
        return not self.probes.one_at_a_time

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> "Options":
        """For the orchestrators: ``config.profile.repeats`` (``min_repeats`` no higher) and
        ``.passes``, ``weight`` where ``config.pipeline.schedule`` is a zero-bubble one or
        "auto", then ``overrides`` (the orchestrator passes ``host`` where
        ``config.cluster.shared_host``)."""
        section = getattr(config, "profile", None)
        repeats = int(getattr(section, "repeats", cls.repeats))
        relax = getattr(config, "relax", None)
        measured = Relaxation.from_config(config).measured_codecs if relax is not None else ()
        schedule = getattr(getattr(config, "pipeline", None), "schedule", "1f1b")
        opts = cls(repeats=repeats, min_repeats=min(cls.min_repeats, repeats),
                   passes=int(getattr(section, "passes", cls.passes)), codecs=measured,
                   weight=schedule in ZERO_BUBBLE + ("auto",))
        return dataclasses.replace(opts, **overrides)


def robust_time(xs: Sequence[float]) -> float:
    """Mean of the fastest half (rounded up) of the repeats. Interference from other processes
    only ever adds time, so the fast half is the least disturbed (the median moves with
    whatever else the host runs)."""
    xs = sorted(xs)
    return float(np.mean(xs[:max((len(xs) + 1) // 2, 1)]))


_EVICT_BYTES = 64 << 20  # above the last-level cache of the CPUs this runs on (32 MiB here)
_evict_buffer: list[np.ndarray] = []


def evict_caches() -> None:
    """Writes one word per cache line of a 64 MiB host buffer, pushing what the last calls left
    in the CPU's caches out to memory (an accelerator's own memory is not touched): for work the
    runtime does once per step, after the step's compute has streamed everything else through
    the caches (the optimizer update, putting the step's inputs)."""
    if not _evict_buffer:
        _evict_buffer.append(np.zeros(_EVICT_BYTES // 4, np.float32))
    _evict_buffer[0][::16] += 1.0
