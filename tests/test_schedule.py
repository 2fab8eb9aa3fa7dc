"""Schedules: action lists, simulation vs closed forms and vs the cost model, trace."""

from __future__ import annotations

import json

import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.plan.model import schedules
from skyjax.plan.replay import simulate
from skyjax.plan.model.schedules import Action

CASES = [(1, 1), (1, 4), (2, 2), (3, 1), (4, 8), (4, 2), (8, 3), (5, 16)]


def model_time(f, b, c, m):
    tk = [f[k] + b[k] + 2 * (c[k] if k < len(f) - 1 else 0.0) for k in range(len(f))]
    return sum(tk) + (m - 1) * max(tk)


@pytest.mark.parametrize("sched", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", CASES)
def test_action_lists(sched, p, m):
    lists = schedules.actions(sched, p, m)
    assert len(lists) == p
    for k, acts in enumerate(lists):
        assert sorted(acts, key=lambda a: (a.kind, a.microbatch)) == (
            [Action("B", i) for i in range(m)] + [Action("F", i) for i in range(m)])
        for i in range(m):
            assert acts.index(Action("F", i)) < acts.index(Action("B", i))
        fwd = [a.microbatch for a in acts if a.kind == "F"]
        assert fwd == sorted(fwd)
    peaks = schedules.inflight_peaks(lists)
    assert peaks == ([m] * p if sched == "gpipe" else [min(m, p - k) for k in range(p)])


def test_1f1b_shape():
    assert [str(a) for a in schedules.actions("1f1b", 3, 4)[0]] == \
        ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]
    assert [str(a) for a in schedules.actions("1f1b", 3, 4)[2]] == \
        ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]
    assert [str(a) for a in schedules.actions("gpipe", 2, 2)[1]] == ["F0", "F1", "B1", "B0"]
    with pytest.raises(ValueError):
        schedules.actions("zb", 2, 2)


@pytest.mark.parametrize("sched", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", CASES)
def test_balanced_closed_form(sched, p, m):
    f, b = 0.5, 1.25
    r = simulate.simulate([f] * p, [b] * p, [0.0] * (p - 1), sched, m)
    assert r.step_time_s == pytest.approx((m + p - 1) * (f + b))
    assert r.busy_s == pytest.approx([m * (f + b)] * p)
    assert r.idle_s == pytest.approx([(p - 1) * (f + b)] * p)
    want = [m] * p if sched == "gpipe" else [min(m, p - k) for k in range(p)]
    assert r.peak_inflight == want


@pytest.mark.parametrize("p,m", CASES)
def test_gpipe_with_links(p, m):
    f, b, c = 1.0, 2.0, 0.3
    ov = simulate.simulate([f] * p, [b] * p, [c] * (p - 1), "gpipe", m)
    assert ov.step_time_s == pytest.approx((m + p - 1) * (f + b) + 2 * c * (p - 1))
    blk = simulate.simulate([f] * p, [b] * p, [c] * (p - 1), "gpipe", m, overlap_comm=False)
    assert blk.step_time_s == pytest.approx(model_time([f] * p, [b] * p, [c] * (p - 1), m))


def test_model_vs_simulation_random():
    """Backward proportional to forward (one device per stage): GPipe without comm equals the
    cost model exactly; with comm overlapped the model is an upper bound for both schedules."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        p, m = int(rng.integers(1, 8)), int(rng.integers(1, 17))
        f = rng.exponential(1.0, p)
        b = f * rng.uniform(1.0, 3.0)
        c = rng.exponential(0.3, p - 1)
        zero = np.zeros(p - 1)
        g = simulate.simulate(f, b, zero, "gpipe", m).step_time_s
        assert g == pytest.approx(model_time(f, b, zero, m), rel=1e-9)
        for sched in ("gpipe", "1f1b"):
            r = simulate.simulate(f, b, c, sched, m)
            assert r.step_time_s <= model_time(f, b, c, m) * (1 + 1e-9)
            assert r.step_time_s >= sum(f + b) + (m - 1) * max(f + b) * 0.5


def test_trace_is_chrome_json():
    r = simulate.simulate([1.0, 2.0], [2.0, 4.0], [0.5], "1f1b", 3, names=["a", "b"])
    text = json.dumps(r.trace)
    events = json.loads(text)["traceEvents"]
    work = [e for e in events if e["ph"] == "X" and e["pid"] == 0]
    assert len(work) == 2 * 2 * 3
    assert {e["name"] for e in work} == {f"{k}{i}" for k in "FB" for i in range(3)}
    assert all(e["dur"] > 0 for e in work)
    assert max(e["ts"] + e["dur"] for e in work) == pytest.approx(r.step_time_s * 1e6)
    assert any(e["ph"] == "M" and e["args"]["name"] == "stage 1 (b)" for e in events)
    assert any(e["pid"] == 1 for e in events)  # link transfers


def test_simulate_plan_matches_cost_model():
    """A GPipe plan with free links and backward = 2 x forward: simulation == plan T."""
    from tests.helpers import make_profile

    rng = np.random.default_rng(3)
    fwd = rng.uniform(0.5, 2.0, (12, 1)) * rng.uniform(1, 4, (1, 4))
    prof = make_profile(fwd, 2 * fwd, latency=np.zeros((4, 4)), bandwidth=np.full((4, 4), np.inf))
    for m in (1, 4, 16):
        p = plan_lib.plan(prof, "optimal", "gpipe", m)
        r = simulate.simulate_plan(p, prof)
        assert r.step_time_s == pytest.approx(p.step_time_s, rel=1e-9)
        p1 = plan_lib.plan(prof, "optimal", "1f1b", m)
        assert simulate.simulate_plan(p1, prof).step_time_s <= p1.step_time_s * (1 + 1e-9)


def test_the_tied_weights_message_is_priced_on_the_first_and_last_stages_link():
    """A decoder's tied embedding (profile.json ``tied_bytes`` on its first and last unit): the
    first and last stage swap its gradient after their last action, latency + bytes / bandwidth
    on their link; one stage sends nothing, and a profile without it is priced as before."""
    from tests.helpers import make_profile

    latency = np.full((3, 3), 0.01)
    bandwidth = np.full((3, 3), 1e6)
    prof = make_profile(np.full((4, 3), 1e-3), latency=latency, bandwidth=bandwidth)
    stages = [plan_lib.Stage(0, (0, 2), 0.0, 0.0, 0), plan_lib.Stage(1, (2, 4), 0.0, 0.0, 0)]
    plan = plan_lib.Plan("manual", "1f1b", 4, stages, step_time_s=0.0, bottleneck_s=0.0,
                         exact=False)
    before = simulate.simulate_plan(plan, prof).step_time_s
    for u in (0, 3):
        prof.units[u]["tied_bytes"] = 20_000  # 0.02 s on the link
    sim = simulate.simulate_plan(plan, prof)
    ends = [max(s.end for s in sim.spans if s.stage == k) for k in (0, 1)]
    tied = 0.01 + 20_000 / 1e6
    assert sim.step_time_s == pytest.approx(max(before, max(ends[0], ends[1] + tied),
                                                max(ends[1], ends[0] + tied)))
    assert sim.step_time_s > before
    one = plan_lib.Plan("manual", "1f1b", 4, [plan_lib.Stage(0, (0, 4), 0.0, 0.0, 0)],
                        step_time_s=0.0, bottleneck_s=0.0, exact=False)
    assert simulate.simulate_plan(one, prof).step_time_s == pytest.approx(
        simulate.simulate_plan(one, make_profile(np.full((4, 3), 1e-3))).step_time_s)
