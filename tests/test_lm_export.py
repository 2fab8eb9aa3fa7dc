"""A decoder language model taken home (skyjax/export/lm.py): a run of configs/gpt2_text.py
exported as a Hugging Face directory that AutoModelForCausalLM loads with no missing or
unexpected tensor, its logits within 1e-5 of skyjax's model of the same checkpoint; the tied
embedding saved once in the checkpoint and once in the export; a greedy continuation from the
directory and from the workdir alike; the resumed run's losses equal the uninterrupted one's;
and docs/guide/decoder.md's walkthrough run as written."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import REPO, make_profile, run_module

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIG = os.path.join(REPO, "configs", "gpt2_text.py")
FAST = ["--config.allocation.calibrate_steps=0", "--config.train.log_every=1",
        "--config.allocation.strategy=even"]


def profile_file(path, devices: int = 4) -> str:
    """A fixed profile of the config's 6 units on ``devices`` devices: no profiling."""
    from skyjax.profile.format import save_profile

    save_profile(make_profile(np.full((6, devices), 1e-3)), str(path))
    return str(path)


def metrics(workdir) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if '"loss"' in line]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> str:
    """configs/gpt2_text.py for 8 steps on its 4 emulated devices (the even split: 4 stages,
    the tied embedding on the first and the last), checkpointed at 4 and 8."""
    root = tmp_path_factory.mktemp("gpt2_run")
    workdir = str(root / "run")
    done = run_module("skyjax.main", f"--config={CONFIG}", f"--workdir={workdir}", *FAST,
                      f"--config.profile.path={profile_file(root / 'profile.json')}",
                      "--config.train.steps=8", "--config.checkpoint.every=4")
    assert done.returncode == 0, done.stderr[-4000:]
    return workdir


def test_the_run_plans_draws_and_scores_perplexity(run):
    """The same outputs as BERT's run: the plan (4 stages, the tied embedding on the first and
    last), its pictures, and the held-out split's loss and perplexity in summary.json and
    metrics.jsonl."""
    with open(os.path.join(run, "summary.json")) as f:
        summary = json.load(f)
    assert len(summary["plan"]["stages"]) == 4 and summary["metric"] == "perplexity"
    assert summary["eval_perplexity"] == pytest.approx(np.exp(summary["eval_loss"]))
    assert summary["eval_tokens"] > 0 and summary["eval_by_split"]["validation"]["perplexity"]
    for picture in ("plan.png", "timeline.png"):
        assert os.path.getsize(os.path.join(run, picture)) > 0
    with open(os.path.join(run, "metrics.jsonl")) as f:
        evals = [json.loads(line) for line in f if "eval_perplexity" in line]
    assert evals and evals[-1]["split"] == "validation" and evals[-1]["step"] == 8
    losses = [m["loss"] for m in metrics(run)]
    assert len(losses) == 8 and losses[-1] < losses[0]


def test_the_export_loads_in_transformers_with_the_same_logits(run, tmp_path):
    from skyjax.export import lm

    out = str(tmp_path / "hf")
    done = run_module("skyjax.export", "--workdir", run, "--out", out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "a gpt2 language model" in done.stdout
    with open(os.path.join(run, "checkpoints", "8", "meta.json")) as f:
        saved = json.load(f)["tensors"]
    assert "params/embeddings/wte/embedding" in saved
    assert not [n for n in saved if "lm_head" in n]  # the tied copy: saved once
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert type(hf).__name__ == "GPT2LMHeadModel"
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    model, tokenizer = lm.load(workdir=run)
    ids = np.asarray([tokenizer("The river runs past the mill")["input_ids"]], np.int32)
    with torch.no_grad():
        want = hf.eval()(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(ids)), want, atol=1e-5, rtol=0)
    a = run_module("skyjax.predict", "--model", out, "--generate", "The river",
                   "--max_new_tokens", "6")
    b = run_module("skyjax.predict", "--workdir", run, "--generate", "The river",
                   "--max_new_tokens", "6")
    assert a.returncode == 0 and b.returncode == 0, (a.stderr[-2000:], b.stderr[-2000:])
    assert a.stdout.startswith("The river") and a.stdout == b.stdout


def test_a_resumed_run_continues_with_the_same_losses(run, tmp_path):
    """The checkpoint of step 4 (the tied embedding saved once) resumed under another plan
    (one stage holding both copies) gives steps 5-8 the uninterrupted run's losses."""
    import shutil

    workdir = str(tmp_path / "resumed")
    shutil.copytree(run, workdir)
    shutil.rmtree(os.path.join(workdir, "checkpoints", "8"))
    profile = profile_file(tmp_path / "profile.json", devices=1)
    done = run_module("skyjax.main", f"--config={CONFIG}", f"--workdir={workdir}", *FAST,
                      f"--config.profile.path={profile}", "--config.train.steps=8",
                      "--config.checkpoint.every=4", "--config.cluster.num_devices=1",
                      "--config.cluster.slowdowns=()")
    assert done.returncode == 0, done.stderr[-4000:]
    want = {m["step"]: m["loss"] for m in metrics(run)}
    got = {m["step"]: m["loss"] for m in metrics(workdir) if m["step"] > 4}
    assert sorted(got) == [5, 6, 7, 8]
    for step, loss in got.items():
        assert loss == pytest.approx(want[step], abs=1e-5), step


@pytest.mark.slow
def test_the_walkthrough_commands_work_as_written(tmp_path):
    """docs/guide/decoder.md's commands, as written (the training with fewer steps, profiled
    once per unit), with its paths under tmp_path."""
    with open(os.path.join(REPO, "docs", "guide", "decoder.md"), encoding="utf-8") as f:
        guide = f.read()
    block = guide.split("```bash\n")[1].split("```")[0]
    lines = [ln for ln in block.splitlines() if ln and not ln.startswith("#")]
    assert [ln.split()[:3] for ln in lines[1:4]] == [
        ["python", "-m", "skyjax.main"], ["python", "-m", "skyjax.export"],
        ["python", "-m", "skyjax.predict"]]
    paths = [("/tmp/skyjax_gpt2_hf", str(tmp_path / "hf")),
             ("/tmp/my_gpt2", str(tmp_path / "ckpt")), ("/tmp/skyjax_gpt2", str(tmp_path / "run"))]
    more = {"skyjax.main": ["--config.train.steps=20", *FAST, "--config.profile.repeats=1"]}
    outputs = []
    for line in lines:
        for old, new in paths:
            line = line.replace(old, new)
        args = shlex.split(line)
        assert args[0] == "python", line
        args += more.get(args[2], [])
        done = subprocess.run([sys.executable, *args[1:]], cwd=REPO, capture_output=True,
                              text=True, timeout=300, stdin=subprocess.DEVNULL,
                              env=dict(os.environ, JAX_PLATFORMS="cpu"))
        assert done.returncode == 0, (line, done.stderr[-3000:])
        outputs.append(done.stdout)
    losses = [m["loss"] for m in metrics(str(tmp_path / "run"))]
    assert losses[-1] < losses[0] - 0.5  # it learned
    assert outputs[3].startswith("The lighthouse keeper")  # skyjax.predict --generate
    assert outputs[4].startswith("The lighthouse keeper")  # transformers' pipeline
