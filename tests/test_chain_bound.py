"""chain_bound (GPipe: device kinds priced along an exact chain of blocks) never exceeds the
brute-force optimum, and is stronger than group_bound where whole blocks and carriers matter.

A bound above the optimum would let the planner call a poor plan exact or print a false gap, so
it is checked on random small instances: regions of interchangeable links with slow links
between them and memory that binds at m in flight, random links (every device its own link
group, so up to five groups and their crossings), and the profile's fixed costs on a quarter.
Each is checked with the optimum as the known plan (the planner's tightest use) and with a
looser one, alone and after group_bound (which shares its B grid).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.plan.certificates import priced_chain
from skyjax.plan.certificates.chain_bound import chain_bound
from skyjax.plan.certificates.priced_chain import PricedChain
from skyjax.plan.pricing.classes import link_groups
from skyjax.plan.bounds.group_bound import group_bound
from skyjax.plan.bounds.group_terms import GroupBound
from skyjax.plan.certificates.master_lp import master_prices
from tests.helpers import (all_plans, as_solution, brute_force, group_visits, random_profile,
                           region_instances, region_profile, with_overheads)


def _check(prof, m: int, case) -> tuple[bool, bool]:
    """chain_bound <= the optimum (fresh, after group_bound, with a looser plan); whether the
    instance was feasible and whether the bound beat group_bound."""
    want = brute_force(prof, "gpipe", m)
    if math.isinf(want):
        return False, False
    t = plan_lib.tables(prof, "gpipe", m)
    fresh = chain_bound(t, upper=want)
    assert fresh <= want * (1 + 1e-9), (case, fresh, want)
    assert chain_bound(t, upper=want * 1.3) <= want * (1 + 1e-9), case
    apart = chain_bound(t, upper=want, goal=want)  # once-each plans bounded apart throughout
    assert apart <= want * (1 + 1e-9), (case, apart, want)
    gb = GroupBound(t)
    g = group_bound(t, upper=want, gb=gb)
    assert gb.b_grid is not None, case
    shared = chain_bound(t, upper=want, gb=gb)  # refines group_bound's grid
    assert shared <= want * (1 + 1e-9), (case, shared, want)
    return True, max(fresh, shared) > g * (1 + 1e-6)


def test_chain_bound_below_optimum_regions():
    rng = np.random.default_rng(31)
    n = stronger = 0
    for i in range(60):
        d, u = int(rng.integers(2, 6)), int(rng.integers(3, 8))
        prof = region_profile(rng, d, u, int(rng.integers(1, 4)))
        if i % 4 == 0:
            prof = with_overheads(prof, rng, 0.05)
        ok, beat = _check(prof, (2, 4, 8)[i % 3], (i, d, u))
        n, stronger = n + ok, stronger + beat
    assert n >= 35 and stronger >= 1, (n, stronger)


def test_chain_bound_below_optimum_random_links():
    rng = np.random.default_rng(32)
    n = 0
    for i in range(50):
        d, u = int(rng.integers(1, 6)), int(rng.integers(2, 7))
        prof = random_profile(rng, d, u)
        if i % 4 == 0:
            prof = with_overheads(prof, rng, 0.1)
        n += _check(prof, (2, 3, 8)[i % 3], (i, d, u))[0]
    assert n >= 25


def test_chain_dp_prices_are_valid_bounds():
    """Any prices >= 0 give a bound <= the optimum's sum of stage times at its bottleneck
    (weak duality), and the DP's own path accounts for its value exactly."""
    rng = np.random.default_rng(33)
    seen = 0
    for i in range(30):
        prof = region_profile(rng, int(rng.integers(3, 6)), int(rng.integers(3, 7)), 2)
        want = brute_force(prof, "gpipe", 4)
        t = plan_lib.tables(prof, "gpipe", 4)
        gb = GroupBound(t)
        if math.isinf(want) or not gb.ok or len(gb.groups) < 2:
            continue
        opt = plan_lib.searched_plan(prof, "optimal", "gpipe", 4)
        sums = sum(s.time_s for s in opt.stages)
        if not opt.exact or abs(opt.step_time_s - want) > 1e-9 * want:
            continue
        if len({gb.groups[g][0] for g in range(len(gb.groups))}) < 2:
            continue
        dp = PricedChain(gb, opt.bottleneck_s * 1.5)
        mus = rng.uniform(0, 2 * opt.bottleneck_s, (4, len(dp.n)))
        val, counts, total, top = dp.price(mus, np.full(4, opt.bottleneck_s))
        regions = {int(np.flatnonzero([s.device in g for g in gb.groups])[0]) for s in opt.stages}
        if len(regions) == len(gb.groups):  # the optimum visits every group: it is a path
            assert (val <= sums * (1 + 1e-9)).all(), (i, val, sums)
        fin = np.isfinite(val)
        assert np.allclose(val[fin], (total + ((counts - dp.n) * mus).sum(axis=1))[fin])
        assert (top[fin] <= opt.bottleneck_s * (1 + 1e-9)).all()
        seen += 1
    assert seen >= 5


def test_master_matches_a_hand_solved_lp():
    """Two kinds, one device each, two paths: one uses kind 0 twice (sum 1), one uses kind 1
    once (sum 3). The master mixes them half and half: value 2, where min(1 + mu_0, 3 - mu_0)
    peaks (mu_0 = 1)."""
    mu, value = master_prices(np.array([1.0, 3.0]), np.array([[2.0, 0.0], [0.0, 1.0]]),
                              np.array([1.0, 1.0]), big=100.0)
    assert value == pytest.approx(2.0)
    assert mu == pytest.approx([1.0, 0.0])
    mu, value = master_prices(np.array([1.0, 3.0]), np.array([[2.0, 0.0], [0.0, 1.0]]),
                              np.array([1.0, 1.0]), big=100.0,
                              box=(np.zeros(2), np.full(2, 0.5)))
    assert (mu <= 0.5 + 1e-12).all()


def test_chain_bound_applies_to_gpipe_only(monkeypatch):
    rng = np.random.default_rng(34)
    prof = region_profile(rng, 4, 5, 2)
    for schedule, m in (("1f1b", 8), ("gpipe", 1)):
        assert chain_bound(plan_lib.tables(prof, schedule, m), upper=1e9) == -math.inf
    assert chain_bound(plan_lib.tables(prof, "gpipe", 4)) == -math.inf  # no known plan
    monkeypatch.setattr(priced_chain, "MAX_CELLS", 0)  # too large a DP: no bound, no error
    assert chain_bound(plan_lib.tables(prof, "gpipe", 4), upper=1e9) == -math.inf


def test_revisits_bound_is_below_every_plan_that_does_not_visit_each_group_once():
    """``chain_bound(revisits=True)`` is below every plan that does not visit each link group
    once, in one run (brute force over every plan); with the least T of the plans that do, it
    bounds the optimum."""
    n = 0
    for i, (_, prof, t) in enumerate(region_instances(35, 80, (2, 5), (3, 6))):
        groups = link_groups(t)
        plans = [(p.step_time_s, group_visits(groups, p)[1])
                 for p in all_plans(prof, "gpipe", t.microbatches)]
        once = min((x for x, o in plans if o), default=math.inf)
        other = min((x for x, o in plans if not o), default=math.inf)
        if not math.isfinite(min(once, other)):
            continue
        if math.isfinite(other):
            got = chain_bound(t, upper=other, revisits=True)
            assert got <= other * (1 + 1e-9), (i, got, other)
        n += 1
    assert n >= 30, n


def test_chain_with_g_crossings_holds_every_revisiting_plan():
    """With G crossings required, the unpriced chain DP at a revisiting plan's bottleneck is at
    most that plan's sum of stage times (the plan is one of its paths); revisits with exactly G
    crossings are the common case here, so requiring one more would fail this."""
    rng = np.random.default_rng(36)
    seen = 0
    for i in range(60):
        prof = region_profile(rng, int(rng.integers(3, 5)), int(rng.integers(3, 6)), 2)
        t = plan_lib.tables(prof, "gpipe", (2, 4, 8)[i % 3])
        gb = GroupBound(t)
        if not gb.ok or len(gb.groups) != 2:
            continue
        assert not t.update_call.any() and not t.update_prefix.any()  # total = sum t_k
        groups = link_groups(t)
        revisits = [as_solution(p) for p in all_plans(prof, "gpipe", t.microbatches)
                    if group_visits(groups, p)[0] >= 2]
        if not revisits:
            continue
        best = min(revisits, key=lambda sol: sol.total)
        dp = PricedChain(gb, best.bottleneck * 1.5, crossings=len(gb.groups))
        val = dp.price(np.zeros((1, len(dp.n))), np.array([best.bottleneck]))[0][0]
        assert val <= best.total * (1 + 1e-9), (i, val, best)
        seen += 1
    assert seen >= 15, seen


def test_revisits_bound_with_one_group_is_the_known_plan():
    """One link group: every plan visits it once, in one run, so no plan is left for the
    revisits bound; it returns the known plan's T (not an error, not -inf)."""
    rng = np.random.default_rng(37)
    for _ in range(50):
        t = plan_lib.tables(region_profile(rng, 3, 4, 1), "gpipe", 4)
        gb = GroupBound(t)
        if gb.ok and len(gb.groups) == 1:
            break
    assert len(gb.groups) == 1
    assert chain_bound(t, upper=5.0, revisits=True) == 5.0
    dp = PricedChain(gb, 10.0, crossings=1)
    assert dp.price(np.zeros((1, len(dp.n))), np.array([10.0]))[0][0] == math.inf
