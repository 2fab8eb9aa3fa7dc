"""Datasets: batches from ``config.data`` as numpy dicts (input_ids, token_type_ids,
attention_mask, labels; eval batches add ``weights``).

Every batch is a pure function of ``(config.train.seed, split, index)``, so each process derives
the same batch order. Text datasets (``"glue/mnli"``) come later: asking for one now raises
``NotImplementedError`` when the data is built, not when the config is loaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from skyjax.data import synthetic

Batch = dict[str, np.ndarray]


def _synthetic_kwargs(config: Any) -> dict[str, Any]:
    s = config.data.synthetic
    return dict(vocab_size=config.model.vocab_size, max_markers=s.max_markers,
                min_segment_len=s.min_segment_len)


def _check_name(config: Any) -> None:
    if config.data.name != "synthetic":
        raise NotImplementedError(
            f"config.data.name={config.data.name!r}: this dataset's loader is not implemented "
            "yet; use 'synthetic'")


def train_batches(config: Any, start_step: int = 0) -> Iterator[Batch]:
    """Training batches for steps ``start_step, start_step + 1, ...`` (endless)."""
    _check_name(config)
    d = config.data
    return synthetic.batches(config.train.seed, d.batch_size, d.seq_len, split="train",
                             start=start_step, **_synthetic_kwargs(config))


def eval_batches(config: Any) -> list[Batch]:
    """The held-out split: ``config.data.eval_examples`` examples in batches of
    ``config.data.batch_size``; the last batch is padded, with ``weights`` 0 on the padding."""
    _check_name(config)
    d = config.data
    num_batches = -(-d.eval_examples // d.batch_size)
    out = []
    for i in range(num_batches):
        batch = synthetic.make_batch(config.train.seed, i, d.batch_size, d.seq_len, split="eval",
                                     **_synthetic_kwargs(config))
        weights = np.arange(i * d.batch_size, (i + 1) * d.batch_size) < d.eval_examples
        out.append({**batch, "weights": weights.astype(np.float32)})
    return out
