"""What bounds a pipeline across a slow link: exact against int8 hand-offs on a profile, the
planner's plan with 1F1B's own warm-ups and with deeper ones (``--warmup auto``, the window
model: docs/design.md, "Latency and the window"), the simulator's replay of the latter (links
as queues, as the transports' link emulation), the best window price over every plan (device
subsets, orders, cuts; brute force), and a bound no schedule goes below.

    python -m skyjax.profile --config configs/local_demo.py --out /tmp/lat/profile.json \\
      --config.cluster.slowdowns="(1,1,1,1)" --config.cluster.regions="('eu','eu','us','us')" \\
      --config.cluster.link_latency_s=0.04 --config.cluster.link_bandwidth_Bps=12.5e6 \\
      --config.cluster.memory_caps_bytes="(20000000,20000000,20000000,20000000)" \\
      --config.relax.handoff_bits=8
    python experiments/latency_bound.py --profile /tmp/lat/profile.json --microbatches 4 8 16

With --bandwidth_Bps / --latency_s the cross-region links of the profile are replaced first.
``--rehearse`` measures instead: rehearsals of the profile (``configs/rehearse.py``: the runtime,
its schedules and link clocks, every call and message taking the profile's time x
``--time_scale``), exact and int8 under 1F1B's own and ``auto`` warm-ups, one pipeline:

    python experiments/latency_bound.py --profile /tmp/lat/profile.json --rehearse --microbatches 4 8

The bound (``chain``): any plan crosses the slow link (the memory caps force it), so some unit
u after the crossing runs all m micro-batches' forward and backward on one device, after the
first micro-batch's forward reached it (one latency and hand-off) and before the last one's
backward leaves it (the other latency and hand-off, then the units before u):
T >= 2 latency + 2 x + sum_{v != u} work_v + m work_u, with each unit's least work over the
devices and x the fewest bytes' hand-off, the least over cuts c of the largest over u >= c (or
m/2 of the work before c, two devices on the first side).

On this 2-core host (the demo: 6 units, 0.2 / 7.3 / 7.3 / 7.3 / 7.3 / 0.1 ms of work per
micro-batch of 8; a hand-off 132 kB: 10.6 ms at 100 Mbit/s, 2.8 ms in int8), exact / int8:

    m   1F1B T (model)     auto T_win         simulated         best plan T_win    chain bound
    4   443 / 382  1.16x   180 / 145  1.24x   180 / 145  1.24x  170 / 145  1.17x   132 / 117
    8   853 / 730  1.17x   239 / 224  1.07x   239 / 224  1.07x  239 / 224  1.07x   133 / 118
    16  1673 / 1428 1.17x  357 / 342  1.04x   357 / 343  1.04x  357 / 342  1.04x   235 / 226

(at m = 4 the best plans put two devices on each side, d0[0,2) > d1[2,3) w3 > d2[3,4) > d3[4,6),
simulated 172.5 / 144.7 ms; auto finds it for int8, by the search without latencies, and keeps
d0[0,1) w3 > d2[1,3) > d3[3,6) for exact.)

Measured (``--rehearse``, time scale 4, 20 steps, in the profile's times; predicted: the plan's
T, the window model's T_win under auto), exact / int8:

    link               m   1F1B's own warm-ups              auto warm-ups
    100 Mbit/s, 40 ms  4   277 / 254 1.09x (443 / 382)      189 / 157 1.20x (180 / 145 1.24x)
                       8   521 / 462 1.13x (853 / 730)      255 / 239 1.07x (239 / 224 1.07x)
    25 Mbit/s, 40 ms   4   457 / 280 1.63x (696 / 450)      358 / 192 1.87x (325 / 182 1.79x)
                       8   822 / 526 1.56x (1358 / 867)     542 / 260 2.09x (494 / 241 2.05x)

(the 25 Mbit/s profile: this one with its cross-region bandwidths set to 3.125e6.) Deeper
warm-ups take the exact step at 100 Mbit/s from 277 to 189 ms (m = 4) and from 521 to 255 ms
(m = 8); today's T of 1F1B's own warm-ups, which charges the latency per micro-batch, is an
upper bound (443 against 277 measured), the window model within 10 % of the measured step.
Repeated runs of a row differ by up to 4 % (1F1B's own at m = 4, int8: 245 and 254 ms). The
relaxation guide's real runs (skyjax.main, this host's own compute, 60 steps, m = 4, the
profile above via --config.profile.path, load average about 18 on 2 cores): 1F1B's own 325 / 315 ms, auto
250 / 231 ms (1.08x), the exact runs' losses equal.

1.5x is out of reach at 100 Mbit/s against the best exact plan: the compute per micro-batch of a stage of two layers (14.6 ms) exceeds the
exact hand-off (10.6 ms one way), so once the latency is hidden the bytes int8 saves are off the
critical path but for the fill (2 x 7.8 ms per step). At m = 4 no schedule reaches it: 1.5x needs
int8 at most 172.5 / 1.5 = 115.0 ms (the simulator's best exact plan, 172.5 ms), below the chain
bound's 116.7 ms. At m = 8 and 16 no plan reaches it with any warm-up (1.07x and 1.04x at best;
brute force over plans of the window model, which the simulator matches within 0.3 % here). A
link floor of 2 latency + 2 m x (1.98x at m = 8) counts both directions as one queue, where the
link clock keeps one per direction, and leaves the compute out.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from skyjax.plan import planner
from skyjax.plan.search import warmup
from skyjax.plan.pricing.cost import evaluate_tables, tables
from skyjax.plan.replay.simulate import simulate_plan
from skyjax.plan.model.types import InfeasibleError
from skyjax.profile.format import Profile, load_profile
from skyjax.relax import Relaxation


def best_window(prof: Profile, m: int):
    """The least T_win over every plan with the warm-ups ``warmup.choose`` gives (brute force),
    and its simulated step."""
    t = tables(prof, "1f1b", m)
    u, d = prof.num_units, prof.num_devices
    best = None
    for p in range(1, min(u, d) + 1):
        for devs in itertools.permutations(range(d), p):
            for cuts in itertools.combinations(range(1, u), p - 1):
                ends = [0, *cuts, u]
                try:
                    plan = evaluate_tables(prof, t, [(e, ends[i], ends[i + 1])
                                                     for i, e in enumerate(devs)], "x", False,
                                           None)
                except InfeasibleError:
                    continue
                plan = warmup.deepen(t, plan, lambda: 0.0)
                if best is None or plan.step_time_s < best.step_time_s:
                    best = plan
    return best, simulate_plan(best, prof).step_time_s


def chain_bound(prof: Profile, m: int, codec: str, latency: float, bandwidth: float) -> float:
    """The module doc's bound for a plan crossing one link of ``latency`` and ``bandwidth``."""
    work = (np.asarray(prof.forward_s) + np.asarray(prof.backward_s)).min(axis=1)
    out = np.array([float(x["output_bytes"]) for x in prof.units]) if codec == "none" else \
        np.asarray(prof.codecs[codec]["output_bytes"], float)
    x = out / bandwidth
    u = len(work)
    return float(min(max([2 * latency + 2 * x[c - 1] + work.sum() + (m - 1) * work[v]
                          for v in range(c, u)] + [m * work[:c].sum() / 2])
                     for c in range(1, u)))


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rehearse(profile: str, m: int, bits: int, warm: str, scale: float, steps: int,
             workdir: str) -> dict:
    """One rehearsal (``configs/rehearse.py``: the real runtime and link clocks, every call and
    message taking the time ``profile`` declares x ``scale``); its summary's ``rehearsal``."""
    cmd = [sys.executable, "-m", "skyjax.main", f"--config={REPO}/configs/rehearse.py",
           f"--workdir={workdir}", f"--config.rehearse.profile={profile}",
           f"--config.rehearse.time_scale={scale}", f"--config.relax.handoff_bits={bits}",
           "--config.relax.min_gain=0", f"--config.pipeline.warmup={warm}",
           "--config.allocation.max_pipelines=1", f"--config.pipeline.microbatches={m}",
           f"--config.data.batch_size={4 * m}", f"--config.train.steps={steps}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"))
    if proc.returncode:
        raise SystemExit(f"run failed ({proc.returncode}): {' '.join(cmd)}\n"
                         f"{proc.stderr[-3000:]}")
    with open(os.path.join(workdir, "summary.json")) as f:
        return json.load(f)["rehearsal"]


def measured(args) -> None:
    """--rehearse: exact and int8 under 1F1B's own and auto warm-ups, measured by rehearsals of
    the profile (times in the profile's base, i.e. divided by the time scale)."""
    print(f"{'m':>3} {'warmup':<6} {'exact meas':>10} {'int8 meas':>10} {'gain':>6}   "
          f"{'exact pred':>10} {'int8 pred':>10} {'gain':>6}")
    for m in args.microbatches:
        for warm in ("1f1b", "auto"):
            got = [rehearse(args.profile, m, bits, warm, args.time_scale, args.steps,
                            tempfile.mkdtemp(prefix=f"lat_{m}_{warm}_{bits}_"))
                   for bits in (32, 8)]
            meas = [r["measured_step_s"] / args.time_scale for r in got]
            pred = [r["model_step_s"] / args.time_scale for r in got]
            print(f"{m:>3} {warm:<6} {meas[0] * 1e3:>8.1f}ms {meas[1] * 1e3:>8.1f}ms "
                  f"{meas[0] / meas[1]:>5.2f}x   {pred[0] * 1e3:>8.1f}ms {pred[1] * 1e3:>8.1f}ms "
                  f"{pred[0] / pred[1]:>5.2f}x", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", required=True)
    p.add_argument("--microbatches", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--latency_s", type=float)
    p.add_argument("--bandwidth_Bps", type=float)
    p.add_argument("--rehearse", action="store_true",
                   help="measure instead: rehearsals of the profile (the runtime, declared times)")
    p.add_argument("--time_scale", type=float, default=4.0)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args(argv)
    if args.rehearse:
        if args.latency_s is not None or args.bandwidth_Bps is not None:
            raise SystemExit("--rehearse runs the profile's own links: write them into it")
        return measured(args)
    prof = load_profile(args.profile)
    region = [d.get("region", "") for d in prof.devices]
    cross = [(i, j) for i in range(prof.num_devices) for j in range(prof.num_devices)
             if region[i] != region[j]]
    for i, j in cross:
        if args.latency_s is not None:
            prof.latency_s[i, j] = args.latency_s
        if args.bandwidth_Bps is not None:
            prof.bandwidth_Bps[i, j] = args.bandwidth_Bps
    lat = max(float(prof.latency_s[i, j]) for i, j in cross)
    bw = min(float(prof.bandwidth_Bps[i, j]) for i, j in cross)
    head = (f"{'m':>3} {'plan':<6} {'1F1B T':>9} {'auto T':>9} {'sim auto':>9} "
            f"{'best T':>9} {'sim best':>9} {'chain':>9}   auto plan")
    print(head + "\n" + "-" * len(head))
    for m in args.microbatches:
        rows = []
        for name, relax in (("exact", Relaxation()), ("int8", Relaxation(8, min_gain=0))):
            own = planner.plan(dataclasses.replace(prof), "optimal", "1f1b", m,
                               max_pipelines=1, relax=relax)
            auto = planner.plan(dataclasses.replace(prof), "optimal", "1f1b", m,
                                max_pipelines=1, relax=relax, warmup="auto")
            best, best_sim = best_window(dataclasses.replace(prof, relax=relax), m)
            rows.append((own.step_time_s, auto.step_time_s,
                         simulate_plan(auto, prof).step_time_s, best.step_time_s, best_sim,
                         chain_bound(prof, m, "none" if name == "exact" else "int8", lat, bw)))
            print(f"{m:>3} {name:<6} " + " ".join(f"{x * 1e3:>7.1f}ms" for x in rows[-1])
                  + "   " + " > ".join(
                      f"d{s.device}[{s.units[0]},{s.units[1]})"
                      + ("" if s.codec == "none" else f" {s.codec}")
                      + ("" if s.warmup is None else f" w{s.warmup}") for s in auto.stages))
        a, b = rows
        print(f"{m:>3} {'exact/int8':<10}" + " ".join(f"{x / y:>9.2f}x" for x, y in zip(a, b)))


if __name__ == "__main__":
    from experiments import results_doc

    results_doc.run(main, [(
        "--rehearse", "latency_bound-rehearse", "Latency across a slow link, rehearsed",
        "The relaxation guide's two-region profile (40 ms; memory caps force every plan across "
        "the link), exact against int8 hand-offs under 1F1B's own and deeper (`auto`) "
        "warm-ups, rehearsed with the profile's declared times (the runtime and its link "
        "clocks): measured step against the window model and the simulator."), (
        None, "latency_bound", "Latency across a slow link: the bounds",
        "The same profile priced, not run: exact against int8 under the cost model with 1F1B's "
        "warm-ups, the window model with deeper ones, the simulator, the best window price "
        "over every plan (brute force) and the chain bound no schedule goes below.")])
