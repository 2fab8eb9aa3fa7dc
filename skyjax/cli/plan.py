"""``python -m skyjax.plan`` (``skyjax-plan``): plan a pipeline from a profile file (no devices
needed; :mod:`skyjax.report.plan_report`).

  python -m skyjax.plan --profile profile.json --strategy optimal --schedule 1f1b \\
      --microbatches 8 [--pipelines N|auto] [--certify] [--shared_host auto|on|off] [--json]
      [--out plan.json] [--trace trace.json] [--plot plan.png] [--timeline timeline.png]
      [--time_scale K]

Without ``--json`` it prints a table (stage, device, units, compute, comm, memory, share of the
bottleneck, totals; the bottleneck marked); with it, the plan.json object (docs/design.md).
``--pipelines N`` lets the planner split the devices into up to N pipelines in data parallel
(default ``auto``: up to min(16, devices, micro-batches), one pipeline where the shared-host
model applies; 1: one pipeline; the table then shows each stage's pipeline, each pipeline's
devices, share and T_i, and the gradient all-reduce). ``--trace`` writes the simulated schedule
as a Chrome / Perfetto trace; ``--plot`` and ``--timeline`` draw the plan and the simulated step
(:mod:`skyjax.report.plots`; matplotlib is imported only then, so planning itself needs neither
it nor JAX). ``--certify`` also computes the lower-bound certificates
(:mod:`skyjax.plan.certificates`). ``--time_scale K`` shows a rehearsal's view
(``config.rehearse``): the plan in its time base and the calls and messages it declares. A bad
profile or an infeasible problem prints one line on stderr and exits with status 2 (bad profile)
or 1 (nothing fits); no traceback.
"""

from __future__ import annotations

import argparse
import math
import sys

from skyjax import failures, workdir
from skyjax.cli.flags import OneLineParser
from skyjax.names import (AVERAGING, OUTER_COMPRESSIONS, PEER_BITS, PEER_SCHEDULES,
                          SCHEDULE_CHOICES, STRATEGIES, WARMUPS)
from skyjax.plan.model.types import InfeasibleError
from skyjax.relax import Relaxation
from skyjax.topk_wire import FRACTION
from skyjax.report import plan_report

DESCRIPTION = "``python -m skyjax.plan``: plan a pipeline from a profile file (no devices needed)."


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(prog="python -m skyjax.plan", description=DESCRIPTION)
    p.add_argument("--profile", required=True, help="profile.json (version 1)")
    p.add_argument("--strategy", choices=STRATEGIES, default="optimal")
    p.add_argument("--schedule", choices=SCHEDULE_CHOICES, default="1f1b",
                   help="auto: every schedule planned, the least predicted step kept")
    p.add_argument("--warmup", choices=WARMUPS, default="auto",
                   help="1F1B's warm-up forwards; auto: deeper before a slow link where the "
                        "simulated step says that pays, within memory; 1f1b: 1F1B's own")
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
    p.add_argument("--handoff_bits", type=int, choices=(32, 16, 8, 4, 2), default=32,
                   help="fewest bits per value a stage hand-off may carry (skyjax.relax; the "
                        "profile must have timed those codecs); 32: exact")
    p.add_argument("--averaging", choices=AVERAGING, default="exact",
                   help="the most relaxed averaging across pipelines allowed")
    p.add_argument("--outer_every", type=_positive_int, default=10,
                   help="diloco: inner steps per outer step")
    p.add_argument("--outer_compression", choices=OUTER_COMPRESSIONS, default="none",
                   help="the relaxed averagings' exchange in top-k plus 4 or 2 bits")
    p.add_argument("--outer_topk", type=_positive_float, default=FRACTION,
                   help="the fraction of each chunk --outer_compression keeps")
    p.add_argument("--peers", choices=PEER_SCHEDULES, default="none",
                   help="allow decentralized averaging, one peer per step on this schedule")
    p.add_argument("--peer_bits", type=int, choices=PEER_BITS, default=32,
                   help="8: decentralized averaging may send int8 differences to the peer")
    p.add_argument("--async_steps", type=int, default=0, metavar="K",
                   help="allow asynchronous averaging, applied K steps late (0: not allowed)")
    p.add_argument("--min_gain", type=float, default=0.05,
                   help="the least fraction of the step a relaxed plan must save")
    p.add_argument("--time_scale", type=_positive_float, default=None, metavar="K",
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


def _positive_float(text: str) -> float:
    """A positive finite number (not 0, negative, inf or nan)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text}")
    return v


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with failures.one_line_errors("skyjax.plan"):
        try:
            for flag in ("out", "trace", "plot", "timeline"):  # before planning: nothing is lost
                if getattr(args, flag):
                    workdir.check_output_file(f"--{flag}", getattr(args, flag))
            plan, profile, extra = plan_report.plan_file(
                args.profile, args.strategy, args.schedule, args.microbatches,
                max_pipelines=args.pipelines, certify=args.certify, shared_host=args.shared_host,
                relax=Relaxation(args.handoff_bits, args.averaging, args.outer_every,
                                 min_gain=args.min_gain,
                                 outer_compression=args.outer_compression,
                                 outer_topk=args.outer_topk, peers=args.peers,
                                 async_steps=args.async_steps, peer_bits=args.peer_bits),
                warmup=args.warmup, time_scale=args.time_scale)
        except InfeasibleError as e:  # a ValueError too: first
            print(f"error: {e}", file=sys.stderr)
            return 1
        except ValueError as e:  # ProfileError, a bad output path
            print(f"error: {e}", file=sys.stderr)
            return 2
        plan_report.write_files(plan, profile, extra, args.out, args.trace)
        if args.plot or args.timeline:
            try:
                plan_report.write_pictures(plan, profile, args.plot, args.timeline)
            except ImportError as e:
                print(f"error: --plot / --timeline need matplotlib (pip install matplotlib): "
                      f"{e}", file=sys.stderr)
                return 2
            except OSError as e:
                print(f"error: cannot write picture: {e}", file=sys.stderr)
                return 2
        print(plan_report.text(plan, profile, args.json, declared=args.time_scale is not None
                               and not args.json))
        return 0


def run() -> None:
    """The command's entry point (``skyjax-plan``, ``python -m skyjax.plan``)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
