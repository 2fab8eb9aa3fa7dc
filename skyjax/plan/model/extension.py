"""Extra cost terms: what a caller may add to the core cost model, and nothing more.

The core model (:mod:`skyjax.plan.pricing.cost`) prices a plan for devices that compute
independently: per-unit compute, fixed per-action and per-message costs, the update, links and
memory. A cluster whose devices interfere in ways that model does not express (processes that share
one host's CPU cores: :mod:`skyjax.hostmodel`) hands the planner, the simulator and the re-planner
an :class:`ExtraCost`; ``None``, the default everywhere, is the core model alone, and then nothing
of the extra model runs or is imported. Pure typing; no JAX.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from skyjax.plan.model.types import Plan
from skyjax.profile.format import Profile


class ExtraCost(Protocol):
    """Terms the analytic step time T cannot express; each may return ``None`` for "no effect"."""

    def step_s(self, plan: Plan, profile: Profile) -> float | None:
        """A step time for ``plan`` that the cost model takes where it exceeds the analytic T
        (T is never below the analytic T, so every bound of the searches stays valid)."""

    def effect(self, plan: Plan, profile: Profile) -> tuple[float, list[float]] | None:
        """What the terms add to the simulated step (seconds) and each stage's busy-time ratio
        (with them / without): the simulator and the re-planner's calibration use it."""

    def best_of(self, profile: Profile, base: Plan, plan_on: Callable[[Profile], Plan],
                evaluate: Callable[[list], Plan]) -> Plan:
        """``base`` or a better plan that the searches, which optimise the analytic T, cannot
        find: ``plan_on(profile)`` plans a modified profile, ``evaluate(assignment)`` prices an
        assignment on the full one."""

    def calibration_groups(self, profile: Profile) -> Sequence[int | None] | None:
        """Per device, a group whose devices the re-planner corrects with one shared factor
        (None: a factor of its own); None when no device is grouped."""
