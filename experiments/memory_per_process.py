"""Host memory per pipeline process: each process builds only its own units.

    python experiments/memory_per_process.py                 # 12 layers, hidden 1024, 4 processes
    python experiments/memory_per_process.py --layers 24 --processes 8

Runs ``python -m skyjax.main`` over N local processes (``skyjax.launch``, ``jax.distributed``)
with an even plan for a few steps of the synthetic task, then prints, from ``summary.json``
``memory``, each process's units, training-state bytes (parameters + AdamW moments of its
units), peak resident set size and its RSS before the model was built, beside the whole model's
training state. With ``--also-one-process`` it runs the same model in one process too (every
stage in one address space), for the footprint a process would have if it held everything.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

GiB = 1024 ** 3
MiB = 1024 ** 2


def overrides(args: argparse.Namespace, distributed: bool) -> list[str]:
    o = {"model.hidden_size": args.hidden, "model.num_hidden_layers": args.layers,
         "model.num_attention_heads": args.hidden // 64, "model.intermediate_size": 4 * args.hidden,
         "model.vocab_size": 30522, "model.max_position_embeddings": 512,
         "data.seq_len": args.seq_len, "data.batch_size": 4, "data.eval_examples": 0,
         "pipeline.microbatches": 2, "train.steps": args.steps, "train.log_every": 1,
         "allocation.strategy": "even", "allocation.calibrate_steps": 0, "profile.repeats": 1,
         "cluster.num_devices": args.processes if distributed else 1, "cluster.slowdowns": "()",
         "cluster.mode": "distributed" if distributed else "local"}
    return [f"--config.{k}={v}" for k, v in o.items()]


def run(args: argparse.Namespace, workdir: str, distributed: bool) -> dict:
    cmd = ([sys.executable, "-m", "skyjax.launch", "--num_processes", str(args.processes), "--"]
           if distributed else [sys.executable, "-m", "skyjax.main"])
    cmd += ["--config", "configs/local_demo.py", "--workdir", workdir] + overrides(args, distributed)
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    with open(os.path.join(workdir, "summary.json")) as f:
        return json.load(f)["memory"]


def table(memory: dict, title: str) -> None:
    total = memory["model_state_bytes"]
    print(f"\n{title}: whole model's training state (params + AdamW mu, nu) "
          f"{total / GiB:.2f} GiB")
    print(f"{'process':>7}  {'units':>9}  {'state GiB':>9}  {'share':>6}  {'RSS before model':>16}"
          f"  {'peak RSS GiB':>12}  {'peak - before':>13}")
    for p in memory["processes"]:
        units = f"[{p['units'][0]}, {p['units'][1]})" if p["units"] else "-"
        grew = p["peak_rss_bytes"] - p["rss_start_bytes"]
        print(f"{p['process']:>7}  {units:>9}  {p['state_bytes'] / GiB:>9.2f}  "
              f"{p['state_bytes'] / total:>6.1%}  {p['rss_start_bytes'] / GiB:>14.2f} G"
              f"  {p['peak_rss_bytes'] / GiB:>12.2f}  {grew / GiB:>11.2f} G")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--also-one-process", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        title = (f"{args.layers} layers, hidden {args.hidden}, {args.processes} processes, "
                 f"even plan")
        table(run(args, os.path.join(tmp, "distributed"), True), title)
        if args.also_one_process:
            table(run(args, os.path.join(tmp, "one"), False), "the same model in one process")


if __name__ == "__main__":
    main()
