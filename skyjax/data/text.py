"""Text classification and regression data, whatever the source: the task description, the
tokenizer, encoding, the epoch order and the batches. GLUE from TensorFlow Datasets
(:mod:`.glue`) and local files or Hugging Face ``datasets`` (:mod:`.tables`) differ only in how a
split is opened: each gives :func:`train_batch_fn` / :func:`eval_split_batches` a function
``open_split(split) -> source``, a source being ``len(src)`` and ``src[i]`` -> an example dict
holding the task's text features and ``"label"``.

Text is encoded exactly as ``tokenizer(a, b, truncation=True, max_length=seq_len,
padding="max_length")`` does with transformers' ``BertTokenizerFast`` (``[CLS] a [SEP] b [SEP]``,
token types 0 / 1, attention mask, padding), as int32 numpy arrays. Labels are int32 class ids
(classification) or float32 values (regression, ``num_labels == 1``).

Order: the training split is one endless stream of epochs; epoch ``e`` visits every example once,
in the order ``numpy.random.default_rng((seed, e)).permutation(n)``, and batch ``i`` holds stream
positions ``[i * batch_size, (i + 1) * batch_size)`` (a batch may straddle two epochs). So batch
``i`` is a pure function of ``(seed, i)``: every process derives the same batches, and a run
resumes at any step in O(1). Validation splits are read in order, from their first example.

This module imports only numpy at import time; transformers is imported when a tokenizer is
built, so validation can run the cheap checks before anything heavy (or JAX) is imported.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from skyjax.models import hf_config

Batch = dict[str, np.ndarray]
OpenSplit = Callable[[str], Any]

VOCAB_FILES = ("tokenizer.json", "vocab.txt")  # what makes a directory a tokenizer (either)


class DataError(ValueError):
    """A dataset, tokenizer or data config problem; the message names the key, file or dataset."""


@dataclasses.dataclass(frozen=True)
class Task:
    """A text task: ``text`` holds one feature (single sentence) or two (sentence pair);
    ``num_labels`` 1 is a regression; ``metric`` is one of ``skyjax.scores.METRICS``;
    ``eval_splits`` are the labelled held-out splits, first one first; ``label_names`` the
    classes' names in id order where the task's source names them (GLUE's; the data carries
    integer ids)."""

    text: tuple[str, ...]
    num_labels: int
    metric: str = "accuracy"
    train_split: str = "train"
    eval_splits: tuple[str, ...] = ("validation",)
    label_names: tuple[str, ...] | None = None

    @property
    def regression(self) -> bool:
        return self.num_labels == 1


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


# --------------------------------------------------------------------------------------------
# Checks that need no transformers or JAX (run by validate_config and again when the data is
# built).

def model_shape(config: Any) -> tuple[int, int, int, str]:
    """(vocab_size, max_position_embeddings, type_vocab_size, where they come from)."""
    m = config.model
    if m.pretrained:
        try:
            hf = hf_config.read(m.pretrained, model_types=hf_config.MODEL_TYPES)
        except hf_config.PretrainedConfigError as e:
            raise DataError(str(e)) from None
        where = f"config.model.pretrained={m.pretrained!r} (config.json)"
        return (int(hf.get("vocab_size", 30522)), hf_config.max_positions(hf),
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


def check_fit(config: Any, task: Task, *, need_tokenizer: bool = False) -> None:
    """The checks that are cheap (files and numbers only): the label count, sequence length,
    token types and the tokenizer's vocabulary against the model. ``need_tokenizer``: a missing
    tokenizer is an error too (validation leaves it for when the data is built, so that a config
    can be planned and profiled without one)."""
    d, m = config.data, config.model
    if m.num_labels != task.num_labels:
        kind = "a regression (1 output)" if task.regression else f"{task.num_labels} labels"
        raise DataError(f"config.model.num_labels={m.num_labels} but config.data.name={d.name!r} "
                        f"has {kind}")
    vocab_size, max_positions, type_vocab_size, where = model_shape(config)
    if d.seq_len > max_positions:
        raise DataError(f"config.data.seq_len={d.seq_len} is above max_position_embeddings="
                        f"{max_positions} of {where}")
    if len(task.text) == 2 and type_vocab_size < 2:
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

def load_tokenizer(config: Any, task: Task) -> Any:
    """transformers' ``BertTokenizerFast`` from the directory :func:`tokenizer_dir` names (local
    files only), after :func:`check_fit`; its vocabulary must fit the model."""
    check_fit(config, task, need_tokenizer=True)
    key, path = tokenizer_dir(config)
    from transformers import BertTokenizerFast  # lazy: transformers takes a second to import

    try:
        tok = BertTokenizerFast.from_pretrained(path, local_files_only=True)
    except Exception as e:  # a malformed file: name the directory
        raise DataError(f"{key}={path!r}: cannot load a BertTokenizerFast "
                        f"({type(e).__name__}: {first_line(e)})") from e
    vocab_size, _, _, where = model_shape(config)
    n = max(tok.get_vocab().values(), default=-1) + 1
    if n > vocab_size:
        raise DataError(f"{key}={path!r}: the tokenizer's vocabulary has {n} token ids, more "
                        f"than vocab_size={vocab_size} of {where}")
    return tok


def as_text(value: Any) -> str:
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

def read(source: Any, indices: np.ndarray) -> list[dict[str, Any]]:
    keys = [int(i) for i in indices]
    getitems = getattr(source, "__getitems__", None)
    if getitems is not None:  # array_record reads a batch ~2x faster than record by record
        try:
            return list(getitems(keys))
        except TypeError:  # tfds.testing.mock_data's sources (tfds 4.9.10) only support [i]
            pass
    return [source[i] for i in keys]


def examples_to_batch(name: str, split: str, task: Task, tokenizer: Any, seq_len: int,
                      examples: list[dict[str, Any]]) -> Batch:
    texts = [[as_text(ex[k]) for ex in examples] for k in task.text]
    if task.regression:
        labels = np.asarray([float(np.asarray(ex["label"])) for ex in examples], np.float32)
        bad = labels[~np.isfinite(labels)]
    else:
        labels = np.asarray([int(np.asarray(ex["label"])) for ex in examples], np.int32)
        bad = labels[(labels < 0) | (labels >= task.num_labels)]
    if bad.size:
        what = "not a finite number" if task.regression else f"outside [0, {task.num_labels})"
        raise DataError(f"dataset {name}, split {split!r}: label {bad[0]} is {what} (an "
                        "unlabelled split?)")
    return {**encode(tokenizer, texts, seq_len), "labels": labels}


def train_batch_fn(config: Any, task: Task, open_split: OpenSplit) -> Callable[[int], Batch]:
    """``make(i)``: training batch ``i`` of the run (loads the tokenizer and opens the split now,
    so that configuration and data errors are raised here)."""
    d = config.data
    name, batch_size, seq_len = d.name, d.batch_size, d.seq_len  # not read again later
    tokenizer = load_tokenizer(config, task)
    source = open_split(task.train_split)
    if not len(source):
        raise DataError(f"dataset {name}: split {task.train_split!r} is empty")
    order = EpochOrder(config.train.seed, len(source))

    def make(i: int) -> Batch:
        examples = read(source, order.indices(i * batch_size, batch_size))
        return examples_to_batch(name, task.train_split, task, tokenizer, seq_len, examples)

    return make


def eval_split_batches(config: Any, task: Task, open_split: OpenSplit,
                       splits: Sequence[str] | None = None) -> dict[str, list[Batch]]:
    """``{split: batches}`` for the task's held-out splits (all, or ``splits``): the first
    ``config.data.eval_examples`` examples of each (-1 = all, 0 = none: ``{}``), in order, in
    batches of ``config.data.batch_size``; the last batch is filled up with examples from the
    start of the split with ``weights`` 0."""
    d = config.data
    if d.eval_examples == 0:
        return {}
    tokenizer = load_tokenizer(config, task)
    out = {}
    for split in (task.eval_splits if splits is None else splits):
        source = open_split(split)
        n = len(source)
        count = n if d.eval_examples < 0 else min(d.eval_examples, n)
        batches = []
        for b in range(math.ceil(count / d.batch_size)):
            pos = np.arange(b * d.batch_size, (b + 1) * d.batch_size)
            examples = read(source, pos % count)
            batch = examples_to_batch(d.name, split, task, tokenizer, d.seq_len, examples)
            batch["weights"] = (pos < count).astype(np.float32)
            batches.append(batch)
        out[split] = batches
    return out
