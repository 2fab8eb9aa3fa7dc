"""TensorBoard event files (skyjax.report.tensorboard): the checksum, the record-to-tag mapping, and
files that TensorFlow's own reader accepts (checksums verified) with the right scalars."""

from __future__ import annotations

import struct

import pytest

from skyjax.report.tensorboard import EventWriter, crc32c, record_scalars, tfrecord
from tests.helpers import read_events


def test_crc32c_known_value():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc32c(b"") == 0


def test_tfrecord_framing():
    rec = tfrecord(b"abc")
    assert struct.unpack("<Q", rec[:8])[0] == 3 and rec[12:15] == b"abc" and len(rec) == 19


def test_record_scalars():
    step, tags = record_scalars({"step": 25, "loss": 0.5, "accuracy": 0.75,
                                 "stage_compute_s": [0.1, 0.2], "flag": True, "name": "x"})
    assert step == 25
    assert tags == {"train/loss": 0.5, "train/accuracy": 0.75,
                    "stage_compute_s/stage_0": 0.1, "stage_compute_s/stage_1": 0.2}
    _, tags = record_scalars({"step": 3, "split": "validation_matched", "eval_loss": 1.0,
                              "eval_accuracy": 0.5, "eval_examples": 10})
    assert tags == {"eval/validation_matched/loss": 1.0, "eval/validation_matched/accuracy": 0.5,
                    "eval/validation_matched/examples": 10.0}
    _, tags = record_scalars({"step": 1, "stage_idle_s": [0.0] * 12})
    assert "stage_idle_s/stage_00" in tags and "stage_idle_s/stage_11" in tags  # sorts as text


def test_event_file_read_by_tensorflow(tmp_path):
    w = EventWriter(str(tmp_path / "tb"))
    for step in (1, 25, 50):
        w.write_record({"step": step, "loss": 1.0 / step, "stage_compute_s": [0.25, 0.5]})
    w.write_record({"step": 50, "split": "validation", "eval_accuracy": 0.875})
    w.close()
    events = read_events(str(tmp_path / "tb"))
    assert [s for s, _ in events["train/loss"]] == [1, 25, 50]
    assert events["train/loss"][1][1] == pytest.approx(0.04)
    assert events["stage_compute_s/stage_1"] == [(1, 0.5), (25, 0.5), (50, 0.5)]
    assert events["eval/validation/accuracy"] == [(50, 0.875)]
