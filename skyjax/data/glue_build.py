"""Prepares a GLUE task for training: downloads it and writes it in TFDS's ``array_record`` format
(random access, what :mod:`skyjax.data.glue` reads), with nothing beyond the packages skyjax's
``tfds`` extra installs (``tfds build`` needs Apache Beam for its format converter). The command
is ``python -m skyjax.data.prepare glue/mnli --data_dir DIR`` (:mod:`skyjax.cli.prepare`).

``extracted``: prepare from GLUE's files already downloaded and unpacked in that directory (the
task's folder, e.g. ``DIR/MNLI/train.tsv``; MRPC's three source files in ``DIR``), for a machine
without internet. Then train with ``--config.data.name=glue/mnli --config.data.data_dir=...``.

Without ``extracted`` the download host is tried once, with a short timeout, before TFDS
starts (whose retries would take minutes offline); a row of a task's file that TFDS cannot read
is named by file and line.
"""

from __future__ import annotations

import csv
import os
import sys
import threading
import urllib.parse
from typing import Any

from absl import logging

from skyjax.data import glue
from skyjax.data.text import DataError, first_line

FILE_FORMAT = "array_record"
REACH_TIMEOUT_S = 10.0  # the whole probe of the download host, name lookup included


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


def _urls(builder: Any) -> list[str]:
    """The URLs the GLUE builder downloads from (its config's, else MRPC's source files)."""
    module = sys.modules[type(builder).__module__]
    url = getattr(builder.builder_config, "data_url", "")
    urls = [url] if url else [v for k, v in vars(module).items() if k.startswith("_MRPC_")]
    return [u for u in urls if isinstance(u, str) and u.startswith(("http://", "https://"))]


def _unreachable(url: str, timeout_s: float = REACH_TIMEOUT_S) -> str | None:
    """Why ``url``'s host (or the proxy configured for it) cannot be reached (one connection,
    ``timeout_s`` in all, the name lookup included: it has no timeout of its own), or None."""
    import socket
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)  # what requests would go through
    if proxy and not urllib.request.proxy_bypass(parts.hostname):
        parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    why: list[str] = ["no answer in %.0f s" % timeout_s]

    def connect() -> None:
        try:
            socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
            why[0] = ""
        except OSError as e:
            why[0] = f"{type(e).__name__}: {e.strerror or e}"

    probe = threading.Thread(target=connect, daemon=True)
    probe.start()
    probe.join(timeout_s)
    return why[0] or None


class _Readers:
    """The ``csv`` module as the GLUE builder's module sees it while preparing, whose readers
    are kept: the last one's ``line_num`` is the line that failed."""

    def __init__(self) -> None:
        self.last: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(csv, name)

    def DictReader(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 - csv's name
        self.last = csv.DictReader(*args, **kwargs)
        return self.last

    def reader(self, *args: Any, **kwargs: Any) -> Any:
        self.last = csv.reader(*args, **kwargs)
        return self.last


def _named_rows(builder: Any, readers: _Readers) -> None:
    """Makes a row that ``builder`` cannot read a ``DataError`` naming its file and line (TFDS
    says only ``invalid literal for int()`` or ``KeyError: 'sentence2'``)."""
    generate = builder._generate_examples

    def named(data_file: Any = None, split: Any = None, **kwargs: Any) -> Any:
        readers.last = None
        try:
            yield from generate(data_file, split, **kwargs)
        except OSError:  # a missing file: prepare() names it
            raise
        except Exception as e:  # noqa: BLE001 - a malformed row of the user's file
            where = str(data_file or f"the {split} files")
            reader = readers.last
            if isinstance(e, KeyError) and getattr(reader, "fieldnames", None) is not None:
                raise DataError(f"{where}: no column {e.args[0]!r} (its header has "
                                f"{', '.join(map(repr, reader.fieldnames))})") from None
            line = getattr(reader, "line_num", 0)
            labels = getattr(builder.builder_config, "label_classes", None)
            raise DataError(f"{where}{f':{line}' if line else ''}: cannot read this row "
                            f"({type(e).__name__}: {first_line(e)}"
                            + (f"; the labels are {', '.join(labels)}" if labels else "")
                            + ")") from None

    builder._generate_examples = named


def prepare(name: str, data_dir: str, extracted: str = "") -> str:
    """Writes ``name`` (a GLUE task of :data:`glue.TASKS`) under ``data_dir`` as array_record;
    returns the dataset's directory. Raises ``DataError`` with one line on bad input."""
    glue.task(name)
    if extracted and not os.path.isdir(extracted):
        raise DataError(f"--extracted={extracted!r}: directory not found")
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise DataError(f"--data_dir={data_dir!r} is a file, not a directory")
    tfds = glue.import_tfds()
    try:
        os.makedirs(data_dir, exist_ok=True)
    except OSError as e:
        raise DataError(f"--data_dir={data_dir!r} cannot be created ({e.strerror or e})") from None
    builder = tfds.builder(name, data_dir=data_dir, file_format=FILE_FORMAT)
    if builder.is_prepared():
        logging.info("%s is already prepared in %s", name, builder.data_dir)
        return str(builder.data_dir)
    if extracted:
        _offline(builder, extracted)
    else:
        for url in _urls(builder)[:1]:  # one host serves every file of a task
            why = _unreachable(url)
            if why:
                raise DataError(f"{name}: cannot reach {urllib.parse.urlsplit(url).netloc} to "
                                f"download it ({why}); offline, download GLUE's files "
                                "elsewhere, unpack them and give their directory as "
                                "--extracted DIR")
    module, readers = sys.modules[type(builder).__module__], _Readers()
    _named_rows(builder, readers)
    saved, module.csv = getattr(module, "csv", csv), readers
    try:
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    except DataError:
        raise
    except FileNotFoundError as e:
        raise DataError(f"{name}: a file is missing ({first_line(e)})"
                        + (f" in --extracted={extracted!r}" if extracted else "")) from None
    except Exception as e:  # noqa: BLE001 - network, disk: one line naming the dataset
        raise DataError(f"{name}: preparing it in {data_dir} failed ({type(e).__name__}: "
                        f"{first_line(e)})") from None
    finally:
        module.csv = saved
    logging.info("%s prepared in %s (%s): train with --config.data.name=%s "
                 "--config.data.data_dir=%s", name, builder.data_dir, FILE_FORMAT, name, data_dir)
    return str(builder.data_dir)
