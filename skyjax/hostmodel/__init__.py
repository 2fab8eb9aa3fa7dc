"""The shared-host model: optional cost terms and profile probes for emulated clusters whose
devices are processes sharing one host's CPU cores (``config.cluster.shared_host = True``).

On such a host, what the core cost model (:mod:`skyjax.plan.pricing.cost`) leaves out dominates; a GPU
or TPU cluster sees none of it, so none of this runs or is imported unless a caller asks:
:class:`SharedHostModel` is the planner's, simulator's and re-planner's
:class:`~skyjax.plan.model.extension.ExtraCost`; :func:`probes` the profiler's
:class:`~skyjax.profile.extension.ExtraProbes` (``skyjax.profile.options.Options.host``);
:func:`activate` prepares a process.

* ``sharing``: stages computing at once slow each other: the event replay of a plan's step;
* ``wake_cost``: what a call after idle costs, the replay's term;
* ``wake``: measuring calls after idle (a profile probe);
* ``messages``: what a message costs the stages computing beside it (a profile probe);
* ``passes``: several profiling passes, the median kept (the host's speed moves);
* ``profile_probes``: the profiler's hook (:class:`HostProbes`), built on the three above;
* ``contention``: ``stage_comparison.contention``, a stage's own cost against contention;
* ``malloc``: glibc's malloc thresholds fixed, so freed host memory stays mapped.
"""

from __future__ import annotations

from typing import Callable, Sequence

from skyjax.hostmodel import sharing
from skyjax.plan.model.types import Plan
from skyjax.profile.format import Profile


class SharedHostModel:
    """:class:`~skyjax.plan.model.extension.ExtraCost` for processes sharing a host's cores."""

    def step_s(self, plan: Plan, profile: Profile) -> float | None:
        """The event replay's step, with contention, calls after idle and poll lateness."""
        return sharing.replayed_step(plan, profile)

    def effect(self, plan: Plan, profile: Profile) -> tuple[float, list[float]] | None:
        out = sharing.replay_effect(plan, profile)
        return None if out is None else (out[0], out[1])

    def best_of(self, profile: Profile, base: Plan, plan_on: Callable[[Profile], Plan],
                evaluate: Callable[[list], Plan]) -> Plan:
        """Leaving some of a shared host's devices out (``sharing.best_subset``)."""
        return sharing.best_subset(profile, base, plan_on, evaluate)

    def calibration_groups(self, profile: Profile) -> Sequence[int | None] | None:
        """Devices sharing a host's cores take one calibration factor."""
        return sharing.host_groups(profile)

    def report(self, plan: Plan, profile: Profile, steps: Sequence) -> dict:
        """``contention``: each stage's actions split by whether another stage of its host
        computed beside them (where two of its stages share a host's cores)."""
        if sharing.stage_sharing(plan, profile) is None:
            return {}
        from skyjax.hostmodel.contention import contention_split

        return {"contention": contention_split(plan, profile, steps)}


def activate() -> None:
    """What a process of an emulated shared-host cluster does before its first buffers: keep
    freed host memory mapped (:mod:`.malloc`)."""
    from skyjax.hostmodel.malloc import keep_freed_memory

    keep_freed_memory()


def probes():
    """The profiler's extra probes for a shared host (:class:`.profile_probes.HostProbes`)."""
    from skyjax.hostmodel.profile_probes import HostProbes

    return HostProbes()
