"""Sky Computing's headline result at the paper's scale, with skyjax's planner.

Sky Computing (arXiv 2202.11836) reports that its load-balanced allocation cuts BERT training time
by 55% against an even allocation on 64 heterogeneous nodes. The original emulated the nodes'
heterogeneity with seeded slow-downs ``numpy.random.default_rng(35).integers(1, 7, 64)`` and ran
one batch through all stages in sequence. This script builds a profile for that setting from
skyjax's FLOP model (:mod:`skyjax.profile.flops`) and prints predicted step times (docs/design.md cost model) of even and optimal plans,
sequentially (m = 1: what the original ran) and pipelined (GPipe / 1F1B, m in {1, 8, 32}).

Assumptions (the original gives no profile):
* Model: BERT-large layers (hidden 1024, 16 heads, FFN 4096), 160 encoder layers (the paper's
  model), sequence 128, micro-batch 8 (1024 tokens). Units at sublayer granularity: embeddings,
  (attention, intermediate, output) x 160, pooler, classifier = 483 units.
* Time: forward FLOPs / 20 TFLOP/s + 20 us per unit on a fast node; backward = 2 x forward; a node
  with slow-down s takes s times as long (the original multiplied times the same way).
* Memory: state = 16 bytes per parameter (fp32 params, grads, Adam m and v); activations kept for
  backward counted per sublayer; every node has 16 GiB.
* Network: the original ignored it; here every link is 10 Gbit/s with 50 us latency (and a
  "no network" column with free links).

Run: ``python experiments/paper_reproduction.py`` (a few seconds). m = 1 is the same for GPipe and
1F1B (one micro-batch: the original's sequential execution), so it is shown once.

Findings (printed at the end): in the original's own setting (all 64 nodes used, cuts balancing
the load, sequential execution, network ignored) the balanced allocation is 1.54x as fast as the
even one: the paper's "55%" is reproduced as a speed-up (35% less time), not as a 55% time
reduction. skyjax's optimal plan, free to leave slow nodes out, takes 71-78% less time than even
sequentially; pipelined with m = 32 it takes 47-62% less time than even (1F1B, free links: 56%).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from skyjax import plan as plan_lib
from skyjax.profile import flops
from skyjax.profile.format import Profile

GIB = 1 << 30


def profile(links: str) -> Profile:
    """The paper's 64 nodes (:func:`skyjax.profile.flops.paper_slowdowns`, 16 GiB each) running
    its 483 units, every link 10 Gbit/s with 50 us latency (``links`` "10G") or free ("free")."""
    units = flops.bert_units(flops.PAPER_SHAPE, "sublayer", split_head=True)
    slow = flops.paper_slowdowns()
    n = len(slow)
    lat, bw = (flops.uniform_links(n, 10e9 / 8, 50e-6) if links == "10G"
               else flops.uniform_links(n, np.inf, 0))
    return flops.slowdown_profile(units, slow, np.full(n, 16 * GIB), lat, bw)


def balanced_assignment(t: plan_lib.Tables) -> list[tuple[int, int, int]]:
    """All devices in order, cuts that minimise the largest stage compute within memory (the
    original's aim of load balancing), by bisection on the cap with a greedy fill."""
    u, d = t.num_units, t.num_devices

    def fits(k: int, a: int, b: int) -> bool:
        need = (t.state_prefix[b] - t.state_prefix[a]
                + t.inflight(d - k) * (t.act_prefix[b] - t.act_prefix[a]))
        return need <= t.memory[k] and t.prefix[k, b] - t.prefix[k, a] <= cap

    def fill() -> list[tuple[int, int, int]] | None:
        out, a = [], 0
        for k in range(d):
            b = u if k == d - 1 else a + 1
            while b < u - (d - k - 1) and fits(k, a, b + 1):
                b += 1
            if not fits(k, a, b):
                return None
            out.append((k, a, b))
            a = b
        return out

    lo, hi = 0.0, float(t.prefix[:, -1].max())
    for _ in range(50):
        cap = (lo + hi) / 2
        lo, hi = (lo, cap) if fill() is not None else (cap, hi)
    cap = hi
    return fill()


def run(links: str) -> list[tuple]:
    prof = profile(links)
    slow = flops.paper_slowdowns()
    rows = []
    for schedule, m in [("gpipe", 1), ("gpipe", 8), ("gpipe", 32), ("1f1b", 8), ("1f1b", 32)]:
        t = plan_lib.tables(prof, schedule, m)
        even = plan_lib.searched_plan(prof, "even", schedule, m)
        bal = plan_lib.evaluate(prof, balanced_assignment(t), schedule, m, "balanced")
        t0 = time.perf_counter()
        opt = plan_lib.searched_plan(prof, "optimal", schedule, m, certify=True)
        dt = time.perf_counter() - t0
        rows.append((schedule, m, even, bal, opt, dt))
    return rows, slow


def _pct(even: float, x: float) -> str:
    return f"{1 - x / even:6.1%} {even / x:5.2f}x"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--links", choices=["10G", "free"], nargs="*", default=["10G", "free"])
    args = parser.parse_args(argv)
    print("Predicted step time (s) per batch of 8 x 128 tokens per micro-batch; reduction = 1 - "
          "T / T_even, speed-up = T_even / T.\nbalanced = all 64 nodes in order, cuts minimising "
          "the largest stage (the original's load balancing); optimal = skyjax (any subset and "
          "order).")
    results = {}
    for links in args.links:
        rows, slow = run(links)
        results[links] = rows
        counts = ", ".join(f"{k}x: {v}" for k, v in zip(*np.unique(slow, return_counts=True)))
        print(f"\n64 nodes, slow-downs rng(35).integers(1, 7, 64) ({counts}); links: {links}")
        print(f"{'schedule':8} {'m':>3} | {'even':>7} | {'balanced':>8} {'reduct.':>7} "
              f"{'speedup':>6} | {'optimal':>8} {'reduct.':>7} {'speedup':>6} {'stages':>6} "
              f"{'LB':>7} | {'plan s':>6}")
        for schedule, m, even, bal, opt, dt in rows:
            label = "seq" if m == 1 else schedule
            lb = "exact" if opt.exact else f"{opt.lower_bound_s:7.3f}"
            e = even.step_time_s
            print(f"{label:8} {m:3d} | {e:7.3f} | {bal.step_time_s:8.3f} "
                  f"{_pct(e, bal.step_time_s)} | {opt.step_time_s:8.3f} "
                  f"{_pct(e, opt.step_time_s)} {len(opt.stages):6d} {lb:>7} | {dt:6.2f}")
            sys.stdout.flush()
    verdict(results)


def verdict(results: dict) -> None:
    """Which reading of the paper's "55%" the numbers support."""
    print("\nThe paper's 55%:")
    for links, rows in results.items():
        seq = rows[0]
        even, bal, opt = seq[2].step_time_s, seq[3].step_time_s, seq[4].step_time_s
        print(f"  links {links}: original's setting (all 64 nodes load-balanced, sequential): "
              f"{even / bal - 1:.0%} speed-up = {1 - bal / even:.0%} less time; skyjax optimal "
              f"sequential: {1 - opt / even:.0%} less time")
        for schedule, m, ev, _, op, _ in rows[1:]:
            if m == 32:
                print(f"    pipelined {schedule} m=32: optimal takes "
                      f"{1 - op.step_time_s / ev.step_time_s:.0%} less time than even")


if __name__ == "__main__":
    main()
