"""Processes sharing a host's cores (skyjax.hostmodel.sharing): the processor-sharing simulation, the
penalty it adds to T, the calibration that removes it, and the planner's device subsets."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.hostmodel import sharing
from skyjax.plan import replan
from skyjax.plan.replay.simulate import simulate, simulate_plan
from tests.helpers import make_profile, shared_profile
from skyjax.hostmodel import SharedHostModel

HOST = SharedHostModel()  # the shared-host model's cost terms


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_unshared_equals_simulate(schedule):
    rng = np.random.default_rng(3)
    for _ in range(60):
        p, m = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        f, b = rng.uniform(0.1, 1, p), rng.uniform(0.1, 2, p)
        c, u = rng.uniform(0, 0.3, p - 1), rng.uniform(0, 0.5, p)
        want = simulate(f, b, c, schedule, m, update_s=u, sync_s=0.1)
        got, busy = sharing.simulate_shared(f, b, c, schedule, m, [None] * p, [0.7] * p,
                                            update_s=u, sync_s=0.1)
        assert got == pytest.approx(want.step_time_s, abs=1e-9)
        assert busy == pytest.approx(want.busy_s, abs=1e-9)


def test_one_host_runs_the_total_work():
    """Two stages of pure CPU work on one host: the host is never idle once both run and its
    rate is one process's, so the step is the total work (32 s), not the pipeline's 18 s."""
    args = ([1.0, 1.0], [1.0, 1.0], [0.0], "1f1b", 8)
    alone, _ = sharing.simulate_shared(*args, [None, None], [1.0, 1.0])
    shared, busy = sharing.simulate_shared(*args, [0, 0], [1.0, 1.0])
    assert alone == pytest.approx(18.0) and shared == pytest.approx(32.0)
    assert sum(busy) > 32.0  # each stage's actions stretch while the other computes
    # No CPU part (e.g. an emulated device's sleep, a GPU): sharing costs nothing.
    assert sharing.simulate_shared(*args, [0, 0], [0.0, 0.0])[0] == pytest.approx(18.0)
    # Two cores, one busy per call: room for both. Each keeping 1.5 busy: 2/3 speed together.
    assert sharing.simulate_shared(*args, [0, 0], [1.0, 1.0], demand=[1.0, 1.0],
                                   capacity=[2.0])[0] == pytest.approx(18.0)
    both = sharing.simulate_shared(*args, [0, 0], [1.0, 1.0], demand=[1.5, 1.5], capacity=[2.0])
    assert 18.0 < both[0] < 32.0
    # Different hosts: nothing shared either.
    assert sharing.simulate_shared(*args, [0, 1], [1.0, 1.0])[0] == pytest.approx(18.0)


def test_host_groups_need_two_processes_on_a_host():
    prof = make_profile(np.ones((4, 3)))
    assert sharing.host_groups(prof) is None  # no host recorded (older profiles)
    assert sharing.host_groups(shared_profile(prof, (1, 2, 3), ["a", "b", "c"])) is None
    assert sharing.host_groups(shared_profile(prof, (1, 2, 3), ["a", "b", "a"])) == [0, None, 0]
    one_process = shared_profile(prof, (1, 1, 1))
    one_process.devices = [dict(dv, process_index=0) for dv in one_process.devices]
    assert sharing.host_groups(one_process) is None  # devices of one process: no sharing
    assert sharing.cpu_shares(shared_profile(prof, (1, 2, 4))) == pytest.approx([1.0, 0.5, 0.25])
    measured = shared_profile(prof, (1, 2, 3), ["a", "b", "a"])
    for dv, cores in zip(measured.devices, (1.5, 1.2, 0.9)):
        dv.update(cpu_cores=cores, host_cores=2)
    # whole cores a call's threads need (its average use rounded up), at most the host's
    assert sharing.cpu_demand(measured) == pytest.approx([2.0, 2.0, 1.0])
    measured.devices[0]["cpu_cores"] = 3.4  # more than its process may use: the host's 2
    assert sharing.cpu_demand(measured) == pytest.approx([2.0, 2.0, 1.0])
    assert sharing.host_capacity(measured) == [2.0]
    assert sharing.host_capacity(shared_profile(prof, (1, 2, 3))) == [1.0]  # unknown: one process


def test_processes_bound_to_disjoint_cores_share_nothing():
    """Cores recorded per process (``launch --bind_cores``, SLURM binding): disjoint sets do not
    share, overlapping ones do (transitively), and a group's capacity is its cores' union."""
    prof = shared_profile(make_profile(np.ones((4, 4))), (1, 2, 3, 4))
    for dv, cpus in zip(prof.devices, ([0, 1], [2, 3], [4, 5], [6, 7])):
        dv.update(cpus=cpus, host_cores=len(cpus))
    assert sharing.host_groups(prof) is None
    assert sharing.stage_sharing(plan_lib.evaluate(prof, [(0, 0, 2), (1, 2, 4)], "1f1b", 4, extra=HOST),
                                 prof) is None
    prof.devices[1]["cpus"] = [1, 2, 4]  # overlaps devices 0 and 2: one group of three
    assert sharing.host_groups(prof) == [0, 0, 0, None]
    assert sharing.host_capacity(prof) == [5.0]  # cores 0, 1, 2, 4, 5
    prof.devices[3].pop("cpus")  # unknown cores: it may run anywhere on the host
    assert sharing.host_groups(prof) == [0, 0, 0, 0]


def test_penalty_in_T_and_simulation():
    """T and the simulated step carry the same penalty; a plan whose stages share no host has
    none; the penalty is what the shared simulation adds."""
    base = make_profile(np.full((6, 2), 0.1))
    prof = shared_profile(base, (1, 1))
    assignment = [(0, 0, 3), (1, 3, 6)]
    plain = plan_lib.evaluate(base, assignment, "1f1b", 8, extra=HOST)
    shared = plan_lib.evaluate(prof, assignment, "1f1b", 8, extra=HOST)
    effect = sharing.replay_effect(shared, prof)
    assert effect[0] > 0.5 * plain.step_time_s
    assert shared.step_time_s == pytest.approx(plain.step_time_s + effect[0])
    assert simulate_plan(shared, prof, extra=HOST).step_time_s == pytest.approx(
        simulate_plan(plain, base, extra=HOST).step_time_s + effect[0])
    alone = plan_lib.evaluate(prof, [(0, 0, 6)], "1f1b", 8, extra=HOST)
    assert sharing.replay_effect(alone, prof) is None
    assert alone.step_time_s == pytest.approx(plan_lib.evaluate(base, [(0, 0, 6)], "1f1b",
                                                                 8, extra=HOST).step_time_s)


def test_T_is_the_larger_of_the_analytic_T_and_the_replay_not_their_sum():
    """Four stages with links on one host: the analytic T charges the bottleneck's transfers in
    every repeat, which the replay overlaps (the unshared replay is shorter than the analytic T).
    T is the shared replay's step, not the analytic T plus what sharing adds to the replay,
    which would count those transfers' time twice; and never below the analytic T."""
    latency = np.full((4, 4), 0.05) - 0.05 * np.eye(4)
    base = make_profile(np.full((8, 4), 0.05), latency=latency)
    prof = shared_profile(base, (1, 2, 3, 6))
    assignment = [(0, 0, 2), (1, 2, 4), (2, 4, 6), (3, 6, 8)]
    analytic = plan_lib.evaluate(base, assignment, "1f1b", 4, extra=HOST).step_time_s
    plan = plan_lib.evaluate(prof, assignment, "1f1b", 4, extra=HOST)
    added, _, replayed = sharing.replay_effect(plan, prof)
    assert replayed - added < analytic  # the unshared replay overlaps the transfers
    assert plan.step_time_s == pytest.approx(replayed) and replayed > analytic
    assert plan.step_time_s < analytic + added - 0.05  # the old sum
    assert plan.analytic_s == pytest.approx(analytic)
    assert simulate_plan(plan, prof, extra=HOST).step_time_s == pytest.approx(plan.step_time_s)


def test_planner_leaves_out_a_device_when_sharing_makes_it_slower():
    """Two equal CPU devices on one host: splitting halves each stage but both then run at
    half speed (the host does the same work), and the link adds its delay; one device alone is
    faster. On two hosts the split wins. The result is not exact; its bound stays below it."""
    base = make_profile(np.full((6, 2), 0.1), latency=[[0.0, 0.01], [0.01, 0.0]])
    on_one = plan_lib.plan(shared_profile(base, (1, 1)), "optimal", "1f1b", 4, extra=HOST)
    assert len(on_one.stages) == 1 and not on_one.exact
    assert on_one.lower_bound_s <= on_one.step_time_s
    on_two = plan_lib.plan(shared_profile(base, (1, 1), ["a", "b"]), "optimal", "1f1b", 4, extra=HOST)
    assert len(on_two.stages) == 2
    # Slow devices mostly sleep: sharing costs little and the split is kept.
    slow = make_profile(np.full((6, 2), 0.4), latency=[[0.0, 0.01], [0.01, 0.0]])
    assert len(plan_lib.plan(shared_profile(slow, (4, 4)), "optimal", "1f1b", 4, extra=HOST).stages) == 2
    # Without subsets the searches alone keep both devices.
    assert len(plan_lib.plan(shared_profile(base, (1, 1)), "optimal", "1f1b", 4).stages) == 2


def test_calibration_corrects_the_device_not_the_contention():
    """Measured busy times equal to the shared prediction leave the device factors at 1: the
    contention is the model's, not the device's."""
    prof = shared_profile(make_profile(np.full((6, 2), 0.1)), (1, 2))
    plan = plan_lib.evaluate(prof, [(0, 0, 3), (1, 3, 6)], "1f1b", 8, extra=HOST)
    ratio = sharing.replay_effect(plan, prof)[1]
    assert max(ratio) > 1.2
    busy = [s.compute_s * 8 * r for s, r in zip(plan.stages, ratio)]
    fixed, factors = replan.corrected_profile(prof, plan, busy, extra=HOST)
    assert np.allclose(fixed.forward_s, prof.forward_s)
    assert list(factors.values()) == pytest.approx([1.0, 1.0])


def test_calibration_takes_one_factor_per_shared_host():
    """Where devices share a host, one stage meeting more contention than predicted (x1.5) and
    the other none: the host's measured over predicted compute scales every device of the host
    alike, the idle one too (which stage met how much of the contention the model knows only on
    average); a device on another host keeps its own ratio (x2)."""
    prof = shared_profile(make_profile(np.full((6, 4), 0.1)), (1, 2, 1, 1), ["h", "h", "h", "g"])
    prof = dataclasses.replace(prof, latency_s=np.zeros((4, 4)))
    plan = plan_lib.evaluate(prof, [(0, 0, 2), (1, 2, 4), (3, 4, 6)], "1f1b", 8, extra=HOST)
    ratio = sharing.replay_effect(plan, prof)[1]
    predicted = [s.compute_s * 8 * r for s, r in zip(plan.stages, ratio)]
    busy = [predicted[0] * 1.5, predicted[1], predicted[2] * 2.0]
    fixed, factors = replan.corrected_profile(prof, plan, busy, extra=HOST)
    assert factors == pytest.approx({0: 1.5, 1: 1.0, 3: 2.0})
    host = (busy[0] + busy[1]) / (predicted[0] + predicted[1])  # b = 0: stage 1 has no excess
    scale = fixed.forward_s[0] / prof.forward_s[0]
    assert scale == pytest.approx([host, host, host, 2.0])
    again = plan_lib.evaluate(fixed, [(0, 0, 2), (1, 2, 4), (3, 4, 6)], "1f1b", 8, extra=HOST)
    shared = sum(s.compute_s * 8 * r for s, r in zip(again.stages[:2],
                                                    sharing.replay_effect(again, fixed)[1]))
    assert shared == pytest.approx(busy[0] + busy[1], rel=0.05)  # the host's total is kept


def test_replay_charges_the_lateness_of_a_waited_for_message():
    """GPipe, 2 stages, m = 1, actions of 10 ms: F0 [0, 10), F1 after waiting 10 ms, B1, B0
    after waiting 20.5 ms. A CPU device's receive looks every 10 % of its wait (at most 2 ms),
    so it sees a message half that late on average: 0.5 ms, then 1 ms; another device's looks
    every 0.2 ms after a 2 ms spin: 0.1 ms each. Without ``poll`` nothing is charged."""
    from skyjax.transport import polling
    from skyjax.transport import transfer

    args = ([0.01, 0.01], [0.01, 0.01], [0.0], "gpipe", 1, [None, None], [1.0, 1.0])
    assert sharing.simulate_shared(*args)[0] == pytest.approx(0.04)
    assert sharing.simulate_shared(*args, poll=[True, True])[0] == pytest.approx(0.0415)
    assert sharing.simulate_shared(*args, poll=[False, False])[0] == pytest.approx(0.0402)
    assert sharing.simulate_shared(*args, poll=[None, True])[0] == pytest.approx(0.0405)
    assert polling.expected_lateness(0.0004, True) == 0.0  # within the first spin
    assert polling.expected_lateness(0.1, True) == pytest.approx(0.001)  # the 2 ms cap
    assert transfer.poll_pause is polling.poll_pause  # the model follows the runtime's rule


def test_lateness_of_cpu_receives_in_T_where_a_replay_applies(monkeypatch):
    """Two CPU stages on one host: the replayed step, and T with it, carries the lateness of
    the receives that waited (0.5-1 ms each here)."""
    prof = shared_profile(make_profile(np.full((2, 2), 0.005)), (1, 1))
    prof.devices = [dict(dv, kind="cpu") for dv in prof.devices]
    plan = plan_lib.evaluate(prof, [(0, 0, 1), (1, 1, 2)], "gpipe", 1, extra=HOST)
    late = sharing.replay_effect(plan, prof)
    assert plan.step_time_s >= late[2] - 1e-12
    assert simulate_plan(plan, prof, extra=HOST).step_time_s == pytest.approx(plan.step_time_s)
    monkeypatch.setattr(sharing, "expected_lateness", lambda waited, cpu: 0.0)
    assert late[2] > sharing.replay_effect(plan, prof)[2] + 0.001
