"""JSON files the way every output of skyjax is written: atomically, or one record a line."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def _write_atomic(path: str, text: str, suffix: str) -> None:
    """``text`` to a temporary file in the same folder, then ``os.replace``: a reader (or a
    crash) never sees half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_", suffix=suffix)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(obj: Any, path: str, indent: int | None = None) -> None:
    """``json.dump`` of ``obj`` to ``path``, atomically."""
    _write_atomic(path, json.dumps(obj, indent=indent) + "\n", ".json")


def write_jsonl_atomic(records: list[dict], path: str) -> None:
    """``records`` as JSON lines in ``path``, atomically (e.g. metrics.jsonl cut back on resume)."""
    _write_atomic(path, "".join(json.dumps(r) + "\n" for r in records), ".jsonl")


def append_jsonl(path: str, record: dict) -> None:
    """Appends one JSON record as a line (metrics.jsonl)."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def read_jsonl(path: str) -> list[dict]:
    """All records of a JSON-lines file."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
