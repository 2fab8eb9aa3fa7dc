"""What ``experiments/hetero_benchmark.py`` prints, and the reference step times it prints
them against (ideal, bubble and host bounds; each plan calibrated from another's steps)."""

from __future__ import annotations

import json
import statistics

def bubble_bound_s(ideal_s: float, stages: int, microbatches: int) -> float:
    """The ideal step with the pipeline's fill and drain: p stages perfectly balanced still take
    (m + p - 1) stage slots, so ideal x (m + p - 1) / m."""
    return ideal_s * (microbatches + stages - 1) / microbatches


def calibrated_s(profile, plans: dict, busy: dict, comm: dict, source: str,
                 extra=None) -> dict:
    """Each plan's T on the profile corrected by the ``source`` plan's measured per-stage compute
    and link waits (``skyjax.plan.replan.corrected_profile``: calibration from measured steps,
    as ``allocation.calibrate_steps`` and the ``dynamic`` strategy do while training); ``extra``:
    the run's extra cost terms (the shared-host model)."""
    from skyjax import plan as plan_lib
    from skyjax.plan.replan import corrected_profile

    fixed, _ = corrected_profile(profile, plan_lib.Plan.from_json(plans[source]), busy[source],
                                 comm[source], extra)
    return {s: plan_lib.evaluate(fixed, [(st["device"], *st["units"]) for st in p["stages"]],
                                 p["schedule"], p["microbatches"], extra=extra).step_time_s
            for s, p in plans.items()}


def ideal_step_s(profile, microbatches: int) -> float:
    """All forward+backward work spread over the devices in proportion to their speed (every
    unit's time on device d scales with 1 / speed_d): no bubble, no communication."""
    work = profile.forward_s + profile.backward_s  # [U, D]
    speed = 1.0 / work.sum(axis=0)  # whole models per second, per device
    return microbatches / speed.sum()


def host_bound_s(profile, microbatches: int) -> float | None:
    """Where the devices share one host's cores (``skyjax.hostmodel.sharing``): no plan beats the
    host doing all the CPU work at full capacity. Each unit's CPU work is its time x CPU share
    x cores busy on the device where that is least; the step takes at least m x its sum / the
    host's cores. None where no host is shared."""
    import numpy as np

    from skyjax.hostmodel import sharing

    if sharing.host_groups(profile) is None:
        return None
    work = np.asarray(profile.forward_s + profile.backward_s)  # [U, D]
    cpu = work * np.array(sharing.cpu_shares(profile)) * np.array(sharing.cpu_demand(profile))
    return microbatches * float(cpu.min(axis=1).sum()) / max(sharing.host_capacity(profile))


def step_boundaries(result: dict, steps_per_block: int) -> dict[str, tuple[float, float]]:
    """Per plan: (median measured, predicted) step boundary (``compare.step_boundary_s``) over
    consecutive steps of each block (other plans' blocks run between); the prediction is the
    one ``compare.stage_comparison`` put in the result."""
    from skyjax.report.compare import step_boundary_s
    from skyjax.spans import Span

    out = {}
    for s, steps in result.get("spans", {}).items():
        steps = [[Span(*sp) for sp in step] for step in steps]
        gaps = [g for i in range(0, len(steps), steps_per_block)
                for g in step_boundary_s(steps[i:i + steps_per_block])]
        if gaps:
            out[s] = (statistics.median(gaps),
                      result["compare"][s]["step_boundary"]["predicted_s"])
    return out


def message_delays(result: dict) -> dict[str, tuple[float, float, float]]:
    """Per plan of several stages: (median, 90th percentile) of ``compare.message_delays`` over
    every measured step, and the mean predicted one-way delay of its links."""
    import numpy as np

    from skyjax.plan import Plan
    from skyjax.plan.replay.measured import message_delays as delays
    from skyjax.plan.pricing.stage_times import stage_actions_s
    from skyjax.profile.format import Profile
    from skyjax.spans import Span

    profile = Profile.from_json(result["profile"])
    out = {}
    for s, steps in result.get("spans", {}).items():
        plan = Plan.from_json(result["plans"][s])
        got = [d for step in steps for d in delays([Span(*sp) for sp in step], len(plan.stages))]
        if not got:
            continue
        links = stage_actions_s(plan, profile)[2]
        out[s] = (float(np.median(got)), float(np.percentile(got, 90)), float(np.mean(links)))
    return out


def contention_split(result: dict) -> dict[str, list[tuple[dict, float]]]:
    """Per plan of several stages on a shared host: ``compare.contention_split`` over every
    measured step, each stage beside the slow-down the model predicted for it."""
    from skyjax.plan import Plan
    from skyjax.hostmodel.contention import contention_split as split
    from skyjax.hostmodel.sharing import stage_sharing
    from skyjax.profile.format import Profile
    from skyjax.spans import Span

    profile = Profile.from_json(result["profile"])
    out = {}
    for s, steps in result.get("spans", {}).items():
        plan = Plan.from_json(result["plans"][s])
        if stage_sharing(plan, profile) is None or s not in result.get("compare", {}):
            continue
        rows = split(plan, profile, [[Span(*sp) for sp in step] for step in steps])
        slow = [r["predicted"]["slowdown"] for r in result["compare"][s]["stages"]]
        out[s] = list(zip(rows, slow))
    return out


def report(result: dict, overhead: dict | None, args, model: dict) -> None:
    """The benchmark's tables; ``model``: the config overrides of the model it ran (unless
    ``args.shipped``)."""
    med = {s: statistics.median(t) for s, t in result["times"].items()}
    pred = {s: p["step_time_s"] for s, p in result["plans"].items()}
    names = result["device_names"]
    print(f"\n{args.processes} processes, slow-downs {tuple(args.slowdowns)}, {args.schedule}, "
          f"m={args.microbatches}, {args.granularity} units, batch {args.batch_size} x seq "
          f"{args.seq_len}, model {'as shipped' if args.shipped else model}")
    for s, p in result["plans"].items():
        blocks = ", ".join(f"{names[st['device']]}[{st['units'][0]}:{st['units'][1]})"
                           for st in p["stages"])
        print(f"  {s:8s} plan: {blocks}")
    cal = result.get("calibrated", {})
    print(f"\n{'plan':8s} {'measured s':>10s} {'predicted s':>11s} {'simulated s':>11s} "
          f"{'error':>7s} {'cal. even':>9s} {'error':>7s} {'cal. opt':>9s} {'error':>7s} "
          f"{'ideal':>6s} {'bubble':>6s}  steps")
    for s, p in result["plans"].items():
        err = (med[s] - pred[s]) / med[s]
        c_even = cal.get("even", {}).get(s, float("nan"))
        c_opt = cal.get("optimal", {}).get(s, float("nan"))
        bubble = bubble_bound_s(result["ideal_s"], len(p["stages"]), p["microbatches"])
        print(f"{s:8s} {med[s]:10.4f} {pred[s]:11.4f} {result['simulated'][s]:11.4f} "
              f"{err:+7.1%} {c_even:9.4f} {(med[s] - c_even) / med[s]:+7.1%} "
              f"{c_opt:9.4f} {(med[s] - c_opt) / med[s]:+7.1%} "
              f"{result['ideal_s'] / med[s]:6.1%} {bubble / med[s]:6.1%}  "
              f"{len(result['times'][s])}")
    print("(error = (measured - predicted) / measured; cal. even / cal. opt: predicted on the "
          "profile calibrated from the even / the optimal plan's measured steps (stage compute, "
          "link waits); the calibrated plan's 'predicted' is on the profile "
          "calibrated by the even steps before it ran (what allocation.calibrate_steps plans "
          "on); ideal / bubble: efficiency = ideal step / measured, without and with the "
          "(m + p - 1) / m fill and drain)")
    print("\nper-stage compute per step (forward + backward of all micro-batches, emulation "
          "and call costs included), measured / predicted (error; x the slow-down that sharing "
          "the host's cores and calls after idle predict for the stage):")
    for s, p in result["plans"].items():
        m = p["microbatches"]
        slow = [r["predicted"]["slowdown"] for r in result["compare"][s]["stages"]]
        cells = [f"{names[st['device']]} {b:.3f}/{m * st['compute_s'] * q:.3f} "
                 f"({(b - m * st['compute_s'] * q) / b:+.0%}, x{q:.2f})"
                 for st, b, q in zip(p["stages"], result["busy"][s], slow)]
        print(f"  {s:8s} " + "  ".join(cells))
    split = contention_split(result)
    if split:
        print("\nper stage action on a shared host, ms: predicted alone (the profile) : measured "
              "when no other stage of the host computed during its CPU part (how many) : all "
              "measured; all / alone against the slow-down predicted for the stage (the "
              "contention; alone / predicted is the action's own cost):")
        for s, rows in split.items():
            cells = []
            for r, q in rows:
                for kind in "FB":
                    c = r[kind]
                    alone = f"{1e3 * c['alone_s']:.1f}" if c["alone_s"] else "-"
                    ratio = f"{c['all_s'] / c['alone_s']:.2f}" if c["alone_s"] else "-"
                    cells.append(f"{names[r['device']]} {kind} {1e3 * c['predicted_s']:.1f} : "
                                 f"{alone} ({c['alone_count']}) : {1e3 * c['all_s']:.1f}, "
                                 f"x{ratio} vs x{q:.2f}")
            print(f"  {s:8s} " + "\n           ".join(cells))
    print("\nlast step per stage, measured / predicted seconds: compute, comm (link waits), idle;"
          " and the schedule replayed with the measured action times:")
    for s, c in result.get("compare", {}).items():
        cells = [f"{names[r['device']]} " + "/".join(
            f"{r['measured'][k]:.3f}:{r['predicted'][k]:.3f}" for k in ("compute_s", "comm_s",
                                                                     "idle_s"))
            for r in c["stages"] if "measured" in r]
        print(f"  {s:8s} " + "  ".join(cells) + f"  | replayed {c.get('replayed_step_s', 0):.4f}"
              f" s, span {c.get('measured_span_s', 0):.4f} s, simulated "
              f"{c['simulated_step_s']:.4f} s")
    if "overheads" in result:
        print(f"fixed costs (profile): {json.dumps(result['overheads'])}")
        print("step boundary (last action of a step to the first of the next, within blocks), "
              "median measured vs predicted update_0 + sync_s: " + ", ".join(
                  f"{s} {1e3 * b:.1f} vs {1e3 * pred:.1f} ms"
                  for s, (b, pred) in step_boundaries(result, args.steps).items()))
        print("message delay (producer end to consumer start, consumer free), median / 90th "
              "percentile measured vs predicted one-way link delay: " + ", ".join(
                  f"{s} {1e3 * med:.2f} / {1e3 * p90:.2f} vs {1e3 * pred:.2f} ms"
                  for s, (med, p90, pred) in message_delays(result).items()))
    measured_speedup = med["even"] / med["optimal"]
    print("\nspeed-up optimal vs even: measured {:.3f}x".format(measured_speedup))
    for what, p in [("profile", pred)] + [(f"calibrated from {src}", c) for src, c in
                                          cal.items()]:
        predicted_speedup = p["even"] / p["optimal"]
        print(f"  predicted ({what}) {predicted_speedup:.3f}x: measured is "
              f"{measured_speedup / predicted_speedup:.1%} of predicted")
    if "calibrated" in med:
        measured_cal = med["even"] / med["calibrated"]
        predicted_cal = result["calibration_even_s"] / pred["calibrated"]
        print(f"speed-up calibrated vs even (both predicted on the profile calibrated by "
              f"{args.calibrate_steps} even steps before the calibrated plan ran): measured "
              f"{measured_cal:.3f}x, predicted {predicted_cal:.3f}x ({measured_cal / predicted_cal:.1%}"
              f" of predicted); calibrated vs optimal: measured "
              f"{med['optimal'] / med['calibrated']:.3f}x")
    print(f"ideal step (perfect balance, no bubble, no comm): {result['ideal_s']:.4f} s")
    from skyjax.profile.format import Profile

    host = host_bound_s(Profile.from_json(result["profile"]), args.microbatches)
    if host is not None:
        bound = max(host, result["ideal_s"])
        print(f"with the host's cores shared (all CPU work at the host's full capacity): "
              f"{host:.4f} s; efficiency against max(ideal, that): " + ", ".join(
                  f"{s} {bound / med[s]:.1%}" for s in result["plans"]))
    if overhead:
        print(f"\none-stage pipeline vs plain jitted step (m=1): {overhead['pipeline']:.4f} s vs "
              f"{overhead['plain']:.4f} s = {overhead['pipeline'] / overhead['plain']:.3f}x")
