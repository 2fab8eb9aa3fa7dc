"""``python -m skyjax.predict`` (``skyjax-predict``): a trained model's predictions on new rows, on
one device (:func:`skyjax.export.predict.write_predictions`).

  python -m skyjax.predict --workdir RUN [--step N] --data FILE --out preds.tsv
  python -m skyjax.predict --model DIR --data FILE --out preds.tsv [--text_columns a,b]
  python -m skyjax.predict --workdir RUN --glue [TASK] --out DIR [--data_dir TFDS_DIR]

Bad input is one line on stderr and exit status 64.
"""

from __future__ import annotations

import argparse
import sys

from skyjax import failures
from skyjax.cli.flags import OneLineParser
from skyjax.export.predict import write_predictions


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(prog="python -m skyjax.predict",
                      description="``python -m skyjax.predict``: a trained model's predictions on "
                                  "new rows, on one device.")
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with failures.one_line_errors("skyjax.predict", args.debug):
        written = write_predictions(
            args.out, workdir=args.workdir, model_dir=args.model, data=args.data, glue=args.glue,
            step=args.step, text_columns=args.text_columns, seq_len=args.seq_len,
            batch_size=args.batch_size, compute_dtype=args.compute_dtype, data_dir=args.data_dir)
        print(f"skyjax.predict: wrote {', '.join(written)}", flush=True)
    return 0


def run() -> None:
    """The command's entry point (``skyjax-predict``, ``python -m skyjax.predict``)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
