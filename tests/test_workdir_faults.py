"""Failed and stopped runs never push the last complete run out of the workdir: an incomplete
run's files are set aside in ``previous.incomplete/``, never in place of the
complete run in ``previous/``."""

from __future__ import annotations

import json
import os

import pytest

from skyjax import workdir as workdir_lib
from skyjax.names import EXIT_NON_FINITE
from tests.helpers import TINY, run_main


def _write(path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (path / name).write_text(text)


def test_two_incomplete_runs_keep_the_complete_one_in_previous(tmp_path):
    _write(tmp_path, {"summary.json": "good", "metrics.jsonl": "good", "plan.json": "good"})
    # the next run (it will fail) sets the complete run aside
    assert workdir_lib.set_aside(str(tmp_path), resumed=False) == [
        "summary.json", "plan.json", "metrics.jsonl"]
    _write(tmp_path, {"metrics.jsonl": "failed 1", "plan.json": "failed 1"})  # no summary.json
    # a second failing run sets the first failure aside: not in place of the complete run
    assert workdir_lib.set_aside(str(tmp_path), resumed=False) == ["plan.json", "metrics.jsonl"]
    assert (tmp_path / "previous" / "summary.json").read_text() == "good"
    assert (tmp_path / "previous" / "metrics.jsonl").read_text() == "good"
    incomplete = tmp_path / workdir_lib.INCOMPLETE
    assert sorted(os.listdir(incomplete)) == ["metrics.jsonl", "plan.json"]
    _write(tmp_path, {"metrics.jsonl": "failed 2"})
    assert workdir_lib.set_aside(str(tmp_path), resumed=False) == ["metrics.jsonl"]
    assert os.listdir(incomplete) == ["metrics.jsonl"]  # the latest failure, whole
    assert (incomplete / "metrics.jsonl").read_text() == "failed 2"
    assert (tmp_path / "previous" / "summary.json").read_text() == "good"
    # a run that finished replaces the complete run in previous/
    _write(tmp_path, {"summary.json": "better"})
    assert workdir_lib.set_aside(str(tmp_path), resumed=False) == ["summary.json"]
    assert os.listdir(tmp_path / "previous") == ["summary.json"]
    assert (tmp_path / "previous" / "summary.json").read_text() == "better"
    assert sorted(os.listdir(tmp_path)) == ["previous", workdir_lib.INCOMPLETE]


@pytest.mark.slow
def test_two_diverging_runs_keep_the_last_complete_run(tmp_path):
    """A finished run, then two runs that fail after writing their first outputs (a diverging
    learning rate, exit 65): the finished run's summary.json and metrics.jsonl stay whole in
    previous/."""
    workdir = tmp_path / "run"
    good = run_main(workdir, "--config.train.steps=2", *TINY)
    assert good.returncode == 0, good.stderr[-3000:]
    summary = (workdir / "summary.json").read_text()
    metrics = (workdir / "metrics.jsonl").read_text()
    failing = ["--config.train.steps=4", "--config.train.learning_rate=1e30", *TINY]
    for attempt in (1, 2):
        bad = run_main(workdir, *failing)
        assert bad.returncode == EXIT_NON_FINITE, (attempt, bad.stderr[-3000:])
        assert not (workdir / "summary.json").exists()
    assert (workdir / "previous" / "summary.json").read_text() == summary
    assert (workdir / "previous" / "metrics.jsonl").read_text() == metrics
    # the first failure's files, set aside by the second
    incomplete = workdir / workdir_lib.INCOMPLETE
    assert "summary.json" not in os.listdir(incomplete)
    config = json.loads((incomplete / "config.json").read_text())
    assert config["train"]["learning_rate"] == 1e30
