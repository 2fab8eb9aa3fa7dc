"""The headline prediction against the rehearsed step, on clusters joined by slow links.

For each cluster file (the README's two regions, ``experiments/clusters/two_regions.json``; the
paper's 64 nodes in four regions, ``paper64.json``; 12 devices in three regions joined by 30, 60
and 90 ms links, ``three_regions.json``) it does what the rehearsal guide
(docs/guide/rehearsal.md) tells a user to do, with its commands as written:

    python -m skyjax.profile.compose --cluster FILE --out profile.json
    python -m skyjax.plan --profile profile.json --microbatches 8 --pipelines 4 --json
    python -m skyjax.main --config configs/rehearse.py --workdir DIR \\
        --config.rehearse.profile=profile.json

(8 micro-batches and up to 4 pipelines: ``configs/rehearse.py``'s, which the run plans with
too; its time scale 10 and 12 steps unless ``--time_scale`` / ``--steps``). It prints one row
per cluster, in the declared cluster's seconds (the run's times divided by the time scale):
the headline prediction (``step_time_s`` of the plan command, the figure it prints, the run
logs as ``predicted`` and summary.json holds), the simulator's step and the cost model's ``T``
(summary.json's ``rehearsal``), the measured median step (without the compiling first step),
the gap measured / predicted - 1, and the rehearsal's wall-clock time. The goal: every gap
within 10 %. A run whose own prediction differs from the plan command's is named below the
table.

Run: ``python experiments/prediction_check.py`` (about 4 minutes on 2 cores; ``--clusters``
for some of them, ``--workdir`` where the runs go; ``--results`` writes the table into
docs/results.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CLUSTERS = {"two_regions": "16 devices, 2 regions, 20 ms",
            "paper64": "64 nodes, 4 regions, 20 ms",
            "three_regions": "12 devices, 3 regions, 30-90 ms"}
GOAL = 0.10
WIDTH = max(len(f"{k} ({v})") for k, v in CLUSTERS.items())


def rehearse_defaults() -> dict:
    """configs/rehearse.py's micro-batches, pipelines, time scale and steps."""
    spec = importlib.util.spec_from_file_location(
        "rehearse_config", os.path.join(REPO, "configs", "rehearse.py"))
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    c = base.get_config()
    return {"microbatches": c.pipeline.microbatches, "pipelines": c.allocation.max_pipelines,
            "time_scale": c.rehearse.time_scale, "steps": c.train.steps}


def command(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise SystemExit(f"prediction_check: python -m {' '.join(args)} failed "
                         f"({done.returncode}): " + " | ".join(tail))
    return done.stdout


def check(name: str, workdir: str, defaults: dict, time_scale: float | None,
          steps: int | None) -> dict:
    """Composes, plans and rehearses one cluster file; its row's figures."""
    profile = os.path.join(workdir, f"{name}.json")
    command("skyjax.profile.compose", "--cluster", os.path.join(HERE, "clusters", f"{name}.json"),
            "--out", profile)
    plan = json.loads(command("skyjax.plan", "--profile", profile,
                              "--microbatches", str(defaults["microbatches"]),
                              "--pipelines", str(defaults["pipelines"]), "--json"))
    run_dir = os.path.join(workdir, name)
    args = ["skyjax.main", "--config", "configs/rehearse.py", "--workdir", run_dir,
            f"--config.rehearse.profile={profile}", "--config.checkpoint.resume=False",
            "--config.checkpoint.replace=True"]
    if time_scale is not None:
        args.append(f"--config.rehearse.time_scale={time_scale}")
    if steps is not None:
        args.append(f"--config.train.steps={steps}")
    start = time.monotonic()
    command(*args)
    wall = time.monotonic() - start
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    r = summary["rehearsal"]
    k = r["time_scale"]
    d = r["declared_cluster_step_s"]
    predicted = plan["step_time_s"]
    return {"name": name, "used": r["devices_used"], "devices": r["devices"],
            "pipelines": r["pipelines"], "predicted": predicted,
            "run_predicted": summary["predicted_step_time_s"] / k,
            "simulated": d["simulated"], "model": d["model"], "measured": d["measured"],
            "gap": d["measured"] / predicted - 1, "wall": wall, "scale": k,
            "steps": r["steps_measured"], "overruns": (r["calls"] or {}).get("overruns", 0)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="/tmp/skyjax_prediction_check")
    ap.add_argument("--clusters", nargs="*", choices=list(CLUSTERS), default=list(CLUSTERS))
    ap.add_argument("--time_scale", type=float, default=None,
                    help="rehearse.time_scale (default: configs/rehearse.py's)")
    ap.add_argument("--steps", type=int, default=None,
                    help="train.steps (default: configs/rehearse.py's)")
    args = ap.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    defaults = rehearse_defaults()
    scale = args.time_scale or defaults["time_scale"]
    print(f"configs/rehearse.py: m = {defaults['microbatches']}, up to "
          f"{defaults['pipelines']} pipelines, time scale {scale:g}, median of steps "
          f"2-{args.steps or defaults['steps']}; seconds of the declared cluster (the run's / "
          "the scale)")
    print(f"{'cluster':<{WIDTH}} {'used':>6} {'p':>2} {'predicted':>9} {'simulated':>9} "
          f"{'model T':>9} {'measured':>9} {'gap':>7} {'wall s':>6}")
    rows = []
    for name in args.clusters:
        row = check(name, args.workdir, defaults, args.time_scale, args.steps)
        rows.append(row)
        print(f"{name + ' (' + CLUSTERS[name] + ')':<{WIDTH}} {row['used']:>3}/{row['devices']:<2} "
              f"{row['pipelines']:>2} {row['predicted']:9.4f} {row['simulated']:9.4f} "
              f"{row['model']:9.4f} {row['measured']:9.4f} {100 * row['gap']:+6.1f}% "
              f"{row['wall']:6.0f}", flush=True)
    held = [r["name"] for r in rows if abs(r["gap"]) <= GOAL]
    print(f"\nmeasured within {100 * GOAL:.0f} % of the headline prediction: {len(held)} of "
          f"{len(rows)}" + (f" ({', '.join(held)})" if held else ""))
    for r in rows:
        if abs(r["run_predicted"] / r["predicted"] - 1) > 1e-6:
            print(f"{r['name']}: the run predicted {r['run_predicted']:.4f} s, the plan command "
                  f"{r['predicted']:.4f} s")
    print(f"runs (timeline.png: measured above simulated): {args.workdir}/<cluster>/",
          file=sys.stderr)


if __name__ == "__main__":
    from experiments import results_doc

    results_doc.run(main, [(
        None, "prediction_check", "The headline prediction on slow links, rehearsed",
        "The README's two-region cluster, the paper's 64 nodes in four regions and 12 devices in "
        "three regions joined by 30-90 ms links (`experiments/clusters/`), each composed, "
        "planned and rehearsed with the rehearsal guide's commands as written: the headline "
        "prediction (what `python -m skyjax.plan` prints and a run logs as `predicted`), the "
        "simulator's step and the cost model's `T` against the measured median step, in the "
        "declared cluster's seconds; the goal: every gap within 10 %.")])
