"""GPipe plan refinement (skyjax.plan.search.refine): never worse, always valid, and exact over its space.

refine replaces the heuristic's plan by the least-sum plan at the same bottleneck over the same
region order; a bug would either return an invalid plan (devices reused, memory exceeded), a worse
one, or miss the optimum of its own space. Each is checked on random small instances (regions of
interchangeable devices, and random links where every device is its own region) against a brute
force over that space, and through the planner's hook.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.plan import planner
from skyjax.plan.search import refine as refine_mod
from skyjax.plan.pricing.classes import link_groups
from skyjax.plan.pricing.cost import Solution, check_assignment
from skyjax.profile.flops import paper_profile
from tests.helpers import (all_plans, as_solution, brute_force, check_plan_valid, price,
                           random_profile, realign_profile, region_profile, with_overheads)


def _solution(prof, t, assignment) -> Solution | None:
    """An assignment as a Solution, priced by the cost model (None if it does not fit memory or
    links)."""
    plan = price(prof, assignment, t.schedule, t.microbatches)
    return None if plan is None else as_solution(plan)


def _step(t, sol: Solution) -> float:
    return sol.total + (t.microbatches - 1) * sol.bottleneck + t.sync_s


def _random_incumbent(rng, prof, t, groups) -> Solution | None:
    """A random plan visiting every region once (random region order, devices, cuts)."""
    u = t.num_units
    order = rng.permutation(len(groups))
    devs = [int(d) for g in order
            for d in rng.permutation(groups[g])[:rng.integers(1, len(groups[g]) + 1)]]
    if len(devs) > u:
        return None
    cuts = sorted(rng.choice(np.arange(1, u), len(devs) - 1, replace=False).tolist())
    bounds = [0] + cuts + [u]
    return _solution(prof, t, [(d, a, b) for d, a, b in zip(devs, bounds, bounds[1:])])


def _plans(prof, t, groups, order: list[int]):
    """Every plan visiting ``order``'s regions in that order, each once, that fits GPipe memory
    and its links (refine's space at an infinite cap), as Solutions: the brute force's plans
    (tests/helpers.py) on such device orders."""
    group_of = {d: i for i, g in enumerate(groups) for d in g}
    pos = {g: i for i, g in enumerate(order)}

    def in_space(devs) -> bool:
        if any(group_of[d] not in pos for d in devs):
            return False
        seq = [pos[group_of[d]] for d in devs]
        return seq[0] == 0 and seq[-1] == len(order) - 1 and all(
            b in (a, a + 1) for a, b in zip(seq, seq[1:]))

    for plan in all_plans(prof, "gpipe", t.microbatches, devices_ok=in_space):
        yield as_solution(plan)


def _brute_sum(prof, t, groups, order: list[int], cap: float) -> float:
    """Least sum (stage times + the first update) over refine's space at cap."""
    return min((s.total for s in _plans(prof, t, groups, order) if s.bottleneck <= cap),
               default=math.inf)


def _check(prof, t, sol: Solution, new: Solution) -> None:
    check_assignment(t, new.assignment)
    again = _solution(prof, t, new.assignment)
    assert again is not None  # memory and links fit
    assert again.total == pytest.approx(new.total, rel=1e-12)
    assert new.bottleneck <= sol.bottleneck * (1 + 1e-9)
    assert _step(t, new) <= _step(t, sol) * (1 + 1e-12)


@pytest.mark.parametrize("kind", ["regions", "regions+overheads", "random links"])
def test_refine_equals_brute_force_over_its_space(kind):
    rng = np.random.default_rng({"regions": 1, "regions+overheads": 2, "random links": 3}[kind])
    improved = checked = 0
    for _ in range(120):
        d, u = int(rng.integers(2, 6)), int(rng.integers(3, 7))
        if kind == "random links":
            prof = random_profile(rng, int(rng.integers(2, 5)), u)
        else:
            prof = region_profile(rng, d, u, int(rng.integers(1, 3)))
            if kind == "regions+overheads":
                prof = with_overheads(prof, rng, 0.05)
        t = plan_lib.tables(prof, "gpipe", int(rng.choice([1, 4, 8])))
        groups = link_groups(t)
        sol = _random_incumbent(rng, prof, t, groups)
        if sol is None:
            continue
        new = refine_mod.refine(t, sol)
        _check(prof, t, sol, new)
        order = list(dict.fromkeys(
            next(i for i, g in enumerate(groups) if dv in g) for dv, _, _ in sol.assignment))
        want = _brute_sum(prof, t, groups, order, sol.bottleneck * (1 + 1e-10))
        assert new.total == pytest.approx(want, rel=1e-9), (kind, d, u)
        checked += 1
        improved += new is not sol
    assert checked >= 25 and improved >= 5


def test_refine_reaches_optimum_when_order_and_bottleneck_are():
    """Where the optimum (brute force over every plan) visits every region once, refine started
    from the worst plan with the optimum's region order and bottleneck returns the optimum."""
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(80):
        prof = with_overheads(region_profile(rng, int(rng.integers(2, 5)),
                                             int(rng.integers(3, 6)), 2), rng, 0.05)
        t = plan_lib.tables(prof, "gpipe", int(rng.choice([2, 4, 8])))
        groups = link_groups(t)
        want = brute_force(prof, "gpipe", t.microbatches)
        if not math.isfinite(want):
            continue
        for order in itertools.permutations(range(len(groups))):
            plans = list(_plans(prof, t, groups, list(order)))
            best = min(plans, key=lambda x: _step(t, x), default=None)
            if best is None or _step(t, best) > want * (1 + 1e-9):
                continue
            same = [x for x in plans if abs(x.bottleneck - best.bottleneck) <= 1e-12 * want]
            worst = max(same, key=lambda x: x.total)
            got = refine_mod.refine(t, worst)
            _check(prof, t, worst, got)
            assert _step(t, got) == pytest.approx(want, rel=1e-9)
            hits += worst is not best
            break
    assert hits >= 10


def test_refine_leaves_other_cases_alone(monkeypatch):
    rng = np.random.default_rng(4)
    prof = region_profile(rng, 5, 6, 2)
    t = plan_lib.tables(prof, "1f1b", 4)
    sol = _solution(prof, t, [(0, 0, 3), (4, 3, 6)])
    assert refine_mod.refine(t, sol) is sol  # 1F1B: in-flight counts depend on position
    t = plan_lib.tables(prof, "gpipe", 4)
    groups = link_groups(t)
    if len(groups) > 1:  # a region visited twice is not in the DP's space
        a, b = groups[0][0], groups[1][0]
        c = next((x for x in groups[0] if x != a), None)
        if c is not None:
            sol = _solution(prof, t, [(a, 0, 2), (b, 2, 4), (c, 4, 6)])
            if sol is not None:
                assert refine_mod.refine(t, sol) is sol
    sol = _random_incumbent(rng, prof, t, groups)
    monkeypatch.setattr(refine_mod, "MAX_STATES", 1)  # over the state cap: unchanged
    assert refine_mod.refine(t, sol) is sol


def test_planner_hook_never_worse(monkeypatch):
    """Forced on every heuristic plan (REGION_GAP < 0): valid, never above the plan without it,
    and the lower bound stays below."""
    rng = np.random.default_rng(6)
    for i in range(12):
        prof = region_profile(rng, int(rng.integers(4, 9)), int(rng.integers(6, 12)), 3)
        m = int(rng.choice([4, 16]))
        try:
            base = plan_lib.searched_plan(prof, "optimal", "gpipe", m, force_heuristic=True)
        except plan_lib.InfeasibleError:
            continue
        monkeypatch.setattr(planner, "REGION_GAP", -1.0)
        got = plan_lib.searched_plan(prof, "optimal", "gpipe", m, force_heuristic=True)
        monkeypatch.undo()
        check_plan_valid(prof, got)
        assert got.step_time_s <= base.step_time_s * (1 + 1e-12), i
        if not got.exact:
            assert got.lower_bound_s <= got.step_time_s


def test_refine_realigns_memory_bound_blocks(monkeypatch):
    """tests/test_bounds.py's constructed case (a slow device holding one unit between fast ones
    re-aligns memory-bound blocks): with the heuristic's order search and interleaved orders
    off, refine alone reaches the exact optimum from the fast-first / slow-first plan."""
    from skyjax.plan.search import order_search

    m = 16
    prof = realign_profile(m)
    want = plan_lib.searched_plan(prof, "optimal", "gpipe", m)
    monkeypatch.setattr(order_search, "improve", lambda top, *a, **k: top)
    monkeypatch.setattr(order_search, "memory_bound", lambda *a: False)
    got = plan_lib.searched_plan(prof, "optimal", "gpipe", m, force_heuristic=True)
    assert got.step_time_s == pytest.approx(want.step_time_s, rel=1e-9)
    check_plan_valid(prof, got)
    monkeypatch.setattr(planner, "refine_plan", lambda profile, t, sol, out, extra=None: out)
    without = plan_lib.searched_plan(prof, "optimal", "gpipe", m, force_heuristic=True)
    assert without.step_time_s > want.step_time_s * 1.1


def test_paper_case_gpipe32_improves():
    """The issue's row: 483 units x 64 nodes, GPipe m = 32; the heuristic's 2.885 becomes 2.873
    (interleaved device kinds no fixed order contains)."""
    got = plan_lib.searched_plan(paper_profile(), "optimal", "gpipe", 32)
    assert got.step_time_s < 2.8735
    assert len({s.device for s in got.stages}) == len(got.stages)


def test_least_sum_equals_brute_force_per_order():
    """``least_sum`` (every region's span the whole model) is the exact least sum over plans
    visiting the regions in a given order, each once, under a cap."""
    rng = np.random.default_rng(8)
    checked = 0
    for i in range(40):
        prof = region_profile(rng, int(rng.integers(2, 5)), int(rng.integers(3, 6)),
                              int(rng.integers(1, 3)))
        if i % 2:
            prof = with_overheads(prof, rng, 0.05)
        t = plan_lib.tables(prof, "gpipe", int(rng.choice([1, 4, 8])))
        groups = link_groups(t)
        for order in itertools.permutations(range(len(groups))):
            plans = list(_plans(prof, t, groups, list(order)))
            if not plans:
                assert refine_mod.least_sum(t, list(order), math.inf, groups) is None
                continue
            cap = float(rng.choice([s.bottleneck for s in plans])) * (1 + 1e-10)
            got = refine_mod.least_sum(t, list(order), cap, groups)
            want = _brute_sum(prof, t, groups, list(order), cap)
            assert got is not None and got.total == pytest.approx(want, rel=1e-9), (i, order)
            assert got.bottleneck <= cap
            check_assignment(t, got.assignment)
            checked += 1
    assert checked >= 30
