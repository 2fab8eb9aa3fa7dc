"""Checkpoint and recovery figures (issue 10): save / restore time of the demo model and of a
12-layer, hidden-1024 BERT; and, for a real kill, the steps lost and the wall time from the kill
to training again.

    python -m experiments.checkpoint_bench                # save/restore table (both models)
    python -m experiments.checkpoint_bench --recovery     # + kill-and-recover runs (a few minutes)

Save: every unit's params and AdamW state from one process (``CheckpointManager.save``: host
copy, safetensors write, fsync, completeness check, commit). Restore: every unit back from the
files (``restore_units``). Recovery: ``python -m skyjax.main`` (local, SIGKILLed, run again on
another plan) and ``python -m skyjax.launch --max_restarts 1`` (3 processes, one SIGKILLed,
finishing on 2); ``tests/test_fault.py`` checks the losses of the same kills.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "configs", "local_demo.py")
# A short demo run on one device (not the demo's 4 emulated ones, nor its calibration steps):
# every step logged, no eval, one profiling repeat.
FAST = ["--config.cluster.num_devices=1", "--config.cluster.slowdowns=()",
        "--config.pipeline.microbatches=1", "--config.allocation.calibrate_steps=0",
        "--config.train.log_every=1", "--config.data.eval_examples=0",
        "--config.profile.repeats=1"]


# ------------------------------------------------------------------------ save / restore timing

def save_restore_times(model: dict, repeats: int = 3) -> dict:
    """Seconds to save and restore every unit of a model of shape ``model`` (config.model keys)."""
    import jax
    import optax
    from flax import nnx

    from skyjax.checkpoint import CheckpointManager, find_resume, restore_units
    from skyjax.models import bert

    cfg = bert.BertConfig(**model)
    chain = bert.units(bert.BertForSequenceClassification(cfg, nnx.Rngs(0)), "layer")
    optimizer = optax.adamw(1e-3)
    states = {u: (unit.params, optimizer.init(unit.params)) for u, unit in enumerate(chain)}
    jax.block_until_ready(states)
    out = {"params": sum(x.size for u in chain for x in jax.tree.leaves(u.params))}
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        manager = CheckpointManager(d, 1, 1, chain, optimizer, {"seed": 0})
        saves, restores = [], []
        for step in range(1, repeats + 1):
            tic = time.perf_counter()
            record = manager.save(step, states)
            saves.append(time.perf_counter() - tic)
            tic = time.perf_counter()
            restore_units(find_resume(d), chain, range(len(chain)), optimizer)
            restores.append(time.perf_counter() - tic)
        out.update(bytes=record["bytes"], save_s=min(saves), restore_s=min(restores))
    return out


MODELS = {
    "demo": dict(vocab_size=128, hidden_size=128, num_hidden_layers=4,  # configs/local_demo.py
                 num_attention_heads=4, intermediate_size=512, max_position_embeddings=64,
                 num_labels=3),
    "bert-12x1024": dict(vocab_size=30522, hidden_size=1024, num_hidden_layers=12,
                         num_attention_heads=16, intermediate_size=4096,
                         max_position_embeddings=512, num_labels=3),
}


# ------------------------------------------------------------------------ kill and recover

def _reader(proc: subprocess.Popen, log):
    """Lines of ``proc``'s output with their arrival times."""
    for raw in iter(proc.stdout.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        if log:
            log(line)
        yield time.monotonic(), line


_STEP = re.compile(r"step (\d+)/(\d+)")
_COMMIT = re.compile(r"checkpoint (\d+) committed")


def _summary(workdir: str) -> dict:
    with open(os.path.join(workdir, "summary.json")) as f:
        return json.load(f)


def kill_and_resume_local(workdir: str, args: list[str], resume_args: list[str],
                          kill_after_checkpoint: int, log=None, timeout_s: float = 600) -> dict:
    """``skyjax.main`` with ``args`` is SIGKILLed once checkpoint ``kill_after_checkpoint`` is
    committed, then run again (same workdir) with ``resume_args``; returns the figures."""
    cmd = [sys.executable, "-m", "skyjax.main", "--workdir", workdir]
    proc = subprocess.Popen(cmd + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=REPO)
    last_step, t_kill = 0, None
    try:
        for t, line in _reader(proc, log):
            m = _STEP.search(line)
            if m:
                last_step = int(m.group(1))
            m = _COMMIT.search(line)
            if m and int(m.group(1)) >= kill_after_checkpoint:
                proc.send_signal(signal.SIGKILL)
                t_kill = t
                break
        proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if t_kill is None:
        raise RuntimeError("the run ended before the checkpoint to kill after was committed")
    proc = subprocess.Popen(cmd + resume_args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=REPO)
    t_again = None
    for t, line in _reader(proc, log):
        if t_again is None and _STEP.search(line):
            t_again = t
    rc = proc.wait(timeout=timeout_s)
    if rc:
        raise RuntimeError(f"the resumed run exited with {rc}")
    summary = _summary(workdir)
    return {"killed_at_step": last_step, "resumed_from_step": summary["resumed_from_step"],
            "steps_lost": last_step - summary["resumed_from_step"],
            "kill_to_training_s": t_again - t_kill, "final_loss": summary["final_loss"]}


def kill_one_of_launched(workdir: str, args: list[str], num_processes: int, victim: int,
                         kill_after_checkpoint: int, log=None, timeout_s: float = 900) -> dict:
    """``skyjax.launch --max_restarts 1`` of ``num_processes``; process ``victim`` is SIGKILLed
    once checkpoint ``kill_after_checkpoint`` is committed; the job finishes on the others."""
    cmd = [sys.executable, "-m", "skyjax.launch", "--num_processes", str(num_processes),
           "--max_restarts", "1", "--timeout", str(timeout_s), "--", "--workdir", workdir, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO,
                            start_new_session=True)
    pids, last_step, t_kill, t_restart, t_again = {}, 0, None, None, None
    try:
        for t, line in _reader(proc, log):
            if line.startswith("[launch] started") and not pids:
                pids = {int(k): int(p) for k, p in re.findall(r"p(\d+):(\d+)", line)}
            m = _STEP.search(line)
            if m and t_kill is None:
                last_step = int(m.group(1))
            elif m and t_restart is not None and t_again is None:
                t_again = t
            m = _COMMIT.search(line)
            if m and t_kill is None and int(m.group(1)) >= kill_after_checkpoint:
                os.kill(pids[victim], signal.SIGKILL)
                t_kill = t
            if line.startswith("[launch] restart"):
                t_restart = t
        rc = proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if rc:
        raise RuntimeError(f"the launcher exited with {rc}")
    summary = _summary(workdir)
    return {"killed_at_step": last_step, "resumed_from_step": summary["resumed_from_step"],
            "steps_lost": last_step - summary["resumed_from_step"],
            "kill_to_restart_s": t_restart - t_kill, "kill_to_training_s": t_again - t_kill,
            "processes_after": summary["processes"], "final_loss": summary["final_loss"]}


def run_main(workdir: str, args: list[str], timeout_s: float = 600) -> dict:
    """An uninterrupted ``skyjax.main`` run; its summary."""
    subprocess.run([sys.executable, "-m", "skyjax.main", "--workdir", workdir, *args], cwd=REPO,
                   check=True, capture_output=True, timeout=timeout_s)
    return _summary(workdir)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recovery", action="store_true", help="also kill and recover runs")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated model names")
    args = parser.parse_args(argv)
    print(f"{'model':14} {'params':>12} {'bytes':>10} {'save s':>8} {'restore s':>10}")
    for name in args.models.split(","):
        r = save_restore_times(MODELS[name])
        print(f"{name:14} {r['params']:>12,} {r['bytes'] / 1e6:>8.1f}MB {r['save_s']:>8.2f} "
              f"{r['restore_s']:>10.2f}", flush=True)
    if not args.recovery:
        return
    base = ["--config", DEMO, "--config.train.steps=40", "--config.checkpoint.every=10", *FAST]
    root = tempfile.mkdtemp(prefix="skyjax_recovery_")
    try:
        ref = run_main(os.path.join(root, "ref"), base)["final_loss"]
        local = kill_and_resume_local(
            os.path.join(root, "local"), base + ["--config.cluster.num_devices=2"],
            base + ["--config.allocation.granularity=sublayer"], kill_after_checkpoint=10)
        dist = kill_one_of_launched(
            os.path.join(root, "dist"), base + ["--config.cluster.mode=distributed",
                                                "--config.cluster.num_devices=3",
                                                "--config.cluster.peer_timeout_s=10"],
            3, victim=1, kill_after_checkpoint=10)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nuninterrupted final loss {ref:.7f}")
    for name, r in (("local, SIGKILL + rerun on 1 device, sublayer", local),
                    ("3 processes, one SIGKILLed, finish on 2", dist)):
        print(f"{name}: killed after step {r['killed_at_step']}, resumed from step "
              f"{r['resumed_from_step']} ({r['steps_lost']} steps lost), "
              f"kill -> training again {r['kill_to_training_s']:.1f} s, "
              f"final loss {r['final_loss']:.7f} (|diff| {abs(r['final_loss'] - ref):.1e})")


if __name__ == "__main__":
    main()
