"""Calls after idle: the profiler's wake costs (skyjax.hostmodel.wake) and the cost model's term
for them (skyjax.hostmodel.wake_cost through skyjax.hostmodel.sharing's replay)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.hostmodel import sharing
from skyjax.plan.replay.simulate import simulate_plan
from skyjax.hostmodel.wake_cost import wake_extra, wake_table
from tests.helpers import make_profile
from skyjax.hostmodel import SharedHostModel

HOST = SharedHostModel()  # the shared-host model's cost terms


def test_wake_table_interpolates_from_zero_and_holds_beyond_the_last_gap():
    table = wake_table({"wake_s": [[0.03, 0.003], [0.005, 0.001]]})
    assert wake_extra(table, 0.0) == 0.0
    assert wake_extra(table, 0.0025) == pytest.approx(0.0005)
    assert wake_extra(table, 0.0175) == pytest.approx(0.002)
    assert wake_extra(table, 1.0) == pytest.approx(0.003)
    for bad in ({}, {"wake_s": None}, {"wake_s": [[0.01, 0.0]]}, {"wake_s": [[0.01, -1.0]]},
                {"wake_s": [[0.01]]}, {"wake_s": "x"}):
        assert wake_table(bad) is None, bad


def test_a_stage_lighter_than_the_longest_unit_pays_between_the_light_and_heavy_extras():
    device = {"wake_s": [[0.005, 0.001], [0.03, 0.003]], "wake_light_s": [[0.03, 0.001]],
              "wake_work_s": [0.002, 0.010]}
    heavy = wake_table(device, 0.010)
    assert wake_extra(heavy, 0.03) == pytest.approx(0.003)
    assert wake_extra(wake_table(device, 0.5), 0.03) == pytest.approx(0.003)  # not beyond
    assert wake_extra(wake_table(device), 0.03) == pytest.approx(0.003)  # work unknown
    light = wake_table(device, 0.002)
    assert wake_extra(light, 0.03) == pytest.approx(0.001)
    assert wake_extra(light, 0.005) == pytest.approx(0.001 * 5 / 30)  # light's own table
    assert wake_extra(wake_table(device, 0.0001), 0.03) == pytest.approx(0.001)  # not below
    half = wake_table(device, 0.006)
    assert wake_extra(half, 0.03) == pytest.approx(0.002)
    assert wake_extra(half, 0.005) == pytest.approx((0.001 + 0.001 * 5 / 30) / 2)
    # malformed light keys: the heavy table, as in profiles before they were measured
    for bad in ({"wake_work_s": [0.01, 0.002]}, {"wake_work_s": None}, {"wake_light_s": "x"},
                {"wake_work_s": [float("nan"), 0.01]}):
        table = wake_table({**device, **bad}, 0.002)
        assert wake_extra(table, 0.03) == pytest.approx(0.003), bad


def test_replay_adds_the_wake_cost_of_each_gap():
    """GPipe, 2 stages, m = 1, every action 1 s: F0 [0, 1), F1 [1, 2), B1 [2, 3), B0 [3, 4)."""
    args = ([1.0, 1.0], [1.0, 1.0], [0.0], "gpipe", 1, [None, None], [1.0, 1.0])
    assert sharing.simulate_shared(*args)[0] == pytest.approx(4.0)
    half = wake_table({"wake_s": [[1.0, 0.5]]})
    # stage 1 idles 1 s before F1 (+0.5), none before B1; stage 0 has no wake cost
    t, busy = sharing.simulate_shared(*args, wake=[None, half])
    assert t == pytest.approx(4.5) and busy == pytest.approx([2.0, 2.5])
    # stage 0 idles 2.5 s before B0: the last measured gap's extra holds beyond it
    assert sharing.simulate_shared(*args, wake=[half, half])[0] == pytest.approx(5.0)
    # stage 1 slowed 2x (CPU work half of its time): half of F1 was its emulated sleep, so B1
    # follows 0.5 s of idle
    slowed = args[:-1] + ([1.0, 0.5],)
    t, busy = sharing.simulate_shared(*slowed, wake=[None, half])
    assert t == pytest.approx(4.75) and busy == pytest.approx([2.0, 2.75])
    # a device that is not a CPU (no CPU share) sleeps in none of its time
    t, busy = sharing.simulate_shared(*args[:-1], [1.0, 0.0], wake=[None, half])
    assert t == pytest.approx(4.5) and busy == pytest.approx([2.0, 2.5])


def _with_wake(profile, pairs):
    devices = [dict(dv, kind="cpu", wake_s=p) for dv, p in zip(profile.devices, pairs)]
    return dataclasses.replace(profile, devices=devices)


def test_wake_costs_in_T_and_the_simulated_step_and_no_longer_exact():
    base = make_profile(np.array([[0.1, 0.3]] * 6))
    prof = _with_wake(base, [[[0.01, 0.02]], [[0.01, 0.02]]])
    assignment = [(0, 0, 4), (1, 4, 6)]
    plain = plan_lib.evaluate(base, assignment, "1f1b", 4, extra=HOST)
    waking = plan_lib.evaluate(prof, assignment, "1f1b", 4, extra=HOST)
    effect = sharing.replay_effect(waking, prof)
    assert effect[0] > 0 and waking.step_time_s == pytest.approx(plain.step_time_s + effect[0])
    assert simulate_plan(waking, prof, extra=HOST).step_time_s == pytest.approx(waking.step_time_s)
    assert max(effect[1]) > 1.0  # a stage's busy time grows by its actions' wake costs
    # the search optimises T without the term: an exact plan's T is then only a bound
    best = plan_lib.searched_plan(base, "optimal", "1f1b", 4, extra=HOST)
    assert best.exact
    again = plan_lib.searched_plan(prof, "optimal", "1f1b", 4, extra=HOST)
    assert not again.exact and again.lower_bound_s == pytest.approx(best.step_time_s)
    assert again.step_time_s > best.step_time_s
    # no wake costs (or all zero): nothing changes
    zero = _with_wake(base, [[[0.01, 0.0]], None])
    assert sharing.replay_effect(plan_lib.evaluate(zero, assignment, "1f1b", 4, extra=HOST), zero) is None


def test_T_is_at_least_the_replayed_step_where_a_later_update_outlasts_the_fill():
    """The analytic T charges update_0 only; a later stage's update that outlasts the fill
    reaching it lengthens the replayed step, and where a replay applies T follows it (so that
    plans the analytic T ties are told apart as the simulator does)."""
    base = make_profile(np.array([[0.1, 0.3]] * 6))
    update = np.zeros((6, 2))
    update[4:, 1] = 5.0  # stage 1's update: 10 s, far beyond the fill that reaches it
    heavy = dataclasses.replace(base, update_s=update)
    prof = _with_wake(heavy, [[[0.01, 0.02]], [[0.01, 0.02]]])
    assignment = [(0, 0, 4), (1, 4, 6)]
    analytic = plan_lib.evaluate(heavy, assignment, "1f1b", 4, extra=HOST)
    plan = plan_lib.evaluate(prof, assignment, "1f1b", 4, extra=HOST)
    effect = sharing.replay_effect(plan, prof)
    assert plan.step_time_s == pytest.approx(simulate_plan(plan, prof, extra=HOST).step_time_s)
    assert plan.step_time_s > analytic.step_time_s + effect[0] + 5.0  # the update shows
    assert plan.extra_s == pytest.approx(plan.step_time_s - analytic.step_time_s)


@pytest.mark.slow
def test_profiler_measures_wake_costs_per_device():
    from tests.helpers import measure, tiny_config
    from skyjax.profile.options import Options
    from skyjax.hostmodel.wake import GAPS_S

    from skyjax.hostmodel import probes

    prof = measure(tiny_config(2, slowdowns=(1.0, 2.0)), options=Options(
        repeats=3, link_repeats=2, host=probes()))
    for dv in prof.devices:
        pairs = np.asarray(dv["wake_s"])
        assert pairs.shape == (len(GAPS_S), 2) and np.allclose(pairs[:, 0], GAPS_S)
        assert np.all(np.isfinite(pairs[:, 1])) and np.all(pairs[:, 1] >= 0), pairs
        light, (w_light, w_heavy) = np.asarray(dv["wake_light_s"]), dv["wake_work_s"]
        assert light.shape == pairs.shape and np.all(light[:, 1] >= 0), light
        assert 0 < w_light < w_heavy, dv["wake_work_s"]  # the shortest and the longest unit
        assert dv["host"] and dv["host_cores"] >= 1 and dv["cpu_cores"] > 0
    # Without the shared-host model none of its probes run: no host, cores or wake records.
    core = measure(tiny_config(2, slowdowns=(1.0, 2.0)), options=Options(repeats=3,
                                                                         link_repeats=2))
    for dv in core.devices:
        assert not {"host", "cpus", "cpu_cores", "wake_s"} & set(dv), dv


def test_wake_extras_below_the_noise_are_zero():
    """An accelerator's after-idle calls match its back-to-back ones within noise: those
    extras must be 0, or every plan would pay a replay penalty and lose ``exact``."""
    from skyjax.hostmodel.wake import GAPS_S, NOISE_FLOOR, wake_extras

    steady = [0.010, 0.0101, 0.0102, 0.0100]  # forward + backward seconds, back to back
    # 1 % slower after idle: below the floor (2 % of the action); a clear 20 % is kept
    pairs = wake_extras([steady, [x * 1.01 for x in steady], [x * 1.2 for x in steady]])
    assert [g for g, _ in pairs] == list(GAPS_S)
    assert pairs[0][1] == 0.0
    assert pairs[1][1] == pytest.approx(0.2 * 0.010 / 2)  # robust times: the fastest half
    assert NOISE_FLOOR * 0.010 / 2 < pairs[1][1]
    # noisy back-to-back times (median 5 % above the fastest): a 4 % extra is noise, 10 % not
    noisy = [0.010, 0.0100, 0.0110, 0.0110]
    pairs = wake_extras([noisy, [x * 1.04 for x in noisy], [x * 1.1 for x in noisy]])
    assert pairs[0][1] == 0.0 and pairs[1][1] > 0.0
    # no devices' extras above the floor: the profile's table is empty, plans stay exact
    assert wake_table({"wake_s": wake_extras([steady, steady, steady])}) is None


def test_heuristic_planner_bounds_the_analytic_T_and_reports_the_penalty():
    """The searches do not see the replay penalty: on the heuristic path too, the plan and its
    bound are those of the profile without wake costs, and T carries the penalty on top, where
    the replayed step is longer than the analytic T. Wake costs that the idle stage's slack
    absorbs (the analytic T charges the whole of its time, the replay overlaps it) add
    nothing."""
    base = make_profile(np.array([[0.1, 0.3]] * 6))
    plain = plan_lib.searched_plan(base, "optimal", "1f1b", 4, force_heuristic=True, extra=HOST)
    absorbed = _with_wake(base, [[[0.01, 0.02]], [[0.01, 0.02]]])
    small = plan_lib.searched_plan(absorbed, "optimal", "1f1b", 4, force_heuristic=True, extra=HOST)
    assert small.extra_s == 0 and small.step_time_s == pytest.approx(plain.step_time_s)
    assert simulate_plan(small, absorbed, extra=HOST).step_time_s < small.step_time_s
    prof = _with_wake(base, [[[0.01, 0.2]], [[0.01, 0.2]]])  # stage 1 then paces the step
    waking = plan_lib.searched_plan(prof, "optimal", "1f1b", 4, force_heuristic=True, extra=HOST)
    assert [s.units for s in waking.stages] == [s.units for s in plain.stages]
    assert waking.extra_s > 0 and not waking.exact
    assert waking.analytic_s == pytest.approx(plain.step_time_s)
    bound = plain.step_time_s if plain.exact else plain.lower_bound_s
    assert waking.lower_bound_s == pytest.approx(bound)
    again = plan_lib.Plan.from_json(waking.to_json())
    assert again.extra_s == pytest.approx(waking.extra_s)
    assert "extra_s" not in plain.to_json()  # plan.json unchanged without a penalty
