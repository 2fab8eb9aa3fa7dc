"""The planner against an independent exact method, side by side (prints a table).

A 96-unit chain over 16 devices in 6 speed classes (slow-downs 1..6; memory binding: each device
holds about 1/10 of the model with GPipe's m micro-batches in flight; no communication). The
independent method is a mixed-integer program solved by HiGHS (``scipy.optimize.milp``): integer
y[c, a, b] = how many devices of class c take block [a, b); the blocks form one path from unit 0
to unit U (flow conservation); at most n_c devices per class; only blocks that fit the class's
memory. It gives

* the least achievable bottleneck tau* (bisection over the sorted block times with a feasibility
  MILP: exact), and
* the least step time T* = min sum_j time_j y_j + (m - 1) z subject to time_j y_j <= z (y_j is 0
  or 1: a path uses a block at most once, so this is exactly "every stage <= z"); its relaxation
  is weak, so with a time limit the MILP reports a proven interval [lower bound, best found].

Printed: the planner's default path (exact class-count DP when it fits, else the heuristic), the
forced heuristic, and the MILP, with wall and CPU seconds, and the planner's proven lower bound
(``Plan.lower_bound_s``: the larger of ``bounds.lower_bound`` and ``group_bound``), so T* lies in
[max(planner bound, MILP bound), least T found]. Run: ``python experiments/exact_check.py``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from skyjax import plan as plan_lib
from skyjax.profile.flops import slowdown_profile


def case(units: int = 96, devices: int = 16, seed: int = 0, m: int = 8):
    """Heterogeneous unit times, six speed classes, memory ~1/10 of the model per device."""
    rng = np.random.default_rng(seed)
    flops = rng.uniform(0.5, 1.5, units) * 1e10
    recs = [dict(name=f"u{i}", flops=float(f), params=int(1e6 * rng.uniform(0.5, 1.5)),
                 act=int(2e6 * rng.uniform(0.5, 1.5)), out=0) for i, f in enumerate(flops)]
    slow = np.arange(devices) % 6 + 1
    need = sum(16 * r["params"] + m * r["act"] for r in recs)
    memory = np.full(devices, need / 10)
    lat = np.zeros((devices, devices))
    bw = np.full((devices, devices), np.inf)
    return slowdown_profile(recs, slow, memory, lat, bw, overhead_s=0.0)


class ChainMILP:
    """y[c, a, b] over feasible blocks of each device class (module doc)."""

    def __init__(self, t: plan_lib.Tables, classes: list[list[int]]):
        u = t.num_units
        self.u, self.m = u, t.microbatches
        rows = []
        for ci, cls in enumerate(classes):
            d = cls[0]
            for a in range(u):
                for b in range(a + 1, u + 1):
                    need = (t.state_prefix[b] - t.state_prefix[a]
                            + t.inflight(1) * (t.act_prefix[b] - t.act_prefix[a]))
                    if need <= t.memory[d]:
                        rows.append((ci, a, b, float(t.prefix[d, b] - t.prefix[d, a])))
        self.blocks = rows
        self.time = np.array([r[3] for r in rows])
        self.sizes = [len(c) for c in classes]
        n = len(rows)
        # flow: for every boundary 0..U: out - in = 1 at 0, -1 at U, 0 elsewhere
        r_idx, c_idx, val = [], [], []
        for j, (ci, a, b, _) in enumerate(rows):
            r_idx += [a, b]
            c_idx += [j, j]
            val += [1.0, -1.0]
        rhs = np.zeros(u + 1)
        rhs[0], rhs[u] = 1.0, -1.0
        flow = coo_matrix((val, (r_idx, c_idx)), shape=(u + 1, n))
        cnt = coo_matrix((np.ones(n), ([r[0] for r in rows], np.arange(n))),
                         shape=(len(classes), n))
        self.cons = [LinearConstraint(flow, rhs, rhs),
                     LinearConstraint(cnt, np.zeros(len(classes)), np.array(self.sizes, float))]

    def _milp(self, c, cons, ub, time_limit: float):
        n = len(c)
        return milp(c, constraints=cons, integrality=np.concatenate([np.ones(len(self.time)),
                                                                     np.zeros(n - len(self.time))]),
                    bounds=Bounds(np.zeros(n), ub), options={"time_limit": time_limit})

    def feasible(self, cap: float) -> bool:
        """Is there a plan with every t_k <= cap (blocks over the cap fixed to 0)?"""
        ub = np.where(self.time <= cap * (1 + 1e-12), 1.0, 0.0)
        res = self._milp(np.zeros(len(self.time)), self.cons, ub, 600.0)
        return res.status == 0

    def least_bottleneck(self) -> float:
        """tau*: bisection over the sorted block times with feasibility MILPs (exact)."""
        caps = np.unique(self.time)
        lo, hi = 0, len(caps) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if not self.feasible(caps[mid]) else (lo, mid)
        return float(caps[lo])

    def least_step(self, time_limit: float) -> tuple[float, float]:
        """T*: one MILP, min sum_j time_j y_j + (m - 1) z with time_j y_j <= z (y_j in {0, 1}: a
        path uses a block at most once). Returns (best T found, proven lower bound on T*):
        equal when HiGHS proves optimality within ``time_limit`` seconds."""
        n = len(self.time)
        c = np.concatenate([self.time, [self.m - 1.0]])
        cons = [LinearConstraint(_pad(con.A, 1), con.lb, con.ub) for con in self.cons]
        cap = coo_matrix((np.concatenate([self.time, -np.ones(n)]),
                          (np.concatenate([np.arange(n), np.arange(n)]),
                           np.concatenate([np.arange(n), np.full(n, n)]))), shape=(n, n + 1))
        cons.append(LinearConstraint(cap, -np.inf, 0.0))
        res = self._milp(c, cons, np.concatenate([np.ones(n), [np.inf]]), time_limit)
        best = float(res.fun) if res.x is not None else np.inf
        bound = float(getattr(res, "mip_dual_bound", np.nan) or np.nan)
        return best, (best if res.status == 0 else bound)


def _pad(a, extra: int):
    """A sparse constraint matrix with ``extra`` zero columns appended."""
    a = coo_matrix(a)
    return coo_matrix((a.data, (a.row, a.col)), shape=(a.shape[0], a.shape[1] + extra))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0])
    parser.add_argument("--time_limit", type=float, default=300.0,
                        help="seconds for the T* MILP (its proven bound is printed if it stops)")
    args = parser.parse_args(argv)
    m = args.microbatches
    print(f"96 units x 16 devices, 6 speed classes, GPipe m={m}, memory binding, no comm")
    print(f"{'seed':>4} | {'method':<22} {'T':>10} {'bottleneck':>10} {'exact':>5} "
          f"{'wall s':>7} {'cpu s':>6} | {'T / T*':>7} {'btl / tau*':>10} {'proven LB':>9}")
    for seed in args.seeds:
        prof = case(seed=seed, m=m)
        t = plan_lib.tables(prof, "gpipe", m)
        rows, lbs = [], []
        for label, force in (("planner (default)", False), ("planner heuristic", True)):
            t0, c0 = time.perf_counter(), time.process_time()
            p = plan_lib.searched_plan(prof, "optimal", "gpipe", m, force_heuristic=force, certify=True)
            lb = p.step_time_s if p.exact else p.lower_bound_s
            lbs.append(lb)
            rows.append((label, p.step_time_s, p.bottleneck_s, str(p.exact),
                         time.perf_counter() - t0, time.process_time() - c0, f"{lb:9.4f}"))
        t0, c0 = time.perf_counter(), time.process_time()
        mip = ChainMILP(t, plan_lib.device_classes(t))
        tau = mip.least_bottleneck()
        best, bound = mip.least_step(args.time_limit)
        proven = best <= bound * (1 + 1e-9)
        rows.append(("MILP (HiGHS)", best, tau, str(proven), time.perf_counter() - t0,
                     time.process_time() - c0, f"{bound:9.4f}"))
        if not proven:
            print(f"     (MILP stopped at its time limit: T* in [{bound:.4f}, {best:.4f}]; "
                  f"tau* = {tau:.4f} is exact)")
        low, high = max(max(lbs), bound), min(best, min(r[1] for r in rows))
        print(f"     T* in [{low:.4f}, {high:.4f}] (the larger proven bound, the least T found); "
              f"planner's T is {rows[0][1] / low - 1:.1%} above that bound")
        for label, T, btl, ex, dt, cpu, lb in rows:
            print(f"{seed:>4} | {label:<22} {T:10.4f} {btl:10.4f} {ex:>5} {dt:7.2f} {cpu:6.2f} | "
                  f"{T / best:7.4f} {btl / tau:10.4f} {lb}")


if __name__ == "__main__":
    from experiments import results_doc

    results_doc.run(main, [(
        None, "exact_check", "The planner against a MILP",
        "A 96-unit chain over 16 devices in six speed classes, memory binding: the "
        "planner's default path, its forced heuristic and an independent mixed-integer "
        "program (HiGHS, with a time limit), with wall and CPU seconds; the optimum "
        "lies between the larger lower bound and the least T found.")])
