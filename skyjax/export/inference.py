"""Predictions of a whole model on new rows, on one device: the rows tokenised by the run's own
tokenizer call (:func:`skyjax.data.text.encode`), the model compiled once for a fixed batch shape
(the last batch padded), one prediction per row.

A prediction is the arg-max class (written as its label name, or its id when the labels are
integers) or, for a regression, the regressed value: what the eval path's last stage computes
(:func:`skyjax.metrics.eval_outputs`). The model is either a run's (:mod:`.trained`) or a
Hugging Face directory; an exported one carries ``skyjax.json`` (text columns, sequence length),
any other needs ``--text_columns``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from skyjax.data import readers, text
from skyjax.export.hf_format import SKYJAX_FILE
from skyjax.export.trained import ExportError, TrainedModel

ID_COLUMNS = ("id", "idx")  # a row's id, when the file has one of these columns
_DEFAULT_LABEL = re.compile(r"^LABEL_(\d+)$")


def from_model_dir(path: str, compute_dtype: str = "float32",
                   attention: str = "exact") -> tuple[TrainedModel, Any, dict]:
    """``(model, tokenizer, skyjax.json or {})`` of a Hugging Face BERT directory (an export,
    or any ``BertForSequenceClassification`` with a tokenizer)."""
    from skyjax.models import hf_loading
    from skyjax.models.units import model_params

    if not os.path.isdir(path):
        raise ExportError(f"--model {path}: directory not found")
    meta: dict = {}
    meta_path = os.path.join(path, SKYJAX_FILE)
    if os.path.isfile(meta_path):
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError) as e:
            raise ExportError(f"{meta_path}: cannot be read ({type(e).__name__}: {e})") from None
    try:
        hf = hf_loading.read_config(path, None)  # checks config.json, by name
        model = hf_loading.from_pretrained(path, compute_dtype=compute_dtype, attention=attention)
    except ValueError as e:
        raise ExportError(f"--model {path}: {e}") from None
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        id2label = json.load(f).get("id2label") or {}
    names = [str(id2label.get(str(i), f"LABEL_{i}")) for i in range(hf.num_labels)]
    if all(_DEFAULT_LABEL.match(n) for n in names):
        names = None
    if meta.get("label_names") is not None:
        names = list(meta["label_names"])
    task = (text.Task(tuple(meta["text_columns"]), hf.num_labels)
            if meta.get("text_columns") else None)
    trained = TrainedModel(model.config, model_params(model), None if hf.num_labels == 1 else names,
                           None, task)
    return trained, load_tokenizer(path, meta), meta


def load_tokenizer(path: str, meta: dict | None = None) -> Any:
    """The ``BertTokenizerFast`` saved in a model directory (local files only); ``meta``: its
    ``skyjax.json``, which says whether the run it came from had text (a tokenizer to save)."""
    from transformers import BertTokenizerFast

    if not any(os.path.isfile(os.path.join(path, f)) for f in text.VOCAB_FILES):
        files, neither = " or ".join(text.VOCAB_FILES), " nor ".join(text.VOCAB_FILES)
        meta = meta or {}
        if meta.get("text_columns"):  # exported with its tokenizer, since removed
            raise ExportError(f"--model {path}: the tokenizer files are missing from the export "
                              f"directory (expected {files}, with tokenizer_config.json); its "
                              f"{SKYJAX_FILE} names a run on {meta.get('dataset', '?')!r} with "
                              f"text columns {', '.join(map(repr, meta['text_columns']))}: "
                              f"copy them back, or export the run again")
        if "dataset" in meta:  # an export of a run without text
            raise ExportError(f"--model {path} has no tokenizer (neither {neither}): its "
                              f"{SKYJAX_FILE} names a run on {meta['dataset']!r}, without text "
                              f"columns (the synthetic task's token ids are its own)")
        raise ExportError(f"--model {path} has no tokenizer (neither {neither} is in the "
                          f"directory): save the model's tokenizer there (save_pretrained)")
    try:
        return BertTokenizerFast.from_pretrained(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - a malformed file: name the directory
        raise ExportError(f"--model {path}: cannot load its tokenizer ({type(e).__name__}: "
                          f"{text.first_line(e)})") from None


# --------------------------------------------------------------------------------------------
# Rows.

def read_rows(path: str, columns: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """``(ids, texts)`` of a ``.csv`` / ``.tsv`` / ``.jsonl`` file, read as training reads its
    files (:func:`skyjax.data.readers.rows`: UTF-8 with or without a byte-order mark, GLUE's TSV
    quoting): each row's ``id`` or ``idx`` column (else its index from 0) and ``texts[k]`` the
    ``columns[k]`` values. A missing column is one line naming the file, line and column."""
    if os.path.isdir(path):
        raise ExportError(f"--data {path} is a directory, not a file")
    if not os.path.isfile(path):
        raise ExportError(f"--data {path}: file not found")
    if not readers.is_files(path):
        raise ExportError(f"--data {path}: not a .csv, .tsv or .jsonl file")
    ids: list[str] = []
    texts: list[list[str]] = [[] for _ in columns]
    key: str | None = None
    try:  # the reader training uses
        for n, (where, row, names) in enumerate(readers.rows(path, tuple(columns))):
            if n == 0:
                key = next((c for c in ID_COLUMNS if c in names), None)
            for column, out in zip(columns, texts):
                if column not in row:
                    raise ExportError(f"{where}: no column {column!r} (it has "
                                      f"{', '.join(map(repr, names))}); the model reads "
                                      f"{', '.join(map(repr, columns))}")
                value = row[column]
                if value is None:
                    raise ExportError(f"{where}: column {column!r} has no value")
                out.append(value if isinstance(value, str) else json.dumps(value))
            if key is not None and row.get(key) in (None, ""):
                raise ExportError(f"{where}: column {key!r} (the row's id) has no value")
            ids.append(str(row[key]) if key is not None else str(n))
    except UnicodeDecodeError as e:
        raise ExportError(f"{path}: not UTF-8 text ({text.first_line(e)})") from None
    except text.DataError as e:
        raise ExportError(str(e)) from None
    if not ids:
        raise ExportError(f"--data {path}: no rows (an empty file, or a header only)")
    return ids, texts


# --------------------------------------------------------------------------------------------
# The model on rows.

def predict_fn(model: TrainedModel) -> Any:
    """``logits(input_ids, token_type_ids, attention_mask)``, jitted once per batch shape."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from skyjax.models.modeling import BertForSequenceClassification

    abstract = nnx.eval_shape(lambda: BertForSequenceClassification(model.bert, nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, model.params))

    @jax.jit
    def logits(state, ids, types, mask):
        return nnx.merge(graphdef, state)(ids, types, mask).astype(jnp.float32)

    return lambda ids, types, mask: np.asarray(logits(state, ids, types, mask))


def logits_of(model: TrainedModel, tokenizer: Any, texts: Sequence[Sequence[str]],
              seq_len: int, batch_size: int = 64) -> np.ndarray:
    """``[rows, num_labels]`` float32 logits of ``texts`` (one list per text column)."""
    if seq_len > model.bert.max_position_embeddings:
        raise ExportError(f"--seq_len {seq_len} is above the model's max_position_embeddings="
                          f"{model.bert.max_position_embeddings}")
    run = predict_fn(model)
    n = len(texts[0])
    out = []
    for start in range(0, n, batch_size):
        chunk = [list(t[start:start + batch_size]) for t in texts]
        rows = len(chunk[0])
        if rows < batch_size:  # one compiled shape: pad with the first row, dropped below
            chunk = [c + [c[0]] * (batch_size - rows) for c in chunk]
        batch = text.encode(tokenizer, chunk, seq_len)
        ids = batch["input_ids"]
        if ids.size and int(ids.max()) >= model.bert.vocab_size:
            raise ExportError(f"token id {int(ids.max())} is outside the model's vocabulary of "
                              f"{model.bert.vocab_size}: the tokenizer is not the model's")
        out.append(run(ids, batch["token_type_ids"], batch["attention_mask"])[:rows])
    return np.concatenate(out)


def predictions(model: TrainedModel, logits: np.ndarray,
                names: Sequence[str] | None = None) -> list[Any]:
    """Per row: the regressed value (float), or the arg-max class's name (``names``, default
    the model's) or, with integer labels, its id."""
    if model.regression:
        return [float(v) for v in logits[:, 0]]
    names = model.label_names if names is None else names
    ids = np.argmax(logits, axis=-1)
    return [names[i] if names else int(i) for i in ids]


def format_value(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


_QUOTE_IF = ("\t", "\n", "\r", '"')  # what makes a TSV field quoted (write_tsv)


def tsv_field(text: str) -> str:
    """``text`` as a field of :func:`write_tsv`: quoted, its quotes doubled, where it holds a
    tab, a newline, a carriage return or a double quote; else as it is."""
    return f'"{text.replace(chr(34), chr(34) * 2)}"' if any(c in text for c in _QUOTE_IF) \
        else text


def write_tsv(path: str, ids: Iterable[str], values: Iterable[Any],
              header: tuple[str, str] = ("id", "prediction")) -> None:
    r"""``header`` then one ``id<TAB>prediction`` line per row (``\n``), written atomically, in
    the ``csv`` module's tab-delimited ``QUOTE_MINIMAL`` dialect (:func:`tsv_field`, not
    ``csv.writer``, which under a ``\n`` line end leaves a carriage return unquoted on Python
    3.11), so ``csv.reader(f, delimiter="\t")`` reads every row back as written."""
    tmp = f"{path}.partial-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        for row in (header, *((i, format_value(v)) for i, v in zip(ids, values))):
            f.write("\t".join(map(tsv_field, row)) + "\n")
    os.replace(tmp, path)
