"""experiments/accuracy_table.py: saved benchmark runs re-priced with the current cost model and
tallied against the prediction goals."""

import json

import numpy as np
import pytest

from experiments import accuracy_table
from skyjax import plan as plan_lib
from tests.test_allocator import make_profile


def _result(profile, slower: dict[str, float]) -> dict:
    """A benchmark result.json whose plans measured ``slower[plan]`` x their prediction, each
    stage's compute as predicted."""
    plans = {"even": plan_lib.plan(profile, "even", "1f1b", 4),
             "optimal": plan_lib.plan(profile, "optimal", "1f1b", 4)}
    return {"profile": profile.to_json(),
            "plans": {n: p.to_json() for n, p in plans.items()},
            "times": {n: [p.step_time_s * slower[n]] * 3 for n, p in plans.items()},
            "busy": {n: [4 * s.compute_s for s in p.stages] for n, p in plans.items()}}


def test_errors_speedup_and_stages_follow_the_measured_steps():
    profile = make_profile(np.array([[0.01, 0.02, 0.04]] * 6))
    got = accuracy_table.run_figures(_result(profile, {"even": 1.25, "optimal": 1.0}))
    assert got["error"]["even"] == pytest.approx(0.2)  # (1.25 - 1) / 1.25
    assert got["error"]["optimal"] == pytest.approx(0.0, abs=1e-12)
    assert got["speedup"] == pytest.approx(1.25)  # measured 1.25x the predicted speed-up
    assert got["stages"] == pytest.approx([0.0] * got["num_stages"], abs=1e-12)


def test_tally_counts_runs_within_the_goals(tmp_path, capsys):
    profile = make_profile(np.array([[0.01, 0.02, 0.04]] * 6))
    for name, slower in [("good", {"even": 1.05, "optimal": 0.97}),
                         ("off", {"even": 1.3, "optimal": 1.0})]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.json").write_text(json.dumps(_result(profile, slower)))
    (tmp_path / "unfinished").mkdir()
    accuracy_table.main([str(tmp_path / n) for n in ("good", "off", "unfinished")])
    out = capsys.readouterr().out
    assert "unfinished: no result.json" in out
    assert "of 2 runs: even within 10% in 1" in out and "optimal in 2" in out
    assert "both in 1; speed-up >= 90% of predicted in 2" in out
