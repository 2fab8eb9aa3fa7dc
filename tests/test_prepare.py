"""`python -m skyjax.data.prepare` (skyjax/data/glue_build.py): a GLUE task written as array_record
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


def test_a_malformed_task_file_or_data_dir_is_one_line_naming_it(tmp_path):
    """TFDS said only 'invalid literal for int()' or "KeyError: 'sentence2'", and a --data_dir
    that is a file was 'FileExistsError'."""
    write_rte(tmp_path / "glue")
    train = tmp_path / "glue" / "RTE" / "train.tsv"
    lines = train.read_text().splitlines()
    lines[3] = "2\ta b\tc d\tmaybe"  # the file's line 4
    train.write_text("\n".join(lines) + "\n")
    proc = run_module("skyjax.data.prepare", "glue/rte", f"--data_dir={tmp_path / 'd'}",
                      f"--extracted={tmp_path / 'glue'}")
    assert proc.returncode == names.EXIT_BAD_INPUT, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].endswith(
        f"skyjax.data.prepare: DataError: {train}:4: cannot read this row (ValueError: invalid "
        "literal for int() with base 10: 'maybe'; the labels are entailment, not_entailment)")
    train.write_text("index\tsentence1\tlabel\n0\ta b\tentailment\n")
    proc = run_module("skyjax.data.prepare", "glue/rte", f"--data_dir={tmp_path / 'd'}",
                      f"--extracted={tmp_path / 'glue'}")
    assert proc.returncode == names.EXIT_BAD_INPUT, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].endswith(
        f"{train}: no column 'sentence2' (its header has 'index', 'sentence1', 'label')")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    proc = run_module("skyjax.data.prepare", "glue/rte", f"--data_dir={a_file}",
                      f"--extracted={tmp_path / 'glue'}")
    assert proc.returncode == names.EXIT_BAD_INPUT, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"skyjax.data.prepare: DataError: --data_dir={str(a_file)!r} is a file, not a directory"]


def test_offline_it_fails_at_once_and_names_extracted(tmp_path, monkeypatch):
    """TFDS retries a download for minutes: the host is tried once (here a closed loopback
    port), before TFDS starts, and the line names the offline way."""
    import socket

    from skyjax.data import glue_build as prepare

    for proxy in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(proxy, raising=False)
        monkeypatch.delenv(proxy.upper(), raising=False)
    # the real task's download host is what is tried
    assert prepare._urls(tfds.builder("glue/rte", data_dir=str(tmp_path / "d"))) == [
        "https://dl.fbaipublicfiles.com/glue/data/RTE.zip"]
    assert len(prepare._urls(tfds.builder("glue/mrpc", data_dir=str(tmp_path / "d")))) == 3
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: the connection is refused at once
    monkeypatch.setattr(prepare, "_urls", lambda builder: [f"http://127.0.0.1:{port}/RTE.zip"])
    with pytest.raises(prepare.DataError, match=rf"^glue/rte: cannot reach 127\.0\.0\.1:{port} "
                                                r"to download it \(ConnectionRefusedError: .*\); "
                                                r"offline, download GLUE's files elsewhere, "
                                                r"unpack them and give their directory as "
                                                r"--extracted DIR$"):
        prepare.prepare("glue/rte", str(tmp_path / "d"))
    listening = socket.create_server(("127.0.0.1", 0))
    with listening:  # a host that answers is reachable
        assert prepare._unreachable(f"http://127.0.0.1:{listening.getsockname()[1]}/x") is None
        # through a proxy, the proxy is what must answer (as for the download itself)
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{listening.getsockname()[1]}")
        assert prepare._unreachable("http://glue.invalid/RTE.zip") is None
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{port}")
        assert "ConnectionRefusedError" in prepare._unreachable("http://glue.invalid/RTE.zip")
