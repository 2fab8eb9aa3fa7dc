"""Lower-bound certificates: relaxations that only tighten a plan's ``lower_bound_s`` and its
``exact`` flag, never the plan. The planner runs them only when asked (``plan(..., certify=True)``,
``python -m skyjax.plan --certify``): at the paper's scale they take seconds.

* ``region_bound`` (1F1B): each region of devices visited in one run;
* ``chain_bound`` (GPipe): device kinds priced along an exact chain of blocks;
* ``priced_chain``: that chain's least priced path at a cap, for a batch of prices;
* ``chain_prices``: the prices tried, by column generation over caps;
* ``once_bound`` (GPipe): ``chain_bound``'s sum term over plans visiting every region once;
* ``master_lp``: the master problem's prices for that column generation.
"""

from __future__ import annotations

from skyjax.plan.pricing.cost import Tables
from skyjax.plan.bounds.group_terms import GroupBound


def certificate(t: Tables, step_s: float, gb: GroupBound, goal_gap: float,
                region_gap: float) -> float:
    """The larger of region_bound and chain_bound for tables ``t`` and a plan of analytic T
    ``step_s`` (chain_bound aims ``goal_gap`` below it, just inside ``region_gap``)."""
    from skyjax.plan.certificates.chain_bound import chain_bound
    from skyjax.plan.certificates.region_bound import region_bound

    return max(region_bound(t, step_s, gb=gb),
               chain_bound(t, step_s, gb, goal=step_s / (1 + min(goal_gap, max(region_gap, 0)))))
