"""``python -m skyjax.plan``: plan a pipeline from a profile file (no devices needed).

  python -m skyjax.plan --profile profile.json --strategy optimal --schedule 1f1b \\
      --microbatches 8 [--json] [--out plan.json] [--trace trace.json]

Without ``--json`` it prints a table (stage, device, units, compute, comm, memory, share of the
bottleneck); with it, the plan.json object (docs/design.md). ``--trace`` writes the simulated schedule
as a Chrome / Perfetto trace. A bad profile or an infeasible problem prints one line on stderr
and exits with status 2 (bad profile) or 1 (nothing fits); no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from skyjax.jsonio import write_json_atomic
from skyjax.names import SCHEDULES, STRATEGIES
from skyjax.plan import planner, simulate
from skyjax.plan.types import InfeasibleError, Plan
from skyjax.profile.format import Profile, ProfileError, load_profile


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m skyjax.plan", description=__doc__.splitlines()[0])
    p.add_argument("--profile", required=True, help="profile.json (version 1)")
    p.add_argument("--strategy", choices=STRATEGIES, default="optimal")
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    p.add_argument("--microbatches", type=_positive_int, default=8)
    p.add_argument("--json", action="store_true", help="print plan.json instead of a table")
    p.add_argument("--out", help="write plan.json here")
    p.add_argument("--trace", help="write the simulated schedule as a Chrome trace here")
    return p.parse_args(argv)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _seconds(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s < 1 else f"{s:.3f} s"


def format_table(plan: Plan, profile: Profile) -> str:
    """A readable summary of the plan, one row per stage."""
    used = len(plan.stages)
    head = (f"{plan.strategy} plan, {plan.schedule}, {plan.microbatches} micro-batches: "
            f"{used} stage{'s' if used != 1 else ''} on {used} of {profile.num_devices} devices, "
            f"{profile.num_units} units")
    rows = [("stage", "device", "units", "compute", "comm", "memory (of device)", "share")]
    for k, s in enumerate(plan.stages):
        a, b = s.units
        names = profile.units[a]["name"] + (f" .. {profile.units[b - 1]['name']}" if b - a > 1
                                             else "")
        dev = profile.devices[s.device]
        rows.append((str(k), f"{s.device} {dev['name']}", f"[{a}, {b}) {names}",
                     _seconds(s.compute_s), _seconds(s.comm_s),
                     f"{_bytes(s.memory_bytes)} ({_bytes(float(dev['memory_bytes']))})",
                     f"{s.time_s / plan.bottleneck_s:.0%}" if plan.bottleneck_s > 0 else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [head, ""]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    tail = (f"\npredicted step time {_seconds(plan.step_time_s)} = sum of stage times + "
            f"({plan.microbatches} - 1) x bottleneck {_seconds(plan.bottleneck_s)}; ")
    if plan.exact:
        tail += "optimal under the cost model (exact)" if plan.strategy != "even" else \
            "even split (no search)"
    else:
        tail += (f"heuristic, lower bound {_seconds(plan.lower_bound_s)}" if plan.lower_bound_s
                 else "even split (no search)")
    lines.append(tail)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        profile = load_profile(args.profile)
        plan = planner.plan(profile, args.strategy, args.schedule, args.microbatches)
    except ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except InfeasibleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    out = plan.to_json()
    if args.out:
        write_json_atomic(out, args.out, indent=1)
    if args.trace:
        write_json_atomic(simulate.simulate_plan(plan, profile).trace, args.trace)
    print(json.dumps(out, indent=1) if args.json else format_table(plan, profile))
    return 0

