"""The cost model's fixed costs (profile version 2): per-call, per-message, optimizer update and
synchronisation. The exact search equals a brute force written straight from the formulas of
docs/design.md; the heuristic never beats it; the simulator agrees on balanced pipelines."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.plan import InfeasibleError
from skyjax.plan.simulate import simulate, simulate_plan
from skyjax.profile.format import Profile
from tests.test_allocator import (check_optimal_equals, check_plan_valid, make_profile,
                                  random_profile)


def with_overheads(p: Profile, rng: np.random.Generator, scale: float = 0.3,
                   inputs: bool = False) -> Profile:
    """Random fixed costs; ``inputs``: also a random ``input_s`` (drawn last, so that the other
    tests' random cases stay as they were)."""
    d = p.to_json()
    n_u, n_d = p.num_units, p.num_devices
    d["update_s"] = (rng.uniform(0, scale, (n_u, n_d))).tolist()
    d["overheads"] = {k: rng.uniform(0, scale, n_d).tolist() for k in
                      ("forward_call_s", "backward_call_s", "update_call_s", "message_s")}
    d["overheads"]["sync_s"] = float(rng.uniform(0, scale))
    if inputs:
        d["overheads"]["input_s"] = rng.uniform(0, scale / 4, n_d).tolist()
        d["overheads"]["batch_s"] = float(rng.uniform(0, scale / 4))
    return Profile.from_json(d)


def brute_force(p: Profile, schedule: str, m: int) -> float:
    """min T over every subset, order and cut, from the docs/design.md formulas."""
    work = p.forward_s + p.backward_s
    u, d = work.shape
    fixed = p.forward_call_s + p.backward_call_s
    sp = np.cumsum([0] + [x["state_bytes"] for x in p.units])
    ap = np.cumsum([0] + [x["activation_bytes"] for x in p.units])
    ob = [x["output_bytes"] for x in p.units]
    mem = [x["memory_bytes"] for x in p.devices]
    best = math.inf
    for n in range(1, min(u, d) + 1):
        for cuts in itertools.combinations(range(1, u), n - 1):
            bounds = list(zip((0,) + cuts, cuts + (u,)))
            for devs in itertools.permutations(range(d), n):
                ts, ok = [], True
                for k, ((a, b), dv) in enumerate(zip(bounds, devs)):
                    infl = m if schedule == "gpipe" else min(m, n - k)
                    if sp[b] - sp[a] + infl * (ap[b] - ap[a]) > mem[dv]:
                        ok = False
                        break
                    t = work[a:b, dv].sum() + fixed[dv] + (2 * p.message_s[dv] if k else 0.0)
                    if k < n - 1:
                        e = devs[k + 1]
                        if p.bandwidth_Bps[dv, e] <= 0:
                            ok = False
                            break
                        t += 2 * p.message_s[dv] + 2 * (p.latency_s[dv, e]
                                                        + ob[b - 1] / p.bandwidth_Bps[dv, e])
                    ts.append(t)
                if not ok:
                    continue
                a0, b0 = bounds[0]
                update0 = p.update_call_s[devs[0]] + p.update_s[a0:b0, devs[0]].sum()
                if n == 1:  # one stage: the step's batch is built and put at the boundary
                    update0 += m * p.input_s[devs[0]] + p.batch_s
                best = min(best, sum(ts) + (m - 1) * max(ts) + update0 + p.sync_s)
    return best


def test_exact_matches_brute_force_with_overheads():
    rng = np.random.default_rng(11)
    n_cases = 0
    for i in range(120):
        d, u = int(rng.integers(1, 5)), int(rng.integers(1, 8))
        prof = with_overheads(random_profile(rng, d, u), rng, inputs=True)
        schedule, m = ("gpipe", "1f1b")[i % 2], (1, 2, 8)[(i // 2) % 3]
        want = brute_force(prof, schedule, m)
        if check_optimal_equals(prof, schedule, m, want, (i, d, u, schedule, m)) is None:
            continue
        try:
            heur = plan_lib.plan(prof, "optimal", schedule, m, force_heuristic=True)
        except InfeasibleError:
            continue  # the heuristic's safe 1F1B bound may miss a tight fit
        assert heur.step_time_s >= want * (1 - 1e-9)
        assert heur.exact or heur.lower_bound_s <= want * (1 + 1e-9)
        check_plan_valid(prof, heur)
        n_cases += 1
    assert n_cases >= 60


def test_overheads_by_hand():
    prof = make_profile([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]], latency=[[0, 0.5], [0.5, 0]],
                        bandwidth=[[0, 100], [100, 0]], out=[100, 200, 300])
    d = prof.to_json()
    d["update_s"] = [[0.1, 0.2]] * 3
    d["overheads"] = {"forward_call_s": [0.01, 0.02], "backward_call_s": [0.03, 0.04],
                      "update_call_s": [0.5, 0.6], "message_s": [0.001, 0.002], "sync_s": 0.25}
    prof = Profile.from_json(d)
    p = plan_lib.evaluate(prof, [(1, 0, 1), (0, 1, 3)], "1f1b", 4)
    s0, s1 = p.stages
    assert s0.compute_s == pytest.approx(6.0 + 0.06)
    assert s0.comm_s == pytest.approx(2 * 0.002 + 2 * (0.5 + 1.0))
    assert s1.compute_s == pytest.approx(6.0 + 0.04) and s1.comm_s == pytest.approx(0.002)
    assert s0.update_s == pytest.approx(0.6 + 0.2) and s1.update_s == pytest.approx(0.5 + 0.2)
    ts = [s0.time_s, s1.time_s]
    assert p.step_time_s == pytest.approx(sum(ts) + 3 * max(ts) + 0.8 + 0.25)
    assert plan_lib.Plan.from_json(p.to_json()) == p


def test_input_put_charged_to_a_one_stage_plan_only():
    """A one-stage plan has no wait to hide its step's inputs in: m input_s joins its update_0
    (model, simulator and search alike); a longer pipeline's first stage does not pay it."""
    prof = make_profile([[1.0, 1.0], [1.0, 1.0]], latency=[[0, 1.25], [1.25, 0]],
                        bandwidth=[[0, 1e12], [1e12, 0]], out=[0, 0])  # unit work 3.0
    d = prof.to_json()
    d["overheads"] = {k: [0.0, 0.0] for k in ("forward_call_s", "backward_call_s",
                                             "update_call_s", "message_s")}
    d["overheads"].update(input_s=[0.5, 0.5], sync_s=0.0)
    prof = Profile.from_json(d)
    assert Profile.from_json(prof.to_json()).input_s.tolist() == [0.5, 0.5]
    one = plan_lib.evaluate(prof, [(0, 0, 2)], "1f1b", 4)
    assert one.stages[0].update_s == pytest.approx(4 * 0.5)
    assert one.step_time_s == pytest.approx(4 * 6.0 + 2.0)
    assert simulate_plan(one, prof).step_time_s == pytest.approx(one.step_time_s)
    two = plan_lib.evaluate(prof, [(0, 0, 1), (1, 1, 2)], "1f1b", 4)
    assert [s.update_s for s in two.stages] == [0.0, 0.0]
    assert two.step_time_s == pytest.approx((3 + 2.5) + 3 + 3 * (3 + 2.5))  # 25
    for heuristic in (False, True):  # 26 for one stage against 25 for two
        best = plan_lib.plan(prof, "optimal", "1f1b", 4, force_heuristic=heuristic)
        assert len(best.stages) == 2 and best.step_time_s == pytest.approx(25.0), heuristic
    d["overheads"]["input_s"] = [0.0, 0.0]  # without the put, one stage wins: 24
    free = plan_lib.plan(Profile.from_json(d), "optimal", "1f1b", 4)
    assert len(free.stages) == 1 and free.step_time_s == pytest.approx(24.0)


def test_batch_build_charged_to_a_one_stage_plan_only():
    """An inline data source's batch (``batch_s``, once per step) is built at a one-stage plan's
    step boundary; a longer pipeline builds it in its first wait. Enough of it turns the choice
    from one stage to two."""
    prof = make_profile([[1.0, 1.0], [1.0, 1.0]], latency=[[0, 1.25], [1.25, 0]],
                        bandwidth=[[0, 1e12], [1e12, 0]], out=[0, 0])  # unit work 3.0
    d = prof.to_json()
    d["overheads"] = {k: [0.0, 0.0] for k in ("forward_call_s", "backward_call_s",
                                             "update_call_s", "message_s", "input_s")}
    d["overheads"].update(sync_s=0.0, batch_s=1.5)
    prof = Profile.from_json(d)
    assert Profile.from_json(prof.to_json()).batch_s == 1.5
    one = plan_lib.evaluate(prof, [(0, 0, 2)], "1f1b", 4)
    assert one.stages[0].update_s == pytest.approx(1.5)
    assert one.step_time_s == pytest.approx(4 * 6.0 + 1.5)
    assert simulate_plan(one, prof).step_time_s == pytest.approx(one.step_time_s)
    two = plan_lib.evaluate(prof, [(0, 0, 1), (1, 1, 2)], "1f1b", 4)
    assert [s.update_s for s in two.stages] == [0.0, 0.0] and two.step_time_s == 25.0
    for heuristic in (False, True):  # 25.5 for one stage against 25 for two
        best = plan_lib.plan(prof, "optimal", "1f1b", 4, force_heuristic=heuristic)
        assert len(best.stages) == 2 and best.step_time_s == pytest.approx(25.0), heuristic
    del d["overheads"]["batch_s"]  # absent (older files, prefetched data): 0, one stage wins
    assert Profile.from_json(d).batch_s == 0.0
    assert len(plan_lib.plan(Profile.from_json(d), "optimal", "1f1b", 4).stages) == 1


def test_version1_profile_reads_with_zero_overheads():
    prof = make_profile(np.ones((3, 2)))
    assert prof.version == 2 and not prof.has_overheads
    again = Profile.from_json(prof.to_json())
    assert np.array_equal(again.update_s, np.zeros((3, 2))) and again.sync_s == 0.0
    assert "update_s" not in plan_lib.plan(prof, "optimal").to_json()["stages"][0]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_simulator_matches_model_on_balanced_with_overheads(schedule):
    """Identical devices, equal blocks: the event simulation equals T,
    call and message costs, the first stage's update and the synchronisation included."""
    n_d = 4
    prof = make_profile(np.ones((8, n_d)))  # links ~free: every t_k equal
    d = prof.to_json()
    d["update_s"] = np.full((8, n_d), 0.02).tolist()
    d["overheads"] = {"forward_call_s": [0.1] * n_d, "backward_call_s": [0.2] * n_d,
                      "update_call_s": [0.05] * n_d, "message_s": [0.0] * n_d, "sync_s": 0.3}
    prof = Profile.from_json(d)
    for m in (1, 4, 9):
        p = plan_lib.evaluate(prof, plan_lib.even_assignment(8, range(n_d)), schedule, m)
        sim = simulate_plan(p, prof, overlap_comm=False)
        assert sim.step_time_s == pytest.approx(p.step_time_s, rel=1e-9)


def test_simulator_update_release():
    """A later stage's update overlaps the fill; the first stage's delays everything."""
    base = simulate([1, 1], [2, 2], [0], "1f1b", 2).step_time_s
    assert simulate([1, 1], [2, 2], [0], "1f1b", 2, update_s=[0.5, 0],
                    sync_s=0.1).step_time_s == pytest.approx(base + 0.6)
    assert simulate([1, 1], [2, 2], [0], "1f1b", 2, update_s=[0, 0.5]).step_time_s == \
        pytest.approx(base)
    assert simulate([1, 1], [2, 2], [0], "1f1b", 2, update_s=[0, 1.5]).step_time_s == \
        pytest.approx(base + 0.5)


def test_heuristic_exact_on_two_devices_with_overheads():
    """Two devices: the heuristic's orders cover both permutations and its chain DP is exact
    for GPipe, so it must find the optimum (its reconstruction included)."""
    rng = np.random.default_rng(5)
    for i in range(40):
        prof = with_overheads(random_profile(rng, 2, int(rng.integers(2, 9))), rng,
                              scale=(0.0, 0.3)[i % 2], inputs=True)
        m = (1, 3, 8)[i % 3]
        want = brute_force(prof, "gpipe", m)
        if math.isinf(want):
            continue
        heur = plan_lib.plan(prof, "optimal", "gpipe", m, force_heuristic=True)
        assert heur.step_time_s == pytest.approx(want, rel=1e-9), i


def test_chain_dp_prices_every_plan_on_its_order_as_the_model_does():
    """The heuristic's chain DP over a fixed device order, without a cap, returns the least sum
    (sum t_k + update_0) of the plans on that order's subsequences: every stage that sends pays
    its outgoing message calls, a one-stage plan its input put (GPipe: memory does not depend on
    the position, so the DP's windows are exact)."""
    from skyjax.plan.chain_dp import ChainDP
    from skyjax.plan.classes import link_groups
    from skyjax.plan.cost import tables
    from tests.test_refine import _solution

    rng = np.random.default_rng(21)
    checked = 0
    for i in range(40):
        d, u = int(rng.integers(2, 4)), int(rng.integers(2, 6))
        prof = with_overheads(random_profile(rng, d, u), rng, scale=0.5, inputs=True)
        t = tables(prof, "gpipe", int((1, 2, 4)[i % 3]))
        groups = link_groups(t)
        group_of = np.zeros(d, int)
        for g, devs in enumerate(groups):
            group_of[devs] = g
        for order in itertools.permutations(range(d)):
            want = math.inf
            for n in range(1, min(u, d) + 1):
                for devs in itertools.combinations(order, n):  # subsequences keep the order
                    for cuts in itertools.combinations(range(1, u), n - 1):
                        b = (0,) + cuts + (u,)
                        sol = _solution(t, list(zip(devs, b, b[1:])))
                        if sol is not None:
                            want = min(want, sol.total)
            got = float(ChainDP(t, list(order), group_of, groups).run(np.array([math.inf]))[0])
            assert got == pytest.approx(want, rel=1e-9), (i, order)
            checked += math.isfinite(want)
    assert checked >= 60
