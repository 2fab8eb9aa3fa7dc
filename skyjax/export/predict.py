"""A trained model's predictions on new rows, written to a file (``python -m skyjax.predict``,
:mod:`skyjax.cli.predict`).

The model is a run's latest checkpoint that verifies (``workdir``, or its step ``step``) or a
Hugging Face directory (``model_dir``: one ``python -m skyjax.export`` wrote, or any BERT
sequence classifier with its tokenizer). ``data``: a ``.csv`` / ``.tsv`` / ``.jsonl`` file whose
text columns are the run's (``text_columns`` overrides), tokenised as in training; ``out`` gets
``id<TAB>prediction`` per row (the row's ``id`` or ``idx`` column, else its index from 0; the
label name, the class id for integer labels, or the score of a regression). ``glue``: the task's
test splits from TensorFlow Datasets, as the GLUE server's files in directory ``out``
(:mod:`skyjax.export.glue_submission`). A run's checkpoint whose replicas differ (DiLoCo
averaging) predicts with their average, or ``replica`` (:mod:`skyjax.export.trained`), said in
one line (``log``). Bad input raises ``ExportError`` naming the flag.
"""

from __future__ import annotations

import os
from typing import Any, Callable


def check_out(out: str, glue: str | None, batch_size: int, seq_len: int) -> None:
    """``out`` is new (a predictions file or GLUE directory is never overwritten)."""
    from skyjax.export.trained import ExportError

    if os.path.lexists(out) and not (glue is not None and os.path.isdir(out)
                                     and not os.listdir(out)):
        raise ExportError(f"--out {out}: exists; remove it or name a new one")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise ExportError(f"--out {out}: directory {parent} does not exist")
    if batch_size < 1 or seq_len < 0:
        raise ExportError("--batch_size must be >= 1 and --seq_len >= 0")


def load(workdir: str | None, model_dir: str | None, step: int | None,
         compute_dtype: str, replica: str | int = "average") -> tuple[Any, Any, dict]:
    """``(model, tokenizer, defaults)``: the defaults are the run's text columns, sequence
    length, GLUE task and TFDS directory."""
    from skyjax.data import text
    from skyjax.export import inference, trained
    from skyjax.models import build

    if model_dir:
        if replica != trained.AVERAGE:
            raise trained.ReplicaChoiceError(f"--replica {replica}: applies to --workdir; --model "
                                             f"{model_dir} is one model (its skyjax.json "
                                             f"records which replica); choose average")
        dtype = build.resolve_compute_dtype(compute_dtype or "auto")
        model, tokenizer, meta = inference.from_model_dir(model_dir, dtype, "auto")
        return model, tokenizer, {"text_columns": meta.get("text_columns"),
                                  "seq_len": meta.get("seq_len"), "glue": meta.get("dataset"),
                                  "data_dir": ""}
    config = trained.run_config(workdir)
    dtype = build.resolve_compute_dtype(compute_dtype or config.train.compute_dtype)
    model = trained.from_workdir(workdir, step, dtype, replica)
    if model.task is None:
        raise trained.ExportError(f"--workdir {workdir} trained on the synthetic task: it "
                                  f"has no text to predict from")
    try:
        tokenizer = text.load_tokenizer(config, model.task)  # exactly training's
    except ValueError as e:
        raise trained.ExportError(f"the run's tokenizer: {e}") from None
    return model, tokenizer, {"text_columns": list(model.task.text),
                              "seq_len": int(config.data.seq_len),
                              "glue": config.data.name, "data_dir": config.data.data_dir}


def write_predictions(out: str, *, workdir: str | None = None, model_dir: str | None = None,
                      data: str | None = None, glue: str | None = None,
                      step: int | None = None, text_columns: str = "", seq_len: int = 0,
                      batch_size: int = 64, compute_dtype: str = "",
                      data_dir: str = "", replica: str | int = "average",
                      log: Callable[[str], None] | None = None) -> list[str]:
    """Writes the predictions of the model (``workdir`` or ``model_dir``) on ``data`` (or, with
    ``glue`` a task name or ``""`` for the run's, GLUE's test splits); returns the files
    written. ``replica``: which of the checkpoint's replicas, where they differ; ``log`` gets
    the line that says which it took."""
    from skyjax.export import glue_submission, inference
    from skyjax.export.trained import ExportError, replica_line

    check_out(out, glue, batch_size, seq_len)
    model, tokenizer, defaults = load(workdir, model_dir, step, compute_dtype, replica)
    which = replica_line(model.replica, "predicting with")
    if which and log is not None:
        log(which)
    seq_len = seq_len or defaults["seq_len"] or min(128, model.bert.max_position_embeddings)
    if glue is not None:
        task = glue or defaults["glue"] or ""
        if task not in glue_submission.FILES:
            raise ExportError(f"--glue: name the GLUE task (the model's run trained on "
                              f"{task or 'no GLUE task'!r}), e.g. --glue glue/mnli")
        return glue_submission.write(task, model, tokenizer, seq_len, out,
                                     data_dir or defaults["data_dir"], batch_size)
    columns = [c for c in text_columns.split(",") if c] or defaults["text_columns"]
    if not columns:
        raise ExportError(f"--model {model_dir} does not say which columns hold the text (it "
                          f"has no skyjax.json): pass --text_columns a[,b]")
    ids, texts = inference.read_rows(data, columns)
    logits = inference.logits_of(model, tokenizer, texts, seq_len, batch_size)
    inference.write_tsv(out, ids, inference.predictions(model, logits))
    return [out]
