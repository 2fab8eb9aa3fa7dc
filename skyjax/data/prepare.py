"""Prepares a GLUE task for training: downloads it and writes it in TFDS's ``array_record`` format
(random access, what :mod:`skyjax.data.glue` reads), with nothing beyond the packages skyjax's
``tfds`` extra installs (``tfds build`` needs Apache Beam for its format converter).

    python -m skyjax.data.prepare glue/mnli --data_dir $HOME/tensorflow_datasets

``--extracted DIR``: prepare from GLUE's files already downloaded and unpacked in ``DIR`` (the
task's folder, e.g. ``DIR/MNLI/train.tsv``; MRPC's three source files in ``DIR``), for a machine
without internet. Then train with ``--config.data.name=glue/mnli --config.data.data_dir=...``.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from absl import app, flags, logging

from skyjax import failures
from skyjax.data import glue
from skyjax.data.text import DataError, first_line

FILE_FORMAT = "array_record"

_DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data directory to write into.",
                                required=True)
_EXTRACTED = flags.DEFINE_string("extracted", "", "A directory holding the task's files, already "
                                 "downloaded and unpacked: prepare without downloading.")


def _offline(builder: Any, root: str) -> None:
    """Makes ``builder`` read its downloads from ``root`` instead of the network: the download
    manager's ``download`` / ``download_and_extract`` return paths under ``root``."""
    from etils import epath

    make = builder._make_download_manager  # tensorflow-datasets 4.9: one manager per prepare

    def local(url: str) -> Any:
        name = os.path.basename(url.split("?")[0])
        stem = os.path.splitext(name)[0] if name.endswith(".zip") else name
        path = os.path.join(root, stem) if os.path.exists(os.path.join(root, stem)) else root
        return epath.Path(path if name != stem or os.path.isfile(path) else root)

    def offline_manager(*args: Any, **kwargs: Any) -> Any:
        manager = make(*args, **kwargs)
        tree = lambda urls: ({k: tree(v) for k, v in urls.items()}  # noqa: E731
                             if isinstance(urls, dict) else local(urls))
        manager.download = tree
        manager.download_and_extract = lambda urls: (
            {k: epath.Path(root) for k in urls} if isinstance(urls, dict) else epath.Path(root))
        return manager

    builder._make_download_manager = offline_manager


def prepare(name: str, data_dir: str, extracted: str = "") -> str:
    """Writes ``name`` (a GLUE task of :data:`glue.TASKS`) under ``data_dir`` as array_record;
    returns the dataset's directory. Raises ``DataError`` with one line on bad input."""
    glue.task(name)
    if extracted and not os.path.isdir(extracted):
        raise DataError(f"--extracted={extracted!r}: directory not found")
    tfds = glue._tfds()
    os.makedirs(data_dir, exist_ok=True)
    builder = tfds.builder(name, data_dir=data_dir, file_format=FILE_FORMAT)
    if builder.is_prepared():
        logging.info("%s is already prepared in %s", name, builder.data_dir)
        return str(builder.data_dir)
    if extracted:
        _offline(builder, extracted)
    try:
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    except FileNotFoundError as e:
        raise DataError(f"{name}: a file is missing ({first_line(e)})"
                        + (f" in --extracted={extracted!r}" if extracted else "")) from None
    except Exception as e:  # noqa: BLE001 - network, disk: one line naming the dataset
        raise DataError(f"{name}: preparing it in {data_dir} failed ({type(e).__name__}: "
                        f"{first_line(e)})") from None
    logging.info("%s prepared in %s (%s): train with --config.data.name=%s "
                 "--config.data.data_dir=%s", name, builder.data_dir, FILE_FORMAT, name, data_dir)
    return str(builder.data_dir)


def main(argv: Sequence[str]) -> None:
    with failures.one_line_errors("skyjax.data.prepare"):
        if len(argv) != 2:
            raise failures.BadInput(f"give one task: python -m skyjax.data.prepare TASK "
                                    f"--data_dir DIR (TASK one of {', '.join(glue.TASKS)})")
        prepare(argv[1], _DATA_DIR.value, _EXTRACTED.value)


if __name__ == "__main__":
    app.run(main)
