"""GLUE test-set predictions as the GLUE server (gluebenchmark.com) takes them: one file per task
split, ``MNLI-m.tsv``, ``CoLA.tsv``, ..., each ``index<TAB>prediction`` with a header line, the
``index`` the example's ``idx`` from TensorFlow Datasets. MNLI, QNLI and RTE are scored on label
names (``entailment``, ...), the others on class ids (0 / 1), STS-B on the regressed score.

The test splits are read from the same TFDS preparation as training (:func:`skyjax.data.glue.
open_split`; unlabelled, ``label`` -1) and tokenised by the same call. AX (the diagnostic set,
``glue/ax``, predicted with the MNLI model) is not a task skyjax trains and is left out.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from skyjax.data import glue, text
from skyjax.export import inference
from skyjax.export.trained import ExportError, TrainedModel

# task: {TFDS test split: the server's file name}
FILES: dict[str, dict[str, str]] = {
    "glue/cola": {"test": "CoLA.tsv"},
    "glue/sst2": {"test": "SST-2.tsv"},
    "glue/mrpc": {"test": "MRPC.tsv"},
    "glue/qqp": {"test": "QQP.tsv"},
    "glue/stsb": {"test": "STS-B.tsv"},
    "glue/mnli": {"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"},
    "glue/qnli": {"test": "QNLI.tsv"},
    "glue/rte": {"test": "RTE.tsv"},
    "glue/wnli": {"test": "WNLI.tsv"},
}
NAMED = ("glue/mnli", "glue/qnli", "glue/rte")  # scored on label names, the rest on ids
HEADER = ("index", "prediction")


def check_task(name: str, model: TrainedModel) -> None:
    if name not in FILES:
        raise ExportError(f"--glue {name!r} is not a GLUE task ({', '.join(FILES)})")
    want = glue.task(name).num_labels
    if model.bert.num_labels != want:
        raise ExportError(f"--glue {name}: the task has {want} label(s), the model "
                          f"{model.bert.num_labels}")


def _examples(source: Any, columns: tuple[str, ...]) -> tuple[list[str], list[list[str]]]:
    rows = text.read(source, np.arange(len(source)))
    ids = [str(int(np.asarray(r["idx"]))) if "idx" in r else str(n) for n, r in enumerate(rows)]
    return ids, [[text.as_text(r[c]) for r in rows] for c in columns]


def write(name: str, model: TrainedModel, tokenizer: Any, seq_len: int, out: str,
          data_dir: str = "", batch_size: int = 64) -> list[str]:
    """Predicts every test split of GLUE task ``name`` into ``out`` (a new directory); returns
    the files written."""
    check_task(name, model)
    task = glue.task(name)
    labels = task.label_names if name in NAMED else None
    os.makedirs(out, exist_ok=True)
    written = []
    for split, file in FILES[name].items():
        ids, texts = _examples(glue.open_split(name, split, data_dir), task.text)
        logits = inference.logits_of(model, tokenizer, texts, seq_len, batch_size)
        if model.regression:
            values: list[Any] = inference.predictions(model, logits)
        else:
            classes = np.argmax(logits, axis=-1)
            values = [labels[c] if labels else int(c) for c in classes]
        path = os.path.join(out, file)
        inference.write_tsv(path, ids, values, HEADER)
        written.append(path)
    return written
