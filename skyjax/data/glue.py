"""GLUE fine-tuning data from TensorFlow Datasets, tokenised with a BERT WordPiece tokenizer.

:data:`TASKS` is the one table of the supported tasks (text features, label count, splits).
Examples are read with ``tfds.data_source`` (random access to an ``array_record`` preparation; no
TensorFlow needed); a split prepared in TFDS's default ``tfrecord`` format is read once into
memory with ``tfds.as_numpy`` instead (that path imports TensorFlow). Nothing is downloaded: a
dataset that is not prepared is an error saying how to prepare it.

Text is encoded exactly as ``tokenizer(a, b, truncation=True, max_length=seq_len,
padding="max_length")`` does with transformers' ``BertTokenizerFast`` (``[CLS] a [SEP] b [SEP]``,
token types 0 / 1, attention mask, padding), as int32 numpy arrays.

Order: the training split is one endless stream of epochs; epoch ``e`` visits every example once,
in the order ``numpy.random.default_rng((seed, e)).permutation(n)``, and batch ``i`` holds stream
positions ``[i * batch_size, (i + 1) * batch_size)`` (a batch may straddle two epochs). So batch
``i`` is a pure function of ``(seed, i)``: every process derives the same batches, and a run
resumes at any step in O(1). Validation splits are read in order, from their first example.

This module imports only numpy and absl at import time; tensorflow_datasets and transformers are
imported when a dataset or tokenizer is built, so validation can use :func:`check_config` before
anything heavy (or JAX) is imported.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from absl import logging

from skyjax.models import hf_config

Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Task:
    """One GLUE task as TFDS names it: ``text`` holds one feature (single sentence) or two
    (sentence pair); ``eval_splits`` are the labelled validation splits, first one first."""

    text: tuple[str, ...]
    num_labels: int
    train_split: str = "train"
    eval_splits: tuple[str, ...] = ("validation",)


TASKS: dict[str, Task] = {
    "glue/mnli": Task(("premise", "hypothesis"), 3,
                      eval_splits=("validation_matched", "validation_mismatched")),
    "glue/sst2": Task(("sentence",), 2),
    "glue/mrpc": Task(("sentence1", "sentence2"), 2),
    "glue/qqp": Task(("question1", "question2"), 2),
    "glue/qnli": Task(("question", "sentence"), 2),
    "glue/rte": Task(("sentence1", "sentence2"), 2),
}

VOCAB_FILES = ("tokenizer.json", "vocab.txt")  # what makes a directory a tokenizer (either)


class DataError(ValueError):
    """A dataset, tokenizer or data config problem; the message names the key, file or dataset."""


def task(name: str) -> Task:
    if name not in TASKS:
        raise DataError(f"config.data.name={name!r} is not a GLUE task "
                        f"({', '.join(map(repr, TASKS))})")
    return TASKS[name]


# --------------------------------------------------------------------------------------------
# Checks that need no TensorFlow, transformers or JAX (run by validate_config and again when the
# data is built).

def model_shape(config: Any) -> tuple[int, int, int, str]:
    """(vocab_size, max_position_embeddings, type_vocab_size, where they come from)."""
    m = config.model
    if m.pretrained:
        try:
            hf = hf_config.read(m.pretrained)
        except hf_config.PretrainedConfigError as e:
            raise DataError(str(e)) from None
        where = f"config.model.pretrained={m.pretrained!r} (config.json)"
        return (int(hf.get("vocab_size", 30522)), int(hf.get("max_position_embeddings", 512)),
                int(hf.get("type_vocab_size", 2)), where)
    return (m.vocab_size, m.max_position_embeddings, m.type_vocab_size, "config.model")


def tokenizer_dir(config: Any) -> tuple[str, str] | None:
    """``(key, directory)`` of the tokenizer: ``config.data.tokenizer``, else the pretrained
    model's directory; None when neither is set."""
    if config.data.tokenizer:
        return "config.data.tokenizer", config.data.tokenizer
    if config.model.pretrained:
        return "config.model.pretrained", config.model.pretrained
    return None


def vocabulary_size(path: str, key: str = "config.data.tokenizer") -> tuple[int, str]:
    """(number of token ids, the file they come from) of the tokenizer directory ``path``, read
    from ``tokenizer.json`` (which the fast tokenizer loads first) or ``vocab.txt``."""
    if not os.path.isdir(path):
        raise DataError(f"{key}={path!r}: tokenizer directory not found")
    tok_json = os.path.join(path, "tokenizer.json")
    if os.path.isfile(tok_json):
        try:
            with open(tok_json, encoding="utf-8") as f:
                spec = json.load(f)
            vocab = spec["model"]["vocab"]
            ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
            ids += [t["id"] for t in spec.get("added_tokens", [])]
        except (ValueError, KeyError, TypeError) as e:
            raise DataError(f"{tok_json}: not a tokenizer.json with a model vocabulary "
                            f"({type(e).__name__}: {e})") from e
        if not ids:
            raise DataError(f"{tok_json}: the vocabulary is empty ({key}={path!r})")
        return max(ids) + 1, tok_json
    vocab_txt = os.path.join(path, "vocab.txt")
    if os.path.isfile(vocab_txt):
        with open(vocab_txt, encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if not n:
            raise DataError(f"{vocab_txt}: the vocabulary is empty ({key}={path!r})")
        return n, vocab_txt
    raise DataError(f"{key}={path!r} has no vocabulary: neither {' nor '.join(VOCAB_FILES)} "
                    "is in that directory")


def check_config(config: Any, *, need_tokenizer: bool = False) -> None:
    """The GLUE checks that are cheap (files and numbers only): the label count, sequence length,
    token types and the tokenizer's vocabulary against the model. ``need_tokenizer``: a missing
    tokenizer is an error too (validation leaves it for when the data is built, so that a config
    can be planned and profiled without one)."""
    d, m = config.data, config.model
    t = task(d.name)
    if m.num_labels != t.num_labels:
        raise DataError(f"config.model.num_labels={m.num_labels} but config.data.name={d.name!r} "
                        f"has {t.num_labels} labels")
    vocab_size, max_positions, type_vocab_size, where = model_shape(config)
    if d.seq_len > max_positions:
        raise DataError(f"config.data.seq_len={d.seq_len} is above max_position_embeddings="
                        f"{max_positions} of {where}")
    if len(t.text) == 2 and type_vocab_size < 2:
        raise DataError(f"config.data.name={d.name!r} is a sentence-pair task (token types 0 and "
                        f"1) but type_vocab_size={type_vocab_size} in {where}")
    found = tokenizer_dir(config)
    if found is None:
        if need_tokenizer:
            raise DataError(f"config.data.name={d.name!r} needs a tokenizer: set "
                            "config.data.tokenizer to a directory with vocab.txt or "
                            "tokenizer.json (or config.model.pretrained to a Hugging Face BERT "
                            "directory that has one)")
        return
    key, path = found
    n, file = vocabulary_size(path, key)
    if n > vocab_size:
        raise DataError(f"{file}: the tokenizer's vocabulary has {n} token ids, more than "
                        f"vocab_size={vocab_size} of {where} ({key}={path!r})")


# --------------------------------------------------------------------------------------------
# Tokenizer.

def load_tokenizer(config: Any) -> Any:
    """transformers' ``BertTokenizerFast`` from the directory :func:`tokenizer_dir` names (local
    files only), after :func:`check_config`; its vocabulary must fit the model."""
    check_config(config, need_tokenizer=True)
    key, path = tokenizer_dir(config)
    from transformers import BertTokenizerFast  # lazy: transformers takes a second to import

    try:
        tok = BertTokenizerFast.from_pretrained(path, local_files_only=True)
    except Exception as e:  # a malformed file: name the directory
        raise DataError(f"{key}={path!r}: cannot load a BertTokenizerFast "
                        f"({type(e).__name__}: {_first_line(e)})") from e
    vocab_size, _, _, where = model_shape(config)
    n = max(tok.get_vocab().values(), default=-1) + 1
    if n > vocab_size:
        raise DataError(f"{key}={path!r}: the tokenizer's vocabulary has {n} token ids, more "
                        f"than vocab_size={vocab_size} of {where}")
    return tok


def _text(value: Any) -> str:
    if isinstance(value, np.ndarray):
        value = value.item()
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def encode(tokenizer: Any, texts: Sequence[Sequence[str]], seq_len: int) -> Batch:
    """``texts``: one list of strings per text feature (one for single sentences, two for pairs).
    Returns int32 ``input_ids``, ``token_type_ids``, ``attention_mask`` [len, seq_len] exactly as
    ``tokenizer(a, b, truncation=True, max_length=seq_len, padding="max_length")`` makes them."""
    enc = tokenizer(*[list(t) for t in texts], truncation=True, max_length=seq_len,
                    padding="max_length", return_token_type_ids=True,
                    return_attention_mask=True, return_tensors="np")
    return {k: np.asarray(enc[k], dtype=np.int32)
            for k in ("input_ids", "token_type_ids", "attention_mask")}


# --------------------------------------------------------------------------------------------
# Examples from TFDS.

def _tfds() -> Any:
    try:  # lazy; tensorflow_datasets does not import TensorFlow by itself
        import tensorflow_datasets as tfds
        import tensorflow_datasets.text.glue  # noqa: F401  registers glue/*
    except ImportError as e:
        raise DataError(f"GLUE data needs tensorflow-datasets: pip install -e '.[tfds]' "
                        f"({type(e).__name__}: {e})") from e

    return tfds


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def _not_prepared(name: str, data_dir: str, builder: Any) -> DataError:
    where = str(builder.data_dir)  # DATA_DIR/glue/mnli/VERSION
    root = data_dir or where.split(f"/{name}/")[0]
    return DataError(
        f"dataset {name} is not prepared in {where} (config.data.data_dir={data_dir!r}) and "
        f"skyjax does not download data: prepare it on a connected machine with `tfds build "
        f"{name} --data_dir {root} --file_format=array_record` and set config.data.data_dir to "
        "that directory")


class _InMemorySource:
    """A split read once, in order, into memory (for preparations without random access)."""

    def __init__(self, rows: list[dict[str, Any]]):
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self._rows[i]


def _read_all(builder: Any, split: str, keys: Sequence[str]) -> _InMemorySource:
    tfds = _tfds()
    ds = builder.as_dataset(split=split, shuffle_files=False)
    rows = [{k: (_text(ex[k]) if k != "label" else int(ex[k])) for k in keys}
            for ex in tfds.as_numpy(ds)]
    return _InMemorySource(rows)


def open_split(name: str, split: str, data_dir: str = "") -> Any:
    """Random access to ``split`` of TFDS dataset ``name`` (``len(src)``, ``src[i]``), from
    ``data_dir`` ("" = TFDS's default)."""
    tfds = _tfds()
    t = task(name)
    try:
        builder = tfds.builder(name, data_dir=data_dir or None)
    except Exception as e:
        raise DataError(f"dataset {name}: cannot open it in config.data.data_dir={data_dir!r} "
                        f"({type(e).__name__}: {_first_line(e)})") from e
    _check_features(name, t, builder)
    random_access = tfds.core.file_adapters.FileFormat.with_random_access()
    prepared = builder.is_prepared()
    if prepared and not builder.info.available_file_formats() & set(random_access):
        logging.warning("%s %s is prepared as %s, without random access: reading it into memory "
                        "(prepare it with --file_format=array_record to avoid this)",
                        name, split, builder.info.file_format.value)
        return _read_all(builder, split, (*t.text, "label"))
    try:
        return builder.as_data_source(split=split)
    except Exception as e:
        if prepared:
            raise DataError(f"dataset {name}, split {split!r} in {builder.data_dir}: "
                            f"{type(e).__name__}: {_first_line(e)}") from e
        raise _not_prepared(name, data_dir, builder) from e


def _check_features(name: str, t: Task, builder: Any) -> None:
    """Checks :data:`TASKS` against the dataset's own description."""
    features = builder.info.features
    missing = [k for k in (*t.text, "label") if k not in features]
    if missing:
        raise DataError(f"dataset {name} has no feature {missing[0]!r} (it has "
                        f"{', '.join(sorted(features.keys()))})")
    classes = getattr(features["label"], "num_classes", t.num_labels)
    if classes != t.num_labels:
        raise DataError(f"dataset {name} has {classes} label classes, the table says "
                        f"{t.num_labels}")


def _read(source: Any, indices: np.ndarray) -> list[dict[str, Any]]:
    keys = [int(i) for i in indices]
    getitems = getattr(source, "__getitems__", None)
    if getitems is not None:  # array_record reads a batch ~2x faster than record by record
        try:
            return list(getitems(keys))
        except TypeError:  # tfds.testing.mock_data's sources (tfds 4.9.10) only support [i]
            pass
    return [source[i] for i in keys]


def _examples_to_batch(name: str, split: str, t: Task, tokenizer: Any, seq_len: int,
                       examples: list[dict[str, Any]]) -> Batch:
    texts = [[_text(ex[k]) for ex in examples] for k in t.text]
    labels = np.asarray([int(np.asarray(ex["label"])) for ex in examples], np.int32)
    bad = labels[(labels < 0) | (labels >= t.num_labels)]
    if bad.size:
        raise DataError(f"dataset {name}, split {split!r}: label {int(bad[0])} is outside "
                        f"[0, {t.num_labels}) (an unlabelled split?)")
    return {**encode(tokenizer, texts, seq_len), "labels": labels}


# --------------------------------------------------------------------------------------------
# Order.

class EpochOrder:
    """Stream position -> example index: epoch ``e`` is
    ``default_rng((seed, e)).permutation(num_examples)``. Keeps the last two permutations."""

    def __init__(self, seed: int, num_examples: int):
        if num_examples < 1:
            raise DataError(f"EpochOrder: num_examples={num_examples} must be >= 1")
        self.seed, self.n = int(seed), int(num_examples)
        self._cache: dict[int, np.ndarray] = {}

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._cache:
            if len(self._cache) >= 2:
                self._cache.pop(min(self._cache))
            self._cache[epoch] = np.random.default_rng((self.seed, epoch)).permutation(self.n)
        return self._cache[epoch]

    def indices(self, start: int, count: int) -> np.ndarray:
        """Example indices at stream positions ``[start, start + count)``."""
        out = np.empty(count, np.int64)
        done, pos = 0, start
        while done < count:
            epoch, offset = divmod(pos, self.n)
            take = min(count - done, self.n - offset)
            out[done:done + take] = self.permutation(epoch)[offset:offset + take]
            done += take
            pos += take
        return out


# --------------------------------------------------------------------------------------------
# Batches.

def train_batch_fn(config: Any) -> Callable[[int], Batch]:
    """``make(i)``: training batch ``i`` of the run (loads the tokenizer and opens the split now,
    so that configuration and data errors are raised here)."""
    d = config.data
    name, batch_size, seq_len = d.name, d.batch_size, d.seq_len  # not read again later
    t = task(name)
    tokenizer = load_tokenizer(config)
    source = open_split(name, t.train_split, d.data_dir)
    if not len(source):
        raise DataError(f"dataset {name}: split {t.train_split!r} is empty")
    order = EpochOrder(config.train.seed, len(source))

    def make(i: int) -> Batch:
        examples = _read(source, order.indices(i * batch_size, batch_size))
        return _examples_to_batch(name, t.train_split, t, tokenizer, seq_len, examples)

    return make


def eval_split_batches(config: Any, splits: Sequence[str] | None = None) -> dict[str, list[Batch]]:
    """``{split: batches}`` for the task's validation splits (all, or ``splits``): the first
    ``config.data.eval_examples`` examples of each (-1 = all, 0 = none: ``{}``), in order, in
    batches of ``config.data.batch_size``; the last batch is filled up with examples from the
    start of the split with ``weights`` 0."""
    d = config.data
    t = task(d.name)
    if d.eval_examples == 0:
        return {}
    tokenizer = load_tokenizer(config)
    out = {}
    for split in (t.eval_splits if splits is None else splits):
        source = open_split(d.name, split, d.data_dir)
        n = len(source)
        count = n if d.eval_examples < 0 else min(d.eval_examples, n)
        batches = []
        for b in range(math.ceil(count / d.batch_size)):
            pos = np.arange(b * d.batch_size, (b + 1) * d.batch_size)
            examples = _read(source, pos % count)
            batch = _examples_to_batch(d.name, split, t, tokenizer, d.seq_len, examples)
            batch["weights"] = (pos < count).astype(np.float32)
            batches.append(batch)
        out[split] = batches
    return out
