"""Cutting batches into micro-batches, and the shape of one: every stage program is compiled for
the micro-batch shape, in training and in evaluation alike."""

from __future__ import annotations

from typing import Callable, Iterable

import jax
import numpy as np

Batch = dict[str, np.ndarray]  # input_ids, token_type_ids, attention_mask, labels (, weights)


def microbatch_like(batch_size: int, seq_len: int, microbatches: int) -> Batch:
    """ShapeDtypeStructs of one training micro-batch."""
    mb = batch_size // microbatches
    tokens = jax.ShapeDtypeStruct((mb, seq_len), np.int32)
    return {"input_ids": tokens, "token_type_ids": tokens, "attention_mask": tokens,
            "labels": jax.ShapeDtypeStruct((mb,), np.int32)}


def split_microbatches(batch: Batch, microbatches: int) -> Callable[[int], Batch]:
    """Micro-batch ``i`` of ``batch`` (equal contiguous slices)."""
    size = len(batch["labels"]) // microbatches
    return lambda i: {k: v[i * size:(i + 1) * size] for k, v in batch.items()}


def eval_microbatches(batches: Iterable[Batch], microbatches: int) -> list[Batch]:
    """Eval batches cut to micro-batch size, so that every stage sees its training shapes."""
    out = []
    for batch in batches:
        split = split_microbatches(batch, microbatches)
        out += [split(i) for i in range(microbatches)]
    return out
