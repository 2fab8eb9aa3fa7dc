"""The rows of a CSV or TSV file (skyjax/data/readers.py), the reader of training's files and of
prediction's rows: a field of a megabyte is read, one over ``FIELD_LIMIT`` is one line naming the
file and line."""

from __future__ import annotations

import csv

import pytest

from skyjax.data import readers
from skyjax.data.text import DataError


@pytest.fixture
def field_limit():
    """The ``csv`` module's process-wide limit, put back after the test."""
    before = csv.field_size_limit()
    yield
    csv.field_size_limit(before)


@pytest.mark.parametrize("fmt,sep", [("csv", ","), ("tsv", "\t")])
def test_a_megabyte_field_is_read(tmp_path, field_limit, fmt, sep):
    csv.field_size_limit(131072)  # the csv module's default
    long = "w " * 500_000
    path = tmp_path / f"rows.{fmt}"
    path.write_text(sep.join(["premise", "hypothesis", "label"]) + "\n"
                    + sep.join(["a", "b", "x"]) + "\n" + sep.join(["c", long, "y"]) + "\n",
                    encoding="utf-8")
    rows = [row for _, row, _ in readers.rows(str(path), ("premise", "hypothesis"))]
    assert [r["hypothesis"] for r in rows] == ["b", long]
    split = readers.read_file(str(path), ("premise", "hypothesis"), "label", "config.data.name")
    assert split.texts[1] == ["b", long] and split.where[1] == f"{path}:3"


def test_a_field_over_the_limit_names_the_file_and_line(tmp_path, field_limit, monkeypatch):
    monkeypatch.setattr(readers, "FIELD_LIMIT", 1000)
    csv.field_size_limit(1000)
    path = tmp_path / "rows.csv"  # its third row starts on line 4: a quoted field spans two
    path.write_text('premise,label\na,x\n"b\nc",y\n' + "q" * 1001 + ",z\n", encoding="utf-8")
    with pytest.raises(DataError) as e:
        readers.read_file(str(path), ("premise",), "label", "config.data.name")
    assert str(e.value) == (f"{path}:5: a field is longer than 1,000 characters (the reader's "
                            f"limit, csv.field_size_limit)")
    tsv = tmp_path / "rows.tsv"
    tsv.write_text("premise\tlabel\na\tx\n" + "q" * 1001 + "\ty\n", encoding="utf-8")
    with pytest.raises(DataError, match=f"^{tsv}:3: a field is longer than 1,000 characters"):
        list(readers.rows(str(tsv), ("premise",)))


def test_the_limit_is_raised_to_the_stated_bound(tmp_path, field_limit):
    csv.field_size_limit(131072)
    path = tmp_path / "rows.csv"
    path.write_text("premise,label\na,x\n", encoding="utf-8")
    list(readers.rows(str(path), ("premise",)))
    assert csv.field_size_limit() == readers.FIELD_LIMIT == 1 << 24

