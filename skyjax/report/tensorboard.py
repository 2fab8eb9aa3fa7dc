"""TensorBoard scalars under ``WORKDIR/tensorboard/``, written without TensorFlow or PyTorch.

Why a writer of our own: an event file is a TFRecord stream of ``Event`` protocol buffers, and a
scalar needs four fields of it (wall time, step, tag, value): about sixty lines, below. The usual
writers cost more than that: TensorFlow's ``tf.summary`` (and ``clu`` / ``flax.metrics`` on top
of it) is a ~500 MB dependency, and ``tensorboardX`` imports PyTorch whenever PyTorch is
installed (Colab, our test extra), adding seconds and hundreds of MB to every training process.
``tests/test_tensorboard.py`` reads the files back with TensorFlow's own reader.

What is written (docs/design.md, "tensorboard/"): every ``metrics.jsonl`` record, by
:func:`record_scalars`: a log step's numbers as ``train/<key>`` and its per-stage lists as
``<key>/stage_NN``; an evaluated split's as ``eval/<split>/<key>``. Pure Python; no JAX.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import Any

_CRC_TABLE: list[int] = []


def _crc_table() -> list[int]:
    if not _CRC_TABLE:
        for n in range(256):
            c = n
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            _CRC_TABLE.append(c)
    return _CRC_TABLE


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum of TFRecord framing."""
    table, crc = _crc_table(), 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> bytes:
    crc = crc32c(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def tfrecord(data: bytes) -> bytes:
    """One TFRecord: length, its checksum, the data, its checksum."""
    header = struct.pack("<Q", len(data))
    return header + _masked_crc(header) + data + _masked_crc(data)


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 two's complement, as protobuf encodes negatives
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def event(wall_time: float, step: int, *, scalars: dict[str, float] | None = None,
          file_version: str | None = None) -> bytes:
    """An ``Event`` message: ``wall_time`` (1, double), ``step`` (2, int64), ``file_version``
    (3) or ``summary`` (5) with one ``Value{tag (1), simple_value (2, float)}`` per scalar."""
    out = _varint(1 << 3 | 1) + struct.pack("<d", wall_time) + _varint(2 << 3) + _varint(step)
    if file_version is not None:
        out += _field(3, file_version.encode())
    if scalars:
        values = b"".join(
            _field(1, _field(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", v))
            for tag, v in scalars.items())
        out += _field(5, values)
    return out


def record_scalars(record: dict[str, Any]) -> tuple[int, dict[str, float]]:
    """``(step, {tag: value})`` of a metrics.jsonl record: an evaluation (it has ``split``)
    becomes ``eval/<split>/<key>`` (``eval_`` dropped from the key), anything else
    ``train/<key>``; a list of numbers (one per stage) becomes ``<key>/stage_NN``."""
    step = int(record.get("step", 0))
    split = record.get("split")
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in ("step", "split") or isinstance(value, bool):
            continue
        if isinstance(value, (list, tuple)):
            width = len(str(max(len(value) - 1, 0)))
            out.update({f"{key}/stage_{k:0{width}d}": float(v) for k, v in enumerate(value)
                        if isinstance(v, (int, float))})
        elif isinstance(value, (int, float)):
            name = key.removeprefix("eval_") if split is not None else key
            out[f"eval/{split}/{name}" if split is not None else f"train/{name}"] = float(value)
    return step, out


class EventWriter:
    """One event file in ``logdir`` (created), appended to and flushed at every write so that a
    live TensorBoard sees each log step and a crashed run keeps what it wrote."""

    def __init__(self, logdir: str):
        os.makedirs(logdir, exist_ok=True)
        stamp = f"{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        n = 0
        while os.path.exists(os.path.join(logdir, f"events.out.tfevents.{stamp}.{n}")):
            n += 1
        self.path = os.path.join(logdir, f"events.out.tfevents.{stamp}.{n}")
        self._file = open(self.path, "ab")
        self._write(event(time.time(), 0, file_version="brain.Event:2"))

    def _write(self, data: bytes) -> None:
        self._file.write(tfrecord(data))
        self._file.flush()

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if values:
            self._write(event(time.time(), step, scalars=values))

    def write_record(self, record: dict[str, Any]) -> None:
        """A metrics.jsonl record as scalars (:func:`record_scalars`)."""
        self.scalars(*record_scalars(record))

    def close(self) -> None:
        self._file.close()
