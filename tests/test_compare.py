"""skyjax.report.compare: per-stage predicted vs measured (summary.json / trace.json ``stages``)."""

from __future__ import annotations

import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.report.compare import stage_comparison
from skyjax.plan.replay.simulate import simulate_plan
from skyjax.spans import Span
from tests.helpers import make_profile, shared_profile


def _plan():
    prof = make_profile(np.ones((6, 3)) * [1.0, 2.0, 3.0], out=np.full(6, 50.0),
                        latency=np.full((3, 3), 0.25), bandwidth=np.full((3, 3), 100.0))
    return prof, plan_lib.evaluate(prof, [(0, 0, 3), (1, 3, 5), (2, 5, 6)], "1f1b", 4)


def test_simulated_spans_compare_equal():
    """Spans of the simulation itself, taken as 'measured', reproduce every predicted term."""
    prof, plan = _plan()
    sim = simulate_plan(plan, prof)
    rep = stage_comparison(plan, prof, sim.spans)
    for rec in rep["stages"]:
        assert rec["measured"]["compute_s"] == pytest.approx(rec["predicted"]["compute_s"])
        assert rec["measured"]["idle_s"] == pytest.approx(rec["predicted"]["idle_s"])
        assert rec["compute_error"] == pytest.approx(0.0, abs=1e-12)
        assert rec["measured"]["comm_s"] <= rec["predicted"]["comm_s"] + 1e-9
    # stage 0 always waits on its gradients over link 0: the link delay is seen there
    assert rep["stages"][0]["measured"]["comm_s"] > 0
    assert rep["replayed_step_s"] == pytest.approx(sim.step_time_s)


def test_slow_stage_shows_in_compute_error():
    prof, plan = _plan()
    spans = [Span(s.stage, s.kind, s.microbatch, s.start * 1.0, s.start + (s.end - s.start) *
                  (1.5 if s.stage == 1 else 1.0)) for s in simulate_plan(plan, prof).spans]
    rep = stage_comparison(plan, prof, spans)
    errs = [r["compute_error"] for r in rep["stages"]]
    assert errs[1] == pytest.approx(1 / 3) and abs(errs[0]) < 1e-12
    assert rep["replayed_step_s"] > rep["simulated_step_s"]


def test_no_spans_predicted_only():
    prof, plan = _plan()
    rep = stage_comparison(plan, prof, [])
    assert all("measured" not in r for r in rep["stages"]) and "replayed_step_s" not in rep


def test_calibration_from_measured_step():
    """replan.corrected_profile: compute scaled per device, link latency grown by the mean
    excess per message; the corrected profile then predicts the measured terms."""
    from skyjax.plan.replan import corrected_profile

    prof, plan = _plan()
    m = plan.microbatches
    busy = [s.compute_s * m * f for s, f in zip(plan.stages, (1.5, 1.0, 2.0))]
    link = 0.25 + 50.0 / 100.0
    comm = [2 * m * (link + 0.1), 2 * m * (link + 0.3), 0.0]
    fixed, factors = corrected_profile(prof, plan, busy, comm)
    assert factors == pytest.approx({0: 1.5, 1: 1.0, 2: 2.0})
    again = plan_lib.evaluate(fixed, [(s.device, *s.units) for s in plan.stages], "1f1b", m)
    assert [s.compute_s * m for s in again.stages] == pytest.approx(busy)
    assert fixed.latency_s[0, 1] == pytest.approx(0.25 + 0.2)
    assert sum(s.comm_s for s in again.stages) * m == pytest.approx(sum(comm))


def test_calibration_keeps_the_per_step_sync():
    """Compute and links are corrected, the per-step sync is not: what a measured period leaves
    beyond them grows with a plan's stages, so the corrected profile keeps the profile's
    sync_s, and a one-stage plan (no links) is re-predicted exactly from its measured compute."""
    from skyjax.plan.replan import corrected_profile

    prof, plan = _plan()
    m = plan.microbatches
    busy = [s.compute_s * m * 1.2 for s in plan.stages]
    fixed, _ = corrected_profile(prof, plan, busy, [0.5] * len(plan.stages))
    assert fixed.sync_s == prof.sync_s
    assert np.all(fixed.latency_s >= prof.latency_s)
    one = plan_lib.evaluate(prof, [(plan.stages[0].device, 0, plan.stages[-1].units[1])],
                            "1f1b", m)
    fixed, _ = corrected_profile(prof, one, [one.stages[0].compute_s * m * 1.3])
    again = plan_lib.evaluate(fixed, [(s.device, *s.units) for s in one.stages], "1f1b", m)
    assert again.stages[0].compute_s == pytest.approx(one.stages[0].compute_s * 1.3)
    assert again.step_time_s - one.step_time_s == pytest.approx(
        m * one.stages[0].compute_s * 0.3, rel=1e-6)


def test_calibration_splits_a_per_action_host_cost_from_device_factors():
    """Every stage measured at (factor x predicted + b per action) with one stage at factor 1:
    the correction finds b (host-wide, so other blocks and unused devices pay it per action)
    and the factors, instead of multiplying a small stage's device by its large ratio."""
    from skyjax.plan.replan import corrected_profile

    prof, _ = _plan()
    m = 4
    plan = plan_lib.evaluate(prof, [(0, 0, 1), (1, 1, 6)], "1f1b", m)  # a one-unit stage
    b, actions = 0.4, 2 * m
    busy = [plan.stages[0].compute_s * m + actions * b,
            1.5 * plan.stages[1].compute_s * m + actions * b]
    fixed, factors = corrected_profile(prof, plan, busy)
    assert factors[0] == pytest.approx(busy[0] / (plan.stages[0].compute_s * m))
    again = plan_lib.evaluate(fixed, [(0, 0, 1), (1, 1, 6)], "1f1b", m)
    assert [s.compute_s * m for s in again.stages] == pytest.approx(busy)
    other = plan_lib.evaluate(fixed, [(0, 0, 4), (2, 4, 6)], "1f1b", m)
    base = plan_lib.evaluate(prof, [(0, 0, 4), (2, 4, 6)], "1f1b", m)
    # device 0: factor 1 on four units plus b per action; device 2 (unused): b per action
    assert [s.compute_s for s in other.stages] == pytest.approx(
        [s.compute_s + 2 * b for s in base.stages])


def test_step_boundary_is_last_end_to_next_first_start():
    from skyjax.report.compare import step_boundary_s

    one = [Span(0, "F", 0, 0.0, 1.0), Span(1, "F", 0, 1.1, 2.0), Span(0, "B", 0, 2.5, 3.0)]
    two = [Span(0, "F", 0, 3.2, 4.0), Span(1, "F", 0, 4.1, 5.0), Span(0, "B", 0, 5.5, 6.5)]
    three = [Span(0, "F", 0, 6.6, 7.0)]
    assert step_boundary_s([one, two, three]) == pytest.approx([0.2, 0.1])
    assert step_boundary_s([one, [], two]) == [] and step_boundary_s([one]) == []


def test_message_delays_only_where_the_consumer_was_free():
    from skyjax.plan.replay.measured import measured_comm, message_delays

    # GPipe, 2 stages, m = 2: stage 1 is still busy with F1(0) when F0(1) ends
    spans = [Span(0, "F", 0, 0.0, 1.0), Span(0, "F", 1, 1.0, 2.0),
             Span(1, "F", 0, 1.5, 3.0), Span(1, "F", 1, 3.1, 4.0),
             Span(1, "B", 1, 4.0, 5.0), Span(1, "B", 0, 5.0, 6.0),
             Span(0, "B", 1, 5.4, 6.0), Span(0, "B", 0, 6.0, 7.0)]
    # F0 -> F1 (mb 0): 0.5, consumer free; F (mb 1): consumer busy until 3.0, excluded;
    # B (mb 1): 0.4, free; B (mb 0): stage 0 busy until 6.0 when B1(0) ended at 6.0: free, 0
    assert sorted(message_delays(spans, 2)) == pytest.approx([0.0, 0.4, 0.5])
    assert measured_comm(spans, 2) == pytest.approx([0.5 + 0.1 + 0.4 + 0.0])


def test_predicted_compute_carries_the_sharing_slowdown():
    """Stages sharing a host's cores are predicted to compute slower by the replayed sharing
    ratio (what the measured spans show), and the same stages apart are not."""
    from skyjax.hostmodel import SharedHostModel
    from skyjax.hostmodel.sharing import replay_effect

    host = SharedHostModel()
    base, _ = _plan()
    blocks = [(0, 0, 3), (1, 3, 5), (2, 5, 6)]
    apart = shared_profile(base, (1, 1, 1), ["a", "b", "c"])
    alone = stage_comparison(plan_lib.evaluate(apart, blocks, "1f1b", 4, extra=host), apart, [],
                             extra=host)
    one_host = shared_profile(base, (1, 1, 1))
    plan = plan_lib.evaluate(one_host, blocks, "1f1b", 4, extra=host)
    shared = stage_comparison(plan, one_host, [], extra=host)
    ratio = replay_effect(plan, one_host)[1]
    assert max(ratio) > 1.2
    for a, s, r in zip(alone["stages"], shared["stages"], ratio):
        assert a["predicted"]["slowdown"] == 1.0
        assert s["predicted"]["slowdown"] == pytest.approx(r)
        assert s["predicted"]["compute_s"] == pytest.approx(a["predicted"]["compute_s"] * r)


def test_contention_split_separates_actions_that_ran_alone():
    """An action counts as alone where no other stage of its host was in its CPU part (a
    device slowed k times computes for the first 1/k of a span) during its own; the predicted
    action is the model's (message calls included)."""
    import dataclasses

    from skyjax.hostmodel import SharedHostModel
    from skyjax.hostmodel.contention import contention_split

    base, _ = _plan()
    blocks = [(0, 0, 3), (1, 3, 6)]
    step = [Span(0, "F", 0, 0.0, 1.0), Span(1, "F", 0, 1.0, 3.0),  # stage 1 computes 1..2
            Span(0, "F", 1, 2.0, 3.5),  # beside stage 1's B0 from 3 (stage 1 sleeps 2..3)
            Span(1, "B", 0, 3.0, 5.0),  # computes 3..4, beside stage 0's F1 until 3.5
            Span(0, "B", 0, 5.0, 7.0)]
    one_host = dataclasses.replace(shared_profile(base, (1, 2, 3)), message_s=np.full(3, 0.1))
    plan = plan_lib.evaluate(one_host, blocks, "1f1b", 4)
    rows = contention_split(plan, one_host, [step])
    assert rows[0]["F"] == {"predicted_s": pytest.approx(3.0 + one_host.forward_call_s[0] + 0.1),
                            "alone_s": 1.0, "alone_count": 1, "all_s": 1.25}
    assert rows[1]["F"]["alone_s"] == 2.0 and rows[1]["F"]["alone_count"] == 1
    assert rows[1]["B"] == {"predicted_s": pytest.approx(12.0 + one_host.backward_call_s[1] + 0.1),
                            "alone_s": None, "alone_count": 0, "all_s": 2.0}
    apart = dataclasses.replace(shared_profile(base, (1, 2, 3), ["a", "b", "c"]),
                                message_s=np.full(3, 0.1))
    rows = contention_split(plan_lib.evaluate(apart, blocks, "1f1b", 4), apart, [step])
    assert rows[1]["B"]["alone_count"] == 1  # other hosts' stages take nothing from it
    # stage_comparison (summary.json) carries the split where two of the plan's stages share a
    # host, and only there
    host = SharedHostModel()
    rep = stage_comparison(plan_lib.evaluate(one_host, blocks, "1f1b", 4), one_host, step,
                           steps=[step, step], extra=host)
    assert [r["F"]["alone_count"] for r in rep["contention"]] == [2, 2]
    assert "contention" not in stage_comparison(plan_lib.evaluate(apart, blocks, "1f1b", 4),
                                                apart, step, steps=[step], extra=host)
    # without the shared-host model nothing of it is reported
    assert "contention" not in stage_comparison(plan_lib.evaluate(one_host, blocks, "1f1b", 4),
                                                one_host, step, steps=[step, step])
