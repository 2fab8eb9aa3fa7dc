"""``config.data`` checked against the model and the dataset it names: GLUE, your own files or
Hugging Face ``datasets``, the synthetic task, or a language model's text (``data.lm_text``).

Reason: a sequence that does not fit the model's positions, a label count the data does not
have, or a bad line in a file would otherwise surface after the model is built and compiled;
the data package's own checks are asked here (``glue.check_config``, ``tables.check_keys``,
``text.check_fit``), so the rule lives once and is reported before anything starts.
"""

from __future__ import annotations

import os
from typing import Any

from skyjax import scores
from skyjax.config import defaults
from skyjax.config.rules import at_least, fail, one_of, positive
from skyjax.data import glue, lm_sources, lm_text, synthetic, tables, text
from skyjax.models import hf_config
from skyjax.data.text import DataError


def check_data(config: Any, max_positions: int) -> None:
    """``config.data``: the dataset's name, batch, sequence length (at most the model's
    ``max_positions``), metric, then the checks of the dataset it names (a language model's:
    its text, :func:`_check_lm_text`)."""
    d, m = config.data, config.model
    family = _family(m)
    if family != "bert":
        _check_lm_text(config, family, max_positions)
        return
    if d.metric in scores.LM_METRICS:
        fail(f"config.data.metric={d.metric!r} is a language model's (config.model.model_type="
             f"'gpt2' or 'llama'); this model is BERT")
    if not (tables.is_files(d.name) or tables.is_hf(d.name)):
        one_of("config.data.name", d.name, defaults.DATASETS)
    positive("config.data.batch_size", d.batch_size)
    at_least("config.data.seq_len", d.seq_len, 4)
    at_least("config.data.prefetch", d.prefetch, 1)
    if d.seq_len > max_positions:
        fail(f"config.data.seq_len={d.seq_len} is above "
             f"config.model.max_position_embeddings={max_positions}")
    if d.metric:
        try:
            scores.check_metric(d.metric, m.num_labels)
        except ValueError as e:
            fail(str(e))
    if d.name in glue.TASKS:
        _check_glue(config)
    elif tables.is_files(d.name) or tables.is_hf(d.name):
        _check_tables(config)
    else:
        _check_synthetic(config)


def _check_synthetic(config: Any) -> None:
    """The synthetic task: two segments and the special tokens fit the sequence, its vocabulary
    fits the model's, and the model has its number of classes."""
    d, m = config.data, config.model
    at_least("config.data.eval_examples", d.eval_examples, 0)
    s = d.synthetic
    at_least("config.data.synthetic.max_markers", s.max_markers, 1)
    at_least("config.data.synthetic.min_segment_len", s.min_segment_len, 1)
    need = 3 + 2 * max(s.min_segment_len, s.max_markers)
    if d.seq_len < need:
        fail(f"config.data.seq_len={d.seq_len} is below {need}: two segments of "
             f"max(config.data.synthetic.min_segment_len={s.min_segment_len}, "
             f"config.data.synthetic.max_markers={s.max_markers}) tokens and 3 special tokens")
    vocab, _, _, where = glue.model_shape(config)  # the pretrained checkpoint's, if any
    if vocab < synthetic.min_vocab_size():
        key = (f"vocab_size={vocab} of {where}" if m.pretrained
               else f"config.model.vocab_size={vocab}")
        fail(f"{key} is below {synthetic.min_vocab_size()}, the synthetic task's vocabulary")
    if m.num_labels != synthetic.NUM_LABELS:
        fail(f"config.model.num_labels={m.num_labels} but the synthetic task has "
             f"{synthetic.NUM_LABELS} classes")


def _check_glue(config: Any) -> None:
    """GLUE: label count, tokenizer files and vocabulary size, data_dir (no TFDS import: whether
    the dataset is prepared is checked when the data is built, as is a missing tokenizer)."""
    d = config.data
    if d.eval_examples < -1:
        fail(f"config.data.eval_examples={d.eval_examples} must be >= -1 (-1 = whole splits)")
    if d.data_dir and "://" not in d.data_dir and not os.path.isdir(d.data_dir):
        fail(f"config.data.data_dir={d.data_dir!r}: directory not found")
    try:
        glue.check_config(config)
    except glue.DataError as e:
        fail(str(e))


def _check_tables(config: Any) -> None:
    """Your own data: the keys, then the files (or dataset) read and their labels checked, so
    that a bad line is reported before anything is built."""
    d = config.data
    if d.eval_examples < -1:
        fail(f"config.data.eval_examples={d.eval_examples} must be >= -1 (-1 = whole splits)")
    try:
        tables.check_keys(config)
        if not tables.is_files(d.name) and d.eval_files:
            fail(f"config.data.eval_files={tuple(d.eval_files)!r} is for local files; hf: data "
                 "names its held-out splits in config.data.eval_splits")
        task = tables.load(config).task
        text.check_fit(config, task)
    except DataError as e:
        fail(str(e))


def _family(m: Any) -> str:
    try:
        family = hf_config.model_type(m)
    except hf_config.PretrainedConfigError as e:
        fail(str(e))
    if not m.pretrained:
        one_of("config.model.model_type", family, hf_config.MODEL_TYPES)
    return family


def _check_lm_text(config: Any, family: str, max_positions: int) -> None:
    """A decoder language model: its shape's relations, then its text (a ``.txt`` file or
    folder, ``.jsonl`` / ``.csv`` with a text column, or ``hf:``) read, tokenised and packed
    (``data.lm_text.load``), so that a bad file is reported before anything is built."""
    d, m = config.data, config.model
    positive("config.data.batch_size", d.batch_size)
    at_least("config.data.seq_len", d.seq_len, 4)
    at_least("config.data.prefetch", d.prefetch, 1)
    if d.seq_len > max_positions:
        fail(f"config.data.seq_len={d.seq_len} is above the model's {max_positions} positions "
             "(config.model.max_position_embeddings, or the pretrained config.json)")
    if d.metric not in ("",) + scores.LM_METRICS:
        fail(f"config.data.metric={d.metric!r}: a {family} language model is scored by "
             "perplexity ('' or 'perplexity')")
    if not m.pretrained:
        heads = m.num_attention_heads
        kv = m.num_key_value_heads or heads
        if kv < 0 or heads % kv:
            fail(f"config.model.num_key_value_heads={m.num_key_value_heads} does not divide "
                 f"config.model.num_attention_heads={heads}")
        positive("config.model.rope_theta", m.rope_theta)
    one_of("config.data.txt_documents", d.txt_documents, ("file", "paragraph"))
    if not 0.0 <= d.eval_fraction < 1.0:
        fail(f"config.data.eval_fraction={d.eval_fraction} must be in [0, 1)")
    if d.eval_examples < -1:
        fail(f"config.data.eval_examples={d.eval_examples} must be >= -1 (-1 = whole splits)")
    if not (lm_sources.is_text_source(d.name) or tables.is_hf(d.name)):
        fail(f"config.data.name={d.name!r}: a {family} language model trains on text: a .txt "
             "file or folder of them, a .jsonl or .csv file with a text column "
             "(config.data.text_column), or hf:DIR / hf:NAME")
    try:
        lm_text.train_batch_fn(config)  # read, tokenised, packed and checked (cached)
        if d.eval_examples:
            lm_text.eval_split_batches(config)
    except DataError as e:
        fail(str(e))
