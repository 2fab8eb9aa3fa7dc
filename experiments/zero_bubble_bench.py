"""Zero bubble measured: GPipe, 1F1B, ZB-H1 and ZB-H2 rehearsed on one pipeline of 4 devices
(``config.rehearse``: the real runtime, every call and message taking its declared time) with
m = 8, against what the planner and the simulator predict.

Clusters (``python -m skyjax.profile.compose`` specs, built here): four equal devices in one
region, where every schedule's plan has 4 stages of two layers; two kinds (2 fast, 2 slow) planned
per schedule by ``optimal``; the same two kinds under ``even`` (one 4-stage plan, unequal stages,
for every schedule: the fill for unequal stages). For each run it prints side by side: stages, the
simulator's step and the measured median step (seconds of the rehearsal: declared x the time
scale) and their error, the measured idle share (per stage ``stage_idle_s / step_time_s`` of
metrics.jsonl, median over the steps after the first, mean over stages) against the simulator's
(``idle_s / step``), the measured bubble against 1F1B's (mean idle seconds per stage), the peak
micro-batches in flight per stage and the largest stage memory (plan.json ``memory_bytes``)
against 1F1B's. Zero-bubble runs also print the measured B and W calls against their declared
times (``plan.replay.rehearsal.rehearsal_times``: ``StageTimes.backward_s`` / ``weight_s``, mean
over the last step's spans in trace.json).

Run: ``python experiments/zero_bubble_bench.py`` (about 12 minutes on 2 cores; ``--cases equal``
for a third of it, ``--scale`` the time scale, ``--steps``, ``--workdir``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

from skyjax.plan.replay.rehearsal import rehearsal_times
from skyjax.plan.replay.simulate import simulate_plan
from skyjax.plan.model.types import Plan
from skyjax.profile.cluster_profile import compose
from skyjax.profile.format import load_profile, save_profile

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEDULES = ("1f1b", "gpipe", "zb-h1", "zb-h2")  # 1F1B first: the others against it
LINKS = {"inside": {"latency_s": 1e-5, "bandwidth_Bps": 1.25e10}}
MODEL = {"hidden": 1024, "heads": 16, "ffn": 4096, "seq": 128, "batch": 8}  # BERT-large layers


def equal_cluster() -> dict:
    """Four equal devices, 8 layers: 4 stages of two layers (the ends with the first and last)."""
    return {"kinds": {"gpu": {"flops_per_s": 2e13, "memory_bytes": 1e10}},
            "model": {"layers": 8, **MODEL}, "regions": {"r": {"gpu": 4}}, "links": LINKS}


def two_kinds() -> dict:
    """Two fast and two slow devices (2:1), 10 layers."""
    return {"kinds": {"fast": {"flops_per_s": 2e13, "memory_bytes": 1e10},
                      "slow": {"flops_per_s": 1e13, "memory_bytes": 1e10}},
            "model": {"layers": 10, **MODEL}, "regions": {"r": {"fast": 2, "slow": 2}},
            "links": LINKS}


CASES = {"equal": (equal_cluster, []), "two kinds": (two_kinds, []),
         "two kinds, even": (two_kinds, ["--config.allocation.strategy=even"])}


def run(workdir: str, profile: str, schedule: str, scale: float, steps: int,
        extra: list[str]) -> None:
    cmd = [sys.executable, "-m", "skyjax.main", "--config", "configs/rehearse.py", "--workdir",
           workdir, f"--config.rehearse.profile={profile}",
           f"--config.rehearse.time_scale={scale}", f"--config.train.steps={steps}",
           "--config.train.log_every=1", "--config.pipeline.microbatches=8",
           "--config.data.batch_size=8", f"--config.pipeline.schedule={schedule}",
           "--config.allocation.max_pipelines=1", "--config.checkpoint.resume=False",
           "--config.checkpoint.replace=True", *extra]
    done = subprocess.run(cmd, cwd=os.path.dirname(HERE), capture_output=True, text=True)
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise SystemExit(f"zero_bubble_bench: {' '.join(cmd)} failed ({done.returncode}): "
                         + " | ".join(tail))


def measure(workdir: str) -> dict:
    """What one run gives (module doc)."""
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(workdir, "plan.json")) as f:
        plan = Plan.from_json(json.load(f))
    profile = load_profile(os.path.join(workdir, "profile.json"))  # the rehearsal's time base
    sim = simulate_plan(plan, profile)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    recs = [r for r in recs if r.get("stage_idle_s") and r["step"] > 1]
    idle = np.median([np.mean(r["stage_idle_s"]) for r in recs])
    share = np.median([np.mean(r["stage_idle_s"]) / r["step_time_s"] for r in recs])
    r = summary["rehearsal"]
    out = {"plan": plan, "stages": len(plan.stages), "simulated": r["simulated_step_s"],
           "measured": r["measured_step_s"], "error": r["error"], "idle_s": float(idle),
           "idle_share": float(share), "sim_idle_s": float(np.mean(sim.idle_s)),
           "sim_share": float(np.mean(sim.idle_s)) / sim.step_time_s,
           "peaks": sim.peak_inflight, "memory": max(s.memory_bytes for s in plan.stages),
           "passes": None}
    if plan.schedule.startswith("zb"):
        times = rehearsal_times(plan, profile).stages
        with open(os.path.join(workdir, "trace.json")) as f:
            spans = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"
                     and e.get("pid") == 0]
        got = {kind: np.mean([e["dur"] / 1e6 for e in spans if e["name"][0] == kind])
               for kind in "BW"}
        want = {"B": np.mean([t.backward_s for t in times]),
                "W": np.mean([t.weight_s for t in times])}
        out["passes"] = (got, want)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="/tmp/skyjax_zero_bubble_bench")
    ap.add_argument("--scale", type=float, default=10.0)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    args = ap.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    print(f"one pipeline, m = 8, time scale {args.scale:g}: seconds of the rehearsal; idle: "
          "per stage, mean over stages (measured: median over steps 2-"
          f"{args.steps}); bubble: idle seconds against 1F1B's")
    print(f"{'case':<16} {'schedule':<7} {'p':>2} {'simulated':>9} {'measured':>9} {'error':>7} "
          f"{'idle pred':>9} {'idle meas':>9} {'bubble vs 1f1b':>15} {'in flight':>12} "
          f"{'memory vs 1f1b':>14}  B / W measured vs declared")
    for case in args.cases:
        spec, extra = CASES[case]
        profile = compose(spec())
        path = os.path.join(args.workdir, f"profile_{case.replace(' ', '_').replace(',', '')}"
                            ".json")
        save_profile(profile, path)
        rows = {}
        for schedule in SCHEDULES:
            work = os.path.join(args.workdir, f"{os.path.basename(path)[8:-5]}_{schedule}")
            run(work, path, schedule, args.scale, args.steps, extra)
            rows[schedule] = m = measure(work)
            base = rows.get("1f1b")
            bubble = (f"{100 * (m['idle_s'] / base['idle_s'] - 1):+.0f}% (pred "
                      f"{100 * (m['sim_idle_s'] / base['sim_idle_s'] - 1):+.0f}%)"
                      if base else "")
            mem = f"{m['memory'] / base['memory']:.2f}x" if base else ""
            passes = ""
            if m["passes"]:
                got, want = m["passes"]
                passes = (f"B {1e3 * got['B']:.1f}/{1e3 * want['B']:.1f} ms, W "
                          f"{1e3 * got['W']:.1f}/{1e3 * want['W']:.1f} ms")
            print(f"{case:<16} {schedule:<7} {m['stages']:>2} {m['simulated']:9.4f} "
                  f"{m['measured']:9.4f} {100 * m['error']:+6.1f}% {100 * m['sim_share']:8.1f}% "
                  f"{100 * m['idle_share']:8.1f}% {bubble:>15} "
                  f"{','.join(map(str, m['peaks'])):>12} {mem:>14}  {passes}", flush=True)
    print(f"\ntimelines (measured above simulated): {args.workdir}/*/timeline.png")


if __name__ == "__main__":
    from experiments import results_doc

    results_doc.run(main, [(
        None, "zero_bubble_bench", "Zero bubble, rehearsed",
        "GPipe, 1F1B, ZB-H1 and ZB-H2 rehearsed on one 4-device pipeline, m = 8 (equal "
        "devices; two kinds planned per schedule; two kinds on one even plan): the simulator's "
        "step against the measured one, idle share predicted and measured, the bubble against "
        "1F1B's, micro-batches in flight and memory against 1F1B's, B and W calls measured "
        "against declared.")])
