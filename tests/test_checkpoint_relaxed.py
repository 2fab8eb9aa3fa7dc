"""A relaxed run's averaging state in checkpoints (``skyjax.checkpoint.relaxed``): a run stopped
and resumed gives the uninterrupted run's losses (int8 residuals; DiLoCo's anchors, momenta and
per-pipeline replicas, resumed mid-period; the per-link-class modes), in one process and end to
end under ``skyjax.launch``; a commit requires every pipeline's state, each process writing its
stage's; a restoring plan with another pipeline count or averaging keeps what still means the
same and says what it dropped; an exact checkpoint restores under a relaxed plan with fresh
state."""

from __future__ import annotations

import logging

import jax
import numpy as np
import optax
import pytest

from skyjax import checkpoint
from skyjax import plan as plan_lib
from skyjax.checkpoint import CheckpointError, CheckpointManager, find_resume, relaxed
from skyjax.runtime.local_executor import LocalExecutor
from tests.helpers import BATCH, SEQ, fresh_chain, make_batch, rng_for

RUN = {"seed": 0, "dataset": "synthetic"}
CLIP, STEPS, STOP = 0.5, 6, 4  # DiLoCo's outer steps after steps 3 and 6: 4 is mid-period
OUTER = {"outer_every": 3, "outer_lr": 0.7, "outer_momentum": 0.5}
TWO = [[(0, (0, 3)), (1, (3, 5))], [(2, (0, 5))]]


# three pipelines, 0 and 1 in region {0, 1}, 2 in region {2, 3}: the per-link-class modes
THREE = [[(0, (0, 5))], [(1, (0, 5))], [(2, (0, 2)), (3, (2, 5))]]
REGIONS = [[0, 1], [2, 3]]


def _plan(pipelines, shares, averaging="exact", groups=None, **outer):
    stages = [plan_lib.Stage(d, block, 0.0, 0.0, 0, pipeline=i)
              for i, stages in enumerate(pipelines) for d, block in stages]
    return plan_lib.Plan("manual", "1f1b", sum(shares), stages, 0.0, 0.0, False,
                         shares=list(shares) if len(shares) > 1 else None,
                         averaging=averaging, exchange_groups=groups, **outer)


def _optimizer():
    return optax.adamw(1e-3)


def _executor(chain, plan, states=None):
    return LocalExecutor(chain, plan, jax.devices(), batch_size=BATCH, seq_len=SEQ,
                         optimizer=_optimizer(), max_grad_norm=CLIP, rng=rng_for,
                         unit_states=states)


def _train(ex, start, stop):
    return [ex.train_step(s, make_batch(s)).loss for s in range(start, stop)]


def _stopped(tmp_path, chain, plan):
    """Trains ``STOP`` steps of ``plan`` and checkpoints them as the trainer does; returns the
    losses and the relaxed tensors this process wrote."""
    ex = _executor(chain, plan)
    losses = _train(ex, 0, STOP)
    manager = CheckpointManager(str(tmp_path), STOP, 1, chain, _optimizer(), RUN,
                                total_steps=STEPS)
    checkpoint.after_step(manager, STOP - 1, ex)
    written = {n: np.asarray(x) for n, x in relaxed.entries(ex, chain)}
    ex.close()
    return losses, written


def _resumed(tmp_path, chain, plan, restore=True):
    resume = find_resume(str(tmp_path))
    states = checkpoint.restore_units(resume, chain, range(len(chain)), _optimizer())
    ex = _executor(chain, plan, states)
    restored = checkpoint.restore_relaxed(resume, ex, chain, _optimizer()) if restore else []
    return ex, restored


@pytest.fixture(scope="module")
def chain():
    return fresh_chain()


@pytest.mark.slow
@pytest.mark.parametrize("mode,outer,pipelines,shares,groups", [
    ("int8", {}, TWO, [2, 2], None), ("diloco", OUTER, TWO, [2, 2], None),
    ("int8-across", {}, THREE, [1, 1, 2], REGIONS),
    ("diloco-across", OUTER, THREE, [1, 1, 2], REGIONS)])
def test_a_stopped_and_resumed_relaxed_run_equals_the_uninterrupted_one(
        tmp_path, chain, mode, outer, pipelines, shares, groups):
    plan = _plan(pipelines, shares, mode, groups, **outer)
    ex = _executor(chain, plan)
    want = _train(ex, 0, STEPS)
    ex.close()
    head, written = _stopped(tmp_path, chain, plan)
    np.testing.assert_array_equal(head, want[:STOP])
    meta = find_resume(str(tmp_path)).meta
    assert meta["averaging"] == {"mode": mode, "pipelines": len(shares)}
    # every tensor the trainer wrote is in the commit, checksummed with the rest
    assert set(written) <= set(meta["tensors"]) and set(written)
    assert any(n.startswith("pipelines/1/") for n in written)

    ex, restored = _resumed(tmp_path, chain, plan)
    again = {n: np.asarray(x) for n, x in relaxed.entries(ex, chain)}
    assert again.keys() == written.keys()
    for name in written:
        np.testing.assert_array_equal(again[name], written[name], err_msg=name)
    tail = _train(ex, STOP, STEPS)
    ex.close()
    np.testing.assert_allclose(tail, want[STOP:], atol=1e-5, rtol=0)
    assert restored == (["residual"] if mode.startswith("int8")
                        else ["anchor", "momentum", "replicas"])
    if mode == "diloco":  # the control: without the state (pipeline 1 from pipeline 0's params
        # mid-period, the anchor at the restored params) the losses differ
        ex, _ = _resumed(tmp_path, chain, plan, restore=False)
        assert np.abs(np.array(_train(ex, STOP, STEPS)) - want[STOP:]).max() > 1e-4
        ex.close()


TOPK = {"outer_compression": "topk2", "outer_topk": 1 / 16}


@pytest.mark.slow
@pytest.mark.parametrize("mode,outer,pipelines,shares,groups", [
    ("diloco", {**OUTER, **TOPK}, TWO, [2, 2], None),
    ("int8-across", TOPK, THREE, [1, 1, 2], REGIONS)])
def test_a_resumed_run_with_top_k_residuals_equals_the_uninterrupted_one(
        tmp_path, chain, mode, outer, pipelines, shares, groups):
    """``relax.outer_compression``: the top-k residuals (each pipeline's own, or at the
    representatives) are saved under the mode ``<mode>+topk2`` and restored, so a run resumed
    mid-period gives the uninterrupted run's losses within 1e-5."""
    plan = _plan(pipelines, shares, mode, groups, **outer)
    ex = _executor(chain, plan)
    want = _train(ex, 0, STEPS)
    ex.close()
    head, written = _stopped(tmp_path, chain, plan)
    np.testing.assert_array_equal(head, want[:STOP])
    meta = find_resume(str(tmp_path)).meta
    assert meta["averaging"] == {"mode": f"{mode}+topk2", "pipelines": len(shares)}
    residuals = [n for n in written if "/residual/" in n]
    assert residuals and any(np.asarray(written[n]).any() for n in residuals)
    ex, restored = _resumed(tmp_path, chain, plan)
    assert "residual" in restored
    tail = _train(ex, STOP, STEPS)
    ex.close()
    np.testing.assert_allclose(tail, want[STOP:], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_another_pipeline_count_or_averaging_keeps_what_still_holds(tmp_path, chain, caplog):
    """int8 residuals are each pipeline's own: under three pipelines they start at zero, with
    a warning line; under an exact plan the state is not used (a warning line); an exact
    checkpoint restores under an int8 plan with zero residuals."""
    plan = _plan(TWO, [2, 2], "int8")
    _stopped(tmp_path / "int8", chain, plan)
    three = _plan([[(0, (0, 5))], [(1, (0, 5))], [(2, (0, 5))]], [2, 1, 1], "int8")
    for other, line in [(three, "saved by 2 pipelines, this plan has 3"),
                        (_plan(TWO, [2, 2]), "not used under this plan's averaging exact")]:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            ex, restored = _resumed(tmp_path / "int8", chain, other)
        assert restored == [] and line in caplog.text
        for s in ex.stages:
            if s.averaging is not None:
                assert all(not np.asarray(x).any()
                           for x in jax.tree.leaves(s.averaging.residual))
        ex.close()
    _stopped(tmp_path / "exact", chain, _plan(TWO, [2, 2]))
    assert "averaging" not in find_resume(str(tmp_path / "exact")).meta
    ex, restored = _resumed(tmp_path / "exact", chain, plan)
    assert restored == []
    assert all(not np.asarray(x).any() for s in ex.stages
               for x in jax.tree.leaves(s.averaging.residual))
    assert np.isfinite(_train(ex, STOP, STOP + 1)).all()
    ex.close()


def test_a_commit_needs_every_pipelines_state(tmp_path, chain):
    """A process that left out its relaxed tensors (here: pipeline 1's residuals) leaves the
    step uncommitted, naming the missing tensor."""
    plan = _plan(TWO, [2, 2], "int8")
    ex = _executor(chain, plan)
    manager = CheckpointManager(str(tmp_path), 1, 1, chain, _optimizer(), RUN)
    entries = [(n, x) for n, x in relaxed.entries(ex, chain) if not n.startswith("pipelines/1/")]
    with pytest.raises(CheckpointError, match=r"tensor pipelines/1/relax/residual/.* was "
                                              r"written by no process"):
        manager.save(1, ex.unit_states(), extra_meta=relaxed.meta(plan), extra=entries,
                     extra_expected=relaxed.expected(plan, chain, _optimizer()))
    ex.close()
    assert checkpoint.committed_steps(str(tmp_path)) == []


@pytest.mark.slow
def test_each_process_writes_its_stages_state_and_together_they_write_the_plans(chain):
    """Distributed executors (threads over one transport, one process left idle): each process
    writes the relaxed tensors of its own stage, no name twice, together exactly what a commit
    of the plan expects, with the values the local executor holds after the same steps."""
    from skyjax.runtime.distributed_executor import DistributedExecutor
    from skyjax.transport import LocalTransport
    from tests.helpers import run_as_processes

    plan = _plan(TWO, [3, 1], "diloco", **OUTER)
    steps = 2  # mid-period: the replicas differ
    ex = _executor(chain, plan)
    _train(ex, 0, steps)
    local = {n: np.asarray(x) for n, x in relaxed.entries(ex, chain)}
    ex.close()
    devices = jax.local_devices()[:4]
    transport = LocalTransport(devices, timeout_s=120)

    def process(k):
        ex = DistributedExecutor(chain, plan, transport.for_stage(k), k, devices[k],
                                 batch_size=BATCH, seq_len=SEQ, optimizer=_optimizer(),
                                 max_grad_norm=CLIP, rng=rng_for)
        _train(ex, 0, steps)
        return {n: np.asarray(x) for n, x in relaxed.entries(ex, chain)}

    written = run_as_processes(process, 4, transport, timeout_s=300)
    assert written[3] == {}  # the idle process
    names = [n for w in written for n in w]
    assert len(names) == len(set(names))
    assert set(names) == set(relaxed.expected(plan, chain, _optimizer())) == set(local)
    for w in written:
        for name, x in w.items():
            np.testing.assert_allclose(x, local[name], atol=1e-6, rtol=0, err_msg=name)


def _regions_profile(path):
    """The demo's 6 units on 4 equal devices, each its own region, 100 Mbit/s and 40 ms between
    them, ample memory, the int8 codec timed (slow, so that DiLoCo is the cheapest averaging):
    the planner's best plan is pipelines in data parallel (``tests/test_relax_quality.py``)."""
    from skyjax.profile.format import Profile, save_profile
    from tests.helpers import make_profile

    n = 4
    lat, bw = np.full((n, n), 0.04), np.full((n, n), 12.5e6)
    np.fill_diagonal(lat, 0.0)
    d = make_profile(np.full((6, n), 2e-2), state=np.full(6, 8e6), act=np.full(6, 1e5),
                     out=np.full(6, 131072.0), memory=np.full(n, 1e12), latency=lat,
                     bandwidth=bw).to_json()
    for j, dev in enumerate(d["devices"]):
        dev["region"] = f"r{j}"
    d["codecs"] = {"int8": {"output_bytes": [u["output_bytes"] * 0.27 for u in d["units"]],
                            "seconds_per_byte": [1e-7] * n}}
    save_profile(Profile.from_json(d), str(path))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_processes_resume_a_relaxed_run_with_the_uninterrupted_losses(tmp_path):
    """``python -m skyjax.launch``, one process per device: a DiLoCo run (H = 3) checkpointed
    after steps 2 and 4; with checkpoint 4 removed, the run again resumes from step 2, each
    process restoring its own pipeline's replica and state, and logs the same losses."""
    import json
    import shutil

    from skyjax.checkpoint import layout
    from tests.helpers import DEMO, run_module

    _regions_profile(tmp_path / "profile.json")
    workdir = tmp_path / "run"
    args = ["--num_processes", "4", "--timeout", "400", "--", f"--config={DEMO}",
            f"--workdir={workdir}", "--config.cluster.mode=distributed",
            "--config.train.steps=4", f"--config.profile.path={tmp_path / 'profile.json'}",
            "--config.allocation.calibrate_steps=0", "--config.cluster.slowdowns=(1,1,1,1)",
            "--config.relax.averaging=diloco", "--config.relax.outer_every=3",
            "--config.relax.min_gain=0", "--config.train.log_every=1",
            "--config.data.eval_examples=0", "--config.checkpoint.every=2"]

    def losses():
        with open(workdir / "metrics.jsonl") as f:
            rows = [json.loads(line) for line in f]
        return [(r["step"], r["loss"]) for r in rows if "loss" in r and "split" not in r]

    first = run_module("skyjax.launch", *args, timeout=600)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    plan = json.loads((workdir / "plan.json").read_text())
    assert plan["averaging"] == "diloco" and len(plan["shares"]) > 1, plan
    summary = json.loads((workdir / "summary.json").read_text())
    # every pipeline's stages hold an anchor and a momentum: two float32 copies of the model
    held = [p["averaging_state_bytes"] for p in summary["memory"]["processes"]]
    assert sum(held) == 2 * 4 * summary["num_params"] * len(plan["shares"]), held
    want = dict(losses())
    shutil.rmtree(layout.step_dir(layout.checkpoints_dir(str(workdir)), 4))
    again = run_module("skyjax.launch", *args, timeout=600)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert json.loads((workdir / "summary.json").read_text())["resumed_from_step"] == 2
    got = losses()  # the first run's up to step 2, then the second run's
    assert [s for s, _ in got] == [1, 2, 3, 4], got
    np.testing.assert_allclose([x for _, x in got[2:]], [want[3], want[4]], atol=1e-5, rtol=0)
