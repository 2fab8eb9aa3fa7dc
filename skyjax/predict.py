"""``python -m skyjax.predict``: a trained model's predictions on new rows, on one device.

  python -m skyjax.predict --workdir RUN [--step N] --data FILE --out preds.tsv
  python -m skyjax.predict --model DIR --data FILE --out preds.tsv [--text_columns a,b]
  python -m skyjax.predict --workdir RUN --glue [TASK] --out DIR [--data_dir TFDS_DIR]

The model is a run's latest checkpoint that verifies (``--workdir``, or its step ``--step``) or a
Hugging Face directory (``--model``: one ``python -m skyjax.export`` wrote, or any BERT
sequence classifier with its tokenizer). ``--data``: a ``.csv`` / ``.tsv`` / ``.jsonl`` file whose
text columns are the run's (``--text_columns`` overrides), tokenised as in training; ``--out``
gets ``id<TAB>prediction`` per row (the row's ``id`` or ``idx`` column, else its index from 0;
the label name, the class id for integer labels, or the score of a regression). ``--glue``: the
task's test splits from TensorFlow Datasets, as the GLUE server's files in directory ``--out``
(:mod:`skyjax.export.glue_submission`). Bad input is one line on stderr and exit status 64.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from skyjax import failures


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = failures.OneLineParser(prog="python -m skyjax.predict",
                               description=__doc__.splitlines()[0])
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--workdir", help="a trained run's --workdir")
    model.add_argument("--model", help="a Hugging Face directory (python -m skyjax.export's)")
    data = p.add_mutually_exclusive_group(required=True)
    data.add_argument("--data", help="a .csv, .tsv or .jsonl file of rows to predict")
    data.add_argument("--glue", nargs="?", const="", metavar="TASK",
                      help="GLUE's test splits (default: the run's task, e.g. glue/mnli)")
    p.add_argument("--out", required=True, help="--data: the TSV to write; --glue: a new directory")
    p.add_argument("--step", type=int, default=None, help="--workdir: the checkpoint's step")
    p.add_argument("--text_columns", default="",
                   help="comma-separated text column(s) (default: the run's)")
    p.add_argument("--seq_len", type=int, default=0, help="tokens per row (default: the run's)")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--compute_dtype", choices=("", "auto", "float32", "bfloat16"), default="",
                   help="default: the run's config.train.compute_dtype (auto for --model)")
    p.add_argument("--data_dir", default="",
                   help="--glue: the TFDS data_dir (default: the run's config.data.data_dir)")
    p.add_argument("--debug", action="store_true", help="show a failure's traceback")
    return p.parse_args(argv)


def check_out(args: argparse.Namespace) -> None:
    """``--out`` is new (a predictions file or GLUE directory is never overwritten)."""
    from skyjax.export.trained import ExportError

    if os.path.lexists(args.out) and not (args.glue is not None and os.path.isdir(args.out)
                                          and not os.listdir(args.out)):
        raise ExportError(f"--out {args.out}: exists; remove it or name a new one")
    parent = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(parent):
        raise ExportError(f"--out {args.out}: directory {parent} does not exist")
    if args.batch_size < 1 or args.seq_len < 0:
        raise ExportError("--batch_size must be >= 1 and --seq_len >= 0")


def load(args: argparse.Namespace) -> tuple[Any, Any, dict]:
    """``(model, tokenizer, defaults)``: the defaults are the run's text columns, sequence
    length, GLUE task and TFDS directory."""
    from skyjax.data import text
    from skyjax.export import inference, trained
    from skyjax.models import build

    if args.model:
        dtype = build.resolve_compute_dtype(args.compute_dtype or "auto")
        model, tokenizer, meta = inference.from_model_dir(args.model, dtype, "auto")
        return model, tokenizer, {"text_columns": meta.get("text_columns"),
                                  "seq_len": meta.get("seq_len"), "glue": meta.get("dataset"),
                                  "data_dir": ""}
    config = trained.run_config(args.workdir)
    dtype = build.resolve_compute_dtype(args.compute_dtype or config.train.compute_dtype)
    model = trained.from_workdir(args.workdir, args.step, dtype)
    if model.task is None:
        raise trained.ExportError(f"--workdir {args.workdir} trained on the synthetic task: it "
                                  f"has no text to predict from")
    try:
        tokenizer = text.load_tokenizer(config, model.task)  # exactly training's
    except ValueError as e:
        raise trained.ExportError(f"the run's tokenizer: {e}") from None
    return model, tokenizer, {"text_columns": list(model.task.text),
                              "seq_len": int(config.data.seq_len),
                              "glue": config.data.name, "data_dir": config.data.data_dir}


def run(args: argparse.Namespace) -> list[str]:
    """Writes the predictions; returns the files written."""
    from skyjax.export import glue_submission, inference
    from skyjax.export.trained import ExportError

    check_out(args)
    model, tokenizer, defaults = load(args)
    seq_len = args.seq_len or defaults["seq_len"] or min(128, model.bert.max_position_embeddings)
    if args.glue is not None:
        task = args.glue or defaults["glue"] or ""
        if task not in glue_submission.FILES:
            raise ExportError(f"--glue: name the GLUE task (the model's run trained on "
                              f"{task or 'no GLUE task'!r}), e.g. --glue glue/mnli")
        return glue_submission.write(task, model, tokenizer, seq_len, args.out,
                                     args.data_dir or defaults["data_dir"], args.batch_size)
    columns = [c for c in args.text_columns.split(",") if c] or defaults["text_columns"]
    if not columns:
        raise ExportError(f"--model {args.model} does not say which columns hold the text (it "
                          f"has no skyjax.json): pass --text_columns a[,b]")
    ids, texts = inference.read_rows(args.data, columns)
    logits = inference.logits_of(model, tokenizer, texts, seq_len, args.batch_size)
    inference.write_tsv(args.out, ids, inference.predictions(model, logits))
    return [args.out]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with failures.one_line_errors("skyjax.predict", args.debug):
        written = run(args)
        print(f"skyjax.predict: wrote {', '.join(written)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
