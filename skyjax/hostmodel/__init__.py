"""The shared-host model: optional cost terms and profile probes for emulated clusters whose
devices are processes sharing one host's CPU cores (``config.cluster.shared_host = True``).

On such a host, what the core cost model (:mod:`skyjax.plan.cost`) leaves out dominates: stages
computing at once slow each other (:mod:`.sharing`), a call after idle costs more
(:mod:`.wake_cost`, measured by :mod:`.wake`), a CPU receive wakes late (``poll``), a message
costs the stages computing beside it (:mod:`.messages`), and the host's speed moves during
profiling (:mod:`.passes`). A GPU or TPU cluster sees none of these, so none of this runs or is
imported unless a caller asks: :class:`SharedHostModel` is the planner's, simulator's and
re-planner's :class:`~skyjax.plan.extension.ExtraCost`; :class:`HostProbes` the profiler's
extra probes (``skyjax.profile.options.Options.host``); :func:`activate` prepares a process.
"""

from __future__ import annotations

from typing import Callable, Sequence

from skyjax.hostmodel import sharing
from skyjax.plan.types import Plan
from skyjax.profile.format import Profile


class SharedHostModel:
    """:class:`~skyjax.plan.extension.ExtraCost` for processes sharing a host's cores."""

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
