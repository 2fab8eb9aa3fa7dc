"""The plan command's report (``python -m skyjax.plan``, :mod:`skyjax.cli.plan`): a profile file
planned under the shared-host model where it applies, the plan as a table (one row per stage,
the bottleneck marked, how the predicted step time is made up) or as plan.json, the simulated
schedule as a Chrome trace, the pictures, and a rehearsal's declared calls and messages.

The shared-host model (:mod:`skyjax.hostmodel`) and matplotlib (:mod:`skyjax.report.plots`) are
imported only when used, so planning a profile needs neither them nor JAX.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys

from skyjax.jsonio import write_json_atomic
from skyjax.names import ZERO_BUBBLE
from skyjax.plan import planner
from skyjax.plan.model.extension import ExtraCost
from skyjax.plan.model.types import Plan
from skyjax.plan.pricing.exchange import unpriced_note
from skyjax.plan.replay import simulate
from skyjax.profile.format import Profile, load_profile
from skyjax.relax import EXACT, Relaxation
from skyjax.report.text_table import fmt_bytes, fmt_time, render, time_unit


def plan_file(path: str, strategy: str, schedule: str, microbatches: int, *,
              max_pipelines: int = 0, certify: bool = False, shared_host: str = "auto",
              relax: Relaxation = EXACT, warmup: str = "1f1b",
              time_scale: float | None = None) -> tuple[Plan, Profile, ExtraCost | None]:
    """``(plan, profile, the shared-host model's terms or None)`` for the profile file ``path``.
    ``shared_host``: ``auto`` (on where the profile was measured under it), ``on`` or ``off``;
    ``time_scale``: a rehearsal's view, the plan and profile with every time x K. Averaging
    modes the relaxation allows but the profile cannot price are left out, in one line on
    stderr (:func:`skyjax.plan.pricing.exchange.unpriced_note`). Raises
    ``InfeasibleError`` when nothing fits, ``ValueError`` on a bad profile or argument."""
    if time_scale is not None and not (math.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"--time_scale {time_scale}: expected a positive finite number")
    profile = load_profile(path)
    extra = shared_host_model(profile, shared_host)
    if max_pipelines > 1 and extra is not None:
        if shared_host == "on":
            raise ValueError("--pipelines > 1 with --shared_host on: the shared-host "
                             "model plans one pipeline")
        extra = None  # auto: several pipelines are planned under the core model
    plan = planner.plan(profile, strategy, schedule, microbatches, certify=certify, extra=extra,
                        max_pipelines=max_pipelines, relax=relax,
                        warmup=warmup)
    note = unpriced_note(dataclasses.replace(profile, relax=relax))
    if note and max_pipelines != 1 and strategy != "even":  # modes the plan could not take
        print(note, file=sys.stderr)
    if certify and strategy != "even":  # the certificates bound the cost model's T
        print(certificate_line(planner.searched_plan(
            profile, strategy, schedule, microbatches, certify=True, extra=extra,
            max_pipelines=max_pipelines, relax=relax)), file=sys.stderr)
    if time_scale is not None:  # a rehearsal's time base: the same plan, every time x K
        from skyjax.plan.replay.rehearsal import scale_plan, scale_profile

        plan, profile = scale_plan(plan, time_scale), scale_profile(profile, time_scale)
    return plan, profile, extra


def certificate_line(searched: Plan) -> str:
    """One line: the cost model's own plan, its T and the certified lower bound on T."""
    if searched.exact:
        return (f"certificates: the cost model's plan has T {fmt_time(searched.step_time_s)}, "
                f"proven optimal under T")
    bound = searched.lower_bound_s or 0.0
    gap = searched.step_time_s / bound - 1 if bound > 0 else math.inf
    return (f"certificates: the cost model's plan has T {fmt_time(searched.step_time_s)}, "
            f"certified lower bound on T {fmt_time(bound)} (gap {100 * gap:.1f} %)")


def write_files(plan: Plan, profile: Profile, extra: ExtraCost | None, out: str | None,
                trace: str | None) -> None:
    """``out``: plan.json; ``trace``: the simulated schedule as a Chrome / Perfetto trace."""
    if out:
        write_json_atomic(plan.to_json(), out, indent=1)
    if trace:
        write_json_atomic(simulate.simulate_plan(plan, profile, extra=extra).trace, trace)


def text(plan: Plan, profile: Profile, as_json: bool = False, declared: bool = False) -> str:
    """What the command prints: plan.json, or the table and (``declared``: a rehearsal's view)
    the declared calls and messages."""
    if as_json:
        return json.dumps(plan.to_json(), indent=1)
    return format_table(plan, profile) + ("\n\n" + declared_table(plan, profile) if declared
                                          else "")


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
    model = plan.step_time_s if plan.model_s is None else plan.model_s
    line = time_unit(max(model, plan.step_time_s, 1e-12))  # one unit for the whole line
    credit = zero_bubble_credit(plan)
    extra = model - stages_s - (plan.microbatches - 1) * plan.bottleneck_s + credit
    small = 1e-9 * max(model, 1e-12)
    head_s = f"predicted step time {fmt_time(plan.step_time_s, line)}" + (
        f" as it runs; the cost model's T {fmt_time(model, line)}"
        if plan.model_s is not None else "")
    tail = (f"{head_s} = sum of stage times {fmt_time(stages_s, line)} + "
            f"({plan.microbatches} - 1) x bottleneck {fmt_time(plan.bottleneck_s, line)} "
            f"(stage {worst})"
            + (f" + once-per-step costs {fmt_time(extra, line)}" if abs(extra) > small else "")
            + (f" - zero-bubble credit {fmt_time(credit, line)} (W passes filling the "
               f"bubble)" if credit > small else "") + "; times per micro-batch; ")
    if plan.exact:
        tail += "optimal under the cost model (exact)" if plan.strategy != "even" else \
            "even split (no search)"
    else:
        tail += (f"heuristic, lower bound {fmt_time(plan.lower_bound_s)}" if plan.lower_bound_s
                 else "even split (no search)")
    return "\n".join([head, "", table, "", tail])


def zero_bubble_credit(plan: Plan) -> float:
    """What a zero-bubble schedule takes off the plan's T (docs/design.md, "Zero-bubble
    schedules"): per stage but the last, min(its backward B + W, f x W), f = min(2, m) (ZB-H1)
    or min(3, m) (ZB-H2), from the stages' F, B, W seconds; 0 under other schedules."""
    if plan.schedule not in ZERO_BUBBLE or not all(s.passes_s for s in plan.stages):
        return 0.0
    f = min(2 if plan.schedule == "zb-h1" else 3, plan.microbatches)
    return float(sum(min(b + w, f * w) for _, b, w in (s.passes_s for s in plan.stages[:-1])))


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
    if plan.averaging.startswith("decentral"):
        coded = ", int8 differences (error feedback)" if plan.averaging.endswith("int8") else ""
        return f"decentralized averaging, one peer per step ({plan.peer_schedule}{coded})"
    if plan.averaging == "async":
        return (f"asynchronous averaging, applied {plan.staleness} step"
                f"{'s' if plan.staleness != 1 else ''} late (staleness {plan.staleness}), "
                f"beyond the compute")
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
    model = plan.step_time_s if plan.model_s is None else plan.model_s
    line = time_unit(max(model, plan.step_time_s, 1e-12))  # one unit for the whole line
    sync = model - max(plan.pipeline_step_s or [0.0]) - plan.allreduce_s
    sync = 0.0 if abs(sync) <= 1e-9 * max(model, 1e-12) else sync  # rounding, not a cost
    head_s = f"predicted step time {fmt_time(plan.step_time_s, line)}" + (
        f" as it runs; the cost model's T {fmt_time(model, line)}"
        if plan.model_s is not None else "")
    tail = (f"{head_s} = slowest pipeline {fmt_time(max(plan.pipeline_step_s or [0.0]), line)}"
            f" + {_averaging(plan)} {fmt_time(plan.allreduce_s, line)} + sync "
            f"{fmt_time(sync, line)}; bottleneck stage {worst}; ")
    if plan.exact:
        tail += "optimal over splits and shares given each pipeline's least-T_i chain (exact)"
    else:
        tail += f"heuristic, lower bound {fmt_time(plan.lower_bound_s)}"
    return lines + ["", tail]


def declared_table(plan: Plan, profile: Profile) -> str:
    """What a rehearsal of ``plan`` waits out (``skyjax.plan.replay.rehearsal``): per stage its
    forward, backward (B under zero bubble), W and update calls, per device pair the bytes and
    seconds of one message."""
    from skyjax.plan.replay.rehearsal import rehearsal_times

    dec = rehearsal_times(plan, profile)
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


def shared_host_model(profile: Profile, choice: str) -> ExtraCost | None:
    """The shared-host model's cost terms for ``choice`` (``--shared_host``: ``auto``, on where
    the profile's devices record their host; ``on``; ``off``); None: the core model alone."""
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
