"""experiments/stage_probe.py: the idle gaps it reads off measured spans, and its table."""

import pytest

from experiments import stage_probe



def test_idle_before_adds_the_previous_actions_emulated_sleep():
    # stage 1 slowed 2x: F0 [0, 4), idle 1, F1 [5, 7), idle 3, B0 [10, 14); stage 0 ignored
    step = [(1, "F", 0, 0.0, 4.0), (1, "F", 1, 5.0, 7.0), (1, "B", 0, 10.0, 14.0),
            (0, "F", 0, 0.0, 100.0)]
    f, b = stage_probe.idle_before([step], 1, 2.0)
    assert f == pytest.approx(1.0 + 2.0)  # the wait, plus half of F0 (its emulated sleep)
    assert b == pytest.approx(3.0 + 1.0)
    assert stage_probe.idle_before([step], 1, 1.0) == pytest.approx((1.0, 3.0))
    # a step's first action has no gap before it in the step; no backward: 0
    assert stage_probe.idle_before([[(0, "F", 0, 0.0, 1.0)]], 0, 1.0) == (0.0, 0.0)


def test_report_ratios_compose_to_the_error():
    rounds = [{"block_now": [0.010, 0.020], "idle_now": [0.011, 0.022],
               "pipeline": [0.012, 0.024], "idle_s": [0.001, 0.030]}] * 3
    probes = {"even": [{"stage": 0, "device": 1, "profile": [0.008, 0.016],
                        "units_now": [0.009, 0.018], "rounds": rounds}]}
    header, row = stage_probe.report(probes, ["a", "dev1"])
    assert "drift" in header and "rest" in header
    cells = row.split("|")[1].split()
    drift, fusion, idle, rest = (float(x) for x in cells[:4])
    assert (drift, fusion, idle, rest) == pytest.approx((27 / 24, 30 / 27, 1.1, 36 / 33),
                                                        abs=1e-3)
    assert drift * fusion * idle * rest == pytest.approx(36 / 24, abs=2e-3)
    assert cells[4] == "+33.3%"  # (36 - 24) / 36
    assert "dev1" in row and "1.0/30.0" in row


@pytest.mark.slow
def test_probing_a_running_pipeline_times_it_and_leaves_training_state_alone():
    """after_block and units_times on the stages of a real (local) pipeline: every figure is a
    positive time, the pipeline's figure is the median of the stage's spans, and the stage's
    parameters, optimizer state and gradient sums are untouched (none deleted by donation)."""
    import types

    import jax
    import numpy as np
    import optax

    from skyjax.profile.chain import sample_microbatch
    from tests.test_runtime_local import BATCH, CFG, SEQ, executor, fresh_chain, make_batch

    blocks, m = [(0, 2), (2, 5)], 2
    chain = fresh_chain()
    ex = executor(chain, blocks, "1f1b", m, optax.adam(1e-2))
    metrics = ex.train_step(0, make_batch(0))
    spans = [[(s.stage, s.kind, s.microbatch, s.start, s.end)
              for r in metrics.results for s in r.spans]]
    n = len(chain)
    profile = types.SimpleNamespace(forward_s=np.full((n, 2), 1e-3),
                                    backward_s=np.full((n, 2), 2e-3),
                                    forward_call_s=None, backward_call_s=None)
    sample = sample_microbatch(CFG, BATCH // m, SEQ)
    snapshot = lambda st: jax.tree.map(np.array, (st.params, st.opt_state, st.grads))  # noqa: E731
    for k, stage in enumerate(ex.stages):
        before = snapshot(stage.state)
        got = stage_probe.after_block(stage, spans)
        mine = [s for s in spans[0] if s[0] == k]
        assert got["pipeline"] == pytest.approx(
            [float(np.median([e - s for _, kind, _, s, e in mine if kind == x])) for x in "FB"])
        for key in ("block_now", "idle_now"):
            assert all(0 < t < 10 for t in got[key]), (key, got)
        units = stage_probe.units_times(stage, blocks[k], chain, profile, sample, k, repeats=3)
        a, b = blocks[k]
        assert units["profile"] == pytest.approx([1e-3 * (b - a), 2e-3 * (b - a)])
        assert all(0 < t < 10 for t in units["units_now"])
        jax.tree.map(np.testing.assert_array_equal, snapshot(stage.state), before)
    ex.close()
