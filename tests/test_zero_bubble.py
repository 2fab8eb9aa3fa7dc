"""Zero-bubble schedules: the backward split in B and W keeps the math (losses equal 1F1B's
and single-device training), the action lists are consistent and bounded in memory, and the
simulator and the cost model price them."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

from skyjax.plan.model import schedules
from skyjax.plan.replay import simulate
from skyjax.plan.model.schedules import Action
from tests.helpers import executor, fresh_chain, make_batch, reference_losses

ZB = ("zb-h1", "zb-h2")


@pytest.mark.parametrize("sched", ZB)
@pytest.mark.parametrize("p,m", [(1, 1), (1, 4), (2, 2), (3, 1), (4, 8), (4, 2), (8, 3), (5, 16)])
def test_action_lists(sched, p, m):
    lists = schedules.actions(sched, p, m)
    assert len(lists) == p
    limit = schedules.inflight_limit(sched, p, m)
    for k, acts in enumerate(lists):
        assert sorted(acts, key=lambda a: (a.kind, a.microbatch)) == (
            [Action(c, i) for c in "BFW" for i in range(m)])
        for i in range(m):
            assert acts.index(Action("F", i)) < acts.index(Action("B", i)) < \
                acts.index(Action("W", i))
        assert [a.microbatch for a in acts if a.kind == "F"] == list(range(m))
        assert [a.microbatch for a in acts if a.kind == "B"] == list(range(m))
    assert all(x <= lim for x, lim in zip(schedules.inflight_peaks(lists), limit))


def test_zb_h1_cuts_the_bubble_at_1f1b_peak_memory():
    """Equal stages, f = b = w: 1F1B idles (p - 1)(f + b + w) per stage, ZB-H1 (p - 1)(f + b -
    w), a third; its peak in flight is 1F1B's first stage's."""
    for p, m in ((4, 8), (8, 16), (4, 4)):
        one = simulate.simulate([1] * p, [2] * p, [0] * (p - 1), "1f1b", m)
        assert one.step_time_s == pytest.approx(3 * (m + p - 1))
        for sched in ZB:
            zb = simulate.simulate([1] * p, [1] * p, [0] * (p - 1), sched, m, weight_s=[1] * p)
            assert zb.step_time_s == pytest.approx(3 * m + (p - 1))
            assert max(zb.peak_inflight) <= (p if sched == "zb-h1" else 2 * p)
        assert max(schedules.inflight_peaks(schedules.actions("zb-h1", p, m))) == \
            max(one.peak_inflight)


def test_split_backward_equals_the_backward():
    """B then W give the backward's input cotangent and parameter gradients, bit for bit on
    CPU, each program compiled once."""
    from skyjax.models import bert
    from skyjax.programs.calls import call_inputs, cotangent
    from skyjax.programs.stage import StageProgram

    chain = fresh_chain()
    batch = make_batch(0)
    carry0 = bert.initial_carry(batch["input_ids"], batch["token_type_ids"],
                                batch["attention_mask"])
    carry = chain[0].apply(chain[0].params, carry0, None, False)
    for units, last in ((chain[1:3], False), (chain[3:], True)):
        prog = StageProgram(units, is_last=last, microbatches=1)
        params = [u.params for u in units]
        dev = jax.devices()[0]
        c, rng, lab = call_inputs(carry, batch["labels"], last, dev)
        out, res = prog.forward(params, c, rng, lab)
        ct = cotangent(out, last)
        zeros = jax.tree.map(np.zeros_like, params)
        want_g, want_d = prog.backward(params, res, ct, zeros)
        got_d, pending = prog.backward_input(params, res, ct)
        got_g = prog.backward_weight(params, pending, jax.tree.map(np.zeros_like, params))
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-7, rtol=1e-6),
                     (want_g, want_d), (got_g, got_d))
        assert prog.compile_counts["backward_input"] == 1
        assert prog.compile_counts["backward_weight"] == 1
        carry = out if not last else carry


@pytest.mark.parametrize("granularity,blocks,sched,m", [
    pytest.param("layer", [(0, 2), (2, 3), (3, 4), (4, 5)], "zb-h1", 8, marks=pytest.mark.slow),
    pytest.param("layer", [(0, 2), (2, 4), (4, 5)], "zb-h2", 4, marks=pytest.mark.slow),
    pytest.param("sublayer", [(0, 4), (4, 9), (9, 11)], "zb-h1", 4, marks=pytest.mark.slow),
])
def test_losses_equal_single_device_training(granularity, blocks, sched, m):
    """Dropout on, clipping active: the zero-bubble pipeline's losses are single-device
    training's (and so 1F1B's) within 1e-5."""
    steps, clip = 3, 0.5
    chain = fresh_chain(granularity)
    want = reference_losses(chain, steps, m, clip)
    ex = executor(chain, blocks, sched, m, optax.adamw(1e-3), max_grad_norm=clip)
    got = [ex.train_step(step, make_batch(step)).loss for step in range(steps)]
    counts = [s.program.compile_counts for s in ex.stages]
    ex.close()
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert all(c == {"forward": 1, "backward": 0, "update": 1, "backward_input": 1,
                     "backward_weight": 1} for c in counts), counts


@pytest.mark.parametrize("sched", ZB)
def test_exact_search_equals_brute_force_and_simulator_bounds(sched):
    """Memory not binding: the exact DP's T equals the least T over every plan priced by the
    cost model (credit per non-last stage), and the simulator's replay of the chosen plan's
    lists stays within 20 % of it (m >= p)."""
    import dataclasses

    from skyjax import plan as plan_lib
    from skyjax.plan.replay.simulate import simulate_plan
    from tests.helpers import all_plans, random_profile

    rng = np.random.default_rng(5)
    for _ in range(6):
        prof = random_profile(rng, 3, 6)
        prof = dataclasses.replace(prof, devices=[{**d, "memory_bytes": 10 ** 12}
                                                  for d in prof.devices])
        m = int(rng.integers(4, 9))  # the credit assumes Ws to fill the drain: m >= p
        best = min(p.step_time_s for p in all_plans(prof, sched, m))
        got = plan_lib.searched_plan(prof, "optimal", sched, m)
        assert got.exact and got.step_time_s == pytest.approx(best, rel=1e-9)
        one = plan_lib.searched_plan(prof, "optimal", "1f1b", m)
        assert got.step_time_s <= one.step_time_s * (1 + 1e-9)
        sim = simulate_plan(got, prof).step_time_s
        assert abs(sim - got.step_time_s) <= 0.2 * got.step_time_s, (sim, got.step_time_s)


def test_auto_schedule_keeps_the_least_step(tmp_path, capsys):
    """schedule "auto" plans every schedule and keeps the least predicted step among those that
    fit memory (exact and heuristic searches, tight memory); config validation and
    ``python -m skyjax.plan --schedule auto`` take it."""
    import json

    from skyjax import plan as plan_lib
    from skyjax.config import defaults, validate_config
    from skyjax.names import SCHEDULES
    from skyjax.cli import plan as plan_cli
    from skyjax.profile.format import save_profile
    from tests.helpers import random_profile

    rng = np.random.default_rng(21)
    picked = set()
    for i in range(12):
        prof = random_profile(rng, int(rng.integers(2, 5)), int(rng.integers(2, 7)))
        m, heur = int(rng.integers(1, 9)), i % 3 == 0
        got = {}
        for sched in SCHEDULES:
            try:
                got[sched] = plan_lib.plan(prof, "optimal", sched, m, force_heuristic=heur)
            except plan_lib.InfeasibleError:
                pass
        if not got:
            with pytest.raises(plan_lib.InfeasibleError):
                plan_lib.plan(prof, "optimal", "auto", m, force_heuristic=heur)
            continue
        auto = plan_lib.plan(prof, "optimal", "auto", m, force_heuristic=heur)
        best = min(p.step_time_s for p in got.values())
        assert auto.schedule in got and auto.step_time_s == best, (i, auto.schedule)
        assert auto.to_json() == got[auto.schedule].to_json()
        picked.add(auto.schedule)
    assert len(picked) >= 2, picked
    config = defaults.base_config()
    config.pipeline.schedule = "auto"
    validate_config(config)
    config.pipeline.schedule = "zb-h3"
    with pytest.raises(ValueError, match="auto"):
        validate_config(config)
    path = tmp_path / "profile.json"
    save_profile(prof, str(path))
    assert plan_cli.main(["--profile", str(path), "--schedule", "auto", "--microbatches", "8",
                          "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schedule"] in SCHEDULES


def test_rehearsal_time_base_and_replay_keep_w():
    """A rehearsal's time base scales the plan's F/B/W passes and the profile's
    backward_weight_s with every other time, so the runtime runs the lists the plan was filled
    for and rehearsal_times() gives B and W k times theirs; the report's replay of measured spans
    keeps W apart (a replay of the simulator's own spans is its step)."""
    import dataclasses

    from skyjax import plan as plan_lib
    from skyjax.plan.pricing.passes import weight_s
    from skyjax.plan.replay.rehearsal import rehearsal_times, scale_plan, scale_profile
    from skyjax.plan.pricing.stage_times import stage_actions_s, stage_weight_s
    from skyjax.report.compare import stage_comparison
    from tests.helpers import random_profile

    rng = np.random.default_rng(3)
    prof = random_profile(rng, 4, 8)
    prof = dataclasses.replace(prof, devices=[{**d, "memory_bytes": 10 ** 12}
                                              for d in prof.devices],
                               backward_weight_s=0.3 * np.asarray(prof.backward_s))
    for sched in ZB:
        p = plan_lib.plan(prof, "optimal", sched, 8)
        k = 10.0
        sp, sprof = scale_plan(p, k), scale_profile(prof, k)
        assert [s.passes_s for s in sp.stages] == [tuple(k * x for x in s.passes_s)
                                                  for s in p.stages]
        assert schedules.plan_lists(sp) == schedules.plan_lists(p)
        np.testing.assert_allclose(weight_s(sprof), k * weight_s(prof))
        times = rehearsal_times(sp, sprof).stages
        w = stage_weight_s(p, prof)
        _, bwd, _ = stage_actions_s(p, prof)
        np.testing.assert_allclose([t.weight_s for t in times], [k * x for x in w])
        np.testing.assert_allclose([t.backward_s for t in times],
                                   [k * (b - x) for b, x in zip(bwd, w)])
        sim = simulate.simulate_plan(p, prof)
        got = stage_comparison(p, prof, sim.spans)["replayed_step_s"]
        assert got == pytest.approx(sim.step_time_s, rel=1e-6)


def test_memory_charged_at_the_plans_own_in_flight_count():
    """A zero-bubble plan of p stages keeps min(m, p) (ZB-H1) or min(m, 2p) (ZB-H2) micro-batches
    in flight on each stage, not one per device of the cluster: two units that fit on two of
    eight devices at 2 in flight (but not at 8) are planned, exactly and by the heuristic, as
    brute force finds; where no depth fits, the refusal names the in-flight rule."""
    from skyjax import plan as plan_lib
    from tests.helpers import brute_force, make_profile

    prof = make_profile(np.ones((2, 8)), state=[10, 10], act=[10, 10], memory=np.full(8, 45.0))
    t = plan_lib.tables(prof, "zb-h1", 8)
    assert t.search_depths() == [1, 2] and t.least_inflight == 1
    want = brute_force(prof, "zb-h1", 8)
    for heur in (False, True):
        got = plan_lib.plan(prof, "optimal", "zb-h1", 8, force_heuristic=heur)
        assert len(got.stages) == 2 and max(s.memory_bytes for s in got.stages) == 30
        model = got.step_time_s if got.model_s is None else got.model_s  # the cost model's T
        assert model == pytest.approx(want, rel=1e-9)
    with pytest.raises(plan_lib.InfeasibleError, match=r"ZB-H2 keeps min\(m, 2p\) on every "
                                                       r"stage of p, m = 8\)"):
        plan_lib.plan(prof, "optimal", "zb-h2", 8)


def test_b_and_w_priced_as_measured():
    """With backward_input_s measured, a zero-bubble stage runs B and W as measured (B + W is
    more than the whole backward: two calls) and the cost model, the simulator and the
    rehearsal's declared times all use them; without it, B is backward_s less W, as before."""
    import dataclasses

    from skyjax import plan as plan_lib
    from skyjax.plan.pricing.stage_times import stage_actions_s, stage_input_s, stage_weight_s
    from skyjax.plan.replay.rehearsal import rehearsal_times
    from skyjax.profile.format import Profile
    from tests.helpers import random_profile

    rng = np.random.default_rng(8)
    base = random_profile(rng, 3, 5)
    base = dataclasses.replace(base, devices=[{**d, "memory_bytes": 10 ** 12}
                                              for d in base.devices])
    bwd = np.asarray(base.backward_s)
    old = dataclasses.replace(base, backward_weight_s=0.63 * bwd)
    new = Profile.from_json({**old.to_json(), "backward_input_s": (0.59 * bwd).tolist()})
    np.testing.assert_array_equal(new.backward_input_s, 0.59 * bwd)
    for sched in ZB:
        assign = [(0, 0, 2), (1, 2, 4), (2, 4, 5)]
        p_old = plan_lib.evaluate(old, assign, sched, 8)
        p_new = plan_lib.evaluate(new, assign, sched, 8)
        for s_old, s_new in zip(p_old.stages, p_new.stages):
            (a, b), d = s_new.units, s_new.device
            assert s_old.passes_s[1] == pytest.approx(0.37 * bwd[a:b, d].sum())
            assert s_new.passes_s[1] == pytest.approx(0.59 * bwd[a:b, d].sum())
            assert s_new.passes_s[2] == pytest.approx(0.63 * bwd[a:b, d].sum())
            assert s_new.compute_s == pytest.approx(s_old.compute_s + 0.22 * bwd[a:b, d].sum())
        assert p_new.step_time_s > p_old.step_time_s
        fwd, full, _ = stage_actions_s(p_new, new)
        w = stage_weight_s(p_new, new)
        b_new = stage_input_s(p_new, new, full, w)
        assert b_new == pytest.approx([x - 0.41 * bwd[s.units[0]:s.units[1], s.device].sum()
                                       for x, s in zip(full, p_new.stages)])
        assert stage_input_s(p_old, old, full, w) == [x - y for x, y in zip(full, w)]
        times = rehearsal_times(p_new, new).stages
        assert [times[k].backward_s for k in range(3)] == pytest.approx(b_new)
        lists = schedules.plan_lists(p_new)
        sim = simulate.simulate(fwd, b_new, [0.0, 0.0], sched, 8, weight_s=w, lists=lists)
        busy = [f * 8 + b * 8 + x * 8 for f, b, x in zip(fwd, b_new, w)]
        assert sim.busy_s == pytest.approx(busy)
