"""Fine-tuning end to end, offline: MNLI from TFDS's mock data, a tiny Hugging Face checkpoint
(tests/fixtures/tiny_bert, made by Hugging Face's own code) with a vocabulary written here, trained
over pipeline stages — in one process and with one process per stage — reporting both validation
splits; the same seed gives the same losses under any plan, and each process builds only its own
units (``summary.json`` ``memory``).

The multi-process test starts this module as the worker (``python -m test_finetune``), which
enters ``tfds.testing.mock_data`` itself before training.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys

import numpy as np
import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS_DIR)
FIXTURE = os.path.join(TESTS_DIR, "fixtures", "tiny_bert")
NUM_EXAMPLES = 20  # per mocked split
SPLITS = ["validation_matched", "validation_mismatched"]


def make_checkpoint(path: str) -> str:
    """The tiny HF checkpoint with a vocabulary beside it (data.tokenizer defaults to it)."""
    from tests.helpers import write_vocab

    shutil.copytree(FIXTURE, path, ignore=shutil.ignore_patterns("reference.npz"))
    return write_vocab(path)


def finetune_config(checkpoint: str, **overrides):
    from skyjax.config import base_config

    config = base_config()
    config.model.pretrained = checkpoint
    config.model.num_labels = 3
    config.data.name = "glue/mnli"
    config.data.seq_len = 16
    config.data.batch_size = 8
    config.data.eval_examples = -1
    config.pipeline.microbatches = 2
    config.profile.repeats = 1
    t = config.train
    t.steps, t.log_every, t.eval_every, t.warmup_steps, t.learning_rate = 4, 1, 2, 1, 1e-3
    for key, value in overrides.items():
        node = config
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = tuple(value) if isinstance(value, list) else value
    return config


def mocked():
    import tensorflow_datasets as tfds
    import tensorflow_datasets.text.glue  # noqa: F401  registers glue/*

    return tfds.testing.mock_data(policy=tfds.testing.MockPolicy.USE_CODE,
                                  num_examples=NUM_EXAMPLES)


def train_losses(workdir) -> list[float]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if "loss" in r]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    pytest.importorskip("tensorflow_datasets")
    pytest.importorskip("transformers")
    return make_checkpoint(str(tmp_path_factory.mktemp("ckpt") / "tiny_bert"))


@pytest.fixture(scope="module")
def reference_run(checkpoint, tmp_path_factory):
    """One device, layer units: the losses every other plan must reproduce."""
    from skyjax import train

    workdir = tmp_path_factory.mktemp("one_device")
    with mocked():
        summary = train.train_and_evaluate(finetune_config(checkpoint), str(workdir))
    return summary, train_losses(workdir)


@pytest.mark.slow
def test_mnli_from_a_hugging_face_checkpoint_reports_both_splits(reference_run):
    summary, losses = reference_run
    assert len(losses) == 4 and all(np.isfinite(losses))
    assert list(summary["eval_by_split"]) == SPLITS
    for split in SPLITS:
        result = summary["eval_by_split"][split]
        assert result["examples"] == NUM_EXAMPLES
        assert 0.0 <= result["accuracy"] <= 1.0 and np.isfinite(result["loss"])
    assert summary["eval_accuracy"] == summary["eval_by_split"][SPLITS[0]]["accuracy"]
    memory = summary["memory"]
    (process,) = memory["processes"]
    assert process["state_bytes"] == memory["model_state_bytes"] > 0  # one process holds all
    assert process["peak_rss_bytes"] >= process["rss_start_bytes"] > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_processes_each_build_only_their_units_and_match_one_device(checkpoint,
                                                                        reference_run, tmp_path):
    from skyjax.launcher import launch

    spec = tmp_path / "spec.json"
    workdir = tmp_path / "run"
    spec.write_text(json.dumps({"checkpoint": checkpoint, "workdir": str(workdir), "overrides": {
        "cluster.mode": "distributed", "cluster.num_devices": 2, "allocation.strategy": "even"}}))
    out = io.BytesIO()
    from tests.helpers import one_device_xla_flags
    env = {"PYTHONPATH": os.pathsep.join([TESTS_DIR, REPO]), "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": one_device_xla_flags(), "SKYJAX_TEST_SPEC": str(spec)}
    rc = launch([], 2, timeout_s=500, env=env, module="test_finetune", stdout=out, grace_s=2)
    assert rc == 0, out.getvalue().decode(errors="replace")[-6000:]
    summary = json.loads((workdir / "summary.json").read_text())
    assert [s["units"] for s in summary["plan"]["stages"]] == [[0, 2], [2, 4]]
    np.testing.assert_allclose(train_losses(workdir), reference_run[1], rtol=1e-5, atol=1e-6)
    assert list(summary["eval_by_split"]) == SPLITS
    for split in SPLITS:
        assert summary["eval_by_split"][split]["examples"] == NUM_EXAMPLES
        np.testing.assert_allclose(summary["eval_by_split"][split]["accuracy"],
                                   reference_run[0]["eval_by_split"][split]["accuracy"])
    memory = summary["memory"]
    processes = memory["processes"]
    assert [p["process"] for p in processes] == [0, 1]
    assert [p["units"] for p in processes] == [[0, 2], [2, 4]]
    # Each process's training state is its units' share; together exactly the whole model.
    assert sum(p["state_bytes"] for p in processes) == memory["model_state_bytes"]
    assert all(0 < p["state_bytes"] < memory["model_state_bytes"] for p in processes)
    assert all(p["peak_rss_bytes"] > 0 for p in processes)


# ------------------------------------------------------------------------------------- worker

def _worker() -> None:
    from skyjax import startup

    with open(os.environ["SKYJAX_TEST_SPEC"]) as f:
        spec = json.load(f)
    config = finetune_config(spec["checkpoint"], **spec["overrides"])
    startup.start_jax(config)
    from skyjax import train
    from skyjax.transport import group as distributed

    with mocked():
        train.train_and_evaluate(config, spec["workdir"])
    distributed.shutdown()


if __name__ == "__main__":
    sys.exit(_worker())
