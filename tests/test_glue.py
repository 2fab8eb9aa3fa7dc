"""GLUE data (skyjax/data/glue.py), offline: TFDS's mock_data stands in for the prepared splits and
a tokenizer is built over a vocabulary written here. Batches must equal what BertTokenizerFast
makes of the same pairs, in an order that is a pure function of (seed, step)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import ml_collections
import numpy as np
import pytest

from skyjax import data
from skyjax.config import defaults as config_defaults
from skyjax.config import validate_config
from skyjax.data import glue
from skyjax.data.prefetch import Prefetcher
from tests.helpers import (VOCAB, reference_tokenizer, take, text_config, tokenized,  # noqa: F401
                           vocab_dir, write_vocab)

tfds = pytest.importorskip("tensorflow_datasets")  # the "test" / "tfds" extra installs it
transformers = pytest.importorskip("transformers")

NUM_EXAMPLES = 20  # examples per mocked split
BATCH = 8
SEQ_LEN = 16  # mock pairs are 6-28 tokens here: some fit, some are truncated

@pytest.fixture
def mock():
    """Every TFDS split has NUM_EXAMPLES random examples (the same ones in every split)."""
    import tensorflow_datasets.text.glue  # noqa: F401  registers glue/*

    with tfds.testing.mock_data(policy=tfds.testing.MockPolicy.USE_CODE,
                                num_examples=NUM_EXAMPLES):
        yield


def make_config(vocab_dir: str, name: str = "glue/mnli", **data) -> ml_collections.ConfigDict:
    config = text_config(vocab_dir, name, glue.TASKS[name].num_labels,
                         {"batch_size": BATCH, "seq_len": SEQ_LEN, **data})
    validate_config(config)
    return config


def assert_batches_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert set(x) == set(y)
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


def row_keys(batch) -> list[bytes]:
    return [r.tobytes() for r in batch["input_ids"]]


def source_rows(name: str, split: str) -> list[dict]:
    """The split's examples as tfds.data_source gives them (under mock)."""
    src = tfds.data_source(name, split=split)
    return [src[i] for i in range(len(src))]


def reference_batch(tokenizer, name: str, rows: list[dict], seq_len: int = SEQ_LEN):
    """One tokenizer call per example, as the task asks: tokenizer(a, b, truncation=True, ...)."""
    return tokenized(tokenizer, rows, glue.TASKS[name].text, seq_len,
                     np.asarray([int(r["label"]) for r in rows], np.int32))


# --------------------------------------------------------------------------------------------
# The table.

def test_task_table():
    assert set(config_defaults.DATASETS) == {"synthetic", *(f"glue/{t}" for t in (
        "cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"))}
    t = glue.TASKS
    assert t["glue/mnli"].text == ("premise", "hypothesis") and t["glue/mnli"].num_labels == 3
    assert t["glue/mnli"].eval_splits == ("validation_matched", "validation_mismatched")
    assert t["glue/sst2"].text == t["glue/cola"].text == ("sentence",)
    assert t["glue/mrpc"].text == t["glue/rte"].text == t["glue/stsb"].text \
        == t["glue/wnli"].text == ("sentence1", "sentence2")
    assert t["glue/qqp"].text == ("question1", "question2")
    assert t["glue/qnli"].text == ("question", "sentence")
    # the published metric of each task
    assert {n: task.metric for n, task in t.items() if task.metric != "accuracy"} == {
        "glue/cola": "matthews", "glue/mrpc": "f1", "glue/qqp": "f1",
        "glue/stsb": "pearson_spearman"}
    assert t["glue/stsb"].num_labels == 1 and t["glue/stsb"].regression
    # label names in TFDS's id order, one per class (STS-B, a regression, has none)
    assert t["glue/mnli"].label_names == ("entailment", "neutral", "contradiction")
    assert t["glue/wnli"].label_names == ("not_entailment", "entailment")
    assert all(len(task.label_names) == task.num_labels for n, task in t.items()
               if n != "glue/stsb") and t["glue/stsb"].label_names is None
    for name, task in t.items():
        assert task.train_split == "train"
        if name not in ("glue/mnli", "glue/stsb"):
            assert task.num_labels == 2 and task.eval_splits == ("validation",)


@pytest.mark.parametrize("name", sorted(glue.TASKS))
def test_every_task_matches_tfds_and_builds(name, vocab_dir, mock):
    builder = tfds.builder(name)
    task = glue.TASKS[name]
    label = builder.info.features["label"]
    assert getattr(label, "num_classes", 1) == task.num_labels  # STS-B: a float score
    for key in task.text:
        assert key in builder.info.features
    config = make_config(vocab_dir, name)
    (batch,) = take(data.train_batches(config), 1)
    assert batch["input_ids"].shape == (BATCH, SEQ_LEN) and batch["labels"].shape == (BATCH,)
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert batch[key].dtype == np.int32, key
    if task.regression:
        assert batch["labels"].dtype == np.float32 and np.isfinite(batch["labels"]).all()
    else:
        assert batch["labels"].dtype == np.int32
        assert 0 <= batch["labels"].min() and batch["labels"].max() < task.num_labels
    assert list(data.eval_splits(config)) == list(task.eval_splits)
    if len(task.text) == 1:  # single sentence: [CLS] a [SEP], token types all 0
        np.testing.assert_array_equal(batch["token_type_ids"], 0)
        assert ((batch["input_ids"] == VOCAB.index("[SEP]")).sum(1) == 1).all()
    else:
        assert (batch["token_type_ids"] == 1).any(1).all()


# --------------------------------------------------------------------------------------------
# Encoding and order.

def test_batches_equal_the_tokenizer_on_the_same_pairs(vocab_dir, reference_tokenizer, mock):
    name = "glue/mnli"
    config = make_config(vocab_dir, name, prefetch=1)
    batches = take(data.train_batches(config), 6)  # 48 stream positions: 2.4 epochs of 20
    rows = source_rows(name, "train")
    order = glue.EpochOrder(config.train.seed, NUM_EXAMPLES)
    for i, batch in enumerate(batches):
        expected = reference_batch(reference_tokenizer, name,
                                   [rows[j] for j in order.indices(i * BATCH, BATCH)])
        assert_batches_equal([batch], [expected])
    ids = np.concatenate([b["input_ids"] for b in batches])
    mask = np.concatenate([b["attention_mask"] for b in batches])
    sep = VOCAB.index("[SEP]")
    full = mask.all(1)
    assert full.any() and not full.all(), "want truncated and padded rows"
    assert (ids[full, -1] == sep).all()  # truncation keeps the final [SEP]
    assert (ids[mask == 0] == 0).all()  # padding is [PAD]
    assert (ids == VOCAB.index("[UNK]")).any()


def test_epoch_order_is_a_permutation_per_epoch():
    order = glue.EpochOrder(seed=3, num_examples=10)
    stream = order.indices(0, 30)
    for e in range(3):
        epoch = stream[10 * e:10 * (e + 1)]
        np.testing.assert_array_equal(epoch, np.random.default_rng((3, e)).permutation(10))
    assert not np.array_equal(stream[:10], stream[10:20])
    np.testing.assert_array_equal(order.indices(7, 9), stream[7:16])  # straddles an epoch
    np.testing.assert_array_equal(glue.EpochOrder(3, 10).indices(25, 5), stream[25:])


def test_same_seed_same_batches_other_seed_other_order(vocab_dir, mock):
    config = make_config(vocab_dir)
    first = take(data.train_batches(config), 3)
    assert_batches_equal(first, take(data.train_batches(config), 3))
    config.train.seed = 1
    other = take(data.train_batches(config), 3)
    assert row_keys(first[0]) != row_keys(other[0])


def test_each_epoch_is_reshuffled(vocab_dir, mock):
    # batch 4 divides 20 examples: batches 0-4 are epoch 0, 5-9 epoch 1.
    config = make_config(vocab_dir, batch_size=4)
    batches = take(data.train_batches(config), 10)
    epoch0 = sum((row_keys(b) for b in batches[:5]), [])
    epoch1 = sum((row_keys(b) for b in batches[5:]), [])
    assert sorted(epoch0) == sorted(epoch1)  # the same examples, each once per epoch
    assert len(set(epoch0)) == len(epoch0) == NUM_EXAMPLES
    assert epoch0 != epoch1  # in another order


@pytest.mark.parametrize("k", [1, 7])
def test_start_step_equals_the_kth_batch(vocab_dir, mock, k):
    config = make_config(vocab_dir)
    fresh = take(data.train_batches(config), k + 2)
    resumed = take(data.train_batches(config, start_step=k), 2)
    assert_batches_equal(resumed, fresh[k:])


def test_prefetch_depth_does_not_change_batches(vocab_dir, mock):
    one = take(data.train_batches(make_config(vocab_dir, prefetch=1)), 4)
    assert_batches_equal(take(data.train_batches(make_config(vocab_dir, prefetch=2)), 4), one)
    assert_batches_equal(take(data.train_batches(make_config(vocab_dir, prefetch=4)), 4), one)


def test_prefetch_zero_is_refused():
    """Every source's batches are built by the prefetch thread: a depth of 0 is a config error
    naming the key, and the Prefetcher refuses it too."""
    config = config_defaults.base_config()
    config.data.prefetch = 0
    with pytest.raises(ValueError, match=r"config\.data\.prefetch=0 must be >= 1"):
        validate_config(config)
    with pytest.raises(ValueError, match="depth=0"):
        Prefetcher(lambda i: i, depth=0)


def test_prefetcher_runs_ahead_stops_and_forwards_errors():
    made = []

    def make(i):
        made.append(i)
        if i == 5:
            raise RuntimeError("batch 5 is broken")
        return i

    before = set(threading.enumerate())
    it = Prefetcher(make, start=2, depth=2)
    assert next(it) == 2
    deadline = time.time() + 5
    while len(made) < 4 and time.time() < deadline:
        time.sleep(0.01)
    assert made[:4] == [2, 3, 4, 5]  # built ahead, in order
    assert next(it) == 3 and next(it) == 4
    with pytest.raises(RuntimeError, match="batch 5"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)

    it = Prefetcher(lambda i: i, depth=3)
    assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4]
    it.close()
    deadline = time.time() + 5
    while set(threading.enumerate()) - before and time.time() < deadline:
        time.sleep(0.01)
    assert not set(threading.enumerate()) - before, "the prefetch threads should have stopped"


def test_prefetcher_skip_builds_nothing_until_its_thread_starts():
    """``skip`` before the first ``next`` moves past a batch unbuilt (a process whose stage
    reads no batch builds none); the thread then starts at the batch after it."""
    made = []

    def make(i):
        made.append(i)
        return i

    it = Prefetcher(make, start=3, depth=2)
    it.skip()
    it.skip()
    time.sleep(0.05)
    assert made == []  # no thread yet
    assert next(it) == 5 and made[0] == 5
    it.skip()  # the thread has started: taken from its queue, in order
    assert next(it) == 7
    it.close()


def test_step_batches_take_ready_batches_in_step_order():
    """``StepBatches.take``: the step's batch and the next step's (held for the next take), none
    for a stage that reads no batch; a batch that fails to build is raised by its own step's
    take, not by the step before it, which takes it ahead."""
    made = []

    def make(i):
        made.append(i)
        if i == 5:
            raise RuntimeError("batch 5 is broken")
        return {"index": i}

    steps = data.StepBatches(Prefetcher(make, start=1, depth=2), start=1)
    assert steps.take(1, read=False) == (None, None)  # skipped before the thread starts
    batch, ahead = steps.take(2)
    assert batch == {"index": 2} and ahead == {"index": 3} and 1 not in made
    again, ahead = steps.take(3)
    assert again is not None and again == {"index": 3} and ahead == {"index": 4}
    assert steps.take(4, read=False) == (None, None)  # the held batch is dropped
    with pytest.raises(ValueError, match="step 6 taken where step 5 comes next"):
        steps.take(6)
    steps = data.StepBatches(Prefetcher(make, start=4, depth=2), start=4)
    batch, ahead = steps.take(4)
    assert batch == {"index": 4} and ahead is None
    with pytest.raises(RuntimeError, match="batch 5"):
        steps.take(5)
    steps.close()
    last = data.StepBatches(Prefetcher(make, start=0, depth=1))
    assert last.take(0, ahead=False) == ({"index": 0}, None)
    assert last.take(1, ahead=False)[0] == {"index": 1}
    last.close()


# --------------------------------------------------------------------------------------------
# Evaluation.

def test_mnli_eval_splits_all_returned_with_weights(vocab_dir, reference_tokenizer, mock):
    config = make_config(vocab_dir)  # eval_examples -1: whole splits
    splits = data.eval_splits(config)
    assert list(splits) == ["validation_matched", "validation_mismatched"]
    for split, batches in splits.items():
        assert len(batches) == 3  # 20 examples in batches of 8
        weights = np.concatenate([b["weights"] for b in batches])
        assert weights.dtype == np.float32 and weights.sum() == NUM_EXAMPLES
        np.testing.assert_array_equal(batches[-1]["weights"], [1, 1, 1, 1, 0, 0, 0, 0])
        rows = source_rows("glue/mnli", split)
        expected = [reference_batch(reference_tokenizer, "glue/mnli",
                                    [rows[j % NUM_EXAMPLES] for j in range(s, s + BATCH)])
                    for s in range(0, 24, BATCH)]
        assert_batches_equal([{k: v for k, v in b.items() if k != "weights"} for b in batches],
                             expected)
    assert_batches_equal(data.eval_batches(config), splits["validation_matched"])


def test_eval_examples_caps_each_split(vocab_dir, mock):
    config = make_config(vocab_dir, eval_examples=10)
    splits = data.eval_splits(config)
    for batches in splits.values():
        assert len(batches) == 2
        np.testing.assert_array_equal(batches[1]["weights"], [1, 1, 0, 0, 0, 0, 0, 0])
    config = make_config(vocab_dir, eval_examples=1000)  # more than the split has
    assert sum(float(b["weights"].sum()) for b in data.eval_batches(config)) == NUM_EXAMPLES
    config = make_config(vocab_dir, eval_examples=0)
    assert data.eval_splits(config) == {} and data.eval_batches(config) == []


def test_synthetic_eval_splits():
    config = config_defaults.base_config()
    config.data.batch_size = 8
    config.data.eval_examples = 20
    splits = data.eval_splits(config)
    assert list(splits) == ["eval"]
    assert_batches_equal(splits["eval"], data.eval_batches(config))
    config.data.eval_examples = 0
    assert data.eval_splits(config) == {}


# --------------------------------------------------------------------------------------------
# Where the tokenizer comes from.

def test_tokenizer_from_the_pretrained_directory(vocab_dir, tmp_path, mock):
    expected = take(data.train_batches(make_config(vocab_dir)), 2)
    pretrained = write_vocab(tmp_path / "bert")
    with open(os.path.join(pretrained, "config.json"), "w") as f:
        json.dump({"model_type": "bert", "vocab_size": 64, "max_position_embeddings": 64}, f)
    config = make_config("")
    config.model.pretrained = pretrained
    validate_config(config)
    assert_batches_equal(take(data.train_batches(config), 2), expected)


def test_tokenizer_json_directory(vocab_dir, reference_tokenizer, tmp_path, mock):
    expected = take(data.train_batches(make_config(vocab_dir)), 2)
    saved = tmp_path / "saved"
    reference_tokenizer.save_pretrained(str(saved))
    if (saved / "vocab.txt").exists():
        (saved / "vocab.txt").unlink()
    assert (saved / "tokenizer.json").exists()
    assert glue.vocabulary_size(str(saved))[0] == len(VOCAB)
    assert_batches_equal(take(data.train_batches(make_config(str(saved))), 2), expected)


def test_importing_data_does_not_import_tensorflow_or_transformers():
    code = ("import sys, skyjax.data, skyjax.config.validation; "
            "print(sorted(m for m in ('tensorflow', 'tensorflow_datasets', 'transformers', 'jax') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_split_prepared_without_random_access_is_read_into_memory(vocab_dir, mock, monkeypatch):
    """A tfrecord preparation (TFDS's default) is read with tfds.as_numpy (imports TensorFlow)."""
    config = make_config(vocab_dir, name="glue/sst2")
    monkeypatch.setattr(tfds.core.DatasetBuilder, "is_prepared", lambda self: True)
    source = glue.open_split("glue/sst2", "validation")
    assert isinstance(source, glue.InMemorySource) and len(source) == NUM_EXAMPLES
    rows = list(tfds.as_numpy(tfds.builder("glue/sst2").as_dataset(split="validation")))
    assert [r["sentence"] for r in (source[0], source[19])] == [
        rows[0]["sentence"].decode(), rows[19]["sentence"].decode()]
    (batches,) = data.eval_splits(config).values()
    assert sum(float(b["weights"].sum()) for b in batches) == NUM_EXAMPLES


# --------------------------------------------------------------------------------------------
# Errors: one line, naming the key, file or dataset.

def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_dataset_not_prepared(vocab_dir, tmp_path):
    """Outside mock_data: an empty data_dir (nothing is downloaded)."""
    config = make_config(vocab_dir, name="glue/rte", data_dir=str(tmp_path))
    for build in (data.train_batches, data.eval_splits, data.eval_batches):
        with pytest.raises(glue.DataError) as e:
            build(config)
        msg = one_line(e)
        assert "glue/rte" in msg and str(tmp_path) in msg
        assert f"python -m skyjax.data.prepare glue/rte --data_dir {tmp_path}" in msg


def test_missing_data_dir_fails_validation(vocab_dir, tmp_path):
    config = make_config(vocab_dir)
    config.data.data_dir = str(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"config\.data\.data_dir=.*nowhere.*not found"):
        validate_config(config)


def test_tokenizer_directory_without_vocabulary(tmp_path):
    empty = tmp_path / "empty_tokenizer"
    empty.mkdir()
    config = config_defaults.base_config()
    config.data.name, config.data.tokenizer = "glue/mnli", str(empty)
    with pytest.raises(ValueError) as e:
        validate_config(config)
    msg = one_line(e)
    assert f"config.data.tokenizer={str(empty)!r}" in msg and "vocab.txt" in msg
    with pytest.raises(glue.DataError) as e:
        data.train_batches(config)
    assert f"config.data.tokenizer={str(empty)!r}" in one_line(e)
    config.data.tokenizer = str(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"config\.data\.tokenizer=.*missing.*not found"):
        validate_config(config)


def test_no_tokenizer_at_all_fails_when_built():
    config = config_defaults.base_config()
    config.data.name = "glue/mnli"
    validate_config(config)  # a config can be planned and profiled without a tokenizer
    with pytest.raises(glue.DataError) as e:
        data.train_batches(config)
    msg = one_line(e)
    assert "config.data.tokenizer" in msg and "config.model.pretrained" in msg


def test_vocabulary_larger_than_the_model(tmp_path):
    big = write_vocab(tmp_path / "big", VOCAB + [f"w{i}" for i in range(200)])
    config = config_defaults.base_config()
    config.data.name, config.data.tokenizer = "glue/mnli", big
    with pytest.raises(ValueError) as e:
        validate_config(config)
    msg = one_line(e)
    assert os.path.join(big, "vocab.txt") in msg and "vocab_size=128" in msg
    assert "config.model" in msg and str(len(VOCAB) + 200) in msg
    with pytest.raises(glue.DataError, match=r"vocab\.txt.*vocab_size=128"):
        data.train_batches(config)
    config.model.vocab_size = len(VOCAB) + 200
    validate_config(config)


def test_label_count_mismatch(vocab_dir):
    config = config_defaults.base_config()
    config.data.name, config.data.tokenizer = "glue/sst2", vocab_dir
    config.model.num_labels = 3
    with pytest.raises(ValueError) as e:
        validate_config(config)
    msg = one_line(e)
    assert "config.model.num_labels=3" in msg and "config.data.name='glue/sst2'" in msg
    assert "2 labels" in msg
    with pytest.raises(glue.DataError, match=r"config\.model\.num_labels=3"):
        data.train_batches(config)
    config.data.name = "glue/mnli"
    validate_config(config)


def test_seq_len_above_max_positions(vocab_dir):
    config = config_defaults.base_config()
    config.data.name, config.data.tokenizer = "glue/mnli", vocab_dir
    config.data.seq_len = 65
    with pytest.raises(ValueError, match=r"config\.data\.seq_len=65 is above "
                                         r"config\.model\.max_position_embeddings=64"):
        validate_config(config)
    with pytest.raises(glue.DataError, match=r"config\.data\.seq_len=65 is above "
                                             r"max_position_embeddings=64"):
        data.train_batches(config)


def test_eval_examples_bounds(vocab_dir):
    config = make_config(vocab_dir)
    config.data.eval_examples = -2
    with pytest.raises(ValueError, match=r"config\.data\.eval_examples=-2 must be >= -1"):
        validate_config(config)
    config = config_defaults.base_config()
    config.data.eval_examples = -1  # "whole split" means nothing for the endless synthetic task
    with pytest.raises(ValueError, match=r"config\.data\.eval_examples=-1 must be >= 0"):
        validate_config(config)


def test_unknown_dataset_name_when_built():
    config = config_defaults.base_config()
    config.data.name = "glue/cola"
    with pytest.raises(ValueError, match=r"config\.data\.name='glue/cola'"):
        validate_config(config)
    with pytest.raises(glue.DataError, match=r"config\.data\.name='glue/cola'"):
        data.train_batches(config)
