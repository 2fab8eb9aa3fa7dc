"""Predictions (``python -m skyjax.predict``, skyjax/export/inference.py and glue_submission.py): a
run of the CSV walkthrough's config predicts its dev file row by row as the eval path's last
stage does (same class, same per-example loss to 1e-5; the run's own eval figures recomputed from
the file), from its workdir and from its export alike; rows keep their ``id`` / ``idx``, and a
TSV reader gets every row back whatever its id holds; a DiLoCo run's replicas predict as their
average or the one asked; GLUE's test splits become the server's files; bad input is one line and
exit 64 (a missing tokenizer named as what it is)."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

from skyjax.names import EXIT_BAD_INPUT
from tests.helpers import REPO, diloco_run, make_plan, make_profile, run_module, write_vocab

transformers = pytest.importorskip("transformers")

CSV_CONFIG = os.path.join(REPO, "configs", "csv_pairs.py")
DEV = os.path.join(REPO, "configs", "data", "pairs", "dev.csv")
TINY_BERT = os.path.join(REPO, "tests", "fixtures", "tiny_bert")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> str:
    """configs/csv_pairs.py on its 2 emulated devices, 2 stages, started from the tiny hub
    checkpoint (random, not-small weights: its predictions differ from row to row), trained 10
    steps, checkpointed at the end, every dev row evaluated. A fixed profile: no profiling."""
    from skyjax.profile.format import save_profile

    workdir = tmp_path_factory.mktemp("csv_run")
    save_profile(make_profile(np.full((4, 2), 1e-3)), str(workdir / "profile.json"))
    done = run_module("skyjax.main", f"--config={CSV_CONFIG}", f"--workdir={workdir / 'run'}",
                      f"--config.model.pretrained={TINY_BERT}",
                      f"--config.profile.path={workdir / 'profile.json'}",
                      "--config.allocation.strategy=even", "--config.train.log_every=5",
                      "--config.train.steps=10", "--config.checkpoint.every=10",
                      "--config.data.eval_examples=-1")
    assert done.returncode == 0, done.stderr[-4000:]
    return str(workdir / "run")


def predict(*args: str):
    return run_module("skyjax.predict", *args)


def read_tsv(path) -> tuple[list[str], list[list[str]]]:
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n").split("\t") for line in f]
    return lines[0], lines[1:]


def eval_path(workdir: str) -> list[np.ndarray]:
    """The dev split through the eval path of training, on one stage holding every unit
    restored from the checkpoint: per batch (loss, prediction, label, weight)."""
    import jax

    from skyjax import data, optim
    from skyjax.checkpoint import find_resume, restore_units
    from skyjax.export.trained import run_config
    from skyjax.models import build
    from skyjax.runtime.batches import eval_microbatches
    from skyjax.runtime.local_executor import LocalExecutor

    config = run_config(workdir)
    chain = build.abstract_chain(config.model, config.train.seed, config.allocation.granularity)
    optimizer = optim.make_optimizer(config.train, clip=False)
    states = restore_units(find_resume(os.path.join(workdir, "checkpoints")), chain,
                           range(len(chain)), optimizer)
    ex = LocalExecutor(chain, make_plan([(0, len(chain))], "gpipe", 1), jax.devices()[:1],
                       batch_size=config.data.batch_size, seq_len=config.data.seq_len,
                       optimizer=optimizer, max_grad_norm=None, rng=lambda *a: None,
                       unit_states=states)
    try:
        batches = data.eval_splits(config)["dev"]
        return ex.stages[0].run_eval(eval_microbatches(batches, 1))
    finally:
        ex.close()


@pytest.mark.slow
def test_csv_predictions_are_the_eval_paths(run, tmp_path):
    from skyjax import scores
    from skyjax.export import inference, trained
    from skyjax.data import text

    out = tmp_path / "dev.tsv"
    done = predict("--workdir", run, "--data", DEV, "--out", str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    header, rows = read_tsv(out)
    with open(DEV, encoding="utf-8") as f:
        dev = list(csv.DictReader(f))
    assert header == ["id", "prediction"] and [r[0] for r in rows] == [str(i) for i in range(200)]
    names = json.loads(open(os.path.join(run, "labels.json")).read())["label_names"]
    got = [names.index(r[1]) for r in rows]
    loss, pred, label, weight = (np.concatenate([np.asarray(r[i]).reshape(-1)
                                                 for r in eval_path(run)]) for i in range(4))
    keep = weight > 0
    assert keep.sum() == 200 and len(set(got)) > 1  # a model that tells classes apart
    np.testing.assert_array_equal(got, pred[keep])
    # The same rows' logits give the eval path's per-example loss.
    model = trained.from_workdir(run)
    texts = [[r[c] for r in dev] for c in ("premise", "hypothesis")]
    tok = text.load_tokenizer(model.config, model.task)
    logits = inference.logits_of(model, tok, texts, 24, batch_size=7)
    logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - logits.max(1, keepdims=True)
    np.testing.assert_allclose(-logp[np.arange(200), label[keep]], loss[keep], atol=1e-5)
    # The run's own (pipelined, two-stage) eval figures, recomputed from the file.
    summary = json.loads(open(os.path.join(run, "summary.json")).read())["eval_by_split"]["dev"]
    ours = scores.summarize([(loss[keep], np.asarray(got), label[keep], weight[keep])],
                            "matthews")
    assert ours["eval_accuracy"] == pytest.approx(summary["accuracy"], abs=1e-12)
    assert ours["eval_matthews"] == pytest.approx(summary["matthews"], abs=1e-12)
    # An export predicts the same file.
    exported = tmp_path / "hf"
    done = run_module("skyjax.export", "--workdir", run, "--out", str(exported))
    assert done.returncode == 0, done.stderr[-4000:]
    again = tmp_path / "again.tsv"
    done = predict("--model", str(exported), "--data", DEV, "--out", str(again))
    assert done.returncode == 0, done.stderr[-4000:]
    assert again.read_text() == out.read_text()


@pytest.mark.slow
def test_rows_keep_their_ids_in_jsonl_and_tsv(run, tmp_path):
    rows = [{"idx": 17, "premise": "the cat sees the tree", "hypothesis": "the cat sees"},
            {"idx": 4, "premise": "the dog", "hypothesis": "the horse sees the ball"}]
    jsonl = tmp_path / "test.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tsv = tmp_path / "test.tsv"
    tsv.write_text("id\tpremise\thypothesis\n" + "".join(
        f"a{r['idx']}\t{r['premise']}\t{r['hypothesis']}\n" for r in rows), encoding="utf-8")
    for path, ids in ((jsonl, ["17", "4"]), (tsv, ["a17", "a4"])):
        out = tmp_path / f"{path.name}.out"
        done = predict("--workdir", run, "--data", str(path), "--out", str(out))
        assert done.returncode == 0, done.stderr[-4000:]
        header, got = read_tsv(out)
        assert [r[0] for r in got] == ids
        assert {r[1] for r in got} <= {"contradiction", "entailment", "neutral"}


@pytest.mark.slow
def test_the_export_walkthrough_commands_work_as_written(run, tmp_path):
    """docs/guide/export.md's export, predict and transformers commands, as written, on this
    module's run (trained with fewer steps than the walkthrough's first command)."""
    import shlex
    import subprocess
    import sys

    with open(os.path.join(REPO, "docs", "guide", "export.md"), encoding="utf-8") as f:
        guide = f.read()
    block = guide.split("# Take the model home")[1].split("```bash\n")[1].split("```")[0]
    lines = [ln for ln in block.splitlines() if ln and not ln.startswith("#")]
    assert lines[0].startswith("python -m skyjax.main --config configs/csv_pairs.py")
    assert "--config.checkpoint.every=" in lines[0]  # else no checkpoint to export
    paths = [("/tmp/skyjax_csv_hf", str(tmp_path / "hf")),
             ("/tmp/skyjax_csv/test.tsv", str(tmp_path / "test.tsv")), ("/tmp/skyjax_csv", run)]
    ran = []
    for line in lines[1:]:
        if line.startswith("pip "):
            continue
        for old, new in paths:
            line = line.replace(old, new)
        args = shlex.split(line)
        assert args[0] == "python", line
        done = subprocess.run([sys.executable, *args[1:]], cwd=REPO, capture_output=True,
                              text=True, timeout=300, stdin=subprocess.DEVNULL,
                              env=dict(os.environ, JAX_PLATFORMS="cpu"))
        assert done.returncode == 0, (line, done.stderr[-3000:])
        ran.append(args[1:3])
        if args[1] == "-c":
            assert "'label': '" in done.stdout, done.stdout
    assert ran == [["-m", "skyjax.export"], ["-m", "skyjax.predict"], ["-c", args[2]]]
    header, rows = read_tsv(tmp_path / "test.tsv")
    assert [r[0] for r in rows] == [f"t{i:02d}" for i in range(24)]


ODD_IDS = ["plain", "tab\there", "new\nline", "cr\rhere", 'a "quote"', '"quoted"', "both\t\n",
           " spaced ", "crlf\r\n"]


def test_the_tsv_gives_a_tsv_reader_its_rows_back(tmp_path):
    """Ids holding tabs, newlines, carriage returns or quotes are quoted (csv's QUOTE_MINIMAL,
    tab-delimited): Python's csv reader gets 25 rows back from 25 written; plain ids are
    written as they are."""
    from skyjax.export import inference

    ids = [ODD_IDS[i % len(ODD_IDS)] + str(i) for i in range(25)]
    values = [("a\tlabel" if i % 3 == 0 else 0.125 * i) for i in range(25)]
    path = tmp_path / "p.tsv"
    inference.write_tsv(str(path), ids, values)
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["id", "prediction"] and len(rows) == 26
    assert rows[1:] == [[i, inference.format_value(v)] for i, v in zip(ids, values)]
    inference.write_tsv(str(tmp_path / "plain.tsv"), ["0", "a1"], ["yes", 0.5])
    assert (tmp_path / "plain.tsv").read_bytes() == b"id\tprediction\n0\tyes\na1\t0.5\n"


def test_a_missing_tokenizer_is_named_as_what_it_is(tmp_path):
    """A directory without tokenizer files: an export of a run with text (its skyjax.json
    names text columns) lost them; one of the synthetic task never had one; another is not
    an export."""
    from skyjax.export import inference
    from skyjax.export.trained import ExportError

    cases = (({"dataset": "/data/train.csv", "text_columns": ["premise", "hypothesis"]},
              f"--model {tmp_path}: the tokenizer files are missing from the export directory "
              f"(expected tokenizer.json or vocab.txt, with tokenizer_config.json); its "
              f"skyjax.json names a run on '/data/train.csv' with text columns 'premise', "
              f"'hypothesis': copy them back, or export the run again"),
             ({"dataset": "synthetic"}, "names a run on 'synthetic', without text columns"),
             ({}, "has no tokenizer (neither tokenizer.json nor vocab.txt is in the directory)"))
    for meta, words in cases:
        with pytest.raises(ExportError) as e:
            inference.load_tokenizer(str(tmp_path), meta)
        assert words in str(e.value) and "\n" not in str(e.value)
        assert ("without text" in str(e.value)) == (meta.get("dataset") == "synthetic")


@pytest.mark.slow
def test_ids_holding_tabs_and_newlines_come_back_from_the_tsv(run, tmp_path):
    ids = [ODD_IDS[i % len(ODD_IDS)] + str(i) for i in range(25)]
    data = tmp_path / "rows.csv"
    with open(data, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "premise", "hypothesis"])
        w.writerows([i, "the cat sees", "the tree"] for i in ids)
    out = tmp_path / "p.tsv"
    done = predict("--workdir", run, "--data", str(data), "--out", str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    with open(out, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert len(rows) == 26 and [r[0] for r in rows[1:]] == ids
    assert {r[1] for r in rows[1:]} <= {"contradiction", "entailment", "neutral"}


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_diloco_runs_replicas_predict_as_asked(tmp_path):
    """A two-pipeline DiLoCo run checkpointed between outer steps predicts with its replicas'
    average by default (said in one line) and with pipeline 1's under ``--replica 1``: the
    predictions of the model the export would hold."""
    from skyjax.data import text
    from skyjax.export import inference, trained

    workdir = diloco_run(tmp_path)
    params = {}
    for replica, said in (("average", "predicting with their average; --replica N or anchor "
                                      "for one"),
                          ("1", "predicting with pipeline 1's (--replica 1;")):
        out = tmp_path / f"{replica}.tsv"
        done = predict("--workdir", workdir, "--data", DEV, "--out", str(out), "--replica",
                       replica)
        assert done.returncode == 0, done.stderr[-4000:]
        assert (f"skyjax.predict: replicas differ (2 pipelines, diloco): {said}"
                in done.stdout), done.stdout
        model = trained.from_workdir(workdir, replica=replica)
        with open(DEV, encoding="utf-8") as f:
            dev = list(csv.DictReader(f))
        tok = text.load_tokenizer(model.config, model.task)
        logits = inference.logits_of(model, tok, [[r[c] for r in dev]
                                                  for c in ("premise", "hypothesis")], 24)
        header, rows = read_tsv(out)
        assert [r[1] for r in rows] == inference.predictions(model, logits)
        params[replica] = model.params
    import jax

    assert not all(jax.tree.leaves(jax.tree.map(np.array_equal, *params.values())))
    done = predict("--workdir", workdir, "--data", DEV, "--out", str(tmp_path / "x"),
                   "--replica", "2")
    assert done.returncode == 2 and "--replica 2: checkpoint 4 holds 2 replicas; choose " \
        "average, 0, 1, anchor" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def one_line(proc, *expected):
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and all(e in lines[0] for e in expected), proc.stderr[-3000:]


@pytest.mark.slow
def test_bad_input_is_one_line(run, tmp_path):
    single = tmp_path / "single.csv"
    single.write_text("sentence\nthe cat\n", encoding="utf-8")
    one_line(predict("--workdir", run, "--data", str(single), "--out", str(tmp_path / "o.tsv")),
             f"{single}:2: no column 'premise'", "it has 'sentence'")
    exists = tmp_path / "exists.tsv"
    exists.write_text("")
    one_line(predict("--workdir", run, "--data", DEV, "--out", str(exists)),
             f"--out {exists}: exists")
    one_line(predict("--workdir", str(tmp_path), "--data", DEV, "--out", str(tmp_path / "o")),
             "config.json: not found")
    foreign = tmp_path / "foreign"  # an HF directory exported elsewhere: no skyjax.json
    done = run_module("skyjax.export", "--workdir", run, "--out", str(foreign))
    assert done.returncode == 0, done.stderr[-3000:]
    os.remove(foreign / "skyjax.json")
    one_line(predict("--model", str(foreign), "--data", DEV, "--out", str(tmp_path / "o")),
             "pass --text_columns")
    done = predict("--model", str(foreign), "--data", DEV, "--out", str(tmp_path / "o.tsv"),
                   "--text_columns", "premise,hypothesis", "--seq_len", "24")
    assert done.returncode == 0, done.stderr[-3000:]
    lost = tmp_path / "lost"  # an export whose tokenizer files were removed
    done = run_module("skyjax.export", "--workdir", run, "--out", str(lost))
    assert done.returncode == 0, done.stderr[-3000:]
    for name in os.listdir(lost):
        if name.startswith(("tokenizer", "vocab", "special_tokens")):
            os.remove(lost / name)
    one_line(predict("--model", str(lost), "--data", DEV, "--out", str(tmp_path / "o2.tsv")),
             f"--model {lost}: the tokenizer files are missing from the export directory",
             "names a run on", "train.csv")


# ------------------------------------------------------------------------------------ GLUE

@pytest.mark.parametrize("task,files", [("glue/mnli", ["MNLI-m.tsv", "MNLI-mm.tsv"]),
                                        ("glue/stsb", ["STS-B.tsv"]),
                                        ("glue/cola", ["CoLA.tsv"])])
def test_glue_test_splits_become_the_servers_files(tmp_path, task, files):
    tfds = pytest.importorskip("tensorflow_datasets")
    import tensorflow_datasets.text.glue  # noqa: F401  registers glue/*
    from flax import nnx

    from skyjax.data import glue, text
    from skyjax.export import glue_submission, inference
    from skyjax.export.trained import TrainedModel
    from skyjax.models import bert

    num_labels = glue.task(task).num_labels
    cfg = bert.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                          num_attention_heads=2, intermediate_size=32, num_labels=num_labels)
    model = TrainedModel(cfg, bert.model_params(bert.BertForSequenceClassification(
        cfg, nnx.Rngs(1))), None, None, glue.task(task))
    tok = transformers.BertTokenizerFast.from_pretrained(write_vocab(tmp_path / "vocab"))
    with tfds.testing.mock_data(policy=tfds.testing.MockPolicy.USE_CODE, num_examples=12):
        written = glue_submission.write(task, model, tok, 16, str(tmp_path / "glue"),
                                        batch_size=5)
        splits = {s: glue.open_split(task, s) for s in glue_submission.FILES[task]}
        expected = {}
        for split, source in splits.items():
            rows = [source[i] for i in range(len(source))]
            texts = [[text.as_text(r[c]) for r in rows] for c in glue.task(task).text]
            logits = inference.logits_of(model, tok, texts, 16)
            expected[split] = ([str(int(r["idx"])) for r in rows], logits)
    assert [os.path.basename(p) for p in written] == files
    for path, (split, (ids, logits)) in zip(written, expected.items()):
        header, rows = read_tsv(path)
        assert header == ["index", "prediction"] and [r[0] for r in rows] == ids
        if task == "glue/stsb":
            np.testing.assert_allclose([float(r[1]) for r in rows], logits[:, 0], rtol=1e-5)
        elif task == "glue/mnli":
            names = ("entailment", "neutral", "contradiction")
            assert [r[1] for r in rows] == [names[i] for i in logits.argmax(1)]
        else:
            assert [r[1] for r in rows] == [str(i) for i in logits.argmax(1)]
