"""Killed runs end with the losses of runs never interrupted (float32, <= 1e-5):
``skyjax.main`` SIGKILLed after a checkpoint and run again on another plan and device count;
one of 3 processes under ``skyjax.launch --max_restarts 1`` SIGKILLed, the job finishing on the 2
survivors; with two pipelines, one of 3 processes SIGKILLed mid-run and the others finishing the
run without its pipeline, no restart, no step lost (drivers in tests/helpers.py;
``experiments/checkpoint_bench.py --recovery`` times the same kills). Every process ends by
itself."""

from __future__ import annotations

import os
import re
import shlex

import pytest

from tests.helpers import (DEMO, ONE_DEVICE, REPO, kill_and_resume_local, kill_one_of_launched,
                           kill_one_pipeline, main_summary, make_profile)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# A short demo run on one device: every step logged, no eval, one profiling repeat.
BASE = ["--config", DEMO, *ONE_DEVICE, "--config.train.steps=14", "--config.checkpoint.every=4",
        "--config.train.log_every=1", "--config.data.eval_examples=0",
        "--config.profile.repeats=1"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return main_summary(str(tmp_path_factory.mktemp("ref")), BASE)["final_loss"]


def test_sigkilled_run_resumes_on_another_plan_with_equal_loss(tmp_path, reference):
    r = kill_and_resume_local(
        str(tmp_path), BASE + ["--config.cluster.num_devices=2",
                               "--config.pipeline.microbatches=2"],
        BASE + ["--config.allocation.granularity=sublayer"], kill_after_checkpoint=4)
    assert r["resumed_from_step"] >= 4 and r["steps_lost"] >= 0
    assert abs(r["final_loss"] - reference) <= 1e-5, (r, reference)
    # metrics.jsonl keeps the first run's lines up to the checkpoint, then the resumed run's.
    from skyjax.jsonio import read_jsonl

    steps = [rec["step"] for rec in read_jsonl(str(tmp_path / "metrics.jsonl")) if "loss" in rec]
    assert steps == sorted(set(steps)) and steps[-1] == 14 and steps[0] == 1, steps


def test_one_of_three_processes_killed_job_finishes_on_two(tmp_path, reference):
    r = kill_one_of_launched(
        str(tmp_path), BASE + ["--config.cluster.mode=distributed",
                               "--config.cluster.num_devices=3",
                               "--config.cluster.slowdowns=(1, 1, 2)",
                               "--config.cluster.peer_timeout_s=10"],
        3, victim=1, kill_after_checkpoint=4)
    assert r["processes_after"] == 2 and r["resumed_from_step"] >= 4, r
    assert abs(r["final_loss"] - reference) <= 1e-5, (r, reference)
    assert os.path.isfile(tmp_path / "profile_survivors_1.json")  # survivors' rows, no re-profile


def test_a_lost_process_loses_its_pipeline_not_the_run(tmp_path, reference):
    """Two pipelines over 3 processes (a fixed profile of identical devices, where two pipelines
    beat one); a process of the pipeline without process 0 is SIGKILLed mid-run: the others drop
    its pipeline, run the step again with all 4 micro-batches on the remaining one and finish
    with the uninterrupted run's loss, every step logged once, no restart. (The survivors'
    new transfer servers: tests/test_transport.py, a peer killed while it pulls.)"""
    import numpy as np

    from skyjax import plan as plan_lib
    from skyjax.jsonio import read_jsonl
    from skyjax.profile.format import save_profile

    profile = make_profile(np.full((6, 3), 1e-3))  # 6 units: the demo's 4 layers
    save_profile(profile, str(tmp_path / "profile.json"))
    plan = plan_lib.plan(profile, "optimal", "1f1b", 4, max_pipelines=2)
    assert plan.num_pipelines == 2, plan
    other = next(i for i in range(2) if 0 not in [plan.stages[k].device
                                                  for k in plan.stage_ids(i)])
    victim = plan.stages[plan.stage_ids(other)[0]].device
    workdir = tmp_path / "run"
    r = kill_one_pipeline(str(workdir), BASE + [
        "--config.cluster.mode=distributed", "--config.cluster.num_devices=3",
        "--config.cluster.slowdowns=(1, 1, 1)", "--config.cluster.peer_timeout_s=10",
        "--config.pipeline.microbatches=4", "--config.allocation.max_pipelines=2",
        f"--config.profile.path={tmp_path / 'profile.json'}"], 3, victim, kill_after_step=6,
        timeout_s=240)
    summary = r["summary"]
    assert summary["resumed_from_step"] == 0 and r["killed_at_step"] < 14, r["killed_at_step"]
    [recovery] = summary["recoveries"]
    assert recovery["lost_process"] == victim and recovery["shares"] == [4], recovery
    assert victim not in recovery["devices"] and summary["plan"]["stages"]
    assert abs(summary["final_loss"] - reference) <= 1e-5, (summary["final_loss"], reference)
    steps = [rec["step"] for rec in read_jsonl(str(workdir / "metrics.jsonl")) if "loss" in rec]
    assert steps == list(range(1, 15)), steps


def _guide_command(flag: str) -> list[str]:
    """docs/guide/checkpoints.md's ``python -m skyjax.launch`` command with ``flag``, split as a
    shell would."""
    with open(os.path.join(REPO, "docs", "guide", "checkpoints.md")) as f:
        text = f.read().replace("\\\n", " ")
    [line] = [ln for ln in text.splitlines()
              if ln.startswith("python -m skyjax.launch") and flag in ln]
    return shlex.split(line)


def test_the_guide_recovery_command_restarts_on_the_survivors(tmp_path):
    """The checkpoints guide's own recovery example (its flags as written: ``slowdowns="()"``
    overriding the config file's four entries), with fewer steps: one process SIGKILLed after a
    checkpoint, the restart on the two survivors keeps the empty override (not the file's
    value, which would not fit 2 devices), resumes and finishes."""
    cmd = _guide_command("--max_restarts")
    i = cmd.index("--")
    launcher, args = cmd[3:i], cmd[i + 1:]
    assert "--config.cluster.slowdowns=()" in args, args  # the case this test is about
    n = int(launcher[launcher.index("--num_processes") + 1])
    w = args.index("--workdir")
    args = args[:w] + args[w + 2:]  # kill_one_of_launched gives its own
    smaller = {"--config.train.steps": "14", "--config.checkpoint.every": "4"}
    args = [f"{a.split('=')[0]}={smaller[a.split('=')[0]]}" if a.split("=")[0] in smaller else a
            for a in args]
    args += ["--config.train.log_every=1", "--config.data.eval_examples=0",
             "--config.profile.repeats=1"]
    r = kill_one_of_launched(str(tmp_path), args, n, victim=1, kill_after_checkpoint=4)
    assert r["processes_after"] == n - 1 and r["resumed_from_step"] >= 4, r
    # What each process's progress lines say: process 0 the loss, the others only what they
    # know (no "loss nan accuracy nan").
    lines = [ln for ln in r["log"] if re.match(r"\[p\d\] .*step \d+/14 ", ln)]
    assert {ln[:4] for ln in lines} == {f"[p{k}]" for k in range(n)}, lines
    assert not [ln for ln in lines if "nan" in ln], lines
    assert all(("loss " in ln) == ln.startswith("[p0]") for ln in lines), lines


def test_a_decoder_with_tied_weights_loses_a_pipeline_not_the_run(tmp_path):
    """configs/gpt2_text.py (its tied embedding on each pipeline's first and last stage) as two
    pipelines over 3 processes; a process of the pipeline without process 0 is SIGKILLed: the
    survivors finish on the other pipeline with the uninterrupted one-device run's loss."""
    import numpy as np

    from skyjax import plan as plan_lib
    from skyjax.profile.format import save_profile

    base = ["--config", os.path.join(REPO, "configs", "gpt2_text.py"),
            "--config.train.steps=10", "--config.train.log_every=1",
            "--config.data.eval_examples=0", "--config.allocation.calibrate_steps=0",
            "--config.profile.repeats=1"]
    reference = main_summary(str(tmp_path / "ref"), base + [
        "--config.cluster.num_devices=1", "--config.cluster.slowdowns=()"])["final_loss"]
    profile = make_profile(np.full((6, 3), 1e-3))  # 6 units: 4 layers
    save_profile(profile, str(tmp_path / "profile.json"))
    plan = plan_lib.plan(profile, "optimal", "1f1b", 4, max_pipelines=2)
    assert plan.num_pipelines == 2, plan
    other = next(i for i in range(2) if 0 not in [plan.stages[k].device
                                                  for k in plan.stage_ids(i)])
    victim = plan.stages[plan.stage_ids(other)[0]].device
    r = kill_one_pipeline(str(tmp_path / "run"), base + [
        "--config.cluster.mode=distributed", "--config.cluster.num_devices=3",
        "--config.cluster.slowdowns=(1, 1, 1)", "--config.cluster.peer_timeout_s=10",
        "--config.allocation.max_pipelines=2",
        f"--config.profile.path={tmp_path / 'profile.json'}"], 3, victim, kill_after_step=4,
        timeout_s=240)
    summary = r["summary"]
    assert r["killed_at_step"] < 10 and len(summary["recoveries"]) == 1, r["killed_at_step"]
    assert abs(summary["final_loss"] - reference) <= 1e-5, (summary["final_loss"], reference)
