"""Export (skyjax/export/, ``python -m skyjax.export``): a run's checkpoint as a Hugging Face
directory that ``transformers`` loads with no weight missing or unexpected, whose logits equal
skyjax's on the same batch (PyTorch against the saved parameters, <= 1e-5), whose tokenizer
encodes as the run's did, from checkpoints of one process and sublayer units, of 2 processes
and 2 stages, and of 2 pipelines computing in bf16; a hub checkpoint's run goes back under the
hub's names; a checkpoint whose replicas differ (DiLoCo between outer steps) exports their average
or the replica asked and says which, one of equal replicas exports pipeline 0's as before; bad
input is one line and exit 64, a ``--replica`` the checkpoint does not offer one line and 2.

The fast tests write their workdir here (config.json, labels.json and a checkpoint saved by
``CheckpointManager`` from units with random parameters); the slow ones train with
``python -m skyjax.main`` / ``skyjax.launch``."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

from skyjax.names import EXIT_BAD_INPUT
from tests.helpers import REPO, diloco_run, make_profile, run_module, write_vocab

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PAIRS = os.path.join(REPO, "configs", "data", "pairs")
CSV = os.path.join(REPO, "configs", "csv_pairs.py")
TINY_BERT = os.path.join(REPO, "tests", "fixtures", "tiny_bert")
SEQ = 16
LABELS = ["maybe", "no", "yes"]
PREMISES = ["a b c", "abc hi j", "d e", "j j a b c d e f g h i j"]
HYPOTHESES = ["hi", "a", "b c d e", "f"]


def write_pairs(path, n=8, labels=LABELS) -> str:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["first", "second", "label"])
        for i in range(n):
            w.writerow([PREMISES[i % 4], HYPOTHESES[(i + 1) % 4], labels[i % len(labels)]])
    return str(path)


def tiny_config(tmp_path, num_labels=3, granularity="layer", pretrained="", dtype="float32"):
    from skyjax.config import defaults

    c = defaults.base_config()
    m = c.model
    m.hidden_size, m.num_hidden_layers, m.num_attention_heads, m.intermediate_size = 32, 2, 2, 48
    m.num_labels, m.pretrained = num_labels, pretrained
    c.data.name = write_pairs(tmp_path / "train.csv",
                              labels=("0.5", "2.25") if num_labels == 1 else LABELS)
    c.data.text_columns, c.data.label_column, c.data.seq_len = ("first", "second"), "label", SEQ
    c.data.tokenizer = "" if pretrained else write_vocab(tmp_path / "vocab")
    c.allocation.granularity = granularity
    c.train.compute_dtype = dtype
    return c


def save_run(tmp_path, config, step=5) -> tuple[str, list]:
    """A workdir as a run leaves it (config.json, labels.json, checkpoint ``step``) whose units
    have random, not-small parameters; returns it and the units' parameters."""
    import jax

    from skyjax import optim
    from skyjax.checkpoint import CheckpointManager
    from skyjax.checkpoint.run import run_identity
    from skyjax.models import build

    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text(json.dumps(config.to_dict()))
    run = run_identity(config)
    if "label_names" in run:
        (workdir / "labels.json").write_text(json.dumps({"label_names": run["label_names"]}))
    chain = build.abstract_chain(config.model, 0, config.allocation.granularity)
    init = build.UnitInitializer(config.model, 0)
    rng = np.random.default_rng(3)
    params = [jax.tree.map(lambda x: np.asarray(x) + 0.2 * rng.standard_normal(x.shape)
                           .astype(np.float32), init.params(u)) for u in chain]
    optimizer = optim.make_optimizer(config.train, clip=False)
    manager = CheckpointManager(str(workdir / "checkpoints"), 1, 0, chain, optimizer,
                                {**run, "granularity": config.allocation.granularity})
    manager.save(step, {u: (p, optimizer.init(p)) for u, p in enumerate(params)})
    return str(workdir), params


def save_replicas(tmp_path, config, pipelines=2, differ=True, step=5) -> tuple[str, list]:
    """A workdir whose checkpoint is laid out as a DiLoCo run's of ``pipelines`` pipelines
    (``checkpoint.relaxed``): pipeline 0's units under ``params/``, pipeline i's under
    ``pipelines/<i>/`` (its parameters moved by noise of its own where ``differ``, else
    pipeline 0's), the anchor and the outer momentum under ``relax/``; returns it and the
    parameters ``[pipeline 0's, ..., the anchor's]``, each a list over units."""
    import jax

    from skyjax import optim
    from skyjax.checkpoint import CheckpointManager
    from skyjax.checkpoint.names import state_entries
    from skyjax.checkpoint.run import run_identity
    from skyjax.models import build

    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text(json.dumps(config.to_dict()))
    run = run_identity(config)
    chain = build.abstract_chain(config.model, 0, config.allocation.granularity)
    init = build.UnitInitializer(config.model, 0)
    rng = np.random.default_rng(4)
    noisy = lambda p: jax.tree.map(  # noqa: E731
        lambda x: np.asarray(x) + 0.2 * rng.standard_normal(x.shape).astype(np.float32), p)
    first = [noisy(init.params(u)) for u in chain]
    replicas = [first] + [[noisy(p) for p in first] if differ else first
                          for _ in range(1, pipelines)] + [[noisy(p) for p in first]]
    optimizer = optim.make_optimizer(config.train, clip=False)
    extra = []
    for u, unit in enumerate(chain):
        for i in range(1, pipelines):
            p = replicas[i][u]
            extra += [(f"pipelines/{i}/{n}", x) for n, x in
                      state_entries(unit.path, p, optimizer.init(p))]
        for state, tree in (("anchor", replicas[-1][u]), ("momentum", noisy(first[u]))):
            extra += [(f"relax/{state}/{n[len('params/'):]}", x)
                      for n, x in state_entries(unit.path, tree, None)]
    expected = {n: ((tuple(x.shape), np.asarray(x).dtype.name), "unit") for n, x in extra}
    manager = CheckpointManager(str(workdir / "checkpoints"), 1, 0, chain, optimizer,
                                {**run, "granularity": config.allocation.granularity})
    manager.save(step, {u: (p, optimizer.init(p)) for u, p in enumerate(first)},
                 extra_meta={"averaging": {"mode": "diloco", "pipelines": pipelines}},
                 extra=extra, extra_expected=expected)
    return str(workdir), replicas


def exported_units(directory, config) -> list:
    """The parameters of an export's ``model.safetensors``, per unit of ``config``'s chain, as
    :func:`save_run` returns them."""
    import jax
    from safetensors import safe_open

    from skyjax.export.hf_format import hf_name
    from skyjax.models import build

    chain = build.abstract_chain(config.model, 0, config.allocation.granularity)
    init = build.UnitInitializer(config.model, 0)
    out = []
    with safe_open(os.path.join(directory, "model.safetensors"), "np") as f:
        for unit in chain:
            prefix = tuple(int(k) if k.isdigit() else k for k in unit.path)

            def read(path, _):
                name, transpose = hf_name(prefix + tuple(k.key for k in path))
                x = f.get_tensor(name)
                return x.T if transpose else x

            out.append(jax.tree_util.tree_map_with_path(read, init.params(unit)))
    return out


def texts():
    return [PREMISES + ["the", ""], HYPOTHESES + ["hi hi", "j"]]


def skyjax_logits(config, params, batch) -> np.ndarray:
    """The run's own model (its chain at its granularity, the saved parameters) on ``batch``."""
    from skyjax.models import bert, build

    chain = build.abstract_chain(config.model, 0, config.allocation.granularity)
    carry = bert.initial_carry(batch["input_ids"], batch["token_type_ids"],
                               batch["attention_mask"])
    return np.asarray(bert.apply_units(chain, params, carry, None, False)["logits"])


def hf_logits(directory, batch) -> np.ndarray:
    """``AutoModelForSequenceClassification`` of ``directory`` (PyTorch) on ``batch``; no weight
    may be missing, unexpected or of another shape."""
    model, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        directory, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    with torch.no_grad():
        out = model.eval()(**{k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()})
    return out.logits.numpy()


def export(workdir, out, *args):
    return run_module("skyjax.export", "--workdir", str(workdir), "--out", str(out), *args)


def one_line(proc, *expected):
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and all(e in lines[0] for e in expected), proc.stderr[-3000:]


# ------------------------------------------------------------------------------ in process

def test_tensor_names_are_hugging_faces_own():
    """Every parameter's name is one that HF's BertForSequenceClassification has (and the
    loader maps back, asserted by ``hf_name``), and every HF weight is named."""
    from flax import nnx

    from skyjax.export.hf_format import hf_tensors
    from skyjax.models import bert

    cfg = bert.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=3,
                          num_attention_heads=2, intermediate_size=24, num_labels=4)
    ours = hf_tensors(bert.model_params(bert.BertForSequenceClassification(cfg, nnx.Rngs(0))))
    hf = transformers.BertForSequenceClassification(transformers.BertConfig(**cfg.to_hf()))
    theirs = {k: tuple(v.shape) for k, v in hf.state_dict().items()
              if not k.endswith("position_ids")}
    assert {k: v.shape for k, v in ours.items()} == theirs


@pytest.mark.parametrize("granularity,num_labels", [("sublayer", 3), ("layer", 1)])
def test_export_loads_in_transformers_with_skyjax_logits(tmp_path, granularity, num_labels):
    from skyjax.data import text
    from skyjax.export import hf_format, trained

    config = tiny_config(tmp_path, num_labels, granularity)
    workdir, params = save_run(tmp_path, config)
    out = tmp_path / "hf"
    hf_format.write(trained.from_workdir(workdir), str(out))
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["num_labels"] == num_labels
    if num_labels == 1:
        assert hf_config["problem_type"] == "regression"
        assert hf_config["id2label"] == {"0": "LABEL_0"}
    else:
        assert hf_config["problem_type"] == "single_label_classification"
        assert hf_config["id2label"] == {"0": "maybe", "1": "no", "2": "yes"}
        assert hf_config["label2id"] == {"maybe": 0, "no": 1, "yes": 2}
    # The exported tokenizer encodes as the run's (data.text's call) does.
    task = trained.run_task(config)
    batch = text.encode(text.load_tokenizer(config, task), texts(), SEQ)
    exported = transformers.AutoTokenizer.from_pretrained(str(out))
    again = exported(*texts(), truncation=True, max_length=SEQ, padding="max_length",
                     return_tensors="np")
    for key in batch:
        np.testing.assert_array_equal(again[key], batch[key], err_msg=key)
    want = skyjax_logits(config, params, batch)
    got = hf_logits(str(out), batch)
    assert np.abs(want).max() > 0.05  # not a degenerate model
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    meta = json.loads((out / "skyjax.json").read_text())
    assert meta["text_columns"] == ["first", "second"] and meta["seq_len"] == SEQ
    assert meta["step"] == 5


def test_a_hub_checkpoints_run_exports_under_the_hubs_names(tmp_path):
    from safetensors import safe_open

    from skyjax.export import hf_format, trained

    config = tiny_config(tmp_path, 3, pretrained=TINY_BERT)
    config.data.tokenizer = write_vocab(tmp_path / "vocab")
    workdir, params = save_run(tmp_path, config)
    out = tmp_path / "hf"
    hf_format.write(trained.from_workdir(workdir), str(out))
    with safe_open(os.path.join(TINY_BERT, "model.safetensors"), "np") as f:
        hub = {k for k in f.keys() if not k.endswith("position_ids")}
    with safe_open(str(out / "model.safetensors"), "np") as f:
        assert set(f.keys()) == hub
    base = json.loads(open(os.path.join(TINY_BERT, "config.json")).read())
    got = json.loads((out / "config.json").read_text())
    assert got["architectures"] == ["BertForSequenceClassification"]
    assert {k: got[k] for k in ("vocab_size", "intermediate_size", "max_position_embeddings")} \
        == {k: base[k] for k in ("vocab_size", "intermediate_size", "max_position_embeddings")}
    ids = np.array([[2, 5, 9, 3, 7, 0, 0, 0]], np.int32)
    batch = {"input_ids": ids, "token_type_ids": np.zeros_like(ids),
             "attention_mask": (ids > 0).astype(np.int32)}
    np.testing.assert_allclose(hf_logits(str(out), batch), skyjax_logits(config, params, batch),
                               atol=1e-5, rtol=0)


def test_bad_input_is_one_line(tmp_path):
    config = tiny_config(tmp_path)
    workdir, _ = save_run(tmp_path, config)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps(config.to_dict()))
    one_line(export(empty, tmp_path / "x"), f"{empty}/checkpoints: no checkpoint",
             "--config.checkpoint.every")
    one_line(export(tmp_path / "nowhere", tmp_path / "x"), "directory not found")
    one_line(export(workdir, tmp_path), f"--out {tmp_path}: the directory exists")
    one_line(export(workdir, tmp_path / "x", "--step", "4"), "--step 4: no checkpoint 4",
             "(it has steps 5)")
    assert not (tmp_path / "x").exists()
    done = export(workdir, tmp_path / "x")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 5 of" in done.stdout and "tokenizer from" in done.stdout, done.stdout


def assert_units_equal(got, want):
    import jax

    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert g.dtype == np.float32
        np.testing.assert_array_equal(g, w)


def test_replicas_that_differ_export_their_average_or_the_one_asked(tmp_path):
    """A checkpoint whose pipelines hold different replicas (DiLoCo between outer steps)
    exports their float32 mean (summed in pipeline order), pipeline N's with ``--replica N``,
    the anchor with ``--replica anchor``; the choice is one line and skyjax.json's
    ``replica``."""
    import jax

    from skyjax.export import hf_format

    config = tiny_config(tmp_path)
    workdir, (p0, p1, anchor) = save_replicas(tmp_path, config)
    lines = hf_format.export_run(workdir, str(tmp_path / "avg"))
    assert lines[1] == ("replicas differ (2 pipelines, diloco): exporting their average; "
                        "--replica N or anchor for one"), lines
    mean = jax.tree.map(lambda a, b: (a + b) / np.float32(2), p0, p1)
    assert_units_equal(exported_units(tmp_path / "avg", config), mean)
    meta = json.loads((tmp_path / "avg" / "skyjax.json").read_text())
    assert meta["replica"] == {"taken": "average", "averaging": "diloco", "pipelines": 2,
                               "differ": True}
    for replica, want, said in ((1, p1, "exporting pipeline 1's (--replica 1;"),
                                ("0", p0, "exporting pipeline 0's (--replica 0;"),
                                ("anchor", anchor, "exporting the anchor, the last outer "
                                                   "step's model (--replica anchor)")):
        out = tmp_path / f"r{replica}"
        lines = hf_format.export_run(workdir, str(out), replica=replica)
        assert said in lines[1], lines
        assert_units_equal(exported_units(out, config), want)
        taken = json.loads((out / "skyjax.json").read_text())["replica"]["taken"]
        assert taken == (int(replica) if str(replica).isdigit() else replica)
    # on the command line; a replica the checkpoint does not hold is a usage error (2)
    done = export(workdir, tmp_path / "cli")
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("skyjax.export: replicas differ (2 pipelines, diloco): exporting their average; "
            "--replica N or anchor for one") in done.stdout.splitlines(), done.stdout
    for flag, words in (("2", ["--replica 2: checkpoint 5 holds 2 replicas",
                               "choose average, 0, 1, anchor"]),
                        ("x", ["argument --replica: 'x'", "average", "anchor"])):
        done = export(workdir, tmp_path / "bad", "--replica", flag)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
        assert all(w in lines[0] for w in words), lines
    assert not (tmp_path / "bad").exists()


def test_equal_replicas_export_pipeline_0s_as_before(tmp_path):
    """Replicas equal bit for bit (DiLoCo just after an outer step: three here, whose float32
    mean need not be each) export pipeline 0's; an exact run's checkpoint holds one replica: its
    export has no ``replica`` record and says nothing, and ``--replica 1`` or ``anchor`` there
    is one line naming the flag and the choices, exit 2."""
    from skyjax.export import hf_format

    config = tiny_config(tmp_path)
    workdir, (p0, *_) = save_replicas(tmp_path, config, pipelines=3, differ=False)
    lines = hf_format.export_run(workdir, str(tmp_path / "same"))
    assert lines[1] == "replicas identical (3 pipelines, diloco): exporting them (pipeline 0's)"
    assert_units_equal(exported_units(tmp_path / "same", config), p0)
    assert json.loads((tmp_path / "same" / "skyjax.json").read_text())["replica"]["differ"] \
        is False
    exact = tmp_path / "exact"
    exact.mkdir()
    workdir, params = save_run(exact, tiny_config(exact))
    lines = hf_format.export_run(workdir, str(exact / "hf"))
    assert len(lines) == 2 and not any(line.startswith("replicas") for line in lines), lines
    assert "replica" not in json.loads((exact / "hf" / "skyjax.json").read_text())
    assert_units_equal(exported_units(exact / "hf", config), params)
    for flag, words in (("1", "--replica 1: checkpoint 5 holds one replica (exact averaging"),
                        ("anchor", "--replica anchor: checkpoint 5 has no anchor")):
        done = export(workdir, exact / "bad", "--replica", flag)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
        assert words in lines[0] and lines[0].endswith("choose average, 0 (--help for usage)")


# ------------------------------------------------------------------- trained runs (slow)

TINY_RUN = ["--config.model.hidden_size=32", "--config.model.num_hidden_layers=2",
            "--config.model.num_attention_heads=2", "--config.model.intermediate_size=64",
            "--config.profile.repeats=1", "--config.data.eval_examples=0",
            "--config.train.steps=4", "--config.checkpoint.every=4"]


def check_export_of(workdir: str, out) -> dict:
    """Exports ``workdir``; the HF model's logits on dev rows equal those of the units the
    training's restore path rebuilds from the checkpoint, whose tensors the export holds bit for
    bit; returns the checkpoint's meta.json."""
    from safetensors import safe_open

    from skyjax import optim
    from skyjax.checkpoint import find_resume, restore_units
    from skyjax.data import text
    from skyjax.export.hf_format import hf_name
    from skyjax.export.trained import run_config, run_task
    from skyjax.models import bert, build
    import jax

    done = export(workdir, out)
    assert done.returncode == 0, done.stderr[-4000:]
    config = run_config(workdir)
    chain = build.abstract_chain(config.model, config.train.seed, config.allocation.granularity)
    resume = find_resume(os.path.join(workdir, "checkpoints"))
    states = restore_units(resume, chain, range(len(chain)),
                           optim.make_optimizer(config.train, clip=False))
    params = [states[u][0] for u in range(len(chain))]
    with safe_open(str(out / "model.safetensors"), "np") as f:
        for unit, p in zip(chain, params):
            prefix = tuple(int(k) if k.isdigit() else k for k in unit.path)
            for path, x in jax.tree_util.tree_flatten_with_path(p)[0]:
                name, transpose = hf_name(prefix + tuple(k.key for k in path))
                saved = f.get_tensor(name)
                np.testing.assert_array_equal(saved.T if transpose else saved, x, err_msg=name)
    with open(os.path.join(PAIRS, "dev.csv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f))[:12]
    batch = text.encode(text.load_tokenizer(config, run_task(config)),
                        [[r["premise"] for r in rows], [r["hypothesis"] for r in rows]],
                        int(config.data.seq_len))
    carry = bert.initial_carry(batch["input_ids"], batch["token_type_ids"],
                               batch["attention_mask"])
    want = np.asarray(bert.apply_units(chain, params, carry, None, False)["logits"])
    np.testing.assert_allclose(hf_logits(str(out), batch), want, atol=1e-5, rtol=0)
    return resume.meta


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_export_of_two_processes_two_stages(tmp_path):
    workdir = tmp_path / "run"
    done = run_module("skyjax.launch", "--num_processes", "2", "--timeout", "240", "--",
                      f"--config={CSV}", f"--workdir={workdir}", *TINY_RUN,
                      "--config.cluster.mode=distributed", "--config.allocation.strategy=even")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    meta = check_export_of(str(workdir), tmp_path / "hf")
    assert meta["processes"] == 2 and meta["step"] == 4
    assert sorted(f for f in os.listdir(workdir / "checkpoints" / "4")
                  if f.endswith(".safetensors")) == ["process_0.safetensors",
                                                     "process_1.safetensors"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_export_of_two_pipelines_computing_in_bf16(tmp_path):
    from skyjax.profile.format import save_profile

    save_profile(make_profile(np.full((4, 3), 1e-3)), str(tmp_path / "profile.json"))
    workdir = tmp_path / "run"
    done = run_module("skyjax.main", f"--config={CSV}", f"--workdir={workdir}", *TINY_RUN,
                      "--config.cluster.num_devices=3", "--config.cluster.slowdowns=(1, 1, 1)",
                      "--config.pipeline.microbatches=2", "--config.allocation.max_pipelines=2",
                      "--config.train.steps=2", "--config.checkpoint.every=2",
                      f"--config.profile.path={tmp_path / 'profile.json'}",
                      "--config.train.compute_dtype=bfloat16")
    assert done.returncode == 0, done.stderr[-4000:]
    plan = json.loads((workdir / "plan.json").read_text())
    assert len(plan["shares"]) == 2, plan  # two pipelines trained it
    check_export_of(str(workdir), tmp_path / "hf")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_export_of_a_diloco_run_between_outer_steps(tmp_path):
    """Two pipelines with DiLoCo averaging checkpointed mid-period (step 4, outer steps every
    3): every parameter of pipeline 1 differs from pipeline 0's, and the export is their
    float32 mean as the checkpoint holds them, or the anchor when asked."""
    from safetensors import safe_open

    from skyjax.checkpoint import find_resume, store
    from skyjax.export.hf_format import hf_name
    from skyjax.export.trained import run_config

    workdir = diloco_run(tmp_path)
    resume = find_resume(os.path.join(workdir, "checkpoints"))
    assert resume.step == 4 and resume.meta["averaging"] == {"mode": "diloco", "pipelines": 2}
    index = store.TensorIndex(resume.path)
    params = [n[len("params/"):] for n in sorted(index.names()) if n.startswith("params/")]
    p0 = {n: index.read(f"params/{n}") for n in params}
    p1 = {n: index.read(f"pipelines/1/params/{n}") for n in params}
    assert all((p0[n] != p1[n]).any() for n in params)  # every tensor of the replicas differs
    config = run_config(workdir)
    assert config.data.name.endswith("train.csv")
    for args, want, said in (
            ((), {n: (p0[n] + p1[n]) / np.float32(2) for n in params},
             "replicas differ (2 pipelines, diloco): exporting their average; --replica N or "
             "anchor for one"),
            (("--replica", "anchor"), {n: index.read(f"relax/anchor/{n}") for n in params},
             "replicas differ (2 pipelines, diloco): exporting the anchor, the last outer "
             "step's model (--replica anchor)")):
        out = tmp_path / f"hf{len(args)}"
        done = export(workdir, out, *args)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"skyjax.export: {said}" in done.stdout.splitlines(), done.stdout
        with safe_open(str(out / "model.safetensors"), "np") as f:
            for n in params:
                path = tuple(int(k) if k.isdigit() else k for k in n.split("/"))
                name, transpose = hf_name(path)
                got = f.get_tensor(name)
                np.testing.assert_array_equal(got.T if transpose else got, want[n], err_msg=n)
        meta = json.loads((out / "skyjax.json").read_text())
        assert meta["replica"]["taken"] == ("anchor" if args else "average")
