"""The synthetic sentence-pair task: determinism, layout, padding, balance and its rule."""

from __future__ import annotations

import numpy as np
import pytest

from skyjax import data
from skyjax.config import defaults as config_defaults
from skyjax.data import synthetic


def batch(index: int = 0, seed: int = 0, split: str = "train", size: int = 64, seq_len: int = 32):
    return synthetic.make_batch(seed, index, size, seq_len, split=split)


def test_shapes_and_dtypes():
    b = batch(size=16, seq_len=40)
    assert set(b) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert b[key].shape == (16, 40) and b[key].dtype == np.int32
    assert b["labels"].shape == (16,) and b["labels"].dtype == np.int32
    assert b["input_ids"].min() >= 0 and b["input_ids"].max() < 128


def test_batch_is_a_pure_function_of_seed_split_and_index():
    a, b = batch(3), batch(3)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(batch(3)["input_ids"], batch(4)["input_ids"])
    assert not np.array_equal(batch(3)["input_ids"], batch(3, seed=1)["input_ids"])
    assert not np.array_equal(batch(3)["input_ids"], batch(3, split="eval")["input_ids"])


def test_batches_generator_matches_make_batch():
    got = list(synthetic.batches(7, 8, 32, start=5, num_batches=3))
    assert len(got) == 3
    for i, b in enumerate(got):
        np.testing.assert_array_equal(b["input_ids"], synthetic.make_batch(7, 5 + i, 8, 32)["input_ids"])


def test_layout_and_padding():
    b = batch(size=256)
    lengths = b["attention_mask"].sum(-1)
    assert len(set(lengths.tolist())) > 5, "lengths should vary"
    for ids, types, mask, n in zip(b["input_ids"], b["token_type_ids"], b["attention_mask"], lengths):
        np.testing.assert_array_equal(mask[:n], 1)  # real tokens first, then padding
        np.testing.assert_array_equal(mask[n:], 0)
        np.testing.assert_array_equal(ids[n:], synthetic.PAD)
        np.testing.assert_array_equal(types[n:], 0)
        assert ids[0] == synthetic.CLS and ids[n - 1] == synthetic.SEP
        seps = np.flatnonzero(ids == synthetic.SEP)
        assert len(seps) == 2
        np.testing.assert_array_equal(types[:seps[0] + 1], 0)  # [CLS] A [SEP]
        np.testing.assert_array_equal(types[seps[0] + 1:n], 1)  # B [SEP]
        assert not np.any(ids[1:n - 1][ids[1:n - 1] != synthetic.SEP] < synthetic.MARKER)


def test_labels_are_balanced():
    labels = np.concatenate([batch(i)["labels"] for i in range(30)])
    counts = np.bincount(labels, minlength=3) / len(labels)
    assert np.all(np.abs(counts - 1 / 3) < 0.04), counts


def test_rule_gives_every_label():
    """The label is a deterministic function of the tokens (a perfect classifier exists)."""
    for i in range(10):
        b = batch(i, split="eval" if i % 2 else "train")
        np.testing.assert_array_equal(
            synthetic.rule(b["input_ids"], b["token_type_ids"], b["attention_mask"]), b["labels"])


def test_no_length_shortcut():
    """Segment lengths carry no information about the label."""
    bs = [batch(i) for i in range(30)]
    labels = np.concatenate([b["labels"] for b in bs])
    types = np.concatenate([b["token_type_ids"] for b in bs])
    mask = np.concatenate([b["attention_mask"] for b in bs])
    len_b = (types * mask).sum(-1)
    len_a = mask.sum(-1) - len_b
    for length in (len_a, len_b):
        means = [length[labels == k].mean() for k in range(3)]
        assert max(means) - min(means) < 0.5, means


def test_too_short_sequence_is_an_error():
    with pytest.raises(ValueError, match="seq_len=10"):
        synthetic.make_batch(0, 0, 2, 10)
    with pytest.raises(ValueError, match="split='test'"):
        synthetic.make_batch(0, 0, 2, 32, split="test")


def test_data_module_from_config():
    config = config_defaults.base_config()
    config.data.batch_size = 8
    config.data.eval_examples = 20
    first = next(data.train_batches(config))
    np.testing.assert_array_equal(first["input_ids"], synthetic.make_batch(0, 0, 8, 32)["input_ids"])
    third = next(data.train_batches(config, start_step=2))
    np.testing.assert_array_equal(third["input_ids"], synthetic.make_batch(0, 2, 8, 32)["input_ids"])
    # built by the prefetch thread like every source's; the loop takes step 2 and step 3 ready
    steps = data.StepBatches(data.train_batches(config, start_step=2), start=2)
    now, ahead = steps.take(2)
    steps.close()
    np.testing.assert_array_equal(now["input_ids"], third["input_ids"])
    np.testing.assert_array_equal(ahead["input_ids"],
                                  synthetic.make_batch(0, 3, 8, 32)["input_ids"])
    evals = data.eval_batches(config)
    assert len(evals) == 3
    assert sum(float(b["weights"].sum()) for b in evals) == 20
    np.testing.assert_array_equal(evals[-1]["weights"], [1, 1, 1, 1, 0, 0, 0, 0])
