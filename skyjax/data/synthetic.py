"""A synthetic sentence-pair classification task with a real, learnable rule (no download).

Each example is ``[CLS] A [SEP] B [SEP] [PAD]...`` with ``token_type_ids`` 0 for ``[CLS] A [SEP]``
and 1 for ``B [SEP]``, and an ``attention_mask`` that is 1 on real tokens. Segments A and B have
random lengths and are filled with random "word" tokens, among which some ``MARKER`` tokens are
scattered. The label compares the marker counts, three classes like MNLI:

* 0 ("entailment"):    A has more markers than B
* 1 ("neutral"):       A and B have the same number of markers
* 2 ("contradiction"): B has more markers than A

Labels are balanced (drawn first, then counts that satisfy them), and segment lengths and marker
positions are independent of the label, so only the rule predicts it. :func:`rule` computes the label
from the tokens alone. Batch ``i`` of a split is a pure function of ``(seed, split, i)``, so every
process derives the same batches without communicating, and the eval split is a separate stream.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

PAD, CLS, SEP, UNK, MARKER = 0, 1, 2, 3, 4
FIRST_WORD = 5  # tokens FIRST_WORD .. vocab_size-1 are filler "words"
NUM_LABELS = 3
LABEL_NAMES = ("entailment", "neutral", "contradiction")
SPLITS = {"train": 0, "eval": 1}


def min_vocab_size() -> int:
    """Smallest vocabulary the task needs (special tokens, marker and a few words)."""
    return FIRST_WORD + 3


def _count_pairs(max_markers: int) -> list[list[tuple[int, int]]]:
    """(n_a, n_b) marker-count pairs for each label."""
    pairs: list[list[tuple[int, int]]] = [[], [], []]
    for na, nb in itertools.product(range(max_markers + 1), repeat=2):
        pairs[0 if na > nb else 1 if na == nb else 2].append((na, nb))
    return pairs


def _segment(rng: np.random.Generator, length: int, markers: int, vocab_size: int) -> np.ndarray:
    seg = rng.integers(FIRST_WORD, vocab_size, size=length)
    seg[rng.choice(length, size=markers, replace=False)] = MARKER
    return seg


def make_batch(seed: int, index: int, batch_size: int, seq_len: int, *, split: str = "train",
               vocab_size: int = 128, max_markers: int = 4,
               min_segment_len: int = 4) -> dict[str, np.ndarray]:
    """Batch ``index`` of ``split``: int32 arrays input_ids, token_type_ids, attention_mask [B, S]
    and labels [B]."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not one of {sorted(SPLITS)}")
    if vocab_size < min_vocab_size():
        raise ValueError(f"vocab_size={vocab_size} is below {min_vocab_size()}")
    lo = max(min_segment_len, max_markers)
    hi = (seq_len - 3) // 2
    if lo > hi:
        raise ValueError(f"seq_len={seq_len} is too short for segments of {lo} tokens")
    rng = np.random.default_rng([seed, SPLITS[split], index])
    pairs = _count_pairs(max_markers)
    ids = np.full((batch_size, seq_len), PAD, np.int32)
    types = np.zeros((batch_size, seq_len), np.int32)
    mask = np.zeros((batch_size, seq_len), np.int32)
    labels = rng.integers(0, NUM_LABELS, size=batch_size).astype(np.int32)
    for b in range(batch_size):
        na, nb = pairs[labels[b]][rng.integers(len(pairs[labels[b]]))]
        len_a, len_b = rng.integers(lo, hi + 1, size=2)
        a = _segment(rng, len_a, na, vocab_size)
        bb = _segment(rng, len_b, nb, vocab_size)
        row = np.concatenate([[CLS], a, [SEP], bb, [SEP]])
        ids[b, :len(row)] = row
        types[b, len_a + 2:len(row)] = 1
        mask[b, :len(row)] = 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "labels": labels}


def batches(seed: int, batch_size: int, seq_len: int, *, split: str = "train", start: int = 0,
            num_batches: int | None = None, **task_kwargs) -> Iterator[dict[str, np.ndarray]]:
    """Yields batches ``start, start+1, ...`` (forever if ``num_batches`` is None)."""
    indices = itertools.count(start) if num_batches is None else range(start, start + num_batches)
    for i in indices:
        yield make_batch(seed, i, batch_size, seq_len, split=split, **task_kwargs)


def rule(input_ids: np.ndarray, token_type_ids: np.ndarray,
         attention_mask: np.ndarray) -> np.ndarray:
    """The label from the tokens alone (the reference classifier; accuracy 1.0 by construction)."""
    real = (input_ids == MARKER) & (attention_mask == 1)
    na = np.sum(real & (token_type_ids == 0), axis=-1)
    nb = np.sum(real & (token_type_ids == 1), axis=-1)
    return np.where(na > nb, 0, np.where(na == nb, 1, 2)).astype(np.int32)
