"""``python -m skyjax.plan``: plan a pipeline from a profile file (no devices needed).

  python -m skyjax.plan --profile profile.json --strategy optimal --schedule 1f1b \\
      --microbatches 8 [--pipelines N|auto] [--certify] [--shared_host auto|on|off] [--json] [--out plan.json]
      [--trace trace.json] [--plot plan.png] [--timeline timeline.png] [--time_scale K]

Without ``--json`` it prints a table (stage, device, units, compute, comm, memory, share of the
bottleneck, totals; the bottleneck marked); with it, the plan.json object (docs/design.md).
``--pipelines N`` lets the planner split the devices into up to N pipelines in data parallel
(default ``auto``: up to min(16, devices, micro-batches), one pipeline where the shared-host
model applies; 1: one pipeline; the table then shows each stage's pipeline, each pipeline's
devices, share and T_i, and the gradient all-reduce). ``--trace`` writes the simulated schedule as a Chrome / Perfetto trace; ``--plot`` and
``--timeline`` draw the plan and the simulated step (:mod:`skyjax.report.plots`; matplotlib is
imported only then, so planning itself needs neither it nor JAX). ``--certify`` also computes
the lower-bound certificates (:mod:`skyjax.plan.certificates`). ``--time_scale K`` shows a
rehearsal's view (``config.rehearse``): the plan in its time base and the calls and messages it
declares. A bad profile or an infeasible
problem prints one line on stderr and exits with status 2 (bad profile) or 1 (nothing fits); no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from skyjax import failures, workdir
from skyjax.jsonio import write_json_atomic
from skyjax.names import AVERAGING, SCHEDULE_CHOICES, STRATEGIES, WARMUPS
from skyjax.plan import planner
from skyjax.plan.replay import simulate
from skyjax.plan.model.types import InfeasibleError, Plan
from skyjax.profile.format import Profile, load_profile
from skyjax.relax import Relaxation
from skyjax.report.text_table import fmt_bytes, fmt_time, render, time_unit


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = failures.OneLineParser(prog="python -m skyjax.plan", description=__doc__.splitlines()[0])
    p.add_argument("--profile", required=True, help="profile.json (version 1)")
    p.add_argument("--strategy", choices=STRATEGIES, default="optimal")
    p.add_argument("--schedule", choices=SCHEDULE_CHOICES, default="1f1b",
                   help="auto: every schedule planned, the least predicted step kept")
    p.add_argument("--warmup", choices=WARMUPS, default="1f1b",
                   help="1F1B's warm-up forwards; auto: deeper before a slow link where that "
                        "hides its latency within memory")
    p.add_argument("--microbatches", type=_positive_int, default=8)
    p.add_argument("--pipelines", type=_pipelines, default=0,
                   help="most pipelines in data parallel (the planner picks 1..N); default "
                        "'auto': up to min(16, devices, micro-batches), one where the "
                        "shared-host model applies: it plans one pipeline")
    p.add_argument("--certify", action="store_true",
                   help="compute the lower-bound certificates (plan.json's lower_bound_s and "
                        "exact; seconds at scale)")
    p.add_argument("--shared_host", choices=("auto", "on", "off"), default="auto",
                   help="the shared-host cost model (skyjax.hostmodel); auto: on where the "
                        "profile was measured under it (its devices record their host)")
    p.add_argument("--handoff_bits", type=int, choices=(32, 16, 8, 4), default=32,
                   help="fewest bits per value a stage hand-off may carry (skyjax.relax; the "
                        "profile must have timed those codecs); 32: exact")
    p.add_argument("--averaging", choices=AVERAGING, default="exact",
                   help="the most relaxed averaging across pipelines allowed")
    p.add_argument("--outer_every", type=_positive_int, default=10,
                   help="diloco: inner steps per outer step")
    p.add_argument("--min_gain", type=float, default=0.05,
                   help="the least fraction of the step a relaxed plan must save")
    p.add_argument("--time_scale", type=float, default=None, metavar="K",
                   help="a rehearsal's view (config.rehearse.time_scale=K): the plan in its "
                        "time base and every call and message it declares")
    p.add_argument("--json", action="store_true", help="print plan.json instead of a table")
    p.add_argument("--out", help="write plan.json here")
    p.add_argument("--trace", help="write the simulated schedule as a Chrome trace here")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw the plan here: units per device, stage times, memory (matplotlib)")
    p.add_argument("--timeline", metavar="FILE.png",
                   help="draw the simulated schedule here, bubbles visible (matplotlib)")
    return p.parse_args(argv)


def _pipelines(text: str) -> int:
    """A positive integer, or ``auto`` (0: the planner's cap, ``planner.AUTO_PIPELINES``)."""
    return 0 if text == "auto" else _positive_int(text)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def format_table(plan: Plan, profile: Profile) -> str:
    """A readable summary of the plan: one row per stage (device, units, compute, comm, stage
    time, memory against the device's, share of the bottleneck), a totals row, the bottleneck
    stage marked, and how the predicted step time is made up."""
    used = len(plan.stages)
    several = plan.num_pipelines > 1
    head = (f"{plan.strategy} plan, {plan.schedule}, {plan.microbatches} micro-batches: "
            f"{used} stage{'s' if used != 1 else ''} on {used} of {profile.num_devices} devices, "
            f"{profile.num_units} units"
            + (f", {plan.num_pipelines} pipelines in data parallel" if several else ""))
    unit = time_unit(max([s.time_s for s in plan.stages] + [1e-12]))
    worst = max(range(used), key=lambda k: plan.stages[k].time_s) if used else -1
    rows, notes = [], []
    coded = any(s.codec != "none" for s in plan.stages)  # a column: each link's codec
    lasts = {ids[-1] for ids in (plan.stage_ids(i) for i in range(plan.num_pipelines))}
    for k, s in enumerate(plan.stages):
        a, b = s.units
        names = profile.units[a]["name"] + (f" .. {profile.units[b - 1]['name']}" if b - a > 1
                                             else "")
        dev = profile.devices[s.device]
        cap = float(dev["memory_bytes"])
        rows.append(((str(s.pipeline),) if several else ()) + (str(k), f"{s.device} {dev['name']}", str(b - a), f"[{a}, {b}) {names}",
                     fmt_time(s.compute_s, unit), fmt_time(s.comm_s, unit),
                     fmt_time(s.time_s, unit), fmt_bytes(s.memory_bytes), fmt_bytes(cap),
                     f"{s.memory_bytes / cap:.1%}" if cap > 0 else "-",
                     f"{s.time_s / plan.bottleneck_s:.0%}" if plan.bottleneck_s > 0 else "-")
                    + ((s.codec if k not in lasts else "",) if coded else ()))
        notes.append("bottleneck" if k == worst else "")
    total = (("",) if several else ()) + ("total", "", str(profile.num_units), "",
             fmt_time(sum(s.compute_s for s in plan.stages), unit),
             fmt_time(sum(s.comm_s for s in plan.stages), unit),
             fmt_time(sum(s.time_s for s in plan.stages), unit),
             fmt_bytes(sum(s.memory_bytes for s in plan.stages)), "", "", "") + (
                 ("",) if coded else ())
    table = render((("pipeline",) if several else ()) + (
        "stage", "device", "units", "unit range", "compute", "comm", "stage time", "memory",
        "device memory", "used", "share") + (("codec to next",) if coded else ()), rows,
        right=((True,) if several else ()) + (True, False, True, False, True, True, True, True,
                                             True, True, True) + ((False,) if coded else ()),
        total=total, notes=notes)
    if several:
        return "\n".join([head, "", table, "", *_pipelines_tail(plan, worst)])
    stages_s = sum(s.time_s for s in plan.stages)
    extra = plan.step_time_s - stages_s - (plan.microbatches - 1) * plan.bottleneck_s
    tail = (f"predicted step time {fmt_time(plan.step_time_s)} = sum of stage times "
            f"{fmt_time(stages_s)} + ({plan.microbatches} - 1) x bottleneck "
            f"{fmt_time(plan.bottleneck_s)} (stage {worst})"
            + (f" + once-per-step costs {fmt_time(extra)}" if abs(extra) > 1e-9 * max(
                plan.step_time_s, 1e-12) else "") + "; times per micro-batch; ")
    if plan.exact:
        tail += "optimal under the cost model (exact)" if plan.strategy != "even" else \
            "even split (no search)"
    else:
        tail += (f"heuristic, lower bound {fmt_time(plan.lower_bound_s)}" if plan.lower_bound_s
                 else "even split (no search)")
    return "\n".join([head, "", table, "", tail])


def _averaging(plan: Plan) -> str:
    """How the pipelines average, as the step time's term names it (``skyjax.relax``)."""
    if plan.averaging == "int8":
        return "int8 gradient exchange (error feedback)"
    if plan.averaging == "int8-across":
        return "gradient exchange, int8 between regions (error feedback)"
    if plan.averaging.startswith("diloco"):
        where = " between regions" if plan.averaging == "diloco-across" else ""
        return (f"{'exact all-reduce in each region + ' if where else ''}DiLoCo outer step"
                f"{where} every {plan.outer_every} steps (lr {plan.outer_lr:g}, "
                f"momentum {plan.outer_momentum:g}), amortised")
    return "gradient all-reduce"


def _pipelines_tail(plan: Plan, worst: int) -> list[str]:
    """Per pipeline its devices, units, share and T_i; then how T is made up."""
    lines = []
    for i in range(plan.num_pipelines):
        sub = plan.pipeline(i)
        lines.append(f"pipeline {i}: devices {[s.device for s in sub.stages]}, units "
                     f"[{sub.stages[0].units[0]}, {sub.stages[-1].units[1]}) in "
                     f"{len(sub.stages)} stage{'s' if len(sub.stages) != 1 else ''}, share "
                     f"{sub.microbatches} micro-batches, T_i {fmt_time(sub.step_time_s)}")
    sync = plan.step_time_s - max(plan.pipeline_step_s or [0.0]) - plan.allreduce_s
    tail = (f"predicted step time {fmt_time(plan.step_time_s)} = slowest pipeline "
            f"{fmt_time(max(plan.pipeline_step_s or [0.0]))} + {_averaging(plan)} "
            f"{fmt_time(plan.allreduce_s)} + sync {fmt_time(sync)}; bottleneck stage {worst}; ")
    if plan.exact:
        tail += "optimal over splits and shares given each pipeline's least-T_i chain (exact)"
    else:
        tail += f"heuristic, lower bound {fmt_time(plan.lower_bound_s)}"
    return lines + ["", tail]


def declared_table(plan: Plan, profile: Profile) -> str:
    """What a rehearsal of ``plan`` waits out (``skyjax.plan.replay.declared``): per stage its
    forward, backward (B under zero bubble), W and update calls, per device pair the bytes and
    seconds of one message."""
    from skyjax.plan.replay.declared import declare

    dec = declare(plan, profile)
    unit = time_unit(max([t.backward_s for t in dec.stages] + [1e-12]))
    rows = [(str(k), f"{s.device} {profile.devices[s.device]['name']}",
             fmt_time(t.forward_s, unit), fmt_time(t.backward_s, unit),
             fmt_time(t.weight_s, unit), fmt_time(t.update_s, unit))
            for k, (s, t) in enumerate(zip(plan.stages, dec.stages))]
    calls = render(("stage", "device", "forward", "backward", "W", "update"), rows,
                   right=(True, False, True, True, True, True))
    pairs = [(f"{d} -> {e}", fmt_bytes(dec.wire_bytes[d, e]),
              fmt_time(float(dec.latency_s[d, e]) + float(dec.wire_bytes[d, e])
                       / float(dec.bandwidth_Bps[d, e]) + float(dec.coding_s[d, e])))
             for d, e in zip(*dec.wire_bytes.nonzero())]
    links = render(("message", "bytes", "seconds"), pairs, right=(False, True, True))
    return "\n".join(["declared calls (each waits out this time)", calls, "",
                      "declared messages (one at a time per directed link)", links])


def shared_host_model(profile: Profile, choice: str):
    """The shared-host model's cost terms for ``--shared_host`` (None: the core model alone)."""
    if choice == "off" or (choice == "auto" and not any(d.get("host") for d in profile.devices)):
        return None
    from skyjax.hostmodel import SharedHostModel

    return SharedHostModel()


def write_pictures(plan: Plan, profile: Profile, plot: str | None, timeline: str | None) -> None:
    """``--plot`` / ``--timeline``: the plan and the simulated step as PNG (matplotlib, imported
    here only)."""
    from skyjax.report import plots

    if plot:
        plots.save(plots.plan_figure(plan, profile), plot)
    if timeline:
        plots.save(plots.timeline_figure(plan, profile), timeline)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with failures.one_line_errors("skyjax.plan"):
        return plan_and_write(args)


def plan_and_write(args: argparse.Namespace) -> int:
    """Plans ``args.profile``, writes the files asked for, prints the table (or the JSON)."""
    try:
        for flag in ("out", "trace", "plot", "timeline"):  # before planning: nothing is lost
            if getattr(args, flag):
                workdir.check_output_file(f"--{flag}", getattr(args, flag))
        profile = load_profile(args.profile)
        extra = shared_host_model(profile, args.shared_host)
        if args.pipelines > 1 and extra is not None:
            if args.shared_host == "on":
                raise ValueError("--pipelines > 1 with --shared_host on: the shared-host "
                                 "model plans one pipeline")
            extra = None  # auto: several pipelines are planned under the core model
        plan = planner.plan(profile, args.strategy, args.schedule, args.microbatches,
                            certify=args.certify, extra=extra, max_pipelines=args.pipelines,
                            relax=Relaxation(args.handoff_bits, args.averaging,
                                             args.outer_every, min_gain=args.min_gain),
                            warmup=args.warmup)
        if args.time_scale is not None:  # a rehearsal's time base: the same plan, every time x K
            if not args.time_scale > 0:
                raise ValueError(f"--time_scale {args.time_scale}: expected a positive number")
            from skyjax.plan.replay.declared import scale_plan, scale_profile

            plan, profile = scale_plan(plan, args.time_scale), scale_profile(profile,
                                                                            args.time_scale)
    except InfeasibleError as e:  # a ValueError too: first
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # ProfileError, a bad output path
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = plan.to_json()
    if args.out:
        write_json_atomic(out, args.out, indent=1)
    if args.trace:
        write_json_atomic(simulate.simulate_plan(plan, profile, extra=extra).trace, args.trace)
    if args.plot or args.timeline:
        try:
            write_pictures(plan, profile, args.plot, args.timeline)
        except ImportError as e:
            print(f"error: --plot / --timeline need matplotlib (pip install matplotlib): {e}",
                  file=sys.stderr)
            return 2
        except OSError as e:
            print(f"error: cannot write picture: {e}", file=sys.stderr)
            return 2
    print(json.dumps(out, indent=1) if args.json else format_table(plan, profile))
    if args.time_scale is not None and not args.json:
        print("\n" + declared_table(plan, profile))
    return 0
