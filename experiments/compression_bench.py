"""Bytes across regions per step, and the eval metric, of the averagings between pipelines: exact,
int8, DiLoCo and DiLoCo with its outer deltas in top-k 2- and 4-bit (``relax.outer_compression``,
at ``relax.outer_topk``'s default fraction).

Each row is a short training run of the demo (``configs/local_demo.py``) planned on a fixed
profile: the demo's 6 units with their real gradient bytes on 4 equal devices, each its own
region, 100 Mbit/s and 40 ms between regions, every model fitting every device, so that the plan
is pipelines in data parallel and the exchange crosses regions (the forcing of
``tests/test_relax_quality.py``; the devices run at the host's speed, so only the math differs
between rows). The bytes are the plan's, message by message (``plan.replay``: the routing, the
coded phases and the top-k payload's exact bytes per unit, ``skyjax.topk_wire``), summed over
the messages whose ends lie in different regions and averaged over an outer period; the ratio is
the exact exchange's bytes on the same plan (its pipelines, averaging exact) over the row's, as
the exact run's own plan may take fewer pipelines. The eval metric is the run's own on the
demo's held-out set.

    python -m experiments.compression_bench [--steps 200] [--results]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from skyjax.plan.data_parallel.pipelines import grad_prefix
from skyjax.plan.model.types import Plan
from skyjax.plan.replay.coding import plan_coding
from skyjax.plan.replay.exchange_run import exchange_of
from skyjax.profile.format import Profile, load_profile, save_profile
from skyjax.topk_wire import FRACTION

MODES = {"exact": [], "int8": ["--config.relax.averaging=int8"],
         "diloco": ["--config.relax.averaging=diloco"],
         "diloco + top-k 2-bit": ["--config.relax.averaging=diloco",
                                  "--config.relax.outer_compression=topk2"],
         "diloco + top-k 4-bit": ["--config.relax.averaging=diloco",
                                  "--config.relax.outer_compression=topk4"]}


def demo_param_bytes() -> list[float]:
    """Each unit's gradient bytes (float32 params) of the demo model."""
    import importlib.util
    import math

    import jax

    from skyjax.models.build import abstract_chain

    spec = importlib.util.spec_from_file_location("demo", f"{REPO}/configs/local_demo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = mod.get_config()
    chain = abstract_chain(cfg.model, 0, "layer")
    return [4.0 * sum(math.prod(x.shape) for x in jax.tree.leaves(u.params)) for u in chain]


def forcing_profile(param_bytes: list[float], n: int = 4) -> Profile:
    """The demo's units on ``n`` equal devices, each its own region (module doc)."""
    lat, bw = np.full((n, n), 0.04), np.full((n, n), 12.5e6)
    np.fill_diagonal(lat, 0.0)
    np.fill_diagonal(bw, 1e10)
    units = [{"name": f"u{i}", "state_bytes": 4 * b, "param_bytes": b,
              "activation_bytes": 1e5, "output_bytes": 131072.0}
             for i, b in enumerate(param_bytes)]
    wire = {"int8": 0.27, "topk2": 0.04, "topk4": 0.04}
    return Profile.from_json({
        "version": 1, "microbatch": {"size": 8, "seq_len": 128}, "units": units,
        "devices": [{"name": f"d{j}", "memory_bytes": 1e12, "region": f"r{j}"}
                    for j in range(n)],
        "forward_s": np.full((len(units), n), 2e-2).tolist(),
        "backward_s": np.full((len(units), n), 4e-2).tolist(),
        "links": {"latency_s": lat.tolist(), "bandwidth_Bps": bw.tolist()},
        "codecs": {c: {"output_bytes": [u["output_bytes"] * w for u in units],
                       "seconds_per_byte": [1e-10] * n} for c, w in wire.items()}})


def cross_region_bytes(plan: Plan, profile: Profile) -> float:
    """Bytes per step on links between regions: each message of the plan's exchange whose ends
    lie in different regions, coded phases at the coded bytes, an outer step's over its H."""
    if plan.num_pipelines < 2:
        return 0.0
    region = [d.get("region") for d in profile.devices]
    run, gp = exchange_of(plan), grad_prefix(profile)
    coded, ratio, _ = plan_coding(plan, profile)

    def of(runs) -> float:
        total = 0.0
        for phases in runs:
            for m in run.route.messages:
                if m.phase in phases and region[m.src] != region[m.dst]:
                    g = sum(gp[u + 1] - gp[u] for u in m.units)
                    total += g * (ratio if m.phase in coded else 1.0)
        return total

    every = of(run.every_step)
    if not run.outer_step:
        return every
    return every + (of(run.outer_step) - every) / max(run.outer_every, 1)


def train(workdir: str, profile_path: str, steps: int, flags: list[str]) -> dict:
    cmd = [sys.executable, "-m", "skyjax.main", f"--config={REPO}/configs/local_demo.py",
           f"--workdir={workdir}", f"--config.profile.path={profile_path}",
           f"--config.train.steps={steps}", f"--config.train.log_every={steps}",
           "--config.allocation.calibrate_steps=0", "--config.cluster.slowdowns=(1,1,1,1)",
           "--config.relax.min_gain=0", *flags]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"))
    if proc.returncode:
        raise SystemExit(f"run failed ({proc.returncode}): {' '.join(cmd)}\n"
                         f"{proc.stderr[-3000:]}")
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(workdir, "plan.json")) as f:
        plan = Plan.from_json(json.load(f))
    return {"summary": summary, "plan": plan,
            "profile": load_profile(os.path.join(workdir, "profile.json"))}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--workdir", help="keep the runs here (default: a temporary directory)")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.workdir or tmp
        path = os.path.join(tmp, "profile.json")
        save_profile(forcing_profile(demo_param_bytes()), path)
        for name in args.modes.split(","):
            wd = os.path.join(tmp, name.replace(" ", "_").replace("+", "p"))
            run = train(wd, path, args.steps, MODES[name])
            s, plan = run["summary"], run["plan"]
            exact_here = dataclasses.replace(plan, averaging="exact", outer_compression="none")
            rows.append((name, cross_region_bytes(plan, run["profile"]),
                         float(s["eval_scores"][s["metric"]]), s["metric"],
                         float(s["final_loss"]), plan,
                         cross_region_bytes(exact_here, run["profile"])))
            print(f"[{name}] {plan.num_pipelines} pipelines, averaging {plan.averaging}"
                  f"{' + ' + plan.outer_compression if plan.outer_compression != 'none' else ''}",
                  flush=True)
    good = next((r[2] for r in rows if r[0] == "exact"), None)
    print(f"\nThe demo, {args.steps} steps, on 4 devices each in its own region (100 Mbit/s, "
          f"40 ms between them), DiLoCo H = 10, top-k 1/{round(1 / FRACTION)} of each 4096 "
          f"values. Each run's plan is the planner's (pipelines: how many it took); 'exact here' "
          f"is what the exact exchange would send across regions on that plan's pipelines, and "
          f"'fewer' is it over the row's bytes. The eval metric is the run's after its steps, "
          f"and its ratio to the exact run's:\n")
    print(f"| averaging | pipelines | bytes across regions / step | exact here | fewer | "
          f"eval {rows[0][3]} | vs exact run | final loss |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, b, metric, _, loss, plan, here in rows:
        ratio = f"{here / b:.1f}x" if b else "-"
        rel = f"{metric / good:.3f}" if good else "-"
        print(f"| {name} | {plan.num_pipelines} | {b / 1e6:.3f} MB | {here / 1e6:.3f} MB | "
              f"{ratio} | {metric:.3f} | {rel} | {loss:.4f} |")


if __name__ == "__main__":
    from experiments import results_doc

    results_doc.run(main, [(
        None, "compression_bench", "Compressed averaging across regions",
        "Bytes across regions per step and the eval metric of the averagings between pipelines "
        "on the demo, each a short run over the same steps: exact, int8, DiLoCo, and DiLoCo "
        "with its outer deltas in top-k (1/8 of each chunk, `relax.outer_topk`'s default) and "
        "2 or 4 bits with error feedback (`relax.outer_compression=topk2` / `topk4`).")])
