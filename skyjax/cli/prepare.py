"""``python -m skyjax.data.prepare glue/mnli --data_dir $HOME/tensorflow_datasets``
(``skyjax-prepare``): a GLUE task downloaded and written for TensorFlow Datasets
(:func:`skyjax.data.glue_build.prepare`).

``--extracted DIR``: prepare from GLUE's files already downloaded and unpacked in ``DIR``, for a
machine without internet. Bad input is one line on stderr.
"""

from __future__ import annotations

from typing import Sequence

from absl import flags

from skyjax import failures
from skyjax.cli.flags import run_absl
from skyjax.data import glue
from skyjax.data.glue_build import prepare

_DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data directory to write into.",
                                required=True)
_EXTRACTED = flags.DEFINE_string("extracted", "", "A directory holding the task's files, already "
                                 "downloaded and unpacked: prepare without downloading.")


def main(argv: Sequence[str]) -> None:
    with failures.one_line_errors("skyjax.data.prepare"):
        if len(argv) != 2:
            raise failures.BadInput(f"give one task: python -m skyjax.data.prepare TASK "
                                    f"--data_dir DIR (TASK one of {', '.join(glue.TASKS)})")
        prepare(argv[1], _DATA_DIR.value, _EXTRACTED.value)


def run() -> None:
    """The command's entry point (``skyjax-prepare``, ``python -m skyjax.data.prepare``)."""
    run_absl(main, __name__, parse=False)


if __name__ == "__main__":
    run()
