"""Bytes across regions per step, and the eval metric, of the averagings between pipelines: exact,
int8, DiLoCo, DiLoCo with its outer deltas in top-k 2- and 4-bit (``relax.outer_compression``,
at ``relax.outer_topk``'s default fraction), and the peer modes: ``decentral`` (one peer per
step, ``relax.peers=ring``), ``decentral-int8`` (the same, its differences to the pair's last
mean in int8, ``relax.peer_bits=8``) and ``async`` (the exact average applied k = 2 steps late,
``relax.async_steps=2``); with ``--curve`` their loss curves over a longer run, with
``--rehearse`` their rehearsed step times on two regions at 100 Mbit/s and 80 ms.

The table. Each row is a short training run of the demo (``configs/local_demo.py``) planned on
a fixed profile: the demo's 6 units with their real gradient bytes on 4 equal devices, each its
own region, 100 Mbit/s and 40 ms between regions, every model fitting every device, so that the
plan is pipelines in data parallel and the exchange crosses regions (the forcing of
``tests/test_relax_quality.py``; the devices run at the host's speed, so only the math differs
between rows). A peer row's plan is forced as ``tests/test_relax_quality.py``'s ``FORCED`` cases
are, so that it is 4 one-device pipelines in that mode whatever the planner prefers: a
``python -c`` wrapper replaces ``skyjax.train.plan_lib.plan`` by ``evaluate_pipelines`` of those
pipelines (its bound from the row's ``--config.relax.*``); the row says whether ``python -m
skyjax.plan`` takes that same plan under the row's bound (there decentral's bound gets 4
pipelines in exact averaging, which the simulator prices faster). The bytes are the plan's,
message by message, summed over the messages whose ends lie in different regions: the
exchange's as the simulator replays it (``plan.replay``: the routing, the coded phases and the
top-k payload's exact bytes per unit, ``skyjax.topk_wire``), an outer step's over its H; a peer
mode's as ``plan.replay.peer_run`` replays it: decentral's pair messages
(``pricing.peers.pair_messages``) averaged over the schedule's period, in float32 or, for
decentral-int8, at the int8 codec's wire (``pricing.peers.peer_wire``, ``INT8_WIRE``, which
``replay.peer_run.peer_coding`` declares to a rehearsal too); async's direct exchange of every
replica's parameters once every k steps. The ratio is the exact exchange's bytes on the same
plan (its pipelines, averaging exact) over the row's, as the exact run's own plan may take
fewer pipelines. The eval metric is the run's own on the demo's
held-out set (a peer mode averages every replica into one model before it evaluates). A row
whose mode this version does not know (a ``--config.relax`` key, a plan mode or a runtime it
lacks) is skipped with one printed line.

The curve (``--curve``). Exact, DiLoCo, DiLoCo + top-k 2-bit, decentral, decentral-int8 and
async, each a run of ``--curve_steps`` (600) on the same profile and plans as the table, the
loss of every step logged (``train.log_every=1``, the run's ``metrics.jsonl``), drawn as the
mean of each ``--curve_every`` (10) steps on a log scale into ``docs/pictures/relax_curves.png``
(``matplotlib.figure.Figure``, no pyplot), the eval metric in the legend.

The rehearsal (``--rehearse``; ``--rehearse_only``: it alone, and with ``--results`` only its
part of the section is rewritten, under a line naming that command, the table and curve above it
left as they were measured). ``experiments/clusters/two_regions_100mbit.json``: 16 devices of
two speeds (1.5 and 0.75 TFLOP/s), 8 in each of two regions joined at 100 Mbit/s and 80 ms,
16 GB each so that one device holds the whole model, a small BERT (6 layers, hidden 256, 28 MB
of float32 gradients) at 256 x 128 tokens per micro-batch: a step's compute (about a second on
one region) is then of the order of the exact exchange across the regions, so that the exact
plan keeps to one region while the relaxed bounds take their mode with pipelines in both (with
600 MB devices no pipeline fitted one region, every pipeline spanned both and every mode took
the same exact plan; with 20 TFLOP/s devices and 8 x 128 tokens per micro-batch no exchange of
the model's bytes at 100 Mbit/s pays, and every mode keeps to one region). It is composed and
rehearsed as docs/guide/rehearsal.md does (``python -m skyjax.profile.compose --cluster FILE
--out profile.json``, then ``python -m skyjax.main --config configs/rehearse.py --workdir DIR
--config.rehearse.profile=profile.json``) with each mode's ``--config.relax.*`` flags,
``--config.relax.min_gain=0`` and ``--config.allocation.max_pipelines`` ``--rehearse_pipelines``
(8; configs/rehearse.py's 4 leaves out the 4 + 4 one-device pipelines), at ``--time_scale`` 2
(the host's real compute per call, ~10 ms, stays small beside the declared calls) for
``--rehearse_steps`` 12, or more where the mode's bound allows a periodic mode: its warm-up,
two whole periods and a last step (31 under DiLoCo's H = 10). Composing gives the hand-off
codecs' rates only; the top-k 2-bit coding rate, which DiLoCo + top-k needs priced, is added to
profile.json as the int8 codec's (one memory-bound pass). The row says the plan the run took
(pipelines, averaging), where its pipelines lie, whether that is the mode asked for (the planner
chooses among what the bound allows; no config key forces an averaging mode, so a plan is not
forced here; ``int8-across`` and ``diloco-across``, the mode on the links between regions only,
count as theirs), the devices used, the plan's bytes per step between the regions (as the
table's), the run's steps, its predicted step (summary.json's, the simulated one; for a periodic
plan the mean over its period: DiLoCo's H steps with their one outer step, a peer schedule's
period of pairings, async's k steps with their one late average), the simulator's, the measured
step and the rehearsal's own (summary.json's ``rehearsal``: the median step without the first;
under DiLoCo their mean), all in the declared cluster's seconds, and the gap measured /
predicted - 1. The measured step is what the prediction predicts: the mean of the logged steps
(``metrics.jsonl``, ``train.log_every=1``) over the most whole periods after a warm-up that runs
every program once, the run's last step left out; period and warm-up are the plan's
(:func:`periodicity`): H and H under DiLoCo (the first outer step, at step H, compiles; with 31
steps it measures steps 11-30), the schedule's period and that period under the peer modes
(``pricing.peers.period``, 2 on the ring of more than two pipelines), k and k + 1 under async
(one exchange in flight: the first late average lands at step k + 1, and compiles), else 1 and 1
(the first step compiles). Below the table, for each mode whose plan is not that mode or keeps
to one region: the mode priced by the cost model (``evaluate_pipelines``) on the pipelines of
the rows that cross the regions, its least T, beside its own plan's.

Every run shares a JAX compilation cache in the work folder: the stages' programs repeat from
run to run, so the first step (compiling, never measured) of the later runs is shorter.

    python -m experiments.compression_bench [--steps 200] [--curve] [--rehearse] [--results]
    python -m experiments.compression_bench --rehearse_only [--results]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from skyjax.plan.data_parallel.pipelines import grad_prefix
from skyjax.plan.model.types import Plan
from skyjax.plan.pricing.exchange import INT8_WIRE, routing
from skyjax.plan.pricing.peers import pair_messages, period
from skyjax.plan.replay.coding import plan_coding
from skyjax.plan.replay.exchange_run import exchange_of
from skyjax.profile.format import Profile, load_profile, save_profile
from skyjax.topk_wire import FRACTION

MODES = {"exact": [], "int8": ["--config.relax.averaging=int8"],
         "diloco": ["--config.relax.averaging=diloco"],
         "diloco + top-k 2-bit": ["--config.relax.averaging=diloco",
                                  "--config.relax.outer_compression=topk2"],
         "diloco + top-k 4-bit": ["--config.relax.averaging=diloco",
                                  "--config.relax.outer_compression=topk4"],
         "decentral": ["--config.relax.peers=ring"],
         "decentral-int8": ["--config.relax.peers=ring", "--config.relax.peer_bits=8"],
         "async": ["--config.relax.async_steps=2"]}
# each mode's (averaging, outer_compression) in a plan; the peer modes' plans are forced
WANT = {"exact": ("exact", "none"), "int8": ("int8", "none"), "diloco": ("diloco", "none"),
        "diloco + top-k 2-bit": ("diloco", "topk2"), "diloco + top-k 4-bit": ("diloco", "topk4"),
        "decentral": ("decentral", "none"), "decentral-int8": ("decentral-int8", "none"),
        "async": ("async", "none")}
FORCED = ("decentral", "decentral-int8", "async")
CURVE = ("exact", "diloco", "diloco + top-k 2-bit", "decentral", "decentral-int8", "async")
REHEARSE = ("exact", "int8", "diloco", "diloco + top-k 2-bit", "decentral", "decentral-int8",
            "async")
CLUSTER = os.path.join(REPO, "experiments", "clusters", "two_regions_100mbit.json")
PICTURE = os.path.join(REPO, "docs", "pictures", "relax_curves.png")

# as tests/test_relax_quality.py's FORCED cases: four pipelines of one device each, in the
# row's mode, its bound (peers, peer_bits, async_steps) the run's own config.relax
_FORCED = """
import dataclasses, sys
import skyjax.train as train
def forced(profile, *a, relax, **k):  # four pipelines of one device each, averaging {mode!r}
    prof = dataclasses.replace(profile, relax=relax)
    return train.plan_lib.evaluate_pipelines(prof, [[(d, 0, prof.num_units)] for d in range(4)],
                                             [1, 1, 1, 1], "1f1b", averaging={mode!r})
train.plan_lib.plan = forced
from skyjax.cli.train import run
sys.argv = ["skyjax.main"] + {argv!r}
run()
"""


def read_run(workdir: str) -> tuple[dict, Plan]:
    """A finished run's summary.json and plan.json."""
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(workdir, "plan.json")) as f:
        return summary, Plan.from_json(json.load(f))


class Skipped(Exception):
    """A row this version cannot run (its message says why)."""


def slug(name: str) -> str:
    return name.replace(" ", "_").replace("+", "p")


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


def _chains(plan: Plan) -> list[list[tuple[int, int, int]]]:
    return [[(s.device, *s.units) for s in plan.pipeline(i).stages]
            for i in range(plan.num_pipelines)]


def peer_wire(plan: Plan, profile: Profile) -> float:
    """Wire bytes per parameter byte of a peer mode's messages, as the pricing takes them
    (``pricing.peers.peer_wire`` where this version has it: decentral-int8's int8, else
    float32)."""
    try:
        from skyjax.plan.pricing.peers import peer_wire as wire_of
    except ImportError:
        return INT8_WIRE if plan.averaging == "decentral-int8" else 1.0
    return float(wire_of(plan.averaging, profile)[0])


def cross_region_bytes(plan: Plan, profile: Profile) -> float:
    """Bytes per step on links between regions: each message of the plan's exchange whose ends
    lie in different regions, coded phases at the coded bytes, an outer step's over its H; a
    peer mode's as :func:`peer_cross_region_bytes`."""
    if plan.num_pipelines < 2:
        return 0.0
    if plan.averaging in FORCED:
        return peer_cross_region_bytes(plan, profile)
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


def peer_cross_region_bytes(plan: Plan, profile: Profile) -> float:
    """A peer mode's bytes per step between regions, as ``plan.replay.peer_run`` sends them:
    decentral's pair messages of each step of the schedule's period, their mean, at the mode's
    wire; async's direct exchange (every owner to every other owner of its units) once every
    k = the plan's staleness steps."""
    region = [d.get("region") for d in profile.devices]
    gp, chains = grad_prefix(profile), _chains(plan)

    def of(messages) -> float:
        return float(sum(gp[u + 1] - gp[u] for m in messages
                         if region[m.src] != region[m.dst] for u in m.units))

    if plan.averaging == "async":
        return of(routing(chains, None).messages) / max(int(plan.staleness), 1)
    steps = period(plan.num_pipelines, plan.peer_schedule)
    total = sum(of(pair_messages(chains, t, plan.peer_schedule)) for t in range(steps))
    return peer_wire(plan, profile) * total / steps


def unknown_keys(flags: list[str]) -> list[str]:
    """The ``--config.a.b=v`` keys of ``flags`` this version's config lacks."""
    from skyjax.config import base_config

    config, out = base_config(), []
    for flag in flags:
        path = flag.split("=", 1)[0][len("--config."):].split(".")
        node = config
        for key in path:
            if key not in node:
                out.append("config." + ".".join(path))
                break
            node = node[key]
    return out


def relax_of(flags: list[str]):
    """The :class:`~skyjax.relax.Relaxation` of ``flags``' ``--config.relax.*`` and min_gain 0."""
    from skyjax.relax import Relaxation

    kw = {"min_gain": 0.0}
    for flag in flags:
        key, value = flag[len("--config.relax."):].split("=", 1)
        kw[key] = type(getattr(Relaxation(), key))(value)
    return Relaxation(**kw)


def supported(name: str) -> None:
    """Raises :class:`Skipped` where this version lacks the mode of row ``name``."""
    from skyjax.names import PEER_MODES

    missing = unknown_keys(MODES[name])
    if missing:
        raise Skipped(f"{', '.join(missing)} is not a key of this version's config")
    if name in FORCED and WANT[name][0] not in PEER_MODES:
        raise Skipped(f"averaging {WANT[name][0]!r} is not a plan mode of this version "
                      f"(skyjax.names.PEER_MODES: {', '.join(PEER_MODES)})")


def run_env(workdir: str) -> dict:
    """A run's environment: this checkout, the CPU, and a compilation cache beside the runs
    (the stages' programs repeat from run to run: their first step, never measured, is
    shorter)."""
    return dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu",
                JAX_COMPILATION_CACHE_DIR=os.path.join(os.path.dirname(workdir), "jax_cache"),
                JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")


def train(workdir: str, profile_path: str, steps: int, name: str, log_every: int | None = None
          ) -> dict:
    """Row ``name``'s run of the demo (its plan forced where it is a peer mode): its
    summary, plan, profile and each logged step's loss."""
    supported(name)
    argv = [f"--config={REPO}/configs/local_demo.py", f"--workdir={workdir}",
            f"--config.profile.path={profile_path}", f"--config.train.steps={steps}",
            f"--config.train.log_every={log_every or steps}",
            "--config.allocation.calibrate_steps=0", "--config.cluster.slowdowns=(1,1,1,1)",
            "--config.relax.min_gain=0", *MODES[name]]
    if name in FORCED:
        cmd = [sys.executable, "-c", _FORCED.format(mode=WANT[name][0], argv=argv)]
    else:
        cmd = [sys.executable, "-m", "skyjax.main", *argv]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=run_env(workdir))
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        if name in FORCED and "not run by this version" in proc.stderr:
            raise Skipped(f"the runtime does not run it: {last}")
        raise SystemExit(f"run failed ({proc.returncode}): {' '.join(cmd[:2])} "
                         f"{' '.join(argv)}\n{proc.stderr[-3000:]}")
    summary, plan = read_run(workdir)
    losses = []
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "split" not in r and "loss" in r:
                losses.append((int(r["step"]), float(r["loss"])))
    return {"summary": summary, "plan": plan, "losses": losses,
            "profile": load_profile(os.path.join(workdir, "profile.json"))}


def described(plan: Plan) -> str:
    """``2 pipelines, exact`` / ``4 pipelines, diloco + topk2``."""
    extra = f" + {plan.outer_compression}" if plan.outer_compression != "none" else ""
    if plan.num_pipelines < 2:
        return "1 pipeline"
    return f"{plan.num_pipelines} pipelines, {plan.averaging}{extra}"


def planners_own(profile_path: str, name: str, forced: Plan) -> str:
    """Whether ``python -m skyjax.plan`` takes the ``forced`` plan on the profile under row
    ``name``'s bound (the same pipelines and averaging), else what it takes."""
    from skyjax.report.plan_report import plan_file

    plan, _, _ = plan_file(profile_path, "optimal", "1f1b", forced.microbatches,
                           relax=relax_of(MODES[name]), warmup="auto")
    same = (_chains(plan) == _chains(forced) and plan.averaging == forced.averaging
            and list(plan.shares or []) == list(forced.shares or []))
    return "the planner's own too" if same else f"the planner's own: {described(plan)}"


def table(args, tmp: str, path: str) -> None:
    """The bytes / quality table (module doc)."""
    rows, skipped = [], []
    for name in args.modes.split(","):
        wd = os.path.join(tmp, slug(name))
        try:
            run = train(wd, path, args.steps, name)
        except Skipped as e:
            print(f"[{name}] skipped: {e}", file=sys.stderr, flush=True)
            skipped.append((name, str(e)))
            continue
        s, plan = run["summary"], run["plan"]
        exact_here = dataclasses.replace(plan, averaging="exact", outer_compression="none")
        how = (f"forced ({planners_own(path, name, plan)})" if name in FORCED
               else "planner")
        rows.append((name, cross_region_bytes(plan, run["profile"]),
                     float(s["eval_scores"][s["metric"]]), s["metric"],
                     float(s["final_loss"]), plan,
                     cross_region_bytes(exact_here, run["profile"]), how))
        print(f"[{name}] {described(plan)} ({how})", file=sys.stderr, flush=True)
    if not rows:
        return
    good = next((r[2] for r in rows if r[0] == "exact"), None)
    print(f"The demo, {args.steps} steps, on 4 devices each in its own region (100 Mbit/s, "
          f"40 ms between them), DiLoCo H = 10, top-k 1/{round(1 / FRACTION)} of each 4096 "
          f"values, decentral on the ring, async k = 2. 'plan' says whose plan it ran: the "
          f"planner's, or forced to 4 one-device pipelines in the peer mode (in brackets: "
          f"whether `python -m skyjax.plan` takes that plan under the row's bound); 'exact "
          f"here' is what the exact exchange would send across regions on that plan's "
          f"pipelines, and 'fewer' is it over the row's bytes. The eval metric is the run's "
          f"after its steps, and its ratio to the exact run's:\n")
    print(f"| averaging | plan | pipelines | bytes across regions / step | exact here | fewer | "
          f"eval {rows[0][3]} | vs exact run | final loss |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, b, metric, _, loss, plan, here, how in rows:
        ratio = f"{here / b:.1f}x" if b else "-"
        rel = f"{metric / good:.3f}" if good else "-"
        print(f"| {name} | {how} | {plan.num_pipelines} | {b / 1e6:.3f} MB | "
              f"{here / 1e6:.3f} MB | {ratio} | {metric:.3f} | {rel} | {loss:.4f} |")
    for name, why in skipped:
        print(f"\n{name}: skipped, {why}.")
    print()


def window_means(losses: list[tuple[int, float]], every: int) -> tuple[list[int], list[float]]:
    """The mean loss of each ``every`` steps, at its last step."""
    steps, means = [], []
    for i in range(0, len(losses) - every + 1, every):
        chunk = losses[i:i + every]
        steps.append(chunk[-1][0])
        means.append(float(np.mean([x for _, x in chunk])))
    return steps, means


def draw_curves(curves: list[tuple[str, list[int], list[float], str]], title: str,
                path: str) -> None:
    """One line per mode, log-scale loss (``matplotlib.figure.Figure``, no pyplot)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 4.8), dpi=120)
    ax = fig.add_subplot(1, 1, 1)
    for label, steps, means, style in curves:
        ax.plot(steps, means, style, label=label, linewidth=1.4)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (mean of the window)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path)


def curve(args, tmp: str, path: str) -> None:
    """The loss curves (module doc)."""
    styles = ["-", "--", ":", "-", "--", "-."]
    curves, rows = [], []
    for name, style in zip(args.curve_modes.split(","), styles):
        try:
            run = train(os.path.join(tmp, "curve_" + slug(name)), path, args.curve_steps, name,
                        log_every=1)
        except Skipped as e:
            print(f"[curve {name}] skipped: {e}", file=sys.stderr, flush=True)
            rows.append((name, None, str(e)))
            continue
        s, plan = run["summary"], run["plan"]
        steps, means = window_means(run["losses"], args.curve_every)
        metric = float(s["eval_scores"][s["metric"]])
        curves.append((f"{name} ({s['metric']} {metric:.3f})", steps, means, style))
        rows.append((name, (plan, float(s["final_loss"]), means[-1], s["metric"], metric),
                     None))
        print(f"[curve {name}] {described(plan)}", file=sys.stderr, flush=True)
    title = (f"The demo, {args.curve_steps} steps, 4 devices each in its own region: the "
             f"training loss, mean of each {args.curve_every} steps")
    if curves:
        draw_curves(curves, f"The demo, {args.curve_steps} steps, 4 devices each in its own "
                    f"region: mean of each {args.curve_every} steps", args.picture)
    rel = os.path.relpath(args.picture, os.path.join(REPO, "docs"))
    print(f"{title} (the table's profile and plans: peer modes forced to 4 one-device "
          f"pipelines), and each run's final loss (its last step's), the mean of its last "
          f"{args.curve_every} steps and its eval metric:\n")
    print(f"![loss curves of the averaging modes]({rel})\n")
    print(f"| averaging | plan | final loss | last {args.curve_every} steps | eval |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, got, why in rows:
        if got is None:
            print(f"| {name} | skipped: {why} | - | - | - |")
            continue
        plan, final, last, metric_name, metric = got
        print(f"| {name} | {described(plan)} | {final:.4f} | {last:.4f} | "
              f"{metric_name} {metric:.3f} |")
    print()


def command(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True,
                          text=True, env=env)


def regions_of(plan: Plan, profile: Profile) -> str:
    """Where the plan's pipelines lie: ``4 eu, 4 us`` (a pipeline across regions: ``eu+us``)."""
    region = [str(d.get("region")) for d in profile.devices]
    counts: dict[str, int] = {}
    for chain in _chains(plan):
        key = "+".join(sorted({region[d] for d, _, _ in chain}))
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} {r}" for r, n in sorted(counts.items()))


def crosses(plan: Plan, profile: Profile) -> bool:
    """Whether the plan's pipelines lie in more than one region (its exchange crosses them)."""
    region = [d.get("region") for d in profile.devices]
    return plan.num_pipelines > 1 and len({region[s.device] for s in plan.stages}) > 1


def taken(name: str, plan: Plan) -> bool:
    """Whether ``plan`` is row ``name``'s mode (``int8-across`` / ``diloco-across``, the mode on
    the links between regions only, count as ``int8`` / ``diloco``)."""
    got = (plan.averaging if plan.num_pipelines > 1 else "one pipeline", plan.outer_compression)
    return (got[0].removesuffix("-across"), got[1]) == WANT[name]


def rehearse_one(name: str, profile: str, workdir: str, args, env: dict) -> dict:
    """Row ``name``'s rehearsal (module doc)."""
    supported(name)
    steps = rehearsal_steps(relax_of(MODES[name]), args)
    cmd = ["skyjax.main", "--config", "configs/rehearse.py", "--workdir", workdir,
           f"--config.rehearse.profile={profile}", "--config.relax.min_gain=0",
           f"--config.rehearse.time_scale={args.time_scale}",
           f"--config.allocation.max_pipelines={args.rehearse_pipelines}",
           f"--config.train.steps={steps}", "--config.train.log_every=1",
           "--config.checkpoint.resume=False", "--config.checkpoint.replace=True",
           *MODES[name]]
    start = time.monotonic()
    done = command(*cmd, env=env)
    wall = time.monotonic() - start
    if done.returncode:
        raise SystemExit(f"rehearsal failed ({done.returncode}): python -m {' '.join(cmd)}\n"
                         f"{done.stderr[-3000:]}")
    summary, plan = read_run(workdir)
    r = summary["rehearsal"]
    k = float(r["time_scale"])
    d = r["declared_cluster_step_s"]
    predicted = float(summary["predicted_step_time_s"]) / k
    times = {}  # logged step (1-based) -> its seconds, declared
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            x = json.loads(line)
            if "split" not in x:
                times[int(x["step"])] = float(x["step_time_s"]) / k
    measured, span = periods_mean(times, plan)
    return {"plan": plan, "used": r["devices_used"], "devices": r["devices"],
            "predicted": predicted, "simulated": float(d["simulated"]),
            "model": float(d["model"]) if d.get("model") is not None else float("nan"),
            "median": float(d["measured"]), "measured": measured,
            "gap": measured / predicted - 1, "span": span, "steps": steps,
            "wall": wall, "overruns": (r.get("calls") or {}).get("overruns", 0)}


def periods_mean(times: dict[int, float], plan: Plan) -> tuple[float, tuple[range, int, int]]:
    """The mean of ``times`` (logged step, 1-based -> seconds) over the most whole periods after
    ``plan``'s warm-up, the last step left out (:func:`periodicity`), and (those steps, the
    number of periods, the period); NaN where not one whole period was logged."""
    warm, period = periodicity(plan)
    last = max(times, default=0)
    n = max((last - 1 - warm) // period, 0)
    span = range(warm + 1, warm + n * period + 1)
    if n == 0 or any(i not in times for i in span):
        return float("nan"), (span, 0, period)
    return statistics.fmean(times[i] for i in span), (span, n, period)


def periodicity(plan: Plan) -> tuple[int, int]:
    """The warm-up and the period, in steps, of ``plan``'s step times (module doc): DiLoCo's
    outer step every H steps (the first, at step H, compiles it); a peer schedule's period
    (``pricing.peers.period``; its first period runs each pairing's program first); async's
    staleness k (the first late average lands at step k + 1); else 1 and 1 (the first step
    compiles)."""
    from skyjax.plan.pricing.peers import period

    mode = plan.averaging if plan.num_pipelines > 1 else "exact"
    if mode.startswith("diloco"):
        return max(int(plan.outer_every), 1), max(int(plan.outer_every), 1)
    if mode.startswith("decentral"):
        p = period(plan.num_pipelines, getattr(plan, "peer_schedule", "") or "ring")
        return p, p
    if mode == "async":
        k = max(int(getattr(plan, "staleness", 0)), 1)
        return k + 1, k
    return 1, 1


def rehearsal_steps(relax, args) -> int:
    """Steps of a rehearsal under bound ``relax``: ``--rehearse_steps``, or more where a periodic
    mode the bound allows needs them for its warm-up, two whole periods and a last step
    (:func:`periodicity`; the planner may take any mode the bound allows)."""
    from skyjax.plan.pricing.peers import period

    need = [args.rehearse_steps]
    if relax.averaging.startswith("diloco"):
        need.append(3 * relax.outer_every + 1)
    if relax.peers != "none":
        p = period(args.rehearse_pipelines, relax.peers)
        need.append(3 * p + 1)
    if relax.async_steps:
        need.append(3 * relax.async_steps + 2)
    return max(need)


def priced_elsewhere(name: str, prof: Profile, rows: list) -> tuple[Plan, str] | None:
    """Row ``name``'s own mode priced by the cost model (``evaluate_pipelines``, T) on the
    pipelines and shares of each other row whose plan crosses the regions: the least T, and
    that row's name (None where no row crosses or none fits)."""
    from skyjax.plan.data_parallel.pipelines import evaluate_pipelines
    from skyjax.plan.model.types import InfeasibleError

    mode = WANT[name][0]
    relaxed = dataclasses.replace(prof, relax=relax_of(MODES[name]))
    best = None
    for other, row, _ in rows:
        if row is None or other == name or not crosses(row["plan"], prof):
            continue
        plan = row["plan"]
        try:
            got = evaluate_pipelines(relaxed, _chains(plan), list(plan.shares), plan.schedule,
                                     averaging=mode)
        except (InfeasibleError, ValueError):
            continue
        if best is None or got.step_time_s < best[0].step_time_s:
            best = (got, other)
    return best


def rehearse(args, tmp: str) -> None:
    """The rehearsed step times of the modes (module doc)."""
    with open(args.cluster) as f:
        cluster = json.load(f)
    profile = os.path.join(tmp, "profile.json")
    done = command("skyjax.profile.compose", "--cluster", args.cluster, "--out", profile)
    if done.returncode:
        raise SystemExit(f"compose failed: {done.stderr[-2000:]}")
    with open(profile) as f:
        d = json.load(f)
    d["codecs"]["topk2"] = {"output_bytes": list(d["codecs"]["int8"]["output_bytes"]),
                            "seconds_per_byte": list(d["codecs"]["int8"]["seconds_per_byte"])}
    with open(profile, "w") as f:
        json.dump(d, f)
    prof = load_profile(profile)
    env = run_env(profile)
    between = cluster["links"]["between"][0]
    rows = []
    for name in args.rehearse_modes.split(","):
        try:
            row = rehearse_one(name, profile, os.path.join(tmp, "rehearse_" + slug(name)),
                               args, env)
        except Skipped as e:
            print(f"[rehearse {name}] skipped: {e}", file=sys.stderr, flush=True)
            rows.append((name, None, str(e)))
            continue
        rows.append((name, row, None))
        print(f"[rehearse {name}] {described(row['plan'])} ({regions_of(row['plan'], prof)}): "
              f"measured {row['measured']:.4f} s against {row['predicted']:.4f} s "
              f"({row['wall']:.0f} s)", file=sys.stderr, flush=True)
    n = sum(sum(k.values()) for k in cluster["regions"].values())
    kinds = ", ".join(f"{k} {v['flops_per_s']:.3g} FLOP/s" for k, v in cluster["kinds"].items())
    mem = max(v["memory_bytes"] for v in cluster["kinds"].values())
    model = cluster.get("model", {})
    shape = ", ".join(f"{k} {v}" for k, v in model.items())
    print(f"The rehearsal: {os.path.relpath(args.cluster, REPO)}, {n} devices in "
          f"{len(cluster['regions'])} regions ({kinds}; {mem / 1e9:g} GB each, so that one "
          f"device holds the whole model) joined at {between['bandwidth_Bps'] * 8 / 1e6:g} "
          f"Mbit/s and {between['latency_s'] * 1e3:g} ms; the model a BERT of {shape} "
          f"({sum(u['param_bytes'] for u in prof.units) / 1e6:.1f} MB of float32 gradients). "
          f"Rehearsed with configs/rehearse.py (m = 8, up to {args.rehearse_pipelines} "
          f"pipelines, relax.min_gain 0) at time scale {args.time_scale:g} for "
          f"{args.rehearse_steps} steps, or more where the bound allows a periodic mode "
          f"('steps'); seconds of the declared cluster. 'plan' is the plan "
          f"the planner took under the mode's bound (nothing forced), 'regions' where its "
          f"pipelines lie, 'taken' whether it is the mode asked for (its -across form, the "
          f"mode on the links between regions only, counts), 'across' the plan's bytes per "
          f"step between the regions (its exchange as replayed, an outer step's over its H); "
          f"predicted is summary.json's (the simulated step; for a periodic plan the mean "
          f"over its period: DiLoCo's H steps with their one outer step, a peer schedule's "
          f"pairings, async's k steps with their one late average), measured the mean of the "
          f"logged steps over whole periods after a warm-up that runs every program once "
          f"('measured steps': the first H steps under DiLoCo, the first period under a peer "
          f"schedule, the first k + 1 under async, else the first step), the run's last step "
          f"left out, median the rehearsal's own (summary.json's: the median step without "
          f"the first; under DiLoCo their mean), gap measured / predicted - 1:\n")
    print("| mode | plan | regions | taken | devices | across / step | steps | "
          "measured steps | predicted (s) | simulated (s) | measured (s) | median (s) | gap | "
          "wall (s) |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: "
          "| ---: |")
    for name, row, why in rows:
        if row is None:
            print(f"| {name} | skipped: {why} |" + " - |" * 12)
            continue
        plan = row["plan"]
        across = cross_region_bytes(plan, prof) if crosses(plan, prof) else 0.0
        span, n, period = row["span"]
        which = (f"{span[0]}-{span[-1]} ({n} x {period})" if n > 0 else "none")
        print(f"| {name} | {described(plan)} | {regions_of(plan, prof)} | "
              f"{'yes' if taken(name, plan) else 'no'} | {row['used']}/{row['devices']} | "
              f"{across / 1e6:.3f} MB | {row['steps']} | {which} | {row['predicted']:.4f} | "
              f"{row['simulated']:.4f} | {row['measured']:.4f} | {row['median']:.4f} | "
              f"{100 * row['gap']:+.1f}% | {row['wall']:.0f} |")
    notes = []
    for name, row, _ in rows:
        if row is None or (taken(name, row["plan"]) and crosses(row["plan"], prof)):
            continue
        plan = row["plan"]
        what = ("not taken" if not taken(name, plan) else "taken inside one region")
        other = priced_elsewhere(name, prof, rows)
        if other is None:
            notes.append(f"- {name}: {what}; no other row's plan crosses the regions to "
                         f"price it on.")
            continue
        got, where = other
        notes.append(
            f"- {name}: {what} ({described(plan)}, {regions_of(plan, prof)}, cost model T "
            f"{row['model']:.4f} s). The cost model prices {WANT[name][0]} on the "
            f"{where} row's pipelines ({regions_of(got, prof)}) at T {got.step_time_s:.4f} s "
            f"(exchange {got.allreduce_s:.4f} s), its least on the plans that cross.")
    if notes:
        print("\nThe modes whose plan keeps to one region or is not the mode, and what the "
              "planner's cost model says of the mode across the regions:\n")
        print("\n".join(notes))
    print()


REHEARSAL_START = ("Rehearsal measured by ", "The rehearsal: ",
                   "experiments/clusters/two_regions_100mbit.json: ")  # the last: the old text


def rehearsal_results(argv: list[str]) -> None:
    """``--rehearse_only --results``: run the rehearsal alone and replace only its part of the
    compression_bench section of docs/results.md (from its first line, ``REHEARSAL_START``, to
    the section's end), under a line naming this command and the machine; the table and the
    curve above it stay as they were measured."""
    import contextlib
    import io
    import shlex

    from experiments import results_doc

    args = [a for a in argv if a != results_doc.FLAG]
    command_line = shlex.join(["python", "-m", "experiments.compression_bench", *args,
                               results_doc.FLAG])
    kept = io.StringIO()

    class Tee(io.TextIOBase):
        def write(self, text: str) -> int:
            kept.write(text)
            return sys.__stdout__.write(text)

        def flush(self) -> None:
            sys.__stdout__.flush()

    with contextlib.redirect_stdout(Tee()):
        main(args)
    begin, end = "<!-- results:compression_bench -->", "<!-- /results:compression_bench -->"
    text = results_doc.RESULTS.read_text(encoding="utf-8")
    if begin not in text or end not in text:
        raise SystemExit(f"{results_doc.RESULTS}: no compression_bench section to update; run "
                         f"the whole bench with --results first")
    head, rest = text.split(begin, 1)
    body, tail = rest.split(end, 1)
    lines = body.split("\n")
    at = next((i for i, line in enumerate(lines) if line.startswith(REHEARSAL_START)),
              len(lines))
    part = (f"Rehearsal measured by `{command_line}` on {results_doc.machine()}.\n\n"
            f"{kept.getvalue().strip()}\n")
    body = "\n".join(lines[:at]).rstrip("\n") + "\n\n" + part
    tmp = results_doc.RESULTS.with_name(results_doc.RESULTS.name + f".tmp-{os.getpid()}")
    tmp.write_text(head + begin + body + end + tail, encoding="utf-8")
    os.replace(tmp, results_doc.RESULTS)
    print(f"{results_doc.FLAG}: wrote the rehearsal of section 'compression_bench' of "
          f"{results_doc.RESULTS}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--no_table", action="store_true", help="skip the bytes / quality table")
    p.add_argument("--curve", action="store_true", help="the loss curves (module doc)")
    p.add_argument("--curve_steps", type=int, default=600)
    p.add_argument("--curve_every", type=int, default=10)
    p.add_argument("--curve_modes", default=",".join(CURVE))
    p.add_argument("--picture", default=PICTURE)
    p.add_argument("--rehearse", action="store_true", help="the rehearsed step times")
    p.add_argument("--cluster", default=CLUSTER)
    p.add_argument("--rehearse_only", action="store_true",
                   help="the rehearsal alone (no table); with --results it rewrites only the "
                        "rehearsal's part of the section")
    p.add_argument("--time_scale", type=float, default=2.0)
    p.add_argument("--rehearse_pipelines", type=int, default=8)
    p.add_argument("--rehearse_steps", type=int, default=12)
    p.add_argument("--rehearse_modes", default=",".join(REHEARSE))
    p.add_argument("--workdir", help="keep the runs here (default: a temporary directory)")
    args = p.parse_args(argv)
    if args.rehearse_only:
        args.no_table, args.curve, args.rehearse = True, False, True
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.workdir or tmp
        os.makedirs(tmp, exist_ok=True)
        path = os.path.join(tmp, "profile_demo.json")
        if not args.no_table or args.curve:  # the demo's profile (the rehearsal composes its own)
            save_profile(forcing_profile(demo_param_bytes()), path)
        parts = [("table", not args.no_table, lambda: table(args, tmp, path)),
                 ("curve", args.curve, lambda: curve(args, tmp, path)),
                 ("rehearse", args.rehearse, lambda: rehearse(args, tmp))]
        for part, on, do in parts:
            if on:
                start = time.monotonic()
                do()
                print(f"[{part}] {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    from experiments import results_doc

    if "--rehearse_only" in sys.argv[1:] and results_doc.FLAG in sys.argv[1:]:
        rehearsal_results(sys.argv[1:])
        sys.exit(0)
    results_doc.run(main, [(
        None, "compression_bench", "Compressed averaging across regions",
        "Bytes across regions per step and the eval metric of the averagings between pipelines "
        "on the demo, each a short run over the same steps: exact, int8, DiLoCo, DiLoCo with "
        "its outer deltas in top-k (1/8 of each chunk, `relax.outer_topk`'s default) and 2 or 4 "
        "bits with error feedback (`relax.outer_compression=topk2` / `topk4`), and the peer "
        "modes `decentral` (ring), `decentral-int8` and `async` (k = 2), their plans forced to "
        "4 one-device pipelines; with `--curve`, the loss curves of a longer run; with "
        "`--rehearse`, each mode's plan and step rehearsed on two regions at 100 Mbit/s and "
        "80 ms (`experiments/clusters/two_regions_100mbit.json`), predicted against measured.")],
        fenced=False)
