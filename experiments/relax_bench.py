"""Relaxation on slow links against the exact run, side by side in one run: hand-off codecs on a
link-bound pipeline, relaxed averaging between two regions, and what the planner chooses on a
fast link.

    python experiments/relax_bench.py                        # every part, ~30 min on 2 cores
    python experiments/relax_bench.py --parts link --steps 100
    python experiments/relax_bench.py --parts fast           # the planner only, seconds

Every run is ``python -m skyjax.main`` on the demo model (``configs/local_demo.py``: 4 layers,
hidden 128, batch 32 in 4 micro-batches of 8 x 32 tokens) over 4 emulated devices in one
process, two regions (``eu``: devices 0, 1; ``us``: 2, 3) joined by a link of
``--bandwidth_Bps`` (default 12.5e6 B/s = 100 Mbit/s) and ``--latency_s`` (40 ms); inside a
region the links are the host's. Link delays are sleeps (deterministic here); the planner
chooses within each run's bound (``config.relax``) from the run's own profile.

* ``link``: memory caps of ``--cap_bytes`` per device, so that no plan fits in one region and
  every plan crosses the slow link; the bound on hand-off bits goes 32 (exact), 16, 8, 4.
  ``relax.min_gain`` 0, so that each bound's codec runs. Twice: the synthetic task from
  scratch, and fine-tuning for the second half of the steps from the exact run's checkpoint at
  half way (a model trained offline; the fine-tuning restores it under each relaxed plan).
  Then exact, int8 and int4 again at ``--narrow_Bps`` (10 Mbit/s), timing only: at 100 Mbit/s
  and 40 ms the demo's 1F1B step is mostly waits for the link's latency (a stage 2 hops before
  the slow link holds at most 3 micro-batches in flight, each a round trip over it), which no
  codec shortens; ``--config.pipeline.warmup=auto`` hides it (more in flight there), and
  ``experiments/latency_bound.py`` measures what int8 gains then.
* ``noise``: the exact run again at another seed: how far two equally good runs end apart,
  the yardstick for the relaxed runs' differences at these small losses.
* ``regions``: no memory caps, devices emulated 4x slower (each call sleeps 3x its compute, so
  the host's 2 cores are not what limits four busy devices), up to 2 pipelines; the bound on
  averaging goes exact, int8, diloco (``--outer_every``).
* ``fast``: the ``link`` and ``regions`` bounds at their loosest on the profile of ``link``
  with its slow link replaced by 10 Gbit/s and 1 ms: the plans the planner chooses.

Printed per run: what the planner chose (the slow link's codec, the averaging), the bytes per
step on the slow link (from the plan's codecs and the profile's shapes: forward and backward
hand-offs of every micro-batch, or the gradient exchange), the predicted and measured step (the
median after the compiling step), the speed-up over the exact run, the final training loss,
the eval loss and accuracy (1024 held-out examples), and the loss every ``--log_every`` steps.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from skyjax.plan import planner
from skyjax.plan.data_parallel.pipelines import INT8_WIRE, grad_prefix
from skyjax.profile.format import load_profile
from skyjax.relax import Relaxation

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REGIONS = ("eu", "eu", "us", "us")


def main_run(workdir: str, flags: list[str]) -> dict:
    """One ``skyjax.main`` run; its summary, plan, profile and logged losses."""
    cmd = [sys.executable, "-m", "skyjax.main", f"--config={REPO}/configs/local_demo.py",
           f"--workdir={workdir}", *flags]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"))
    if proc.returncode:
        raise SystemExit(f"run failed ({proc.returncode}): {' '.join(cmd)}\n"
                         f"{proc.stderr[-3000:]}")
    return _load(workdir)


def link_flags(args, bits: int, steps: int, slowdowns: str = "(1,1,1,1)",
               pipelines: int = 1) -> list[str]:
    """One pipeline unless ``pipelines`` says otherwise (the link part's pipeline crosses the
    slow link; the default max_pipelines, auto, would plan as the run's profile says)."""
    return [f"--config.train.steps={steps}", f"--config.train.log_every={args.log_every}",
            f"--config.allocation.max_pipelines={pipelines}",
            "--config.allocation.calibrate_steps=0", f"--config.cluster.slowdowns={slowdowns}",
            f"--config.cluster.regions={REGIONS}",
            f"--config.cluster.link_latency_s={args.latency_s}",
            f"--config.cluster.link_bandwidth_Bps={args.bandwidth_Bps}",
            f"--config.relax.handoff_bits={bits}",
            # every bound's codec in use, so that each is measured against exact (the planner's
            # own min_gain rule is what the "fast" part shows)
            "--config.relax.min_gain=0"]


def slow_link_bytes(run: dict) -> tuple[float, str]:
    """Bytes per step on the cross-region links, and what crossed (codecs / averaging)."""
    plan, prof = run["plan"], run["profile"]
    region = [d.get("region", "") for d in prof.devices]
    total, what = 0.0, []
    shares = plan.get("shares") or [plan["microbatches"]]
    by_pipe: dict[int, list] = {}
    for s in plan["stages"]:
        by_pipe.setdefault(s.get("pipeline", 0), []).append(s)
    for i, stages in by_pipe.items():
        for s, nxt in zip(stages, stages[1:]):
            if region[s["device"]] != region[nxt["device"]]:
                codec, cut = s.get("codec", "none"), s["units"][1] - 1
                one = (prof.units[cut]["output_bytes"] if codec == "none"
                       else prof.codecs[codec]["output_bytes"][cut])
                total += 2 * shares[i] * float(one)  # forward and backward, per micro-batch
                what.append(codec)
    if len(by_pipe) > 1:  # each stage sends its replicated gradients to its cross-region peers
        g = grad_prefix(prof)
        averaging = plan.get("averaging", "exact")
        # the direct exchange's bytes across (an upper bound for the -across modes, which send
        # one copy of a unit per region)
        per = {"exact": 1.0, "int8": INT8_WIRE,
               "diloco": 1.0 / max(plan.get("outer_every", 1), 1)}[averaging.split("-")[0]]
        pipes = list(by_pipe.values())
        for a in pipes:
            for b in pipes:
                if a is b:
                    continue
                for s in a:
                    for t in b:
                        lo, hi = max(s["units"][0], t["units"][0]), min(s["units"][1],
                                                                         t["units"][1])
                        if lo < hi and region[s["device"]] != region[t["device"]]:
                            total += per * float(g[hi] - g[lo])
        what.append(f"averaging {averaging}")
    return total, ", ".join(what) or "no crossing"


def describe(run: dict) -> str:
    plan = run["plan"]
    shares = plan.get("shares") or [plan["microbatches"]]
    pipes: dict[int, list] = {}
    for s in plan["stages"]:
        pipes.setdefault(s.get("pipeline", 0), []).append(
            f"d{s['device']}[{s['units'][0]},{s['units'][1]})")
    return " | ".join(f"{'>'.join(v)} m={shares[i]}" for i, v in sorted(pipes.items()))


def table(title: str, rows: list[tuple[str, dict]]) -> None:
    print(f"\n{title}")
    base = rows[0][1]["summary"]["step_time_s"]
    head = (f"{'bound':<14} {'plan':<44} {'slow link':<26} {'MB/step':>8} {'pred.':>8} "
            f"{'meas.':>8} {'speed-up':>8} {'loss':>7} {'eval':>7} {'acc':>6}")
    print(head)
    print("-" * len(head))
    for name, run in rows:
        s = run["summary"]
        nbytes, what = slow_link_bytes(run)
        print(f"{name:<14} {describe(run):<44} {what:<26} {nbytes / 1e6:>8.3f} "
              f"{s['predicted_step_time_s'] * 1e3:>6.0f}ms {s['step_time_s'] * 1e3:>6.0f}ms "
              f"{base / s['step_time_s']:>7.2f}x {s['final_loss']:>7.4f} {s['eval_loss']:>7.4f} "
              f"{s['eval_accuracy']:>6.3f}")
    ref = rows[0][1]
    for name, run in rows[1:]:
        de = run["summary"]["eval_loss"] / ref["summary"]["eval_loss"] - 1
        da = 100 * (run["summary"]["eval_accuracy"] - ref["summary"]["eval_accuracy"])
        print(f"  {name}: eval loss {de:+.2%} against exact, accuracy {da:+.1f} points")
    print("  loss curves (step: " + " ".join(str(k) for k, _ in ref["curve"]) + ")")
    for name, run in rows:
        print(f"  {name:<14} " + " ".join(f"{x:.3f}" for _, x in run["curve"]))


def part_link(args, tmp: str) -> None:
    caps = ",".join([str(args.cap_bytes)] * 4)
    half = args.steps // 2
    sources = (("synthetic task from scratch", "scratch"),
               (f"fine-tuning from the exact run's checkpoint at step {half}", "resume"))
    for source, kind in sources:
        rows = []
        for bits in (32, 16, 8, 4):
            wd = os.path.join(tmp, f"link_{kind}_{bits}")
            flags = link_flags(args, bits, args.steps) + [
                f"--config.cluster.memory_caps_bytes=({caps})"]
            if kind == "scratch" and bits == 32:  # the checkpoint the fine-tuning starts from
                flags.append(f"--config.checkpoint.every={half}")
            if kind == "resume":
                pretrained = os.path.join(tmp, "link_scratch_32", "checkpoints", str(half))
                shutil.copytree(pretrained, os.path.join(wd, "checkpoints", str(half)))
            run = main_run(wd, flags)
            rows.append(("exact" if bits == 32 else f"<= {bits} bits", run))
            print(f"[link] {source}, bits {bits}: step {run['summary']['step_time_s']:.4f} s",
                  flush=True)
        table(f"Link-bound pipeline, {source}: memory caps {args.cap_bytes / 1e6:g} MB per "
              f"device, regions {REGIONS}, {args.bandwidth_Bps * 8 / 1e6:g} Mbit/s and "
              f"{args.latency_s * 1e3:g} ms between them", rows)
    if not args.narrow_Bps:
        return
    narrow = []  # the same bounds where the bytes, not the latency, fill the step
    for bits in (32, 8, 4):
        wd = os.path.join(tmp, f"narrow_{bits}")
        flags = link_flags(args, bits, args.timing_steps) + [
            f"--config.cluster.memory_caps_bytes=({caps})",
            f"--config.cluster.link_bandwidth_Bps={args.narrow_Bps}"]
        narrow.append(("exact" if bits == 32 else f"<= {bits} bits", main_run(wd, flags)))
    print(f"\nThe same bounds at {args.narrow_Bps * 8 / 1e6:g} Mbit/s and "
          f"{args.latency_s * 1e3:g} ms, {args.timing_steps} steps (step time only; the "
          f"losses of a plan do not depend on the link's speed)")
    base = narrow[0][1]["summary"]["step_time_s"]
    for name, run in narrow:
        s = run["summary"]
        nbytes, what = slow_link_bytes(run)
        print(f"  {name:<14} {describe(run):<44} {what:<10} {nbytes / 1e6:>6.3f} MB/step "
              f"pred. {s['predicted_step_time_s'] * 1e3:>5.0f}ms meas. "
              f"{s['step_time_s'] * 1e3:>5.0f}ms {base / s['step_time_s']:>5.2f}x")


def part_noise(args, tmp: str) -> None:
    """How far two exact runs that differ only in the seed end apart: the yardstick for the
    relaxed runs' differences (an exact run at another seed is as good a model)."""
    flags = link_flags(args, 32, args.steps) + [
        "--config.cluster.memory_caps_bytes=(" + ",".join([str(args.cap_bytes)] * 4) + ")"]
    done = os.path.join(tmp, "link_scratch_32")  # the link part's exact run, when it ran
    base = _load(done) if os.path.exists(os.path.join(done, "summary.json")) else main_run(
        os.path.join(tmp, "noise_seed0"), flags)
    other = main_run(os.path.join(tmp, "noise_seed1"), flags + ["--config.train.seed=1"])
    table("Exact against exact at another seed (the same plan): run-to-run spread",
          [("exact", base), ("exact, seed 1", other)])


def _load(workdir: str) -> dict:
    """A finished run's results (as :func:`main_run` returns them)."""
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(workdir, "plan.json")) as f:
        plan = json.load(f)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        curve = [(r["step"], r["loss"]) for r in map(json.loads, f) if "loss" in r]
    return {"summary": summary, "plan": plan, "curve": curve,
            "profile": load_profile(os.path.join(workdir, "profile.json"))}


def part_regions(args, tmp: str) -> list:
    rows = []
    for averaging in ("exact", "int8", "diloco"):
        wd = os.path.join(tmp, f"regions_{averaging}")
        run = main_run(wd, link_flags(args, 32, args.steps, "(4,4,4,4)", pipelines=2) + [
            f"--config.relax.averaging={averaging}",
            f"--config.relax.outer_every={args.outer_every}"])
        rows.append((averaging, run))
        print(f"[regions] {averaging}: step {run['summary']['step_time_s']:.4f} s", flush=True)
    table(f"Two regions that each hold the model: devices 4x slower, up to 2 pipelines, "
          f"{args.bandwidth_Bps * 8 / 1e6:g} Mbit/s and {args.latency_s * 1e3:g} ms between "
          f"regions, DiLoCo H = {args.outer_every}", rows)
    return rows


def part_fast(args, tmp: str) -> None:
    """The planner on a measured profile whose cross-region links are fast."""
    wd = os.path.join(tmp, "fast_profile")
    paths = glob.glob(os.path.join(tmp, "link_scratch_4", "profile.json"))
    if not paths:  # a short run measures the profile (all codecs timed)
        caps = ",".join([str(args.cap_bytes)] * 4)
        main_run(wd, link_flags(args, 4, 2) + [f"--config.cluster.memory_caps_bytes=({caps})"])
        paths = [os.path.join(wd, "profile.json")]
    prof = load_profile(paths[0])
    region = [d.get("region", "") for d in prof.devices]
    print("\nThe planner at 10 Gbit/s and 1 ms between regions (the measured profile, its "
          "cross-region links replaced), loosest bounds: hand-offs >= 4 bits, averaging up to "
          "diloco")
    for name, lat, bw in (("slow link", args.latency_s, args.bandwidth_Bps),
                          ("10 Gbit/s, 1 ms", 1e-3, 10e9 / 8)):
        for i in range(prof.num_devices):
            for j in range(prof.num_devices):
                if region[i] != region[j]:
                    prof.latency_s[i, j], prof.bandwidth_Bps[i, j] = lat, bw
        for caps, pipes in ((args.cap_bytes, 1), (float("inf"), 2)):
            for d in prof.devices:
                d["memory_bytes"] = caps if np.isfinite(caps) else 1e12
            loose = planner.plan(prof, "optimal", "1f1b", 4, max_pipelines=pipes,
                                 relax=Relaxation(4, "diloco", args.outer_every))
            exact = planner.plan(prof, "optimal", "1f1b", 4, max_pipelines=pipes)
            codecs = [s.codec for s in loose.stages if s.codec != "none"]
            print(f"  {name:<16} {'caps' if pipes == 1 else 'no caps, 2 pipelines':<22} "
                  f"codecs {codecs or 'none'}, averaging {loose.averaging}: predicted "
                  f"{loose.step_time_s * 1e3:.1f} ms against exact {exact.step_time_s * 1e3:.1f}"
                  f" ms")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="link,noise,regions,fast")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--log_every", type=int, default=20)
    p.add_argument("--latency_s", type=float, default=0.04)
    p.add_argument("--bandwidth_Bps", type=float, default=12.5e6)
    p.add_argument("--narrow_Bps", type=float, default=1.25e6,
                   help="a narrower slow link for a timing-only rerun of exact, int8, int4 "
                        "(0: none)")
    p.add_argument("--timing_steps", type=int, default=30)
    p.add_argument("--cap_bytes", type=int, default=20_000_000)
    p.add_argument("--outer_every", type=int, default=10)
    p.add_argument("--workdir", help="keep the runs here (default: a temporary directory)")
    args = p.parse_args(argv)
    parts = args.parts.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.workdir or tmp
        if "link" in parts:
            part_link(args, tmp)
        if "noise" in parts:
            part_noise(args, tmp)
        if "regions" in parts:
            part_regions(args, tmp)
        if "fast" in parts:
            part_fast(args, tmp)


if __name__ == "__main__":
    from experiments import results_doc

    results_doc.run(main, [(
        None, "relax_bench", "Relaxation on slow links, trained",
        "The demo model, each row a full training run against the exact one: hand-off codecs on "
        "a link-bound pipeline across 100 Mbit/s and 40 ms (from scratch, fine-tuning from a "
        "mid-way checkpoint, and timing on a 10x narrower link), the exact run at another seed "
        "as the yardstick, relaxed averaging between two regions, and the planner's choices on "
        "a fast link: bytes on the slow link, predicted and measured step, final and eval loss, "
        "accuracy.")])
