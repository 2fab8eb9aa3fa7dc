"""A rehearsal of another cluster (``config.rehearse``): its devices on this host's, its plan,
and every call and message of the run taking the time its profile declares.

:class:`Rehearsal` is the feature as one object, made once per process from the config
(:meth:`Rehearsal.from_config`, before JAX starts: it reads the profile and gives the run the
profile's devices and unit count, :func:`fit_config`). What builds the run takes it: the cluster
(:meth:`Rehearsal.cluster`: a logical device per profiled device, links carrying the plan's
declared bytes), the executors (:meth:`Rehearsal.stage`: a stage's declared times and the
ledger its calls go to) and the report (:meth:`Rehearsal.report`). Every process of a
distributed run makes its own from the same config; its ledger records that process's calls.
The times themselves are pure pricing (:mod:`skyjax.plan.replay.rehearsal`); reading a run's
config is this module's, not the planner's. A rehearsal's stop (:meth:`Rehearsal.stop`) ends
every declared wait of the run at once, and a run predicted to take over :data:`LONG_RUN_S`
is refused before it compiles unless ``config.rehearse.allow_long`` confirms it
(:meth:`Rehearsal.check_length`).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Callable

from skyjax import failures
from skyjax.cluster import Cluster, DeviceSpec
from skyjax.cluster.devices import select_devices
from skyjax.cluster.rehearsal import (RehearsalLedger, RehearsalLinks, WaitStop, merge,
                                      rehearsed_call, rehearsed_wait)
from skyjax.plan import Plan
from skyjax.plan.replay.rehearsal import (RehearsalTimes, StageTimes, rehearsal_times,
                                          scale_plan, scale_profile)
from skyjax.plan.replay.simulate import simulate_plan
from skyjax.profile.format import Profile, load_profile


# A rehearsal predicted to take longer than this (its steps x the plan's step in the time base)
# is refused unless config.rehearse.allow_long confirms it: a time scale or a declared link off
# by orders of magnitude would otherwise start a run of months, waiting without a word.
LONG_RUN_S = 24 * 3600.0


def wall_clock(seconds: float) -> str:
    """``seconds`` in the unit a person reads (s, min, h or days)."""
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:,.0f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.3g} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.3g} s"


def fit_config(config: Any) -> Profile | None:
    """Loads ``config.rehearse.profile`` (None when off) and makes the run its shape: one
    device per profiled device (``cluster.num_devices``) and the profile's unit count
    (``model.num_hidden_layers`` at ``allocation.granularity``: L + 2 units per layer, 3L + 2
    per sub-layer), the other model keys as the config has them. Raises ``ValueError`` naming
    the key or the profile's field. JSON only (called before JAX starts)."""
    path = config.rehearse.profile
    if not path:
        return None
    try:
        profile = load_profile(path)
    except ValueError as e:  # ProfileError: names the field
        raise ValueError(f"config.rehearse.profile={path!r}: {e}") from None
    units, granularity = profile.num_units, config.allocation.granularity
    per_layer = 1 if granularity == "layer" else 3
    layers, rest = divmod(units - 2, per_layer)
    if layers < 1 or rest:
        raise ValueError(
            f"config.rehearse.profile={path!r} has {units} units; a BERT at "
            f"config.allocation.granularity={granularity!r} has {per_layer}L + 2 (embeddings, "
            f"{'layers' if per_layer == 1 else 'three sub-layers per layer'}, the head)")
    if config.model.pretrained:
        raise ValueError(f"config.model.pretrained={config.model.pretrained!r} cannot be "
                         f"combined with config.rehearse.profile={path!r}: the rehearsal's "
                         "model takes its layer count from the profile")
    config.model.num_hidden_layers = layers
    config.cluster.num_devices = profile.num_devices
    return profile


@dataclasses.dataclass(frozen=True)
class StageRehearsal:
    """One stage's part of a rehearsal: its declared seconds, the ledger its calls go to and
    the run's :class:`~skyjax.cluster.rehearsal.WaitStop`, which ends its waits early."""

    times: StageTimes
    ledger: RehearsalLedger
    stop: WaitStop | None = None

    def call(self, what: str, fn: Callable, *args: Any) -> tuple[Any, float]:
        """``fn(*args)`` taking the declared ``what`` seconds (a :class:`StageTimes` field);
        ``(result, wall seconds)``."""
        return rehearsed_call(fn, *args, seconds=getattr(self.times, what), ledger=self.ledger,
                              stop=self.stop)

    def sync(self) -> None:
        """The step's synchronisation, as long as the profile declares it."""
        rehearsed_wait(self.times.sync_s, self.stop)


@dataclasses.dataclass(frozen=True, eq=False)
class Rehearsal:
    """The rehearsal of the cluster ``profile`` describes (``path``), every time x
    ``time_scale``. The planner plans ``profile`` as given; the run, its outputs and its report
    are in the time base, ``scaled`` (every time x k, bandwidths / k: the cost model's terms and
    the simulator's step scale by exactly k)."""

    path: str
    time_scale: float
    profile: Profile
    scaled: Profile
    ledger: RehearsalLedger = dataclasses.field(default_factory=RehearsalLedger)
    # ends every declared wait of the run early (:meth:`stop`)
    waits: WaitStop = dataclasses.field(default_factory=WaitStop)
    # the last plan's times (a plan's are computed once: the cluster and the executor read them)
    _times: list = dataclasses.field(default_factory=list, init=False, repr=False)

    @classmethod
    def from_config(cls, config: Any) -> Rehearsal | None:
        """The rehearsal ``config.rehearse`` sets (None when off); gives the config the
        profile's devices and unit count (:func:`fit_config`)."""
        profile = fit_config(config)
        if profile is None:
            return None
        k = float(config.rehearse.time_scale)
        return cls(str(config.rehearse.profile), k, profile, scale_profile(profile, k))

    def time_base(self, plan: Plan) -> Plan:
        """``plan`` (the planner's, on :attr:`profile`) in the time base: the same stages, cuts
        and shares, every predicted time x ``time_scale``."""
        return scale_plan(plan, self.time_scale)

    def check_length(self, plan: Plan, steps: int, allow_long: bool) -> None:
        """Refuses (``failures.BadInput``, one line stating the predicted wall-clock time) a run
        of ``steps`` steps of ``plan`` (in the time base) predicted to take over
        :data:`LONG_RUN_S`, unless ``allow_long`` (``config.rehearse.allow_long``)."""
        step = plan.step_time_s
        total = step * max(0, steps)
        if total <= LONG_RUN_S or allow_long:
            return
        raise failures.BadInput(
            f"config.rehearse.time_scale={self.time_scale:g}: the run's {steps} step(s) are "
            f"predicted to take {wall_clock(total)} of wall-clock time ({step:.6g} s a step "
            f"at this scale); a rehearsal predicted to take over {wall_clock(LONG_RUN_S)} "
            f"starts only with --config.rehearse.allow_long=True (or lower the time scale)")

    def times(self, plan: Plan) -> RehearsalTimes:
        """The declared times of the calls and messages of ``plan`` (in the time base)."""
        if not self._times or self._times[0] is not plan:
            self._times[:] = [plan, rehearsal_times(plan, self.scaled)]
        return self._times[1]

    def stage(self, plan: Plan, k: int) -> StageRehearsal:
        """Stage ``k`` of ``plan``'s declared times, its calls recorded in :attr:`ledger`."""
        return StageRehearsal(self.times(plan).stages[k], self.ledger, self.waits)

    def stop(self, reason: BaseException | str = "stopped") -> None:
        """Ends every declared wait of the run, in every thread, now and later (the run is
        stopping: a stage failed, or it was interrupted)."""
        self.waits.set(reason)

    def cluster(self, plan: Plan, mode: str) -> Cluster:
        """The profiled devices on this host: in one process, each on a local device in turn
        (the declared times, not the device, set its speed); under ``jax.distributed``, the
        first device of each process. Links carry ``plan``'s declared bytes, in the time
        base."""
        devices = select_devices("distributed", self.profile.num_devices)
        specs = [DeviceSpec(name=str(d.get("name", f"device{i}")),
                            kind=f"declared:{d.get('kind', 'device')}",
                            region=str(d.get("region") or "r0"),
                            process_index=int(devices[i].process_index))
                 for i, d in enumerate(self.profile.devices)]
        times = self.times(plan)
        links = RehearsalLinks(self.scaled.latency_s, self.scaled.bandwidth_Bps,
                               times.wire_bytes, times.coding_s)
        return Cluster(specs, devices, self.scaled.latency_s, self.scaled.bandwidth_Bps,
                       emulate_links=True, mode=mode, rehearsal_links=links)

    def report(self, plan: Plan, step_times: list[float], calls: list[dict] | None) -> dict:
        """summary.json's ``rehearsal``: the median measured step (the first, compiling step
        left out; the mean under DiLoCo, whose exchange every H steps the model amortises)
        against the simulator's step and the cost model's ``T``, in the time base and divided
        by ``time_scale`` (the declared cluster's seconds), the devices and pipelines used, and
        per call the real compute and this host's overhead (``calls``: every process's
        :attr:`ledger`; None on processes other than 0)."""
        simulated = simulate_plan(plan, self.scaled).step_time_s
        steps = step_times[1:] or step_times
        # DiLoCo exchanges every H steps and the model amortises it (AR / H): the mean, not the
        # median, is what it predicts
        average = statistics.mean if plan.averaging.startswith("diloco") else statistics.median
        measured = average(steps) if steps else float("nan")
        k = self.time_scale
        model = plan.model_s if plan.model_s is not None else plan.step_time_s
        return {
            "profile": self.path, "time_scale": k,
            "devices": self.scaled.num_devices, "devices_used": len(plan.stages),
            "pipelines": plan.num_pipelines, "schedule": plan.schedule,
            "microbatches": plan.microbatches,
            "measured_step_s": measured, "simulated_step_s": simulated,
            "model_step_s": model,
            "error": (measured - simulated) / simulated if simulated else None,
            "declared_cluster_step_s": {"measured": measured / k, "simulated": simulated / k,
                                        "model": model / k},
            "steps_measured": len(steps),
            "calls": merge(calls) if calls else None,
        }
