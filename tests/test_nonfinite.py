"""The non-finite guard (issue 39): a diverging run stops at the step with one line and
``EXIT_NON_FINITE``, keeping its last good checkpoint; infinite config values are refused like
NaN; token ids beyond the model's vocabulary never reach the model."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from skyjax import data as data_lib
from skyjax.checkpoint import committed_steps, find_resume
from skyjax.config import validate_config
from skyjax.data.glue import DataError
from skyjax.guard import NonFiniteError, check_step
from skyjax.names import EXIT_NON_FINITE, EXIT_PEER_LOST
from skyjax.runtime.steps import StepMetrics, StepResult
from tests.helpers import REPO, TINY, run_main, tiny_run_config

TINY_BERT = os.path.join(REPO, "tests", "fixtures", "tiny_bert")


def _errors(stderr: str) -> list[str]:
    """The lines of stderr that report an error (after absl's log lines and the config dump,
    main's one line ends stderr)."""
    lines = stderr.strip().splitlines()
    return [line for line in lines if "Error" in line or "Invalid config" in line]


@pytest.mark.slow
def test_diverging_run_stops_with_one_line_and_keeps_the_good_checkpoints(tmp_path):
    workdir = tmp_path / "run"
    proc = run_main(workdir, *TINY, "--config.train.steps=4", "--config.checkpoint.every=1",
                    "--config.train.learning_rate=1e30")
    assert proc.returncode == EXIT_NON_FINITE != EXIT_PEER_LOST, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = _errors(proc.stderr)
    assert len(errors) == 1, errors
    assert errors[0].startswith("skyjax.main: NonFiniteError: step 3: loss nan, gradient norm nan"), \
        errors
    assert "on stage 0" in errors[0] and "last good checkpoint is step 2" in errors[0]
    checkpoints = str(workdir / "checkpoints")
    assert committed_steps(checkpoints) == [1, 2]  # the diverged step 3 was never saved
    assert find_resume(checkpoints).meta["verified"]


def _metrics(loss, grad_norm=None, local=(None, None)):
    results = [StepResult([], [], [], 0.0, grad_sq_norm=x) for x in local]
    return StepMetrics(loss, 0.5, 0.0, results, grad_norm=grad_norm)


def test_check_step_names_step_values_and_stage():
    names = lambda: ["units [0, 2) on device 0", "units [2, 5) on device 1"]  # noqa: E731
    check_step(0, _metrics(1.0, 2.0, (1.0, 3.0)), names)  # finite: nothing
    with pytest.raises(NonFiniteError, match=r"^step 7: loss 1\.5, gradient norm inf on stage 1 "
                                             r"\(units \[2, 5\) on device 1\)"):
        check_step(6, _metrics(1.5, float("inf"), (float("inf"), float("inf"))), names)
    with pytest.raises(NonFiniteError, match=r"^step 1: loss nan, gradient norm n/a .*the loss "
                                             r"is computed on stage 1.*last good checkpoint is "
                                             r"step 4"):
        check_step(0, _metrics(float("nan")), names, lambda: 4)
    # a process that does not gather the loss checks the gradient norm only
    quiet = StepMetrics(float("nan"), float("nan"), 0.0, [], grad_norm=1.0, has_loss=False)
    check_step(0, quiet)


@pytest.mark.parametrize("key, value", [("learning_rate", float("inf")),
                                        ("learning_rate", float("-inf")),
                                        ("adam_eps", float("inf")),
                                        ("grad_clip_norm", float("inf"))])
def test_infinite_config_values_are_refused(key, value):
    config = tiny_run_config(**{key: value})
    with pytest.raises(ValueError, match=rf"^config\.train\.{key}={value!r} must be a finite "
                                         rf"number$"):
        validate_config(config)


def test_synthetic_data_draws_from_the_pretrained_vocabulary():
    """The tiny BERT fixture with the demo config: the checkpoint's 99 tokens, not config 128."""
    config = tiny_run_config()
    config.model.pretrained = TINY_BERT
    validate_config(config)
    vocab = json.load(open(os.path.join(TINY_BERT, "config.json")))["vocab_size"]
    assert data_lib.model_vocab_size(config) == vocab == 99 < config.model.vocab_size
    batches = data_lib.train_batches(config)
    try:
        ids = np.stack([next(batches)["input_ids"] for _ in range(4)])
    finally:
        batches.close()
    assert ids.max() < vocab and ids.max() >= vocab - 10
    assert max(b["input_ids"].max() for b in data_lib.eval_batches(config)) < vocab


def test_token_ids_beyond_the_vocabulary_are_refused():
    batch = {"input_ids": np.array([[1, 5, 130, 2]], np.int32)}
    with pytest.raises(DataError, match=r"^glue/sst2 training batch 3: token id 130 is outside "
                                        r"the model's vocabulary of 128"):
        data_lib.check_token_ids(batch, 128, "glue/sst2 training batch 3")
    assert data_lib.check_token_ids(batch, 131, "ok") is batch
