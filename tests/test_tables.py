"""Your own data (skyjax/data/tables.py): CSV, TSV and JSON Lines files and Hugging Face datasets
saved with save_to_disk, all written here. Batches must equal what BertTokenizerFast makes of the
same rows, in the order GLUE uses (a pure function of seed and step), with labels mapped and
checked; every bad input is one line naming the file, line and column."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from skyjax import data
from skyjax.checkpoint.restore import CheckpointMismatch, Resume, check_compatible
from skyjax.checkpoint.run import run_identity
from skyjax.config import validate_config
from skyjax.data import tables, text
from tests.helpers import (reference_tokenizer, take, text_config, tokenized,  # noqa: F401
                           vocab_dir)

transformers = pytest.importorskip("transformers")

BATCH = 4
SEQ_LEN = 12
WORDS = list("abcdefghij") + ["abc", "hi", "j"]


def sentence(rng) -> str:
    return " ".join(rng.choice(WORDS, size=rng.integers(1, 6)))


def pair_rows(n: int, seed: int, labels=("yes", "no", "maybe")) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"first": sentence(rng), "second": sentence(rng), "label": str(rng.choice(labels))}
            for _ in range(n)]


def write_csv(path, rows, columns=("first", "second", "label"), delimiter=","):
    with open(path, "w", newline="", encoding="utf-8") as f:
        kwargs = {"quoting": csv.QUOTE_NONE} if delimiter == "\t" else {}
        w = csv.writer(f, delimiter=delimiter, **kwargs)
        w.writerow(columns)
        for r in rows:
            w.writerow([r[c] for c in columns])
    return str(path)


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def make_config(vocab_dir, name, *, num_labels=3, validate=True, **keys):
    config = text_config(vocab_dir, name, num_labels, {
        "batch_size": BATCH, "seq_len": SEQ_LEN, "text_columns": ("first", "second"), **keys})
    if validate:
        validate_config(config)
    return config


def reference(tokenizer, rows, labels, columns=("first", "second")):
    return tokenized(tokenizer, rows, columns, SEQ_LEN, labels)


def assert_batch(batch, expected):
    assert set(batch) >= set(expected)
    for k, v in expected.items():
        np.testing.assert_array_equal(batch[k], v, err_msg=k)


# --------------------------------------------------------------------------------------------
# Reading and batching.

@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
def test_batches_equal_the_tokenizer_on_the_same_rows(fmt, tmp_path, vocab_dir,
                                                      reference_tokenizer):
    rows = pair_rows(10, seed=1)
    path = str(tmp_path / f"train.{fmt}")
    if fmt == "jsonl":
        write_jsonl(path, rows)
    else:
        write_csv(path, rows, delimiter="," if fmt == "csv" else "\t")
    config = make_config(vocab_dir, path)
    names = sorted({r["label"] for r in rows})
    assert data.label_names(config) == names
    batches = take(data.train_batches(config), 4)  # 16 stream positions: 1.6 epochs of 10
    order = text.EpochOrder(config.train.seed, 10)
    for i, batch in enumerate(batches):
        picked = [rows[j] for j in order.indices(i * BATCH, BATCH)]
        labels = np.asarray([names.index(r["label"]) for r in picked], np.int32)
        assert_batch(batch, reference(reference_tokenizer, picked, labels))


def test_single_sentences_integer_labels_and_a_resumed_stream(tmp_path, vocab_dir,
                                                               reference_tokenizer):
    rows = [{"first": r["first"], "label": i % 2} for i, r in enumerate(pair_rows(9, seed=2))]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    config = make_config(vocab_dir, path, num_labels=2, text_columns=("first",))
    assert data.label_names(config) is None and data.metric(config) == "accuracy"
    fresh = take(data.train_batches(config), 5)
    resumed = take(data.train_batches(config, start_step=3), 2)
    for a, b in zip(fresh[3:], resumed):
        assert_batch(a, b)
    order = text.EpochOrder(config.train.seed, 9)
    picked = [rows[j] for j in order.indices(0, BATCH)]
    assert_batch(fresh[0], reference(reference_tokenizer, picked, np.asarray([r["label"] for r in picked],
                                                                   np.int32), ("first",)))
    other = make_config(vocab_dir, path, num_labels=2, text_columns=("first",))
    other.train.seed = 1
    assert not np.array_equal(take(data.train_batches(other), 1)[0]["labels"],
                              fresh[0]["labels"]) or not np.array_equal(
        take(data.train_batches(other), 1)[0]["input_ids"], fresh[0]["input_ids"])


def test_regression_labels_are_floats_and_scored_by_correlation(tmp_path, vocab_dir):
    rng = np.random.default_rng(3)
    rows = [{**r, "label": float(rng.uniform(0, 5))} for r in pair_rows(6, seed=3)]
    path = write_jsonl(tmp_path / "scores.jsonl", rows)
    config = make_config(vocab_dir, path, num_labels=1, eval_files=(path,))
    assert data.metric(config) == "pearson_spearman"
    (batch,) = take(data.train_batches(config), 1)
    assert batch["labels"].dtype == np.float32
    assert set(batch["labels"].tolist()) <= {np.float32(r["label"]) for r in rows}
    evals = data.eval_splits(config)
    assert list(evals) == ["scores"]
    np.testing.assert_allclose(np.concatenate([b["labels"] for b in evals["scores"]])[:6],
                               [r["label"] for r in rows], rtol=1e-6)


def test_every_eval_file_is_one_split_and_the_last_batch_is_padded(tmp_path, vocab_dir):
    train = write_csv(tmp_path / "train.csv", pair_rows(8, seed=4))
    dev = write_csv(tmp_path / "dev.csv", pair_rows(6, seed=5))
    test = write_jsonl(tmp_path / "test.jsonl", pair_rows(3, seed=6))
    config = make_config(vocab_dir, train, eval_files=(dev, test),
                         label_names=("maybe", "no", "yes"))
    evals = data.eval_splits(config)
    assert list(evals) == ["dev", "test"]
    assert [len(b) for b in evals.values()] == [2, 1]
    np.testing.assert_array_equal(evals["dev"][1]["weights"], [1, 1, 0, 0])
    np.testing.assert_array_equal(evals["test"][0]["weights"], [1, 1, 1, 0])
    assert tables.split_names(["a/dev.csv", "b/dev.csv", "c/x.csv"]) == ["a/dev.csv",
                                                                         "b/dev.csv", "x"]


def test_label_names_set_the_ids_and_are_part_of_the_run_identity(tmp_path, vocab_dir):
    rows = pair_rows(8, seed=7)
    path = write_csv(tmp_path / "train.csv", rows)
    config = make_config(vocab_dir, path, label_names=("yes", "no", "maybe"))
    (batch,) = take(data.train_batches(config), 1)
    order = text.EpochOrder(config.train.seed, 8)
    expected = [("yes", "no", "maybe").index(rows[j]["label"]) for j in order.indices(0, BATCH)]
    np.testing.assert_array_equal(batch["labels"], expected)
    identity = run_identity(config)
    assert identity["label_names"] == ["yes", "no", "maybe"]
    resume = Resume(3, str(tmp_path / "checkpoints/3"),
                    {**identity, "label_names": ["maybe", "no", "yes"], "tensors": {},
                     "units": []})
    with pytest.raises(CheckpointMismatch, match=r"written with label_names=\['maybe', 'no', "
                                                 r"'yes'\], this run has label_names=\['yes'"):
        check_compatible(resume, identity, [], None)
    check_compatible(Resume(3, "c", {**identity, "tensors": {}, "units": []}), identity, [],
                     None)


# --------------------------------------------------------------------------------------------
# One line for every bad input.

def expect_error(match, vocab_dir, name, **keys):
    num_labels = keys.pop("num_labels", 3)
    with pytest.raises(ValueError, match=match):
        make_config(vocab_dir, name, num_labels=num_labels, **keys)


def test_file_errors_name_the_file_line_and_column(tmp_path, vocab_dir):
    rows = pair_rows(20, seed=8)
    good = write_csv(tmp_path / "train.csv", rows)
    expect_error(r"config.data.name='.*missing.csv': file not found", vocab_dir,
                 str(tmp_path / "missing.csv"))
    no_column = write_csv(tmp_path / "nocol.csv", rows, columns=("first", "label"))
    expect_error(r"nocol.csv:2: no column 'second' \(it has 'first', 'label'\)", vocab_dir,
                 no_column)
    short = tmp_path / "short.csv"
    short.write_text("first,second,label\na b,c,yes\nd e,f\n")
    expect_error(r"short.csv:3: column 'label' has no value", vocab_dir, str(short))
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    expect_error(r"empty.csv: no examples", vocab_dir, str(empty))
    header = tmp_path / "header.tsv"
    header.write_text("first\tsecond\tlabel\n")
    expect_error(r"header.tsv: no examples", vocab_dir, str(header))
    blank = tmp_path / "blank.jsonl"
    blank.write_text('{"first": "a", "second": "b", "label": ""}\n')
    expect_error(r"blank.jsonl:1: column 'label' is empty", vocab_dir, str(blank))
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"first": "a", "second": "b", "label": "yes"}\n{"first": \n')
    expect_error(r"bad.jsonl:2: not a JSON object", vocab_dir, str(bad_json))
    unknown = write_csv(tmp_path / "dev.csv", pair_rows(4, seed=9, labels=("yes", "nope")))
    expect_error(r"dev.csv:\d: column 'label' = 'nope' is not a known label \('maybe', 'no', "
                 r"'yes'\)", vocab_dir, good, eval_files=(unknown,))
    expect_error(r"train.csv: 3 distinct labels \('maybe', 'no', 'yes'\) but "
                 r"config.model.num_labels=2", vocab_dir, good, num_labels=2)
    expect_error(r"config.data.label_names has 2 names, config.model.num_labels=3", vocab_dir,
                 good, label_names=("yes", "no"))
    ints = write_jsonl(tmp_path / "ints.jsonl", [{**r, "label": i} for i, r in enumerate(rows)])
    expect_error(r"ints.jsonl:4: column 'label' = 3 is outside \[0, "
                 r"config.model.num_labels=3\)", vocab_dir, ints)
    expect_error(r"train.csv:2: column 'label' = '(yes|no|maybe)' is not a finite number "
                 r"\(config.model.num_labels=1: a regression\)", vocab_dir, good, num_labels=1)
    expect_error(r"config.data.eval_files: an eval file may not be named train", vocab_dir, good,
                 eval_files=(good,))
    wrong = tmp_path / "train.txt"
    wrong.write_text("x")
    expect_error(r"config.data.name='.*train.txt' is not one of", vocab_dir, str(wrong))


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
def test_a_file_starting_with_a_byte_order_mark_reads_its_first_column(fmt, tmp_path,
                                                                         vocab_dir):
    """Excel's "CSV UTF-8" export starts with U+FEFF; read as plain UTF-8 it would be part of
    the first column's name, which is then not found."""
    rows = pair_rows(6, seed=16)
    plain = str(tmp_path / f"plain.{fmt}")
    if fmt == "jsonl":
        write_jsonl(plain, rows)
    else:
        write_csv(plain, rows, delimiter="," if fmt == "csv" else "\t")
    marked = tmp_path / f"marked.{fmt}"
    marked.write_bytes(b"\xef\xbb\xbf" + open(plain, "rb").read())
    expected = take(data.train_batches(make_config(vocab_dir, plain)), 1)[0]
    assert_batch(take(data.train_batches(make_config(vocab_dir, str(marked))), 1)[0], expected)


def test_a_column_named_twice_or_a_directory_is_one_line(tmp_path, vocab_dir):
    rows = pair_rows(6, seed=17)
    twice = tmp_path / "twice.csv"
    twice.write_text("first,second,first,label\na,b,c,yes\n")
    expect_error(r"^.*twice.csv:1: the header names column 'first' twice \(only one of the two "
                 r"would be read\)$", vocab_dir, str(twice))
    tsv = tmp_path / "twice.tsv"
    tsv.write_text("label\tfirst\tsecond\tlabel\nyes\ta\tb\tno\n")
    expect_error(r"twice.tsv:1: the header names column 'label' twice", vocab_dir, str(tsv))
    jsonl = tmp_path / "twice.jsonl"
    jsonl.write_text('{"first": "a", "second": "b", "label": "yes"}\n'
                     '{"first": "a", "second": "b", "second": "c", "label": "no"}\n')
    expect_error(r"twice.jsonl:2: this object names column 'second' twice", vocab_dir,
                 str(jsonl))
    # a column the run does not read may repeat: Excel's trailing empty columns are all ''
    spare = tmp_path / "spare.csv"
    spare.write_text("first,second,label,,\n" + "".join(
        f"{r['first']},{r['second']},{r['label']},,\n" for r in rows))
    make_config(vocab_dir, str(spare))
    folder = tmp_path / "folder.csv"
    folder.mkdir()
    expect_error(r"^config.data.name='.*folder.csv' is a directory, not a file$", vocab_dir,
                 str(folder))
    good = write_csv(tmp_path / "train.csv", rows)
    expect_error(r"^config.data.eval_files='.*folder.csv' is a directory, not a file$",
                 vocab_dir, good, eval_files=(str(folder),))


def test_key_errors(tmp_path, vocab_dir):
    good = write_csv(tmp_path / "train.csv", pair_rows(6, seed=10))
    expect_error(r"config.data.text_columns=\('a', 'b', 'c'\) must name one column", vocab_dir,
                 good, text_columns=("a", "b", "c"))
    expect_error(r"config.data.label_column='first' is also a text column", vocab_dir, good,
                 label_column="first")
    expect_error(r"config.data.metric='pearson_spearman' does not fit "
                 r"config.model.num_labels=3", vocab_dir, good, metric="pearson_spearman")
    expect_error(r"config.data.eval_files=.* is for local files", vocab_dir,
                 "hf:" + str(tmp_path), eval_files=(good,))
    for name in ("hf:", "hf: "):  # datasets would say 'list index out of range'
        expect_error(rf"^config.data.name={name!r} names no dataset: hf:DIR or hf:NAME$",
                     vocab_dir, name)


# --------------------------------------------------------------------------------------------
# Hugging Face datasets.

@pytest.fixture(scope="module")
def saved_dataset(tmp_path_factory):
    datasets = pytest.importorskip("datasets")  # the "test" / "datasets" extras install it
    features = datasets.Features({"first": datasets.Value("string"),
                                  "second": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["neg", "pos"])})
    splits = {}
    for split, n, seed in (("train", 10, 11), ("validation", 5, 12), ("test", 3, 13)):
        rows = pair_rows(n, seed, labels=("neg", "pos"))
        splits[split] = datasets.Dataset.from_dict(
            {"first": [r["first"] for r in rows], "second": [r["second"] for r in rows],
             "label": [["neg", "pos"].index(r["label"]) if split != "test" else -1
                       for r in rows]}, features=features)
    path = str(tmp_path_factory.mktemp("hf") / "pairs")
    datasets.DatasetDict(splits).save_to_disk(path)
    return path, {s: d for s, d in splits.items()}


def test_a_saved_dataset_batches_like_files(saved_dataset, vocab_dir, reference_tokenizer):
    path, splits = saved_dataset
    config = make_config(vocab_dir, "hf:" + path, num_labels=2)
    assert data.label_names(config) == ["neg", "pos"]
    train = splits["train"]
    batches = take(data.train_batches(config), 3)
    order = text.EpochOrder(config.train.seed, len(train))
    for i, batch in enumerate(batches):
        picked = [train[int(j)] for j in order.indices(i * BATCH, BATCH)]
        labels = np.asarray([r["label"] for r in picked], np.int32)
        assert_batch(batch, reference(reference_tokenizer, picked, labels))
    resumed = take(data.train_batches(config, start_step=2), 1)
    assert_batch(resumed[0], batches[2])
    evals = data.eval_splits(config)
    assert list(evals) == ["validation"] and evals["validation"][1]["weights"].sum() == 1


def test_saved_dataset_errors(saved_dataset, vocab_dir, tmp_path):
    datasets = pytest.importorskip("datasets")
    path, splits = saved_dataset
    expect_error(r"config.data.eval_splits='dev': hf:.* has no such split \(it has 'train', "
                 r"'validation', 'test'\)", vocab_dir, "hf:" + path, num_labels=2,
                 eval_splits=("dev",))
    expect_error(r"hf:.*\[test\] row 0: column 'label' = -1 is not one of its 2 classes",
                 vocab_dir, "hf:" + path, num_labels=2, eval_splits=("test",))
    expect_error(r"hf:.*\[train\]: no column 'sentence'", vocab_dir, "hf:" + path,
                 num_labels=2, text_columns=("sentence",))
    expect_error(r"its label column has 2 classes \(neg, pos\), config.model.num_labels=3",
                 vocab_dir, "hf:" + path)
    single = str(tmp_path / "single")
    splits["train"].save_to_disk(single)
    expect_error(r"holds one Dataset without splits", vocab_dir, "hf:" + single, num_labels=2)
    (tmp_path / "nothing").mkdir()
    expect_error(r"config.data.name='hf:.*nothing' \(config.data.hf_subset=''\): cannot load it",
                 vocab_dir, "hf:" + str(tmp_path / "nothing"), num_labels=2)
    assert datasets  # imported for the skip


def test_load_dataset_reads_a_folder_of_split_files(tmp_path, vocab_dir, monkeypatch):
    """hf:NAME goes through datasets.load_dataset (a hub name online, its cache offline); a
    local folder of files named by split takes the same path without a network."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    folder = tmp_path / "pairs"
    folder.mkdir()
    train = pair_rows(9, seed=14)
    write_jsonl(folder / "train.jsonl", train)
    write_jsonl(folder / "validation.jsonl", pair_rows(4, seed=15))
    config = make_config(vocab_dir, f"hf:{folder}")
    assert data.label_names(config) == sorted({r["label"] for r in train})
    (batch,) = take(data.train_batches(config), 1)
    order = text.EpochOrder(config.train.seed, 9)
    names = data.label_names(config)
    np.testing.assert_array_equal(batch["labels"], [names.index(train[j]["label"])
                                                    for j in order.indices(0, BATCH)])
    assert [len(b) for b in data.eval_splits(config).values()] == [1]


# --------------------------------------------------------------------------------------------
# docs/guide/configs.md's CSV command, end to end.

@pytest.mark.slow
def test_the_csv_example_trains_scores_and_guards_its_label_mapping(tmp_path):
    from skyjax import names
    from tests.helpers import run_module

    workdir = tmp_path / "run"
    short = ["--config.train.steps=4", "--config.checkpoint.every=2", "--config.train.log_every=2"]
    proc = run_module("skyjax.main", "--config=configs/csv_pairs.py", f"--workdir={workdir}",
                      *short)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((workdir / "labels.json").read_text()) == {
        "label_names": ["contradiction", "entailment", "neutral"]}
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["metric"] == "matthews"
    assert set(summary["eval_scores"]) == {"accuracy", "matthews"}
    assert summary["eval_by_split"]["dev"]["examples"] == 200
    records = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
    assert any(r.get("split") == "dev" and "eval_matthews" in r for r in records)
    # resuming under another label order is refused before anything is built, in one line
    proc = run_module("skyjax.main", "--config=configs/csv_pairs.py", f"--workdir={workdir}",
                      *short[:1], "--config.train.steps=6",
                      "--config.data.label_names=('neutral', 'entailment', 'contradiction')")
    assert proc.returncode == names.EXIT_BAD_INPUT, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "label_names=['contradiction', 'entailment', 'neutral']" in last, last
    assert "this run has label_names=['neutral', 'entailment', 'contradiction']" in last, last


def test_without_the_datasets_package_hf_data_says_what_to_install(tmp_path, vocab_dir,
                                                                   monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)  # an import of it fails
    expect_error(r"config.data.name='hf:...' needs Hugging Face datasets: pip install -e "
                 r"'.\[datasets\]'", vocab_dir, "hf:" + str(tmp_path / "x"), num_labels=2)
