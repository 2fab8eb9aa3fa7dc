"""Damaged checkpoint directories are refused or skipped by name, never silently restarted over:
checkpoint directories without ``meta.json`` count as checkpoints
that fail verification; a ``meta.json`` whose step is not its directory's is a failed
verification; a file named ``checkpoints`` is one line; ``CheckpointError`` is one class."""

from __future__ import annotations

import os
import shutil

import jax
import numpy as np
import optax
import pytest

from skyjax import failures
from skyjax.checkpoint import (CheckpointManager, CheckpointMismatch, committed_steps,
                               find_resume, layout, prepare, replace_earlier)
from skyjax.names import EXIT_BAD_INPUT
from tests import helpers as ref
from tests.helpers import TINY, run_main

RUN = {"seed": 0, "dataset": "synthetic"}


def _optimizer():
    return optax.adamw(1e-2, weight_decay=0.01)


def _saved(directory, steps) -> list:
    """Checkpoints ``steps`` of the reference model under ``directory`` (no executor: nothing
    compiles); returns the chain."""
    chain = ref.fresh_chain("layer")
    manager = CheckpointManager(str(directory), 1, 0, chain, _optimizer(), RUN)
    opt = _optimizer()
    for step in steps:
        states = {}
        for u, unit in enumerate(chain):
            params = jax.tree.map(lambda x: np.asarray(x) * (1 + step / 10), unit.params)
            states[u] = (params, opt.init(params))
        manager.save(step, states)
    return chain


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def _config(resume=True, replace=False):
    config = ref.tiny_run_config()
    config.checkpoint.resume, config.checkpoint.replace = resume, replace
    return config


def _one_line(proc) -> str:
    """The failure's line: stderr's last line, after absl's log lines; no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr.strip().splitlines()[-1]


def test_checkpoints_without_meta_are_refused_not_started_over(tmp_path, caplog):
    directory = tmp_path / layout.CHECKPOINTS
    _saved(directory, (1, 2))
    for step in (1, 2):
        os.remove(os.path.join(layout.step_dir(str(directory), step), layout.META))
    caplog.set_level("WARNING")
    with pytest.raises(CheckpointMismatch, match=rf"no checkpoint under {directory} verifies "
                                                 rf"\(latest, 2: .*meta.json is missing\)"):
        prepare(_config(), str(tmp_path))
    assert any(line.startswith("checkpoint 2 skipped, it does not verify: ")
               for line in _warnings(caplog))
    # resuming off: refused as committed checkpoints are
    with pytest.raises(CheckpointMismatch, match=r"holds the checkpoints of an earlier run "
                                                 r"\(steps 1, 2\)"):
        prepare(_config(resume=False), str(tmp_path))
    # replace: starts afresh, and the damaged directories go before this run writes its own
    assert prepare(_config(replace=True), str(tmp_path)) is None
    assert replace_earlier(_config(replace=True), str(tmp_path)) == [1, 2]
    assert os.listdir(directory) == []


def test_a_meta_json_of_another_step_is_a_failed_verification(tmp_path, caplog):
    """A checkpoint directory copied (or renamed) to another step's name would resume at the
    wrong step: it is named and skipped, and the previous checkpoint is used."""
    _saved(tmp_path, (1, 2, 3))
    shutil.copytree(layout.step_dir(str(tmp_path), 2), layout.step_dir(str(tmp_path), 5))
    os.rename(layout.step_dir(str(tmp_path), 3), layout.step_dir(str(tmp_path), 4))
    caplog.set_level("WARNING")
    resume = find_resume(str(tmp_path))
    assert resume.step == 2 and resume.meta["step"] == 2 and resume.meta["verified"]
    lines = _warnings(caplog)
    for step, recorded in ((5, 2), (4, 3)):
        assert any(line.startswith(f"checkpoint {step} skipped, it does not verify: ") and
                   f"records step {recorded}, its directory is step {step}" in line
                   for line in lines), lines


def test_a_file_named_checkpoints_is_refused_by_name(tmp_path):
    (tmp_path / layout.CHECKPOINTS).write_text("not checkpoints")
    with pytest.raises(NotADirectoryError, match=rf"^{tmp_path / layout.CHECKPOINTS} is a file, "
                                                 r"not a directory of checkpoints"):
        prepare(_config(), str(tmp_path))
    assert failures.exit_status(NotADirectoryError()) == EXIT_BAD_INPUT


def test_checkpoint_error_is_one_class():
    """A pretrained checkpoint that does not fit and a save that cannot be committed raise the
    same class, so one ``except`` catches both, and both are bad input (exit 64)."""
    from skyjax import checkpoint
    from skyjax.checkpoint import manager
    from skyjax.models import bert, hf_loading

    assert checkpoint.CheckpointError is manager.CheckpointError is hf_loading.CheckpointError
    assert bert.CheckpointError is hf_loading.CheckpointError
    assert failures.exit_status(checkpoint.CheckpointError("x")) == EXIT_BAD_INPUT


@pytest.mark.slow
def test_a_run_over_checkpoints_without_meta_is_refused_in_one_line(tmp_path):
    """The fault as a user meets it: a resume over checkpoints whose meta.json are gone ends
    with exit 64 and one line naming the directory, and leaves them alone; with
    checkpoint.replace it starts afresh over them."""
    workdir = tmp_path / "run"
    first = run_main(workdir, "--config.train.steps=2", "--config.checkpoint.every=1", *TINY)
    assert first.returncode == 0, first.stderr[-3000:]
    directory = workdir / layout.CHECKPOINTS
    for step in (1, 2):
        os.remove(os.path.join(layout.step_dir(str(directory), step), layout.META))
    before = {s: sorted(os.listdir(layout.step_dir(str(directory), s))) for s in (1, 2)}
    again = ["--config.train.steps=4", "--config.checkpoint.every=1", *TINY]
    refused = run_main(workdir, *again)
    assert refused.returncode == EXIT_BAD_INPUT, refused.stderr[-3000:]
    line = _one_line(refused)
    assert line.startswith(f"skyjax.main: CheckpointMismatch: no checkpoint under {directory} "
                           f"verifies"), line
    assert {s: sorted(os.listdir(layout.step_dir(str(directory), s))) for s in (1, 2)} == before
    replaced = run_main(workdir, *again, "--config.checkpoint.replace=True")
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert committed_steps(str(directory)) == [2, 3, 4]  # keep=3, all this run's
    assert find_resume(str(directory)).meta["verified"]


@pytest.mark.slow
def test_a_run_with_a_file_named_checkpoints_is_refused_in_one_line(tmp_path):
    (tmp_path / layout.CHECKPOINTS).write_text("not checkpoints")
    proc = run_main(tmp_path, "--config.train.steps=2", "--config.checkpoint.every=1", *TINY)
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr[-3000:]
    line = _one_line(proc)
    assert line == (f"skyjax.main: NotADirectoryError: {tmp_path / layout.CHECKPOINTS} is a "
                    f"file, not a directory of checkpoints: move it aside or use another "
                    f"--workdir"), line
    assert sorted(os.listdir(tmp_path)) == [".skyjax.lock", layout.CHECKPOINTS]
