"""``python -m skyjax.predict`` (``skyjax-predict``): a trained model's predictions on new rows, on
one device (:func:`skyjax.export.predict.write_predictions`).

  python -m skyjax.predict --workdir RUN [--step N] [--replica {average,N,anchor}] --data FILE
      --out preds.tsv
  python -m skyjax.predict --model DIR --data FILE --out preds.tsv [--text_columns a,b]
  python -m skyjax.predict --workdir RUN --glue [TASK] --out DIR [--data_dir TFDS_DIR]

``preds.tsv``: a header, then ``id<TAB>prediction`` per row, in the ``csv`` module's
tab-delimited ``QUOTE_MINIMAL`` dialect (a field holding a tab, a newline, a carriage return or
a double quote is quoted), so ``csv.reader(f, delimiter="\\t")`` gets every row back. With
``--workdir``, where the checkpoint's replicas differ (DiLoCo averaging between outer steps),
the model is their average or ``--replica``'s choice, said in one line. Bad input is one line
on stderr and exit status 64; a ``--replica`` the checkpoint does not offer, one line and 2.
"""

from __future__ import annotations

import sys

from skyjax import failures
from skyjax.cli.flags import OneLineParser, add_replica_flag
from skyjax.export.predict import write_predictions


def parser() -> OneLineParser:
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
    data.add_argument("--generate", metavar="PROMPT",
                      help="a language model: print the greedy continuation of PROMPT")
    p.add_argument("--out", help="--data: the TSV to write; --glue: a new directory")
    p.add_argument("--max_new_tokens", type=int, default=32,
                   help="--generate: the most tokens to add")
    p.add_argument("--step", type=int, default=None, help="--workdir: the checkpoint's step")
    add_replica_flag(p, "--workdir: predict with")
    p.add_argument("--text_columns", default="",
                   help="comma-separated text column(s) (default: the run's)")
    p.add_argument("--seq_len", type=int, default=0, help="tokens per row (default: the run's)")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--compute_dtype", choices=("", "auto", "float32", "bfloat16"), default="",
                   help="default: the run's config.train.compute_dtype (auto for --model)")
    p.add_argument("--data_dir", default="",
                   help="--glue: the TFDS data_dir (default: the run's config.data.data_dir)")
    p.add_argument("--debug", action="store_true", help="show a failure's traceback")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    with failures.one_line_errors("skyjax.predict", args.debug):
        from skyjax.export.trained import ReplicaChoiceError

        if args.generate is not None:  # a language model's continuation, printed
            from skyjax.export import lm

            model, tokenizer = lm.load(args.workdir, args.model, args.step)
            print(args.generate + lm.generate(model, tokenizer, args.generate,
                                              args.max_new_tokens), flush=True)
            return 0
        if not args.out:
            p.error("--out is required with --data or --glue")
        try:
            written = write_predictions(
                args.out, workdir=args.workdir, model_dir=args.model, data=args.data,
                glue=args.glue, step=args.step, text_columns=args.text_columns,
                seq_len=args.seq_len, batch_size=args.batch_size,
                compute_dtype=args.compute_dtype, data_dir=args.data_dir, replica=args.replica,
                log=lambda line: print(f"skyjax.predict: {line}", flush=True))
        except ReplicaChoiceError as e:
            p.error(str(e))  # a usage error: one line, status 2
        print(f"skyjax.predict: wrote {', '.join(written)}", flush=True)
    return 0


def run() -> None:
    """The command's entry point (``skyjax-predict``, ``python -m skyjax.predict``)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
