"""GLUE from TensorFlow Datasets: the task table and how a split is opened; the batches are
:mod:`.text`'s (tokenised with a BERT WordPiece tokenizer, batch ``i`` a pure function of
``(seed, i)``).

:data:`TASKS` is the one table of the tasks (text features, label count, metric, splits, label
names in TensorFlow Datasets' id order): all nine of GLUE's labelled tasks, each with its
published metric (:mod:`skyjax.scores`): Matthews
correlation for CoLA, F1 and accuracy for MRPC and QQP, Pearson and Spearman correlation for the
regression STS-B (``num_labels = 1``), accuracy elsewhere; MNLI is scored on its matched and
mismatched validation splits. Examples are read with ``tfds.data_source`` (random access to an
``array_record`` preparation; no TensorFlow needed); a split prepared in TFDS's default
``tfrecord`` format is read once into memory with ``tfds.as_numpy`` instead (that path imports
TensorFlow). Nothing is downloaded: a dataset that is not prepared is an error saying how to
prepare it (``python -m skyjax.data.prepare``).

This module imports only numpy and absl at import time; tensorflow_datasets and transformers are
imported when a dataset or tokenizer is built, so validation can use :func:`check_config` before
anything heavy (or JAX) is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from absl import logging

from skyjax.data.text import (Batch, DataError, EpochOrder, Task, as_text, first_line,  # noqa: F401
                              model_shape, vocabulary_size)
from skyjax.data import text

TASKS: dict[str, Task] = {
    "glue/cola": Task(("sentence",), 2, metric="matthews",
                      label_names=("unacceptable", "acceptable")),
    "glue/sst2": Task(("sentence",), 2, label_names=("negative", "positive")),
    "glue/mrpc": Task(("sentence1", "sentence2"), 2, metric="f1",
                      label_names=("not_equivalent", "equivalent")),
    "glue/qqp": Task(("question1", "question2"), 2, metric="f1",
                     label_names=("not_duplicate", "duplicate")),
    "glue/stsb": Task(("sentence1", "sentence2"), 1, metric="pearson_spearman"),
    "glue/mnli": Task(("premise", "hypothesis"), 3,
                      eval_splits=("validation_matched", "validation_mismatched"),
                      label_names=("entailment", "neutral", "contradiction")),
    "glue/qnli": Task(("question", "sentence"), 2, label_names=("entailment", "not_entailment")),
    "glue/rte": Task(("sentence1", "sentence2"), 2, label_names=("entailment", "not_entailment")),
    "glue/wnli": Task(("sentence1", "sentence2"), 2,
                      label_names=("not_entailment", "entailment")),
}


def task(name: str) -> Task:
    if name not in TASKS:
        raise DataError(f"config.data.name={name!r} is not a GLUE task "
                        f"({', '.join(map(repr, TASKS))})")
    return TASKS[name]


def check_config(config: Any, *, need_tokenizer: bool = False) -> None:
    """:func:`text.check_fit` for the configured GLUE task."""
    text.check_fit(config, task(config.data.name), need_tokenizer=need_tokenizer)


# --------------------------------------------------------------------------------------------
# Examples from TFDS.

def import_tfds() -> Any:
    """``tensorflow_datasets`` with ``glue/*`` registered, or a ``DataError`` saying how to
    install it."""
    try:  # lazy; tensorflow_datasets does not import TensorFlow by itself
        import tensorflow_datasets as tfds
        import tensorflow_datasets.text.glue  # noqa: F401  registers glue/*
    except ImportError as e:
        raise DataError(f"GLUE data needs tensorflow-datasets: pip install -e '.[tfds]' "
                        f"({type(e).__name__}: {e})") from e

    return tfds


def _not_prepared(name: str, data_dir: str, builder: Any) -> DataError:
    where = str(builder.data_dir)  # DATA_DIR/glue/mnli/VERSION
    root = data_dir or where.split(f"/{name}/")[0]
    return DataError(
        f"dataset {name} is not prepared in {where} (config.data.data_dir={data_dir!r}) and "
        f"skyjax does not download data: prepare it on a connected machine with `python -m "
        f"skyjax.data.prepare {name} --data_dir {root}` and set config.data.data_dir to that "
        "directory")


class InMemorySource:
    """A split read once, in order, into memory (for preparations without random access)."""

    def __init__(self, rows: list[dict[str, Any]]):
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self._rows[i]


def _read_all(builder: Any, split: str, keys: Sequence[str]) -> InMemorySource:
    tfds = import_tfds()
    ds = builder.as_dataset(split=split, shuffle_files=False)
    rows = [{k: (as_text(ex[k]) if k != "label" else ex[k].item()) for k in keys}
            for ex in tfds.as_numpy(ds)]
    return InMemorySource(rows)


def open_split(name: str, split: str, data_dir: str = "") -> Any:
    """Random access to ``split`` of TFDS dataset ``name`` (``len(src)``, ``src[i]``), from
    ``data_dir`` ("" = TFDS's default)."""
    tfds = import_tfds()
    t = task(name)
    try:
        builder = tfds.builder(name, data_dir=data_dir or None)
    except Exception as e:
        raise DataError(f"dataset {name}: cannot open it in config.data.data_dir={data_dir!r} "
                        f"({type(e).__name__}: {first_line(e)})") from e
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
                            f"{type(e).__name__}: {first_line(e)}") from e
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


# --------------------------------------------------------------------------------------------
# Batches (the machinery is text's).

def _opener(name: str, data_dir: str) -> Callable[[str], Any]:
    return lambda split: open_split(name, split, data_dir)


def train_batch_fn(config: Any) -> Callable[[int], Batch]:
    """``make(i)``: training batch ``i`` of the run (loads the tokenizer and opens the split now,
    so that configuration and data errors are raised here)."""
    d = config.data
    return text.train_batch_fn(config, task(d.name), _opener(d.name, d.data_dir))


def eval_split_batches(config: Any, splits: Sequence[str] | None = None) -> dict[str, list[Batch]]:
    """``{split: batches}`` of the task's validation splits (see :func:`text.eval_split_batches`)."""
    d = config.data
    return text.eval_split_batches(config, task(d.name), _opener(d.name, d.data_dir), splits)
