"""``python -m skyjax.export`` (``skyjax-export``): a trained run's model as a Hugging Face
directory (:func:`skyjax.export.hf_format.export_run`).

  python -m skyjax.export --workdir RUN --out DIR [--step N] [--replica {average,N,anchor}]

Reads the run's latest checkpoint that verifies (or step ``N``), saved under any plan, process
count or number of pipelines, and writes ``DIR``: ``config.json``, ``model.safetensors``, the
tokenizer the run used and ``skyjax.json`` (:mod:`skyjax.export.hf_format`).
``transformers.AutoModelForSequenceClassification.from_pretrained(DIR)`` loads it, and so does
``skyjax.models.bert.from_pretrained(DIR)``. Where the checkpoint's replicas differ (DiLoCo
averaging between outer steps) the export is their average, or ``--replica``'s choice, said in
one line and recorded in ``skyjax.json``. A bad workdir, checkpoint or ``--out`` is one line
on stderr and exit status 64; a ``--replica`` the checkpoint does not offer, one line and 2.
"""

from __future__ import annotations

import sys

from skyjax import failures
from skyjax.cli.flags import OneLineParser, add_replica_flag


def parser() -> OneLineParser:
    p = OneLineParser(prog="python -m skyjax.export",
                      description="``python -m skyjax.export``: a trained run's model as a "
                                  "Hugging Face directory.")
    p.add_argument("--workdir", required=True, help="the run's --workdir")
    p.add_argument("--out", required=True, help="the directory to write (new, or empty)")
    p.add_argument("--step", type=int, default=None,
                   help="the checkpoint's step (default: the latest that verifies)")
    add_replica_flag(p, "export")
    p.add_argument("--debug", action="store_true", help="show a failure's traceback")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    with failures.one_line_errors("skyjax.export", args.debug):
        from skyjax.export import hf_format, trained

        from skyjax.export import lm

        try:
            if lm.is_lm_run(args.workdir):  # a decoder language model (one replica)
                lines = lm.export_run(args.workdir, args.out, args.step)
            else:
                lines = hf_format.export_run(args.workdir, args.out, args.step, args.replica)
        except trained.ReplicaChoiceError as e:
            p.error(str(e))  # a usage error: one line, status 2
        for line in lines:
            print(f"skyjax.export: {line}", flush=True)
    return 0


def run() -> None:
    """The command's entry point (``skyjax-export``, ``python -m skyjax.export``)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
