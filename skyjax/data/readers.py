"""Reading your own data into memory: the rows of a ``.csv``, ``.tsv`` or ``.jsonl`` file
(:func:`rows`, shared by training and prediction) and the splits of a Hugging Face ``datasets``
dataset, each as a :class:`Split` of raw values; :mod:`.tables` resolves the labels.

Files are read as UTF-8 with or without a byte-order mark (Excel's "CSV UTF-8" writes one).
A CSV or TSV field may hold up to :data:`FIELD_LIMIT` characters (the ``csv`` module's own
limit, 131,072, is below a long document's; a row's text is cut to ``seq_len`` tokens anyway).
Every problem is one line naming the file, line (row) and column: a missing column, a column
the run reads named twice (a header or a JSON object), a field over the limit (or any line the
``csv`` module cannot read), an empty file.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

from skyjax.data.text import DataError, first_line

FILE_SUFFIXES = (".csv", ".tsv", ".jsonl")
FIELD_LIMIT = 1 << 24  # characters in one CSV / TSV field (16 Mi)
HF_PREFIX = "hf:"


def is_files(name: str) -> bool:
    return name.lower().endswith(FILE_SUFFIXES)


def is_hf(name: str) -> bool:
    return name.startswith(HF_PREFIX)


@dataclasses.dataclass
class Split:
    """One split in memory: the text of every example per text column, the raw label values and
    where each example came from (``file:line`` or ``dataset[split] row n``)."""

    texts: list[list[str]]
    labels: list[Any]
    where: list[str]
    names: tuple[str, ...] | None = None  # a ClassLabel column's names (ids are then ints)


# --------------------------------------------------------------------------------------------
# Reading files.

def _format(path: str) -> str:
    return os.path.splitext(path)[1].lower().lstrip(".")


def _value(row: dict, column: str, where: str, columns: Sequence[str]) -> Any:
    if column not in row:
        raise DataError(f"{where}: no column {column!r} (it has {', '.join(map(repr, columns))})")
    value = row[column]
    if value is None:  # a short CSV row, or JSON null
        raise DataError(f"{where}: column {column!r} has no value")
    return value


def _check_twice(names: Sequence[str], used: Sequence[str], where: str, what: str) -> None:
    """A ``used`` column named twice: a dict keeps one of the two, so the run would read one
    without a word (others may repeat: Excel's trailing empty columns are all named '')."""
    twice = next((c for c in used if list(names).count(c) > 1), None)
    if twice is not None:
        raise DataError(f"{where}: {what} names column {twice!r} twice (only one of the two "
                        "would be read)")


class _Object(dict):
    """A JSON object that keeps its keys as given (``json.loads``' hook), repeats included."""

    def __init__(self, pairs: list[tuple[str, Any]]):
        super().__init__(pairs)
        self.given = [k for k, _ in pairs]


def rows(path: str, used: Sequence[str]) -> Iterator[tuple[str, dict, list[str]]]:
    """``(where, row dict, columns)`` of every example of a local file, the reader of training's
    files and of prediction's rows: ``used`` columns must be named once; ``utf-8-sig`` drops the
    byte-order mark of Excel's "CSV UTF-8" from the header."""
    fmt = _format(path)
    with open(path, encoding="utf-8-sig", newline="" if fmt != "jsonl" else None) as f:
        if fmt == "jsonl":
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line, object_pairs_hook=_Object)
                except ValueError as e:
                    raise DataError(f"{path}:{n}: not a JSON object ({first_line(e)})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path}:{n}: not a JSON object (a {type(row).__name__})")
                _check_twice(row.given, used, f"{path}:{n}", "this object")
                yield f"{path}:{n}", row, list(row)
            return
        if csv.field_size_limit() < FIELD_LIMIT:  # (process-wide; a larger one is kept)
            csv.field_size_limit(FIELD_LIMIT)
        reader = (csv.DictReader(f) if fmt == "csv"
                  else csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        try:
            columns = reader.fieldnames or []
            _check_twice(columns, used, f"{path}:1", "the header")
            for row in reader:
                yield f"{path}:{reader.line_num}", row, columns
        except csv.Error as e:
            # (the DictReader's line_num is the last row it returned; its reader's, this one)
            raise DataError(_csv_error(path, reader.reader.line_num, e)) from None


def _csv_error(path: str, line: int, e: csv.Error) -> str:
    """The line of a CSV / TSV file the ``csv`` module could not read."""
    if "field larger than field limit" in str(e):
        return (f"{path}:{line}: a field is longer than {csv.field_size_limit():,} characters "
                f"(the reader's limit, csv.field_size_limit)")
    return f"{path}:{line}: {first_line(e)}"


def read_file(path: str, text_columns: Sequence[str], label_column: str, key: str) -> Split:
    """Every example of the file at ``path`` (``key`` names the config key that gave it)."""
    if os.path.isdir(path):
        raise DataError(f"{key}={path!r} is a directory, not a file")
    if not os.path.isfile(path):
        raise DataError(f"{key}={path!r}: file not found")
    if _format(path) not in {s.lstrip(".") for s in FILE_SUFFIXES}:
        raise DataError(f"{key}={path!r}: not a .csv, .tsv or .jsonl file")
    texts: list[list[str]] = [[] for _ in text_columns]
    labels, where = [], []
    try:
        for at, row, columns in rows(path, (*text_columns, label_column)):
            for column, out in zip(text_columns, texts):
                value = _value(row, column, at, columns)
                out.append(value if isinstance(value, str) else json.dumps(value))
            label = _value(row, label_column, at, columns)
            if isinstance(label, str) and not label.strip():
                raise DataError(f"{at}: column {label_column!r} is empty")
            labels.append(label)
            where.append(at)
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({first_line(e)})") from None
    except csv.Error as e:
        raise DataError(f"{path}: {first_line(e)}") from None
    if not labels:
        raise DataError(f"{path}: no examples (an empty file, or a header only; {key})")
    return Split(texts, labels, where)


# --------------------------------------------------------------------------------------------
# Reading Hugging Face datasets.

def _datasets() -> Any:
    try:
        import datasets
    except ImportError as e:
        raise DataError(f"config.data.name='hf:...' needs Hugging Face datasets: pip install -e "
                        f"'.[datasets]' ({type(e).__name__}: {e})") from e
    return datasets


def _saved(path: str) -> bool:
    """Whether ``path`` was written by ``save_to_disk`` (a DatasetDict or one Dataset)."""
    return any(os.path.isfile(os.path.join(path, f)) for f in ("dataset_dict.json", "state.json"))


def hf_dataset_dict(name: str, subset: str) -> Any:
    """``hf:DIR`` written by ``save_to_disk``; else ``datasets.load_dataset`` of the rest: a hub
    name (served from the ``datasets`` cache offline) or a local folder of data files whose
    names give the splits (``train.jsonl``, ``validation.jsonl``, ...)."""
    datasets = _datasets()
    target = name[len(HF_PREFIX):]
    if os.path.isdir(target) and _saved(target):
        try:
            loaded = datasets.load_from_disk(target)
        except Exception as e:  # noqa: BLE001 - a damaged save_to_disk directory
            raise DataError(f"config.data.name={name!r}: cannot read this save_to_disk "
                            f"directory ({type(e).__name__}: {first_line(e)})") from None
        if not isinstance(loaded, datasets.DatasetDict):
            raise DataError(f"config.data.name={name!r} holds one Dataset without splits: save "
                            "a DatasetDict({'train': ..., 'validation': ...}) instead")
        return loaded
    try:
        return datasets.load_dataset(target, subset or None)
    except Exception as e:  # noqa: BLE001 - unknown name, offline without a cache, ...
        raise DataError(f"config.data.name={name!r} (config.data.hf_subset={subset!r}): cannot "
                        f"load it ({type(e).__name__}: {first_line(e)}); offline, the datasets "
                        "cache must hold it (HF_DATASETS_OFFLINE=1)") from None


def read_hf(name: str, splits: Any, split: str, text_columns: Sequence[str],
            label_column: str, key: str) -> Split:
    """Every example of ``split`` of ``splits``, the Hugging Face dataset ``name`` (``hf:DIR`` or
    ``hf:NAME``) as :func:`hf_dataset_dict` opened it once for all its splits."""
    if split not in splits:
        raise DataError(f"{key}={split!r}: {name} has no such split (it has "
                        f"{', '.join(map(repr, splits))})")
    ds = splits[split]
    where = f"{name}[{split}]"
    for column in (*text_columns, label_column):
        if column not in ds.column_names:
            raise DataError(f"{where}: no column {column!r} (it has "
                            f"{', '.join(map(repr, ds.column_names))})")
    if not len(ds):
        raise DataError(f"{where}: no examples ({key})")
    texts = []
    for column in text_columns:
        values = ds[column]
        for n, v in enumerate(values):
            if not isinstance(v, str):
                raise DataError(f"{where} row {n}: column {column!r} is "
                                f"{'missing' if v is None else type(v).__name__}, not text")
        texts.append(list(values))
    labels = list(ds[label_column])
    feature = ds.features[label_column]
    names = tuple(feature.names) if hasattr(feature, "names") else None
    return Split(texts, labels, [f"{where} row {n}" for n in range(len(labels))], names)
