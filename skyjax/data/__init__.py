"""Datasets: batches from ``config.data`` as numpy dicts (int32 input_ids, token_type_ids,
attention_mask [batch, seq_len] and labels [batch]; eval batches add float32 ``weights``, 0 on
rows that only pad the last batch).

``config.data.name`` is ``"synthetic"`` (the offline sentence-pair task, :mod:`.synthetic`), a
GLUE task (``"glue/mnli"``, ``"glue/cola"``, ... :data:`.glue.TASKS`) read from TensorFlow
Datasets (:mod:`.glue`), or your own data (:mod:`.tables`): a ``.csv``, ``.tsv`` or ``.jsonl``
file, or ``hf:DIR`` / ``hf:NAME`` for Hugging Face ``datasets``; text is tokenised with a BERT
tokenizer (:mod:`.text`). A causal language model (:func:`is_causal_lm`) reads documents
instead (:mod:`.lm_text`: ``input_ids``, next-token ``labels`` and ``attention_mask``
``[batch, seq_len]``, ``segment_ids`` with ``config.data.document_mask``), scored by perplexity.
Labels are int32 class ids, or float32 values for a regression
(``config.model.num_labels`` 1). Every training batch is a pure
function of ``(config.train.seed, step)``, so each process derives the same batch order, and a run
resumes at any step without replaying the data. Errors in the data config (tokenizer, dataset not
prepared, label count) are raised when the data is built: by :func:`train_batches`,
:func:`eval_batches` or :func:`eval_splits` themselves, not at the first batch.

Importing this package imports neither TensorFlow nor transformers nor JAX.

* ``synthetic``: the offline sentence-pair task with a learnable rule;
* ``glue``: the GLUE task table and its splits from TensorFlow Datasets;
* ``tables``: your own ``.csv`` / ``.tsv`` / ``.jsonl`` files or Hugging Face ``datasets``;
* ``readers``: their rows read into memory (:func:`.readers.rows`, also prediction's reader);
* ``text``: what every text source shares: tokenizer, encoding, epoch order, batches;
* ``lm_sources``: a language model's documents: ``.txt`` files or folders, JSONL / CSV ``text``
  columns, Hugging Face ``datasets``;
* ``lm_text``: those documents tokenised, packed into sequences with end-of-text separators
  (``segment_ids`` on request) and batched for a causal language model;
* ``prefetch``: batches built ahead by a background thread (``Prefetcher``, ``StepBatches``);
* ``glue_build``: a GLUE task downloaded and written for TFDS (``array_record``);
* ``prepare``: ``python -m skyjax.data.prepare``, only naming :mod:`skyjax.cli.prepare`.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from skyjax.data import glue, lm_text, synthetic, tables
from skyjax.data.prefetch import Prefetcher, StepBatches
from skyjax.data.text import DataError

Batch = dict[str, np.ndarray]
SYNTHETIC_EVAL_SPLIT = "eval"


def is_causal_lm(config: Any) -> bool:
    """Whether ``config.model`` is a decoder language model (GPT-2, Llama): its data is text
    packed into sequences (:mod:`.lm_text`)."""
    from skyjax.models import hf_config  # JSON only

    try:
        return hf_config.model_type(config.model) in hf_config.DECODER_TYPES
    except hf_config.PretrainedConfigError as e:
        raise DataError(str(e)) from None


def model_vocab_size(config: Any) -> int:
    """The model's real vocabulary size: the pretrained checkpoint's ``config.json`` when
    ``config.model.pretrained`` names one (``config.model.vocab_size`` is then unused), else
    ``config.model.vocab_size``."""
    return glue.model_shape(config)[0]


def _synthetic_kwargs(config: Any) -> dict[str, Any]:
    s = config.data.synthetic
    return dict(vocab_size=model_vocab_size(config), max_markers=s.max_markers,
                min_segment_len=s.min_segment_len)


def check_token_ids(batch: Batch, vocab_size: int, what: str) -> Batch:
    """``batch``, once its token ids are known to lie in ``[0, vocab_size)`` (an id outside the
    embedding table is silently clamped by XLA and trains to NaN); raises ``DataError``."""
    ids = batch["input_ids"]
    if not ids.size:
        return batch
    low, high = int(ids.min()), int(ids.max())
    if high >= vocab_size or low < 0:
        raise DataError(f"{what}: token id {high if high >= vocab_size else low} is "
                             f"outside the model's "
                             f"vocabulary of {vocab_size} (config.model.vocab_size, or the "
                             f"pretrained checkpoint's config.json)")
    return batch


def kind(name: str) -> str:
    """``"synthetic"``, ``"glue"``, ``"files"`` or ``"hf"``; raises ``DataError`` naming
    ``config.data.name`` when it is none of them."""
    if name == "synthetic":
        return "synthetic"
    if name in glue.TASKS:
        return "glue"
    if tables.is_files(name):
        return "files"
    if tables.is_hf(name):
        return "hf"
    raise DataError(f"config.data.name={name!r} is not 'synthetic', a GLUE task "
                    f"({', '.join(glue.TASKS)}), a .csv, .tsv or .jsonl file, or hf:DIR / hf:NAME")


def _is_synthetic(config: Any) -> bool:
    return kind(config.data.name) == "synthetic"


def task(config: Any) -> glue.Task | None:
    """The text task of the config (None: synthetic). Local files and ``datasets`` are read."""
    k = kind(config.data.name)
    if k == "synthetic":
        return None
    return glue.task(config.data.name) if k == "glue" else tables.load(config).task


def metric(config: Any) -> str:
    """The held-out metric (``skyjax.scores.METRICS``): ``config.data.metric`` when set, else
    the GLUE task's own, else accuracy (classification) or pearson_spearman (regression)."""
    if config.data.metric:
        return config.data.metric
    if is_causal_lm(config):
        return "perplexity"
    t = task(config)
    return "accuracy" if t is None else t.metric


def label_names(config: Any) -> list[str] | None:
    """String labels in id order of your own data (None: integer ids, a regression, GLUE or
    synthetic); part of the run's identity, which checkpoints record."""
    if is_causal_lm(config) or kind(config.data.name) not in ("files", "hf"):
        return None
    names = tables.load(config).names
    return None if names is None else list(names)


def _train_make(config: Any) -> Callable[[int], Batch]:
    """The function that builds training batch ``i`` of the configured source."""
    d = config.data
    vocab = model_vocab_size(config)
    if _is_synthetic(config):
        kwargs = _synthetic_kwargs(config)
        make = lambda i: synthetic.make_batch(config.train.seed, i, d.batch_size,  # noqa: E731
                                              d.seq_len, split="train", **kwargs)
    elif kind(d.name) == "glue":
        make = glue.train_batch_fn(config)
    else:
        make = tables.train_batch_fn(config)
    return lambda i: check_token_ids(make(i), vocab, f"{config.data.name} training batch {i}")


def train_batches(config: Any, start_step: int = 0) -> Prefetcher:
    """Training batches for steps ``start_step, start_step + 1, ...`` (endless), built by a
    background thread up to ``config.data.prefetch`` batches ahead (every source), started at the
    first ``next``; ``close()`` on the returned iterator stops it (dropping the iterator does
    too). GLUE's tokenizer and dataset are opened here (errors are raised by this call). The
    training loop takes them through :class:`StepBatches`."""
    if is_causal_lm(config):
        return lm_text.train_batches(config, start_step)
    name = "synthetic" if _is_synthetic(config) else config.data.name
    return Prefetcher(_train_make(config), start=start_step, depth=config.data.prefetch,
                      name=f"skyjax-data-{name}")


def _synthetic_eval(config: Any) -> list[Batch]:
    d = config.data
    num_batches = -(-d.eval_examples // d.batch_size)
    out = []
    for i in range(num_batches):
        batch = synthetic.make_batch(config.train.seed, i, d.batch_size, d.seq_len, split="eval",
                                     **_synthetic_kwargs(config))
        weights = np.arange(i * d.batch_size, (i + 1) * d.batch_size) < d.eval_examples
        out.append({**batch, "weights": weights.astype(np.float32)})
    return out


def eval_splits(config: Any) -> dict[str, list[Batch]]:
    """Every held-out split, ``{split name: batches}``, in a fixed order: synthetic ``{"eval":
    ...}``; GLUE its validation splits (MNLI ``validation_matched``, ``validation_mismatched``;
    the others ``validation``). Each has ``config.data.eval_examples`` examples (capped at the
    split's size; -1 = the whole split, not synthetic) in batches of ``config.data.batch_size``; the
    last batch is padded, with ``weights`` 0 on the padding. ``eval_examples`` 0: ``{}``. A
    language model's: :func:`.lm_text.eval_split_batches` (sequences, per split)."""
    if is_causal_lm(config):
        return lm_text.eval_split_batches(config)
    if _is_synthetic(config):
        return {SYNTHETIC_EVAL_SPLIT: _synthetic_eval(config)} if config.data.eval_examples else {}
    if kind(config.data.name) == "glue":
        return glue.eval_split_batches(config)
    return tables.eval_split_batches(config)


def eval_batches(config: Any) -> list[Batch]:
    """The first held-out split's batches (see :func:`eval_splits`); ``[]`` when
    ``config.data.eval_examples`` is 0."""
    if is_causal_lm(config):
        return next(iter(lm_text.eval_split_batches(config).values()), [])
    if _is_synthetic(config):
        return _synthetic_eval(config)
    first = task(config).eval_splits[:1]
    make = glue.eval_split_batches if kind(config.data.name) == "glue" else tables.eval_split_batches
    return next(iter(make(config, first).values()), [])
