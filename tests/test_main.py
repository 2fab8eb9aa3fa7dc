"""End to end: ``python -m skyjax.main`` and ``train.train_and_evaluate`` on shrunk configs."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from skyjax import baseline, optim
from skyjax.checkpoint import committed_steps, find_resume
from skyjax.names import EXIT_BAD_INPUT
from skyjax.models.build import build_model
from tests.helpers import TINY, run_main, tiny_run_config


def test_main_writes_summary(tmp_path):
    workdir = tmp_path / "run"
    proc = run_main(workdir, "--config.train.steps=3", *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["steps"] == 3
    assert np.isfinite(summary["final_loss"])
    assert 0.0 <= summary["eval_accuracy"] <= 1.0 and summary["eval_examples"] == 20
    assert summary["step_time_s"] > 0 and summary["train_time_s"] > 0
    plan = summary["plan"]
    assert plan["stages"][0]["units"] == [0, 4] and plan["microbatches"] == 2
    assert set(plan) >= {"strategy", "schedule", "microbatches", "stages", "step_time_s",
                         "bottleneck_s", "exact"}
    assert json.loads((workdir / "plan.json").read_text()) == plan
    # the step boundary: predicted update_0 + sync_s, measured between steps 2 and 3 (after
    # step 1 come the first log line and what else happens once)
    boundary = summary["stage_comparison"]["step_boundary"]
    # (a gap inside the training loop, so within its time; no wall-clock window: one gap on a
    # loaded host has exceeded the mean step time)
    assert boundary["steps"] == 1 and 0 < boundary["measured_s"] < summary["train_time_s"]
    assert boundary["predicted_s"] == pytest.approx(plan["stages"][0].get("update_s", 0.0)
                                                    + json.loads((workdir / "profile.json")
                                                                 .read_text())["overheads"]
                                                    ["sync_s"])
    # batches are built ahead by the prefetch thread: the profile has no term for building them
    assert "batch_s" not in json.loads((workdir / "profile.json").read_text())["overheads"]
    assert json.loads((workdir / "config.json").read_text())["train"]["steps"] == 3
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]
    assert "eval_accuracy" in records[-1]
    assert not [p for p in os.listdir(workdir) if p.startswith(".tmp")]


@pytest.mark.parametrize("override, message", [
    ("--config.model.num_attention_heads=3",
     "config.model.num_attention_heads=3 does not divide config.model.hidden_size=128"),
    ("--config.model.hiden_size=64", "config.model.hiden_size: unknown config key"),
    ("--config.cluster.slowdowns=(1, 0)", "config.cluster.slowdowns has 2 entries"),
])
def test_bad_override_fails_before_compiling(tmp_path, override, message):
    workdir = tmp_path / "run"
    proc = run_main(workdir, override, timeout=120)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert not workdir.exists()  # nothing was built, let alone compiled
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_microbatches_average_to_the_full_batch_gradient():
    """Without dropout, one step over 4 micro-batches equals one step over the whole batch."""
    from skyjax import data
    from skyjax.models import bert

    config = tiny_run_config()
    model = build_model(config.model, config.train.seed)
    chain = bert.units(model, "layer")
    optimizer = optim.make_optimizer(config.train)
    batch = next(data.train_batches(config))
    outs = []
    for m in (1, 4):
        params = jax.tree.map(lambda x: x.copy(), [u.params for u in chain])
        step = baseline.make_train_step(chain, optimizer, 0, m)
        params, _, metrics = step(params, optimizer.init(params), batch, np.int32(5))
        outs.append((params, metrics))
    np.testing.assert_allclose(outs[0][1]["loss"], outs[1][1]["loss"], rtol=1e-5)
    np.testing.assert_allclose(outs[0][1]["grad_norm"], outs[1][1]["grad_norm"], rtol=1e-4)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), outs[0][0], outs[1][0])


def test_learning_rate_schedule():
    config = tiny_run_config(steps=100, warmup_steps=10, learning_rate=1.0)
    lr = optim.learning_rate_schedule(config.train)
    assert float(lr(0)) == 0.0 and float(lr(10)) == pytest.approx(1.0)
    assert float(lr(55)) == pytest.approx(0.5) and float(lr(100)) == pytest.approx(0.0)
    config.train.lr_schedule = "constant"
    assert float(optim.learning_rate_schedule(config.train)(90)) == pytest.approx(1.0)


@pytest.mark.slow
def test_checkpoint_of_another_seed_is_refused_in_one_line(tmp_path):
    """Resume is the default; a checkpoint of another run is refused, naming the difference, and
    nothing in the workdir is overwritten."""
    workdir = tmp_path / "run"
    first = run_main(workdir, "--config.train.steps=2", "--config.checkpoint.every=2", *TINY)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = (workdir / "summary.json").read_text()
    again = run_main(workdir, "--config.train.steps=4", "--config.train.seed=1", *TINY)
    assert again.returncode != 0
    assert "CheckpointMismatch: " in again.stderr and "seed" in again.stderr
    assert "Traceback" not in again.stderr
    assert (workdir / "summary.json").read_text() == summary
    # starting afresh over them is refused too, unless told to replace them
    fresh = ["--config.train.steps=2", "--config.train.seed=1", "--config.checkpoint.every=1",
             "--config.checkpoint.resume=False", *TINY]
    refused = run_main(workdir, *fresh)
    assert refused.returncode == EXIT_BAD_INPUT and "Traceback" not in refused.stderr
    assert "--config.checkpoint.replace=True" in refused.stderr
    assert committed_steps(str(workdir / "checkpoints")) == [2]
    replaced = run_main(workdir, *fresh, "--config.checkpoint.replace=True")
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert committed_steps(str(workdir / "checkpoints")) == [1, 2]
    assert find_resume(str(workdir / "checkpoints")).meta["seed"] == 1
    # the first run's outputs, whole, in previous/; the new run's in the workdir
    assert (workdir / "previous" / "summary.json").read_text() == summary
    assert json.loads((workdir / "config.json").read_text())["train"]["seed"] == 1
