"""The cost model's fixed costs (profile version 2): per-call, per-message, optimizer update and
synchronisation. The cost model prices every plan as the formulas of docs/design.md, written
here straight from the document; the exact search equals the brute-force optimum; the heuristic
never beats it; the simulator agrees on balanced pipelines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.plan import InfeasibleError
from skyjax.plan.replay.simulate import simulate, simulate_plan
from skyjax.profile.format import Profile
from tests.helpers import (all_plans, as_solution, assignments, brute_force,
                           check_optimal_equals, check_plan_valid, make_profile, random_profile,
                           with_overheads)


def design_step_time(p: Profile, assignment, schedule: str, m: int) -> float:
    """T of one plan straight from the docs/design.md formulas; inf where it does not fit
    memory or links."""
    work = p.forward_s + p.backward_s
    fixed = p.forward_call_s + p.backward_call_s
    sp = np.cumsum([0] + [x["state_bytes"] for x in p.units])
    ap = np.cumsum([0] + [x["activation_bytes"] for x in p.units])
    ob = [x["output_bytes"] for x in p.units]
    mem = [x["memory_bytes"] for x in p.devices]
    n, ts = len(assignment), []
    for k, (dv, a, b) in enumerate(assignment):
        infl = m if schedule == "gpipe" else min(m, n - k)
        if sp[b] - sp[a] + infl * (ap[b] - ap[a]) > mem[dv]:
            return math.inf
        t = work[a:b, dv].sum() + fixed[dv] + (2 * p.message_s[dv] if k else 0.0)
        if k < n - 1:
            e = assignment[k + 1][0]
            if p.bandwidth_Bps[dv, e] <= 0:
                return math.inf
            t += 2 * p.message_s[dv] + 2 * (p.latency_s[dv, e] + ob[b - 1] / p.bandwidth_Bps[dv, e])
        ts.append(t)
    d0, a0, b0 = assignment[0]
    update0 = p.update_call_s[d0] + p.update_s[a0:b0, d0].sum()
    if n == 1:  # one stage: the step's inputs are put at the boundary
        update0 += m * p.input_s[d0]
    return sum(ts) + (m - 1) * max(ts) + update0 + p.sync_s


def test_exact_matches_brute_force_with_overheads():
    rng = np.random.default_rng(11)
    n_cases = 0
    for i in range(120):
        d, u = int(rng.integers(1, 5)), int(rng.integers(1, 8))
        prof = with_overheads(random_profile(rng, d, u), rng, inputs=True)
        schedule, m = ("gpipe", "1f1b")[i % 2], (1, 2, 8)[(i // 2) % 3]
        # the cost model prices every plan as the formulas do, and rejects exactly those that
        # do not fit: the brute-force optimum (over the model's prices) is the formulas' own
        plans = {tuple((s.device, *s.units) for s in p.stages): p
                 for p in all_plans(prof, schedule, m)}
        for a in assignments(u, d):
            formula, got = design_step_time(prof, a, schedule, m), plans.get(tuple(a))
            assert (got is None) == math.isinf(formula), (i, a)
            assert got is None or got.step_time_s == pytest.approx(formula, rel=1e-9), (i, a)
        want = min((p.step_time_s for p in plans.values()), default=math.inf)
        if check_optimal_equals(prof, schedule, m, want, (i, d, u, schedule, m)) is None:
            continue
        try:
            heur = plan_lib.searched_plan(prof, "optimal", schedule, m, force_heuristic=True)
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
        best = plan_lib.searched_plan(prof, "optimal", "1f1b", 4, force_heuristic=heuristic)
        assert len(best.stages) == 2 and best.step_time_s == pytest.approx(25.0), heuristic
    d["overheads"]["input_s"] = [0.0, 0.0]  # without the put, one stage wins: 24
    free = plan_lib.searched_plan(Profile.from_json(d), "optimal", "1f1b", 4)
    assert len(free.stages) == 1 and free.step_time_s == pytest.approx(24.0)


def test_older_batch_s_is_read_and_ignored():
    """``overheads.batch_s`` of older profile.json files (a batch built in the training loop's
    thread) is read without error and ignored: batches are built ahead by the prefetch thread,
    so the plans are those of the same file without it."""
    prof = make_profile([[1.0, 1.0], [1.0, 1.0]], latency=[[0, 1.25], [1.25, 0]],
                        bandwidth=[[0, 1e12], [1e12, 0]], out=[0, 0])  # unit work 3.0
    d = prof.to_json()
    d["overheads"] = {k: [0.0, 0.0] for k in ("forward_call_s", "backward_call_s",
                                             "update_call_s", "message_s", "input_s")}
    d["overheads"].update(sync_s=0.0, batch_s=1.5)
    prof = Profile.from_json(d)
    assert not hasattr(prof, "batch_s") and "batch_s" not in prof.to_json()["overheads"]
    one = plan_lib.evaluate(prof, [(0, 0, 2)], "1f1b", 4)
    assert one.stages[0].update_s == 0.0 and one.step_time_s == pytest.approx(4 * 6.0)
    best = plan_lib.searched_plan(prof, "optimal", "1f1b", 4)  # 24 for one stage against 25 for two
    assert len(best.stages) == 1 and best.step_time_s == pytest.approx(24.0)


def test_version1_profile_reads_with_zero_overheads():
    prof = make_profile(np.ones((3, 2)))
    assert prof.version == 2 and not prof.has_overheads
    again = Profile.from_json(prof.to_json())
    assert np.array_equal(again.update_s, np.zeros((3, 2))) and again.sync_s == 0.0
    assert "update_s" not in plan_lib.searched_plan(prof, "optimal").to_json()["stages"][0]


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
        heur = plan_lib.searched_plan(prof, "optimal", "gpipe", m, force_heuristic=True)
        assert heur.step_time_s == pytest.approx(want, rel=1e-9), i


def test_chain_dp_prices_every_plan_on_its_order_as_the_model_does():
    """The heuristic's chain DP over a fixed device order, without a cap, returns the least sum
    (sum t_k + update_0) of the plans on that order's subsequences: every stage that sends pays
    its outgoing message calls, a one-stage plan its input put (GPipe: memory does not depend on
    the position, so the DP's windows are exact)."""
    import itertools

    from skyjax.plan.search.chain_dp import ChainDP
    from skyjax.plan.pricing.classes import link_groups
    from skyjax.plan.pricing.cost import tables

    rng = np.random.default_rng(21)
    checked = 0
    for i in range(40):
        d, u = int(rng.integers(2, 4)), int(rng.integers(2, 6))
        prof = with_overheads(random_profile(rng, d, u), rng, scale=0.5, inputs=True)
        m = int((1, 2, 4)[i % 3])
        t = tables(prof, "gpipe", m)
        groups = link_groups(t)
        group_of = np.zeros(d, int)
        for g, devs in enumerate(groups):
            group_of[devs] = g
        sums = [([s.device for s in p.stages], as_solution(p).total)
                for p in all_plans(prof, "gpipe", m)]
        for order in itertools.permutations(range(d)):
            pos = {dv: k for k, dv in enumerate(order)}
            want = min((total for devs, total in sums  # subsequences keep the order
                        if all(pos[a] < pos[b] for a, b in zip(devs, devs[1:]))),
                       default=math.inf)
            got = float(ChainDP(t, list(order), group_of, groups).run(np.array([math.inf]))[0])
            assert got == pytest.approx(want, rel=1e-9), (i, order)
            checked += math.isfinite(want)
    assert checked >= 60
