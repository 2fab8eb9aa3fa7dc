"""Your own data: CSV, TSV or JSON Lines files, or a Hugging Face ``datasets`` dataset, read whole
into memory and batched by :mod:`.text` exactly like GLUE (same tokenizer call, same epoch order,
batch ``i`` a pure function of ``(seed, i)``, same prefetch and eval).

``config.data.name`` selects the source:

* a file ending in ``.csv`` (comma-separated, a header line, standard quoting), ``.tsv``
  (tab-separated, a header line, no quoting: GLUE's own files) or ``.jsonl`` (one JSON object per
  line): the training file; ``config.data.eval_files`` the held-out files, each one eval split
  named after its file (``dev.csv`` -> ``dev``);
* ``hf:DIR``, a directory written by ``datasets``' ``save_to_disk`` (a ``DatasetDict``), or
  ``hf:NAME`` what ``datasets.load_dataset(NAME, config.data.hf_subset)`` loads: a dataset of the
  Hugging Face hub (the ``datasets`` cache serves it offline, ``HF_DATASETS_OFFLINE=1``) or a
  local folder of data files named by split; the splits ``config.data.train_split`` and
  ``config.data.eval_splits``.

``config.data.text_columns`` names one column (single sentences) or two (pairs);
``config.data.label_column`` the label. ``config.model.num_labels`` 1 makes the task a regression
(float labels, mean squared error); otherwise labels are class ids, given either as integers in
``[0, num_labels)`` or as strings mapped to ids: by ``config.data.label_names`` when set, else in
sorted order of the training split's distinct labels, of which there must be exactly
``num_labels``. A ``datasets`` ``ClassLabel`` column brings its own names. The mapping is part of
the run's identity (:func:`skyjax.data.label_names`): checkpoints record it and a resume under another mapping
is refused.

Files are read by :mod:`.readers`. Every problem is one line naming the file, line (row) and
column: besides the reading's own, a label that is not a number (regression) or not a known
label, a label count that does not match ``num_labels``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from skyjax.data import text
from skyjax.data.readers import (HF_PREFIX, Split, hf_dataset_dict, is_files, is_hf, read_file,
                                 read_hf)
from skyjax.data.text import DataError, Task

_INT = re.compile(r"^[+-]?\d+$")


class Source:
    """A split with its labels resolved, as :func:`skyjax.data.text.read` reads it."""

    def __init__(self, columns: Sequence[str], split: Split, labels: np.ndarray):
        self._columns, self._split, self._labels = tuple(columns), split, labels

    def __len__(self) -> int:
        return len(self._labels)

    def __getitem__(self, i: int) -> dict[str, Any]:
        out = {c: t[i] for c, t in zip(self._columns, self._split.texts)}
        out["label"] = self._labels[i]
        return out


# --------------------------------------------------------------------------------------------
# Labels.

def _is_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, np.integer)) or (isinstance(value, str)
                                                     and bool(_INT.match(value.strip())))


def _names_of(train: Split, num_labels: int, configured: Sequence[str], where: str
              ) -> tuple[str, ...] | None:
    """The label names in id order, or None when the labels are integer ids."""
    if configured:
        if len(configured) != num_labels:
            raise DataError(f"config.data.label_names has {len(configured)} names, "
                            f"config.model.num_labels={num_labels}")
        return tuple(configured)
    if train.names is not None:
        if len(train.names) != num_labels:
            raise DataError(f"{where}: its label column has {len(train.names)} classes "
                            f"({', '.join(train.names)}), config.model.num_labels={num_labels}")
        return train.names
    if all(_is_int(v) for v in train.labels):
        return None
    distinct = sorted({str(v).strip() for v in train.labels})
    if len(distinct) != num_labels:
        shown = ", ".join(map(repr, distinct[:10])) + (", ..." if len(distinct) > 10 else "")
        raise DataError(f"{where}: {len(distinct)} distinct labels ({shown}) but "
                        f"config.model.num_labels={num_labels} (set config.data.label_names to "
                        "name them in id order)")
    return tuple(distinct)


def label_ids(split: Split, num_labels: int, names: tuple[str, ...] | None,
              label_column: str) -> np.ndarray:
    """The split's labels as float32 values (regression) or int32 class ids."""
    if num_labels == 1:
        out = np.empty(len(split.labels), np.float32)
        for i, v in enumerate(split.labels):
            try:
                out[i] = float(v)
            except (TypeError, ValueError):
                out[i] = np.nan
            if isinstance(v, bool) or not np.isfinite(out[i]):
                raise DataError(f"{split.where[i]}: column {label_column!r} = {v!r} is not a "
                                "finite number (config.model.num_labels=1: a regression)")
        return out
    out = np.empty(len(split.labels), np.int32)
    index = None if names is None else {n: i for i, n in enumerate(names)}
    for i, v in enumerate(split.labels):
        if split.names is not None and _is_int(v):  # a ClassLabel id: its name
            if not 0 <= int(v) < len(split.names):
                raise DataError(f"{split.where[i]}: column {label_column!r} = {v!r} is not one "
                                f"of its {len(split.names)} classes (an unlabelled split?)")
            v = split.names[int(v)]
        if index is not None:
            if str(v).strip() not in index:
                raise DataError(f"{split.where[i]}: column {label_column!r} = {v!r} is not a "
                                f"known label ({', '.join(map(repr, names))})")
            out[i] = index[str(v).strip()]
        elif _is_int(v):
            out[i] = int(v)
        else:
            raise DataError(f"{split.where[i]}: column {label_column!r} = {v!r} is not a class "
                            f"id: the training labels are integers in [0, {num_labels})")
        if not 0 <= out[i] < num_labels:
            raise DataError(f"{split.where[i]}: column {label_column!r} = {v!r} is outside "
                            f"[0, config.model.num_labels={num_labels})")
    return out


# --------------------------------------------------------------------------------------------
# The dataset of a config.

@dataclasses.dataclass
class Dataset:
    task: Task
    names: tuple[str, ...] | None  # string labels in id order (None: integer ids or regression)
    sources: dict[str, Source]

    def open_split(self, split: str) -> Source:
        return self.sources[split]


def split_names(paths: Sequence[str]) -> list[str]:
    """Eval split names of eval files: the file's stem, or the whole path where stems repeat."""
    stems = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    return [s if stems.count(s) == 1 else p for s, p in zip(stems, paths)]


def _key(config: Any) -> tuple:
    d, m = config.data, config.model
    files = [d.name, *d.eval_files] if is_files(d.name) else []
    stamp = tuple((p, os.path.getmtime(p), os.path.getsize(p)) for p in files
                  if os.path.isfile(p))
    return (d.name, tuple(d.eval_files), d.hf_subset, d.train_split, tuple(d.eval_splits),
            tuple(d.text_columns), d.label_column, tuple(d.label_names), m.num_labels,
            d.metric, stamp)


_CACHE: dict[tuple, Dataset] = {}


def metric_of(config: Any) -> str:
    """``config.data.metric``, or accuracy (classification) / pearson_spearman (regression)."""
    if config.data.metric:
        return config.data.metric
    return "pearson_spearman" if config.model.num_labels == 1 else "accuracy"


def check_keys(config: Any) -> None:
    """The name and column keys, before any file is read (or ``datasets`` imported)."""
    d = config.data
    if is_hf(d.name) and not d.name[len(HF_PREFIX):].strip():
        raise DataError(f"config.data.name={d.name!r} names no dataset: hf:DIR or hf:NAME")
    columns = tuple(d.text_columns)
    if len(columns) not in (1, 2) or not all(isinstance(c, str) and c for c in columns):
        raise DataError(f"config.data.text_columns={columns!r} must name one column (single "
                        "sentences) or two (sentence pairs)")
    if not isinstance(d.label_column, str) or not d.label_column:
        raise DataError("config.data.label_column must name the label column")
    if d.label_column in columns:
        raise DataError(f"config.data.label_column={d.label_column!r} is also a text column")


def load(config: Any) -> Dataset:
    """The configured local files or ``datasets`` dataset, read and checked (cached per process
    while the files are unchanged)."""
    key = _key(config)
    if key in _CACHE:
        return _CACHE[key]
    check_keys(config)
    d, m = config.data, config.model
    columns = tuple(d.text_columns)
    if is_files(d.name):
        train = read_file(d.name, columns, d.label_column, "config.data.name")
        evals = split_names(d.eval_files)
        raw = {"train": train, **{s: read_file(p, columns, d.label_column, "config.data.eval_files")
                                  for s, p in zip(evals, d.eval_files)}}
        if "train" in evals:
            raise DataError("config.data.eval_files: an eval file may not be named train.* "
                            "(the training split's name)")
        train_split, where = "train", d.name
    else:
        splits = hf_dataset_dict(d.name, d.hf_subset)
        train = read_hf(d.name, splits, d.train_split, columns, d.label_column,
                        "config.data.train_split")
        evals = list(d.eval_splits)
        raw = {d.train_split: train, **{s: read_hf(d.name, splits, s, columns, d.label_column,
                                                   "config.data.eval_splits") for s in evals}}
        train_split, where = d.train_split, f"{d.name}[{d.train_split}]"
    names = None if m.num_labels == 1 else _names_of(train, m.num_labels, d.label_names, where)
    sources = {s: Source(columns, split, label_ids(split, m.num_labels, names, d.label_column))
               for s, split in raw.items()}
    task = Task(columns, m.num_labels, metric_of(config), train_split, tuple(evals))
    _CACHE[key] = out = Dataset(task, names, sources)
    return out


def train_batch_fn(config: Any) -> Callable[[int], dict[str, np.ndarray]]:
    """``make(i)``: training batch ``i`` (see :func:`skyjax.data.text.train_batch_fn`)."""
    ds = load(config)
    return text.train_batch_fn(config, ds.task, ds.open_split)


def eval_split_batches(config: Any, splits: Sequence[str] | None = None
                       ) -> dict[str, list[dict[str, np.ndarray]]]:
    """``{split: batches}`` of the held-out splits (see :func:`text.eval_split_batches`)."""
    ds = load(config)
    return text.eval_split_batches(config, ds.task, ds.open_split, splits)
