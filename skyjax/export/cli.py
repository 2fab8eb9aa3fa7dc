"""``python -m skyjax.export``: a trained run's model as a Hugging Face directory.

  python -m skyjax.export --workdir RUN --out DIR [--step N]

Reads the run's latest checkpoint that verifies (or step ``N``), saved under any plan, process
count or number of pipelines, and writes ``DIR``: ``config.json``, ``model.safetensors``, the
tokenizer the run used and ``skyjax.json`` (:mod:`skyjax.export.hf_format`).
``transformers.AutoModelForSequenceClassification.from_pretrained(DIR)`` loads it, and so does
``skyjax.models.bert.from_pretrained(DIR)``. A bad workdir, checkpoint or ``--out`` is one line
on stderr and exit status 64.
"""

from __future__ import annotations

import argparse
import sys

from skyjax import failures


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = failures.OneLineParser(prog="python -m skyjax.export",
                               description=__doc__.splitlines()[0])
    p.add_argument("--workdir", required=True, help="the run's --workdir")
    p.add_argument("--out", required=True, help="the directory to write (new, or empty)")
    p.add_argument("--step", type=int, default=None,
                   help="the checkpoint's step (default: the latest that verifies)")
    p.add_argument("--debug", action="store_true", help="show a failure's traceback")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with failures.one_line_errors("skyjax.export", args.debug):
        from skyjax.export import hf_format, trained

        hf_format.check_out(args.out)  # before the checkpoint is read
        model = trained.from_workdir(args.workdir, args.step)
        done = hf_format.write(model, args.out)
        print(f"skyjax.export: step {model.step} of {args.workdir} -> {args.out}: "
              f"{done['tensors']} tensors, {done['parameters']:,} parameters, "
              f"{model.bert.num_labels} label(s)"
              + ("" if model.regression else f" ({', '.join(hf_format.id2label(model).values())})"),
              flush=True)
        print("skyjax.export: " + (f"tokenizer from {done['tokenizer']}" if done["tokenizer"]
                                   else "no tokenizer: the synthetic task's token ids are its "
                                        "own"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
