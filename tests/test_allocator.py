"""Planner (skyjax.plan): cost model, even, optimal == brute force on random small instances, edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.plan import InfeasibleError
from skyjax.plan.pricing import classes
from skyjax.plan.search import heuristic
from skyjax.profile.format import Profile
from tests.helpers import (brute_force, check_optimal_equals, check_plan_valid, make_profile,
                           random_profile, region_profile)


def test_optimal_matches_brute_force_random():
    rng = np.random.default_rng(0)
    n_cases = 0
    for i in range(250):
        d, u = int(rng.integers(1, 6)), int(rng.integers(1, 11))
        prof = random_profile(rng, d, u)
        schedule = ("gpipe", "1f1b")[i % 2]
        m = (1, 2, 8)[(i // 2) % 3]
        want = brute_force(prof, schedule, m)
        if check_optimal_equals(prof, schedule, m, want, (i, d, u, schedule, m)) is None:
            continue
        n_cases += 1
    assert n_cases >= 200


def test_heuristic_bounds_on_random():
    """Forced heuristic: never better than the optimum; its lower bound never above it."""
    rng = np.random.default_rng(1)
    for i in range(40):
        prof = random_profile(rng, int(rng.integers(2, 6)), int(rng.integers(2, 11)))
        schedule, m = ("gpipe", "1f1b")[i % 2], (1, 2, 8)[i % 3]
        try:
            opt = plan_lib.searched_plan(prof, "optimal", schedule, m)
        except InfeasibleError:
            continue
        lb = plan_lib.lower_bound(plan_lib.tables(prof, schedule, m))
        assert lb <= opt.step_time_s * (1 + 1e-9)
        try:
            heur = plan_lib.searched_plan(prof, "optimal", schedule, m, force_heuristic=True)
        except InfeasibleError:
            continue  # the heuristic's safe 1F1B bound may miss a tight fit
        assert heur.step_time_s >= opt.step_time_s * (1 - 1e-9)
        assert heur.exact or heur.lower_bound_s <= opt.step_time_s * (1 + 1e-9)
        check_plan_valid(prof, heur)


def test_cost_model_by_hand():
    prof = make_profile([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]], state=[10, 10, 10], act=[1, 2, 3],
                        out=[100, 200, 300], latency=[[0, 0.5], [0.5, 0]],
                        bandwidth=[[0, 100], [100, 0]])
    p = plan_lib.evaluate(prof, [(1, 0, 1), (0, 1, 3)], "1f1b", 4)
    s0, s1 = p.stages
    assert s0.compute_s == 6.0 and s0.comm_s == pytest.approx(2 * (0.5 + 1.0))
    assert s1.compute_s == 6.0 and s1.comm_s == 0.0
    assert s0.memory_bytes == 10 + 2 * 1 and s1.memory_bytes == 20 + 1 * 5
    assert p.bottleneck_s == 9.0 and p.step_time_s == pytest.approx(15 + 3 * 9)
    g = plan_lib.evaluate(prof, [(1, 0, 1), (0, 1, 3)], "gpipe", 4)
    assert g.stages[0].memory_bytes == 14 and g.stages[1].memory_bytes == 40
    with pytest.raises(ValueError, match="used twice"):
        plan_lib.evaluate(prof, [(0, 0, 1), (0, 1, 3)])
    with pytest.raises(ValueError, match="covers"):
        plan_lib.evaluate(prof, [(0, 0, 2)])


def test_even_remainder_to_first_stages():
    assert plan_lib.even_assignment(10, [3, 1, 2]) == [(3, 0, 4), (1, 4, 7), (2, 7, 10)]
    assert plan_lib.even_assignment(2, [0, 1, 2]) == [(0, 0, 1), (1, 1, 2)]
    prof = make_profile(np.ones((7, 3)))
    p = plan_lib.searched_plan(prof, "even", "gpipe", 2)
    assert [s.units for s in p.stages] == [(0, 3), (3, 5), (5, 7)]


def test_one_device():
    prof = make_profile([[1.0], [2.0]])
    for strategy in ("even", "optimal"):
        p = plan_lib.searched_plan(prof, strategy, "1f1b", 4)
        assert [(s.device, s.units) for s in p.stages] == [(0, (0, 2))]
        assert p.step_time_s == pytest.approx(4 * 9.0)


def test_more_devices_than_units():
    prof = make_profile([[1.0, 1.0, 3.0, 1.0]])
    p = plan_lib.searched_plan(prof, "optimal", "gpipe", 8)
    assert len(p.stages) == 1 and p.stages[0].device != 2
    assert len(plan_lib.searched_plan(prof, "even").stages) == 1


def test_device_too_small_for_any_unit():
    prof = make_profile(np.ones((4, 3)) * [1.0, 0.1, 1.0], state=[10] * 4,
                        memory=[100, 5, 100])
    p = plan_lib.searched_plan(prof, "optimal", "gpipe", 8)
    assert 1 not in [s.device for s in p.stages]
    with pytest.raises(InfeasibleError, match="device 1"):
        plan_lib.searched_plan(prof, "even")


def test_unreachable_link_never_used():
    bw = [[0, 0, 1e12], [1e12, 0, 1e12], [1e12, 0, 0]]  # 0->1, 2->1 and 2->2 unreachable
    prof = make_profile(np.ones((6, 3)), bandwidth=bw)
    for m in (1, 8):
        p = plan_lib.searched_plan(prof, "optimal", "1f1b", m)
        devs = [s.device for s in p.stages]
        for a, b in zip(devs, devs[1:]):
            assert bw[a][b] > 0
    assert len(plan_lib.searched_plan(prof, "optimal", "1f1b", 8).stages) == 3
    with pytest.raises(InfeasibleError, match="cannot reach"):
        plan_lib.searched_plan(prof, "even")


def test_m1_uses_fastest_device():
    prof = make_profile(np.ones((5, 3)) * [3.0, 1.0, 2.0], latency=np.full((3, 3), 0.1))
    p = plan_lib.searched_plan(prof, "optimal", "gpipe", 1)
    assert [(s.device, s.units) for s in p.stages] == [(1, (0, 5))]
    assert p.exact and p.step_time_s == pytest.approx(15.0)


def test_infeasible_names_device_and_bytes():
    prof = make_profile(np.ones((3, 2)), state=[50, 50, 50], memory=[40, 60])
    with pytest.raises(InfeasibleError, match=r"device 1 .*short by \d+ bytes"):
        plan_lib.searched_plan(prof, "optimal", "gpipe", 2)
    prof = make_profile(np.ones((3, 2)), state=[50, 50, 50], memory=[60, 60])
    with pytest.raises(InfeasibleError, match=r"30 bytes do not fit"):
        plan_lib.searched_plan(prof, "optimal", "gpipe", 2)


def test_infeasible_names_the_stage_count_or_the_links_that_do_not_fit():
    """Memory enough in total, but not in blocks: the line names the stages the units need
    against the devices; enough memory only across devices no link joins: it names the group."""
    prof = make_profile(np.ones((3, 2)), state=[3, 3, 3], memory=[5, 5])
    for pipelines in (1, 0):
        with pytest.raises(InfeasibleError, match=r"in blocks that fit the largest device's 5 "
                           r"bytes, the 3 units need at least 3 stages, but only 2 devices"):
            plan_lib.searched_plan(prof, "optimal", "1f1b", 4, max_pipelines=pipelines)
    apart = np.array([[1e12, 0.0], [0.0, 1e12]])
    prof = make_profile(np.ones((4, 2)), state=[3] * 4, memory=[7, 7], bandwidth=apart)
    with pytest.raises(InfeasibleError, match=r"need at least 12 bytes in total but the devices "
                       r"that links join hold at most 7 \(device 0; bandwidth_Bps is 0"):
        plan_lib.searched_plan(prof, "optimal", "gpipe", 2)


def test_1f1b_memory_position():
    """1F1B keeps fewer micro-batches on late stages, GPipe m everywhere: only 1F1B fits."""
    prof = make_profile(np.ones((2, 2)), state=[0, 0], act=[10, 10], memory=[80, 15])
    p = plan_lib.searched_plan(prof, "optimal", "1f1b", 8)
    assert [(s.device, s.units, s.memory_bytes) for s in p.stages] == [
        (0, (0, 1), 20), (1, (1, 2), 10)] or [s.device for s in p.stages] == [0]
    with pytest.raises(InfeasibleError):
        plan_lib.searched_plan(prof, "optimal", "gpipe", 8)


def test_identical_classes_exact_and_fast():
    """64 identical devices x 160 units: one class, exact."""
    prof = make_profile(np.ones((160, 64)) * np.linspace(1, 2, 160)[:, None],
                        out=np.full(160, 1e6), latency=np.full((64, 64), 1e-3),
                        bandwidth=np.full((64, 64), 1e9))
    p = plan_lib.searched_plan(prof, "optimal", "1f1b", 32)
    assert p.exact
    assert p.step_time_s < plan_lib.searched_plan(prof, "even", "1f1b", 32).step_time_s * 1.001


def test_classes_tell_fixed_costs_apart():
    """Devices with equal unit times and memory but different call costs are not one class:
    the exact DP prices a class by one device, so a split over both would look cheap."""
    d = make_profile(np.ones((2, 2))).to_json()
    d["update_s"] = [[0.0, 0.0]] * 2
    d["overheads"] = {"forward_call_s": [0.0, 10.0], "backward_call_s": [0.0, 20.0],
                      "update_call_s": [0.0, 0.0], "message_s": [0.0, 0.0], "sync_s": 0.0}
    prof = Profile.from_json(d)
    assert len(classes.device_classes(plan_lib.tables(prof))) == 2
    p = plan_lib.searched_plan(prof, "optimal", "1f1b", 8)
    assert p.exact and [s.device for s in p.stages] == [0]
    assert p.step_time_s == pytest.approx(6.0 * 8)


def test_plan_json_roundtrip():
    prof = make_profile(np.ones((4, 2)))
    p = plan_lib.searched_plan(prof, "optimal", "gpipe", 3)
    d = p.to_json()
    assert set(d) >= {"strategy", "schedule", "microbatches", "stages", "step_time_s",
                      "bottleneck_s", "exact"}
    assert plan_lib.Plan.from_json(d) == p


def test_lower_bound_tight_for_single_fast_device():
    prof = make_profile(np.ones((4, 2)) * [1.0, 5.0])
    t = plan_lib.tables(prof, "gpipe", 1)
    assert plan_lib.lower_bound(t) == pytest.approx(12.0)


def test_chain_dp_caps_independent():
    """The chain DP's sum for a cap does not depend on the other caps run with it (the cap
    search reuses a round's ends), and the plan rebuilt for a cap has that sum."""
    from skyjax.plan.search.chain_dp import ChainDP
    rng = np.random.default_rng(5)
    for i in range(12):
        prof = region_profile(rng, int(rng.integers(2, 5)), int(rng.integers(2, 6)), 2)
        t = plan_lib.tables(prof, ("1f1b", "gpipe")[i % 2], 4)
        groups = classes.link_groups(t)
        dp = ChainDP(t, list(rng.permutation(t.num_devices)), classes.labels(groups, t.num_devices),
                     groups, classes.labels(classes.device_classes(t), t.num_devices))
        s_inf = dp.run(np.array([np.inf]))[0]
        if not np.isfinite(s_inf):
            continue
        caps = np.geomspace(s_inf / 20, s_inf, 6)
        sums = dp.run(caps)
        for j in range(len(caps)):
            assert dp.run(caps[j:j + 1])[0] == sums[j]
            sol = dp.reconstruct(caps[j])
            assert (sol is None) == (sums[j] == np.inf)
            if sol is not None:
                assert sol.total == pytest.approx(sums[j], rel=1e-9)
                assert sol.bottleneck <= caps[j] * (1 + 1e-9)


def test_heuristic_with_coarsened_links(monkeypatch):
    """Per-pair links (every device its own link group) coarsened to 2 groups: plans stay valid
    (true costs) and never beat the optimum."""
    monkeypatch.setattr(heuristic, "MAX_LINK_GROUPS", 2)
    rng = np.random.default_rng(2)
    for i in range(20):
        prof = random_profile(rng, 5, int(rng.integers(3, 10)))
        schedule, m = ("gpipe", "1f1b")[i % 2], (1, 8)[i % 2]
        try:
            opt = plan_lib.searched_plan(prof, "optimal", schedule, m)
            heur = plan_lib.searched_plan(prof, "optimal", schedule, m, force_heuristic=True)
        except InfeasibleError:
            continue
        assert heur.step_time_s >= opt.step_time_s * (1 - 1e-9)
        check_plan_valid(prof, heur)


def test_coarse_groups_split_regions():
    lat = np.full((6, 6), 0.1)
    lat[:3, :3] = lat[3:, 3:] = 1e-4
    lat += np.random.default_rng(0).uniform(0, 1e-6, (6, 6))  # noisy: all link groups singletons
    prof = make_profile(np.ones((4, 6)), latency=lat, bandwidth=np.full((6, 6), 1e9))
    t = plan_lib.tables(prof)
    assert len(plan_lib.link_groups(t)) == 6
    assert sorted(classes.coarse_groups(t, 2)) == [[0, 1, 2], [3, 4, 5]]


def _two_region_starved() -> Profile:
    """Two regions, each one fast device (memory 7: two units fit at 1F1B level 2, not 3) and
    one slow one. The optimum runs the fast pair, half each; every full candidate order puts a
    device the plan leaves unused after the first fast one, so the chain DP charges it level 3."""
    fwd = np.ones((4, 1)) * np.array([1.0, 10.0, 1.0, 10.0])[None] / 3
    region = np.array([0, 0, 1, 1])
    lat = np.where(region[:, None] == region[None, :], 0.0, 0.01)
    return make_profile(fwd, state=np.ones(4), act=np.ones(4), out=np.ones(4),
                        memory=np.array([7.0, 100.0, 7.0, 100.0]), latency=lat)


def test_fastest_subsets_find_starved_optimum(monkeypatch):
    """With the order search off, only the fastest-subset step (heuristic step 4) finds the
    optimum: without it the plan is the 1-unit/3-unit split the inflated count forces."""
    prof = _two_region_starved()
    want = brute_force(prof, "1f1b", 4)
    monkeypatch.setattr(heuristic.order_search, "improve", lambda top, *a, **k: top)
    got = plan_lib.searched_plan(prof, "optimal", "1f1b", 4, force_heuristic=True)
    assert got.step_time_s == pytest.approx(want, rel=1e-9)
    assert [s.device for s in got.stages] == [0, 2]
    monkeypatch.setattr(heuristic, "fastest_subsets", lambda t, top, *a: top)
    without = plan_lib.searched_plan(prof, "optimal", "1f1b", 4, force_heuristic=True)
    assert without.step_time_s > want * 1.1


def test_fastest_subsets_never_worse(monkeypatch):
    """On random region cases the step only replaces the plan by a better one, never goes below
    the brute-force optimum, and the plan stays valid."""
    rng = np.random.default_rng(12)
    steps = []
    real = heuristic.fastest_subsets
    monkeypatch.setattr(heuristic, "overcharged", lambda *a: True)  # always try the step
    for i in range(25):
        prof = region_profile(rng, int(rng.integers(3, 6)), int(rng.integers(3, 7)), 2)
        m = (3, 4, 8)[i % 3]
        want = brute_force(prof, "1f1b", m)
        if math.isinf(want):
            continue
        monkeypatch.setattr(heuristic, "fastest_subsets", lambda t, top, *a: top)
        try:
            without = plan_lib.searched_plan(prof, "optimal", "1f1b", m, force_heuristic=True)
        except InfeasibleError:
            continue
        monkeypatch.setattr(heuristic, "fastest_subsets", real)
        got = plan_lib.searched_plan(prof, "optimal", "1f1b", m, force_heuristic=True)
        check_plan_valid(prof, got)
        assert want * (1 - 1e-9) <= got.step_time_s <= without.step_time_s * (1 + 1e-9), i
        steps.append(got.step_time_s)
    assert len(steps) >= 10
