"""The README's demo (configs/local_demo.py): 4 emulated devices of unequal speed in one process,
the even split timed for its first steps, then the chosen plan; ``summary.json`` ``calibration``
and the last log line give both measured step times and the speed-up."""

from __future__ import annotations

import json

import pytest

from skyjax.report import outputs
from tests.helpers import run_main


def _result(times, replans, resumed_from_step=0):
    return {"step_times": times, "replans": replans, "resumed_from_step": resumed_from_step,
            "calibration_strategy": "even"}


def test_calibration_report_times_each_plan_without_its_compiling_step():
    # step 1 compiles; steps 2-4 even; calibration after step 4 switches; step 5 compiles
    times = [9.0, 0.4, 0.5, 0.6, 7.0, 0.2, 0.3, 0.1]
    r = outputs.calibration_report(_result(times, [{"step": 4, "calibration": True,
                                                    "switch": True}]))
    assert r["strategy"] == "even" and r["switched"]
    assert r["steps"] == [2, 4] and r["step_time_s"] == pytest.approx(0.5)
    assert r["chosen_steps"] == [6, 8] and r["chosen_step_time_s"] == pytest.approx(0.2)
    assert r["speedup"] == pytest.approx(2.5)
    assert outputs.calibration_line(r) == ("even split 500 ms/step -> chosen plan 200 ms/step: "
                                           "2.50x faster")


def test_calibration_report_stops_at_a_later_switch_and_counts_from_the_resumed_step():
    # resumed from step 10: steps 11 (compiles) .. 18; calibration after 13, re-plan after 16
    times = [9.0, 0.4, 0.4, 7.0, 0.2, 0.2, 5.0, 0.1]
    replans = [{"step": 13, "calibration": True, "switch": True},
               {"step": 16, "calibration": False, "switch": True}]
    r = outputs.calibration_report(_result(times, replans, resumed_from_step=10))
    assert r["steps"] == [12, 13] and r["step_time_s"] == pytest.approx(0.4)
    assert r["chosen_steps"] == [15, 16] and r["chosen_step_time_s"] == pytest.approx(0.2)


def test_calibration_report_when_the_plan_is_kept_or_not_calibrated():
    kept = outputs.calibration_report(_result([9.0, 0.4, 0.4, 0.4],
                                              [{"step": 3, "calibration": True,
                                                "switch": False}]))
    assert not kept["switched"] and kept["chosen_steps"] == [4, 4]  # no compile: same plan
    assert "kept" in outputs.calibration_line(kept)
    assert outputs.calibration_report(_result([9.0, 0.4], [])) is None
    assert outputs.calibration_line(None) == ""


@pytest.mark.slow  # the README's first command, whole: about a minute on 2 cores
def test_demo_learns_the_task_and_times_the_even_split_then_the_chosen_plan(tmp_path):
    """The README's demo command reaches eval accuracy >= 0.8; the calibration steps run the
    even split, the chosen plan follows, and runs faster (the slow devices' extra time is sleep,
    which the host's load does not shrink; the margin is generous all the same); summary.json
    has both mean step times and their ratio, and the last line prints them."""
    workdir = tmp_path / "demo"
    proc = run_main(workdir, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((workdir / "summary.json").read_text())
    config = json.loads((workdir / "config.json").read_text())
    assert summary["eval_accuracy"] >= 0.8, summary
    calibrate, steps = config["allocation"]["calibrate_steps"], config["train"]["steps"]
    assert config["cluster"]["num_devices"] == 4 and len(set(config["cluster"]["slowdowns"])) > 1
    c = summary["calibration"]
    assert c["strategy"] == "even" and c["steps"] == [2, calibrate]
    assert summary["replans"][0]["calibration"] and summary["replans"][0]["step"] == calibrate
    assert c["switched"] and c["chosen_steps"] == [calibrate + 2, steps]
    assert c["speedup"] == pytest.approx(c["step_time_s"] / c["chosen_step_time_s"])
    assert c["speedup"] > 1.1, c
    assert summary["plan"]["stages"] == summary["replans"][0]["candidate"]["stages"]
    last = [ln for ln in proc.stderr.splitlines() if "summary: " in ln][-1]
    assert f"even split {1e3 * c['step_time_s']:.0f} ms/step -> chosen plan " in last
    assert f"{c['speedup']:.2f}x faster" in last
