"""Rehearsed against predicted: the plans the planner chooses for a declared cluster, run by the
real runtime with every call and message taking its declared time (``config.rehearse``).

For each cluster file (``python -m skyjax.profile.compose``: the paper's 64 nodes in four regions
in one process, a 16-device version under ``jax.distributed``) and each planning mode (one
pipeline; up to 8 pipelines; up to 8 with int8 hand-offs and int8 averaging allowed), it runs
``skyjax.main`` with ``configs/rehearse.py`` and prints, side by side: devices used, pipelines,
the simulator's step and the cost model's ``T`` (the declared cluster's seconds), the measured
median step (divided by the time scale), its error against the simulator, the examples per
second of the declared cluster (BERT-large micro-batches of 8 x 128), and this host's overhead
per call. Each run's ``timeline.png`` (measured above simulated) stays in its workdir.

Run: ``python experiments/rehearsal_bench.py`` (about 10 minutes on 2 cores; ``--only local``
or ``--only distributed`` for half of it, ``--scale`` the time scale, ``--workdir`` where the
runs go).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from skyjax.profile.cluster_profile import compose
from skyjax.profile.format import save_profile

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = {"one pipeline": ["--config.allocation.max_pipelines=1"],
         "up to 8 pipelines": ["--config.allocation.max_pipelines=8"],
         "relaxed (int8)": ["--config.allocation.max_pipelines=8", "--config.relax.handoff_bits=8",
                            "--config.relax.averaging=int8"]}


def sixteen_of_paper() -> dict:
    """The paper cluster's first four nodes of each region: 16 devices in four regions."""
    with open(os.path.join(HERE, "clusters", "paper64.json")) as f:
        spec = json.load(f)
    for name, counts in spec["regions"].items():
        left, kept = 4, {}
        for kind, n in counts.items():
            kept[kind], left = min(n, left), left - min(n, left)
        spec["regions"][name] = {k: n for k, n in kept.items() if n}
    return spec


def run(workdir: str, profile: str, microbatches: int, scale: float, steps: int,
        extra: list[str], processes: int) -> dict:
    args = ["--config", "configs/rehearse.py", "--workdir", workdir,
            f"--config.rehearse.profile={profile}", f"--config.rehearse.time_scale={scale}",
            f"--config.train.steps={steps}", f"--config.pipeline.microbatches={microbatches}",
            f"--config.data.batch_size={microbatches}", "--config.checkpoint.resume=False",
            "--config.checkpoint.replace=True", *extra]
    if processes > 1:
        cmd = [sys.executable, "-m", "skyjax.launch", "--num_processes", str(processes), "--",
               *args, "--config.cluster.mode=distributed"]
    else:
        cmd = [sys.executable, "-m", "skyjax.main", *args]
    done = subprocess.run(cmd, cwd=os.path.dirname(HERE), capture_output=True, text=True)
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise SystemExit(f"rehearsal_bench: {' '.join(cmd)} failed ({done.returncode}): "
                         + " | ".join(tail))
    with open(os.path.join(workdir, "summary.json")) as f:
        return json.load(f)


def row(label: str, mode: str, summary: dict, examples_per_microbatch: int) -> str:
    r = summary["rehearsal"]
    d = r["declared_cluster_step_s"]
    calls = r["calls"] or {}
    rate = r["microbatches"] * examples_per_microbatch / d["measured"]
    return (f"{label:<22} {mode:<18} {r['devices_used']:>3}/{r['devices']:<3} "
            f"{r['pipelines']:>2} {d['simulated']:9.4f} {d['model']:9.4f} {d['measured']:9.4f} "
            f"{100 * r['error']:+7.1f}% {rate:9.1f} {1e3 * calls.get('overhead_mean_s', 0):7.2f} "
            f"{calls.get('overruns', 0):5d}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="/tmp/skyjax_rehearsal_bench")
    ap.add_argument("--microbatches", type=int, default=32)
    ap.add_argument("--scale", type=float, default=10.0)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--only", choices=["local", "distributed"], default=None)
    ap.add_argument("--modes", nargs="*", default=list(MODES))
    args = ap.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    with open(os.path.join(HERE, "clusters", "paper64.json")) as f:
        clusters = [("64 nodes, 4 regions", json.load(f), 1),
                    ("16 nodes, 4 regions", sixteen_of_paper(), 16)]
    if args.only:
        clusters = [c for c in clusters if (c[2] == 1) == (args.only == "local")]
    print(f"m = {args.microbatches} micro-batches of 8 x 128 (BERT-large, FLOP model), time "
          f"scale {args.scale:g}, median of steps 2-{args.steps}; seconds of the declared "
          "cluster (measured / scale)")
    print(f"{'cluster (executor)':<22} {'planning':<18} {'used':>7} {'p':>2} {'simulated':>9} "
          f"{'model T':>9} {'measured':>9} {'error':>8} {'ex/s':>9} {'ovh ms':>7} {'over':>5}")
    for name, spec, processes in clusters:
        profile = compose(spec)
        path = os.path.join(args.workdir, f"profile_{profile.num_devices}.json")
        save_profile(profile, path)
        label = f"{name} ({'local' if processes == 1 else f'{processes} processes'})"
        for mode in args.modes:
            work = os.path.join(args.workdir, f"{profile.num_devices}_{mode.split()[0]}"
                                f"{'_' + mode.split()[2] if mode.startswith('up') else ''}")
            summary = run(work, path, args.microbatches, args.scale, args.steps, MODES[mode],
                          processes)
            print(row(label, mode, summary, profile.microbatch["size"]), flush=True)
    print(f"\ntimelines (measured above simulated): {args.workdir}/*/timeline.png")


if __name__ == "__main__":
    from experiments import results_doc

    results_doc.run(main, [(
        None, "rehearsal_bench", "Rehearsals against the simulator",
        "The paper's 64 nodes in four regions (one process) and a 16-node version (16 "
        "processes), rehearsed under the planner's plans (one pipeline, up to eight, relaxed): "
        "devices used, the simulator's and the cost model's step against the measured one (the "
        "declared cluster's seconds), examples/s, this host's overhead per call.")])
