"""Cutting batches into micro-batches, and the shape of one: every stage program is compiled for
the micro-batch shape, in training and in evaluation alike; the first unit's carry of a host
batch (:func:`host_carry`), a BERT's or a language model's."""

from __future__ import annotations

from typing import Callable, Iterable

import jax
import numpy as np

# input_ids, token_type_ids, attention_mask, labels (, weights); a language model's: input_ids,
# attention_mask, labels [batch, seq] (, segment_ids)
Batch = dict[str, np.ndarray]


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


def host_carry(batch: Batch) -> dict[str, np.ndarray]:
    """``skyjax.models.bert.initial_carry`` of a host batch, built on the host (numpy): one
    device transfer, not one dispatch per array. A language model's batch has no
    ``token_type_ids`` (zeros, which its embeddings ignore); its ``segment_ids``
    (``config.data.document_mask``) enter the attention mask as each token's document + 1, 0 on
    padding, which the decoder's causal mask keeps within a document
    (``models.decoder.causal_mask``)."""
    ids = np.asarray(batch["input_ids"], np.int32)
    mask = np.asarray(batch["attention_mask"], np.int32)
    if "segment_ids" in batch:
        mask = mask * (np.asarray(batch["segment_ids"], np.int32) + 1)
    types = batch.get("token_type_ids")
    return {"input_ids": ids,
            "token_type_ids": np.zeros_like(ids) if types is None else np.asarray(types, np.int32),
            "attention_mask": mask}
