"""Killed runs end with the losses of runs never interrupted (float32, <= 1e-5):
``skyjax.main`` SIGKILLed after a checkpoint and run again on another plan and device count;
one of 3 processes under ``skyjax.launch --max_restarts 1`` SIGKILLed, the job finishing on the 2
survivors (drivers in tests/helpers.py; ``experiments/checkpoint_bench.py --recovery`` times the
same kills). Every process ends by itself."""

from __future__ import annotations

import os

import pytest

from tests.helpers import (DEMO, ONE_DEVICE, kill_and_resume_local, kill_one_of_launched,
                           main_summary)

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
