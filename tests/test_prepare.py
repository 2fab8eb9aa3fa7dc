"""`python -m skyjax.data.prepare` (skyjax/data/prepare.py): a GLUE task written as array_record
from GLUE's own files (unpacked here, as --extracted reads them: everything but the download),
then read back by the GLUE reader; bad input is one line."""

from __future__ import annotations

import numpy as np
import pytest

from skyjax import names
from skyjax.data import glue
from tests.helpers import run_module

tfds = pytest.importorskip("tensorflow_datasets")

WORDS = list("abcdefghij")


def write_rte(root, rows_per_split=(12, 5, 4)):
    """GLUE's RTE folder: train/dev with labels, test without (tab-separated, a header)."""
    rng = np.random.default_rng(0)
    folder = root / "RTE"
    folder.mkdir(parents=True)
    written = {}
    for split, n in zip(("train", "dev", "test"), rows_per_split):
        rows = [(" ".join(rng.choice(WORDS, 3)), " ".join(rng.choice(WORDS, 4)),
                 str(rng.choice(["entailment", "not_entailment"]))) for _ in range(n)]
        header = "index\tsentence1\tsentence2" + ("\tlabel" if split != "test" else "")
        lines = [f"{i}\t{a}\t{b}" + (f"\t{c}" if split != "test" else "")
                 for i, (a, b, c) in enumerate(rows)]
        (folder / f"{split}.tsv").write_text("\n".join([header, *lines]) + "\n")
        written[split] = rows
    return written


def test_prepare_writes_array_record_that_the_reader_reads(tmp_path):
    rows = write_rte(tmp_path / "glue")
    data_dir = tmp_path / "tfds"
    proc = run_module("skyjax.data.prepare", "glue/rte", f"--data_dir={data_dir}",
                      f"--extracted={tmp_path / 'glue'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list((data_dir / "glue" / "rte").glob("*/glue-train.array_record-*"))
    for split, tsv in (("train", "train"), ("validation", "dev")):
        src = glue.open_split("glue/rte", split, str(data_dir))
        got = sorted((src[i]["sentence1"].decode(), src[i]["sentence2"].decode(),
                      int(src[i]["label"])) for i in range(len(src)))
        want = sorted((a, b, ["entailment", "not_entailment"].index(c)) for a, b, c in rows[tsv])
        assert got == want
    again = run_module("skyjax.data.prepare", "glue/rte", f"--data_dir={data_dir}")
    assert again.returncode == 0 and "already prepared" in again.stderr


def test_bad_input_is_one_line(tmp_path):
    proc = run_module("skyjax.data.prepare", "glue/nope", f"--data_dir={tmp_path}")
    assert proc.returncode == names.EXIT_BAD_INPUT
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "skyjax.data.prepare: DataError: config.data.name='glue/nope' is not a GLUE task")
    proc = run_module("skyjax.data.prepare", "glue/rte", f"--data_dir={tmp_path / 'd'}",
                      f"--extracted={tmp_path / 'absent'}")
    assert proc.returncode == names.EXIT_BAD_INPUT
    assert "--extracted=" in proc.stderr and "directory not found" in proc.stderr
    write_rte(tmp_path / "glue")
    (tmp_path / "glue" / "RTE" / "dev.tsv").unlink()
    proc = run_module("skyjax.data.prepare", "glue/rte", f"--data_dir={tmp_path / 'd'}",
                      f"--extracted={tmp_path / 'glue'}")
    assert proc.returncode == names.EXIT_BAD_INPUT, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("skyjax.data.prepare: DataError: glue/rte: a file is missing") \
        and "dev.tsv" in last and "--extracted=" in last
