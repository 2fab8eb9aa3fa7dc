"""What a run shows a person (skyjax.report.watch, end to end through ``python -m skyjax.main``):
progress lines with an ETA and no bar in a log, TensorBoard scalars at every log step (loss,
throughput, per-stage compute and idle time, eval), plan.png and timeline.png."""

from __future__ import annotations

import json

import pytest

from tests.helpers import TINY, read_events, run_main


@pytest.mark.slow  # about a minute on 2 shared cores
def test_run_leaves_progress_tensorboard_and_pictures(tmp_path):
    workdir = tmp_path / "run"
    proc = run_main(workdir, *TINY, "--config.train.steps=4", "--config.train.log_every=2",
                    "--config.cluster.num_devices=2", "--config.allocation.strategy=even",
                    "--config.profile.repeats=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "] step " in line]
    assert [line.split("] step ")[1].split()[0] for line in lines] == ["1/4", "2/4", "4/4"]
    assert all("ETA" in line and "examples/s" in line and "s/step" in line for line in lines)
    assert "ETA --" in lines[0] and "ETA 0.0s" in lines[-1]
    assert "\r" not in proc.stderr  # not a terminal: plain lines, no live bar
    # Identical devices are measured once: the profiler's lines name the first.
    assert any("| device 1/2, ETA" in line for line in proc.stderr.splitlines())

    records = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 4]
    assert all(len(r["stage_compute_s"]) == 2 and len(r["stage_idle_s"]) == 2 for r in train)
    assert all(r["stage_compute_s"][k] > 0 for r in train for k in range(2))

    events = read_events(str(workdir / "tensorboard"))
    assert [s for s, _ in events["train/loss"]] == [1, 2, 4]
    assert [v for _, v in events["train/loss"]] == [
        pytest.approx(r["loss"], rel=1e-6) for r in train]
    for tag in ("train/accuracy", "train/learning_rate", "train/step_time_s",
                "train/examples_per_s", "stage_compute_s/stage_1", "stage_idle_s/stage_0"):
        assert [s for s, _ in events[tag]] == [1, 2, 4], tag
    assert [s for s, _ in events["eval/eval/accuracy"]] == [4]

    for name in ("plan.png", "timeline.png"):
        assert (workdir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name

    # trace.json: the last step's measured actions, a thread per stage, beside the simulation
    trace = json.loads((workdir / "trace.json").read_text())
    measured = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["pid"] == 0]
    step = [e for e in measured if e["cat"] == "step"]  # the row as long as the step
    measured = [e for e in measured if e["cat"] != "step"]
    assert {e["tid"] for e in measured} == {0, 1}
    assert sorted(e["name"] for e in measured if e["tid"] == 1) == ["B0", "B1", "F0", "F1"]
    assert len(step) == 1 and step[0]["ts"] == 0.0
    assert step[0]["dur"] >= max(e["ts"] + e["dur"] for e in measured)
    assert any(e["pid"] >= 10 for e in trace["traceEvents"])
