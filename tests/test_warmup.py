"""Latency hidden by micro-batches in flight (docs/design.md, "Latency and the window"): 1F1B
with per-stage warm-ups as data, the simulator's link queues, the window model against brute
force and the simulator, its bound, the planner's choice, and the same math at run time."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.plan.model import schedules
from skyjax.plan.replay import simulate
from skyjax.plan.search import warmup
from skyjax.plan.bounds.step import lower_bound
from skyjax.plan.pricing.cost import evaluate_tables, tables
from skyjax.plan.model.schedules import Action
from skyjax.plan.model.types import InfeasibleError
from tests.helpers import assignments, make_profile, random_profile


@pytest.mark.parametrize("p,m", [(2, 4), (3, 4), (4, 8), (3, 2)])
def test_deeper_warmup_lists(p, m):
    """Every warm-up vector at least 1F1B's and not increasing: each F and B once, F(i) before
    B(i), both in micro-batch order (the backward order, so the gradient sums, are 1F1B's),
    min(m, warmup + 1) in flight, and the simulator runs them without deadlock."""
    own = schedules.warmups(p, m)
    for warm in itertools.product(range(m + 1), repeat=p):
        if any(w < o for w, o in zip(warm, own)) or any(a < b for a, b in zip(warm, warm[1:])):
            with pytest.raises(ValueError, match="warmup"):
                schedules.actions("1f1b", p, m, warmup=list(warm))
            continue
        lists = schedules.actions("1f1b", p, m, warmup=list(warm))
        for acts in lists:
            assert [a.microbatch for a in acts if a.kind == "F"] == list(range(m))
            assert [a.microbatch for a in acts if a.kind == "B"] == list(range(m))
            assert all(acts.index(Action("F", i)) < acts.index(Action("B", i))
                       for i in range(m))
        want = [min(m, w + 1) for w in warm]
        assert schedules.inflight_peaks(lists) == want
        assert schedules.inflight_limit("1f1b", p, m, list(warm)) == want
        simulate.simulate([1.0] * p, [2.0] * p, [0.5] * (p - 1), "1f1b", m, lists=lists)
    assert schedules.actions("1f1b", p, m, warmup=[None] * p) == schedules.actions("1f1b", p, m)
    with pytest.raises(ValueError, match="only 1f1b"):
        schedules.actions("gpipe", p, m, warmup=own)


def test_links_are_queues_as_the_link_clock():
    """A link carries one message at a time per direction (its bytes), latency beside: GPipe
    with no compute over one link of latency L and x seconds of bytes ends 2 L + 2 m x after
    it starts (the transports' LinkClock gives the same due times); as a pure delay, 2 L + 2 x."""
    from skyjax.cluster.emulation import LinkEmulation
    from skyjax.transport.base import LinkClock

    lat, x, m = 0.04, 0.01, 5
    queued = simulate.simulate([0.0, 0.0], [0.0, 0.0], [lat + x], "gpipe", m, latency_s=[lat])
    assert queued.step_time_s == pytest.approx(2 * lat + 2 * m * x)
    delay = simulate.simulate([0.0, 0.0], [0.0, 0.0], [lat + x], "gpipe", m)
    assert delay.step_time_s == pytest.approx(2 * lat + 2 * x)
    now = [0.0]
    clock = LinkClock(LinkEmulation(np.array([[0, lat], [lat, 0]]),
                                    np.array([[0, 1e6], [1e6, 0]])), None, lambda: now[0])
    dues = [clock.due(0, 1, int(x * 1e6)) for _ in range(m)]
    assert dues == pytest.approx([lat + (i + 1) * x for i in range(m)])
    assert clock.due(1, 0, int(x * 1e6)) == pytest.approx(lat + x)  # the other direction: free


def _slow_profile(rng, d=3, u=5):
    """random_profile with a slow link's latency in the range of a stage's compute."""
    prof = random_profile(rng, d, u)
    lat = np.asarray(prof.latency_s, float) * rng.uniform(5, 40)
    return dataclasses.replace(prof, latency_s=lat)


def _warmup_vectors(p, m):
    own = schedules.warmups(p, m)
    for warm in itertools.product(*(range(o, m + 1) for o in own)):
        if all(a >= b for a, b in zip(warm, warm[1:])):
            yield list(warm)


def test_window_model_brute_force_and_bound():
    """On every plan of small random profiles with slow links: T_win at the warm-ups ``choose``
    gives is the least over every warm-up vector that fits memory, never above 1F1B's T, and
    the bound of the link-free tables stays below every one of them."""
    rng = np.random.default_rng(3)
    checked = 0
    for _ in range(6):
        prof = _slow_profile(rng)
        m = int(rng.integers(2, 7))
        t = tables(prof, "1f1b", m)
        bound = lower_bound(warmup.linkless(t))
        for a in assignments(prof.num_units, prof.num_devices):
            try:
                plan = evaluate_tables(prof, t, a, "x", False, None)
            except InfeasibleError:
                continue
            if len(plan.stages) < 2:
                continue
            win = warmup.window(t, plan)
            extra = t.step_extra(plan.stages[0].update_s)
            fits = []
            for warm in _warmup_vectors(len(plan.stages), m):
                mem = [warmup.stage_memory(t, *s.units, min(m, w + 1)) for s, w in
                       zip(plan.stages, warm)]
                if all(x <= t.memory[s.device] for x, s in zip(mem, plan.stages)):
                    fits.append(win.step(m, warm, extra))
            got = win.step(m, warmup.choose(t, plan, win), extra)
            assert got == pytest.approx(min(fits), rel=1e-12)
            assert got <= plan.step_time_s * (1 + 1e-12)
            assert bound <= min(fits) * (1 + 1e-9)
            checked += 1
    assert checked > 50


def test_planner_deepens_where_it_pays_and_the_simulator_agrees():
    """warmup="auto" (the default): plans take deeper warm-ups where the simulated step says
    they pay (recorded, within memory, the price their simulated step, the lower bound below
    it), by the exact search and the heuristic alike; "1f1b" keeps 1F1B's own, never faster."""
    rng = np.random.default_rng(12)
    deepened = 0
    for _ in range(30):
        prof = _slow_profile(rng, 3, 6)
        m = int(rng.integers(4, 9))
        try:
            base = plan_lib.plan(prof, "optimal", "1f1b", m, warmup="1f1b")
        except InfeasibleError:
            continue
        assert all(s.warmup is None for s in base.stages)
        got = plan_lib.plan(prof, "optimal", "1f1b", m)
        assert got.to_json() == plan_lib.plan(prof, "optimal", "1f1b", m,
                                              warmup="auto").to_json()
        assert got.step_time_s <= base.step_time_s * (1 + 1e-12)
        if not any(s.warmup is not None for s in got.stages):
            continue
        deepened += 1
        assert got.step_time_s < base.step_time_s
        heur = plan_lib.plan(prof, "optimal", "1f1b", m, force_heuristic=True)
        assert heur.step_time_s <= plan_lib.plan(prof, "optimal", "1f1b", m, warmup="1f1b",
                                                 force_heuristic=True).step_time_s
        assert all(s.memory_bytes <= prof.devices[s.device]["memory_bytes"]
                   for s in heur.stages)
        assert got.lower_bound_s is None or got.lower_bound_s <= got.step_time_s
        for s in got.stages:
            assert s.memory_bytes <= prof.devices[s.device]["memory_bytes"]
        again = plan_lib.Plan.from_json(got.to_json())
        assert [s.warmup for s in again.stages] == [s.warmup for s in got.stages]
        sim = simulate.simulate_plan(again, prof).step_time_s
        assert sim == pytest.approx(got.step_time_s, rel=1e-12)
        peaks = schedules.inflight_peaks(schedules.plan_lists(got))
        assert peaks == [min(m, (s.warmup if s.warmup is not None else len(got.stages) - k - 1)
                             + 1) for k, s in enumerate(got.stages)]
    assert deepened >= 3


def test_no_latency_nothing_changes():
    """Links without latency: warmup="auto" gives 1F1B's plan bit for bit."""
    rng = np.random.default_rng(2)
    for _ in range(4):
        prof = random_profile(rng, 3, 5)
        prof = dataclasses.replace(prof, latency_s=np.zeros_like(prof.latency_s))
        try:
            base = plan_lib.plan(prof, "optimal", "1f1b", 6)
        except InfeasibleError:
            continue
        assert plan_lib.plan(prof, "optimal", "1f1b", 6, warmup="auto").to_json() == \
            base.to_json()


def test_bad_warmup_is_one_clear_line():
    prof = make_profile(np.ones((2, 2)))
    with pytest.raises(ValueError, match="warmup: expected one of"):
        plan_lib.plan(prof, "optimal", "1f1b", 2, warmup="deep")


@pytest.mark.slow
def test_deeper_warmup_losses_equal_1f1b():
    """The same seed gives the same losses as 1F1B: a deeper warm-up runs every micro-batch's
    backward in 1F1B's order, so the gradient sums are the same bits."""
    import jax
    import optax

    from skyjax.runtime.local_executor import LocalExecutor
    from tests.helpers import BATCH, SEQ, fresh_chain, make_batch, make_plan, rng_for

    chain = fresh_chain("layer")
    blocks, m, steps = [(0, 2), (2, 4), (4, 5)], 4, 3
    runs = []
    for warm in ([None] * 3, [3, 1, None]):
        plan = make_plan(blocks, "1f1b", m)
        plan.stages = [dataclasses.replace(s, warmup=w) for s, w in zip(plan.stages, warm)]
        ex = LocalExecutor(chain, plan, jax.devices()[:len(blocks)], batch_size=BATCH,
                           seq_len=SEQ, optimizer=optax.adamw(1e-3), max_grad_norm=0.5,
                           rng=rng_for)
        assert schedules.inflight_peaks(ex.actions[0]) == [4 if warm[0] else 3, 2, 1]
        runs.append([ex.train_step(step, make_batch(step)).loss for step in range(steps)])
        ex.close()
    assert runs[0] == runs[1]


def test_replanning_keeps_deeper_warmups():
    """Re-planning a deepened plan (calibration, ``dynamic``) prices the running plan with its
    warm-ups and the candidate as they run, so neither loses its warm-ups to a price that
    ignores them."""
    from skyjax.plan import replan

    rng = np.random.default_rng(12)
    for _ in range(30):
        prof = _slow_profile(rng, 3, 6)
        m = int(rng.integers(4, 9))
        try:
            got = plan_lib.plan(prof, "optimal", "1f1b", m)
        except InfeasibleError:
            continue
        if any(s.warmup is not None for s in got.stages):
            break
    busy = [s.compute_s * m for s in got.stages]  # as predicted: nothing to correct
    decision = replan.decide(prof, got, busy)
    assert [s.warmup for s in decision.current.stages] == [s.warmup for s in got.stages]
    assert decision.current.step_time_s == pytest.approx(got.step_time_s, rel=1e-9)
    assert decision.candidate.step_time_s <= got.step_time_s * (1 + 1e-9)


def test_the_plan_cli_takes_the_warmup():
    """The plan CLI's ``--warmup`` takes "auto" (default) or "1f1b" (the config key's check is in
    tests/test_config.py)."""
    from skyjax.cli import plan as cli

    assert cli.parse_args(["--profile", "p.json", "--warmup", "1f1b"]).warmup == "1f1b"
    assert cli.parse_args(["--profile", "p.json"]).warmup == "auto"


@pytest.mark.parametrize("m", [4, 8])
def test_two_regions_latency_paid_once(m):
    """docs/guide/relaxation.md's shape: a light first unit on one side of a 40 ms link, four
    layers behind it, the plan fixed across the link. 1F1B's own warm-ups pay the round trip per
    micro-batch (a round trip per 3 in flight); deeper ones pay it once: the simulator's step is
    within 2 % of T_win and under 70 % of 1F1B's."""
    fwd = np.array([0.2, 2.4, 2.4, 2.4, 2.4, 0.05])[:, None] * np.ones((1, 3)) * 1e-3
    lat = np.full((3, 3), 1e-5)
    lat[0, 1:] = lat[1:, 0] = 0.04
    bw = np.full((3, 3), 1e10)
    bw[0, 1:] = bw[1:, 0] = 12.5e6
    prof = make_profile(fwd, state=np.ones(6), act=np.ones(6), out=np.full(6, 1.32e5),
                        latency=lat, bandwidth=bw)
    assignment = [(0, 0, 1), (1, 1, 3), (2, 3, 6)]
    t = tables(prof, "1f1b", m)
    own = evaluate_tables(prof, t, assignment, "x", False, None)
    deep = warmup.deepen(t, own, lambda: 0.0)
    assert deep.stages[0].warmup == m - 1 and deep.stages[1].warmup is None
    sim_own = simulate.simulate_plan(own, prof).step_time_s
    sim_deep = simulate.simulate_plan(deep, prof).step_time_s
    assert abs(sim_deep - deep.step_time_s) <= 0.02 * deep.step_time_s
    assert sim_deep < 0.7 * sim_own
