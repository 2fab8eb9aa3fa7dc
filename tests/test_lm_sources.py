"""A language model's documents (skyjax.data.lm_sources): .txt files and folders (a file per
document, or blank-line-separated paragraphs), JSONL / CSV text columns, Hugging Face
``datasets`` saved to disk, and one line naming the file and line for every bad input."""

from __future__ import annotations

import json
import os

import pytest

from skyjax.data import lm_sources
from skyjax.data.text import DataError
from tests.helpers import REPO

CORPUS = os.path.join(REPO, "configs", "data", "tiny_corpus")
CORPUS_JSONL = os.path.join(REPO, "configs", "data", "tiny_corpus.jsonl")


def write(path, data) -> str:
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(path, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as f:
        f.write(data)
    return str(path)


def test_the_shipped_corpus_reads_alike_as_files_and_as_jsonl():
    folder = lm_sources.read_documents(CORPUS)
    rows = lm_sources.read_documents(CORPUS_JSONL)
    assert len(folder) == len(rows) == 5
    assert [t for _, t in folder] == [t for _, t in rows]
    assert folder[0][0] == os.path.join(CORPUS, "bread.txt")
    assert rows[1][0] == f"{CORPUS_JSONL}:2"
    assert 3000 < sum(len(t) for _, t in folder) < 10_000


def test_txt_paragraphs_and_folders(tmp_path):
    path = write(tmp_path / "a.txt", "\ufeffFirst line\nsecond line\n\n  \n\nTwo\n\n\nThree\n")
    assert lm_sources.read_documents(path) == [(path, "First line\nsecond line\n\n  \n\nTwo"
                                                      "\n\n\nThree")]
    assert lm_sources.read_documents(path, txt_documents="paragraph") == [
        (f"{path}:1", "First line\nsecond line"), (f"{path}:6", "Two"), (f"{path}:9", "Three")]
    os.makedirs(tmp_path / "sub")
    write(tmp_path / "sub" / "b.txt", "bee")
    write(tmp_path / "blank.txt", " \n\n")  # in a folder: skipped
    write(tmp_path / "notes.md", "not read")
    docs = lm_sources.read_documents(str(tmp_path))
    assert [w for w, _ in docs] == [path, str(tmp_path / "sub" / "b.txt")]
    with pytest.raises(DataError, match="txt_documents='lines' is not one of"):
        lm_sources.read_documents(path, txt_documents="lines")


def test_jsonl_and_csv_text_columns(tmp_path):
    jsonl = write(tmp_path / "d.jsonl", '{"text": "one", "id": 1}\n\n{"text": "  "}\n'
                                        '{"text": "two"}\n')
    assert lm_sources.read_documents(jsonl) == [(f"{jsonl}:1", "one"), (f"{jsonl}:4", "two")]
    csv = write(tmp_path / "d.csv", 'id,body\n1,"a, b\nc"\n2,d\n')
    assert lm_sources.read_documents(csv, text_column="body") == [
        (f"{csv}:3", "a, b\nc"), (f"{csv}:4", "d")]


@pytest.mark.parametrize("name,data,message", [
    ("empty.txt", "", r"empty.txt: empty file \(no text\)$"),
    ("blank.txt", "\n  \n", r"blank.txt: empty file"),
    ("nul.txt", b"line one\nline\x00two\n", r"nul.txt:2: a binary file, not text \(a NUL byte "
                                            r"at byte offset 13\)$"),
    ("latin.txt", "ok\ncaf\u00e9\n".encode("latin-1"),
     r"latin.txt:2: not UTF-8 text \(byte 0xe9 at byte offset 6; a binary file\?\)$"),
    ("bom.txt", b"\xef\xbb\xbf\xff", r"bom.txt:1: not UTF-8 text \(byte 0xff at byte offset 3"),
    ("rows.jsonl", '{"text": "a"}\n{"text": "b",}\n', r"rows.jsonl:2: not a JSON object"),
    ("rows.jsonl", '{"text": "a"}\n[1, 2]\n', r"rows.jsonl:2: not a JSON object \(a list\)"),
    ("rows.jsonl", '{"body": "a", "id": 3}\n',
     r"rows.jsonl:1: no column 'text' in this row \(it has 'body', 'id'; "
     r"config.data.text_column\)$"),
    ("rows.jsonl", '{"text": 7}\n', r"rows.jsonl:1: column 'text' is a int, not text$"),
    ("rows.jsonl", '{"text": null}\n', r"rows.jsonl:1: column 'text' is missing, not text$"),
    ("rows.jsonl", '{"text": ""}\n', r"rows.jsonl: no documents \(every text is empty"),
    ("rows.csv", "title,body\nx,y\n", r"rows.csv:1: no column 'text' in the header \(it has "
                                      r"'title', 'body'; config.data.text_column\)$"),
    ("rows.csv", "text\n", r"rows.csv: no rows \(a header only\?\)$"),
    ("rows.csv", "", r"rows.csv: empty file"),
    ("rows.tsv", "text\nx\n", r"rows.tsv'?: not a .txt, .jsonl or .csv file"),
])
def test_bad_input_is_one_line_naming_file_and_line(tmp_path, name, data, message):
    path = write(tmp_path / name, data)
    with pytest.raises(DataError, match=message) as e:
        lm_sources.read_documents(path)
    assert "\n" not in str(e.value) and path in str(e.value)


def test_missing_sources_and_empty_folders(tmp_path):
    with pytest.raises(DataError, match=r"config.data.name='.*nothing.txt': no such file"):
        lm_sources.read_documents(str(tmp_path / "nothing.txt"))
    with pytest.raises(DataError, match=r"a folder with no .txt files"):
        lm_sources.read_documents(str(tmp_path))
    write(tmp_path / "blank.txt", "\n")
    with pytest.raises(DataError, match=r"no documents"):
        lm_sources.read_documents(str(tmp_path))
    write(tmp_path / "bin.txt", b"\x00\x01")  # a binary file in a folder is named, not skipped
    with pytest.raises(DataError, match=r"bin.txt:1: a binary file"):
        lm_sources.read_documents(str(tmp_path))
    assert lm_sources.is_text_source(str(tmp_path)) and lm_sources.is_text_source("hf:x")
    assert lm_sources.is_text_source("a.TXT") and not lm_sources.is_text_source("a.tsv")


def test_hf_dataset_saved_to_disk(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the hf: source needs Hugging Face datasets")
    path = str(tmp_path / "saved")
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": ["alpha", "", "beta"], "n": [1, 2, 3]}),
        "validation": datasets.Dataset.from_dict({"text": ["gamma"], "n": [4]}),
    }).save_to_disk(path)
    got = lm_sources.hf_documents(f"hf:{path}", ("train", "validation"))
    assert got == {"train": [(f"hf:{path}[train] row 0", "alpha"),
                             (f"hf:{path}[train] row 2", "beta")],
                   "validation": [(f"hf:{path}[validation] row 0", "gamma")]}
    with pytest.raises(DataError, match=r"\[train\]: no column 'body' \(it has 'text', 'n'"):
        lm_sources.hf_documents(f"hf:{path}", ("train",), text_column="body")
    with pytest.raises(DataError, match=r"no split 'test' \(it has 'train', 'validation'\)"):
        lm_sources.hf_documents(f"hf:{path}", ("test",))
    json.dumps(got)
