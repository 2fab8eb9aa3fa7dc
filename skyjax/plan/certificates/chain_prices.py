"""Prices for the chain's device kinds (:mod:`skyjax.plan.certificates.priced_chain`), by
column generation over caps: what ``chain_bound`` knows at each cap B, and which prices to try
next.

Every path the priced DP finds is a column (its kind counts, its unpriced sum of stage times,
its largest stage); the restricted master LP over the columns feasible at a cap
(:mod:`skyjax.plan.certificates.master_lp`) gives prices that may do better there. Prices are
tried in boxes of a few radii around the best known at the nearest cap (a trust region), the
first from the fill's marginal prices (``_rents``). Reason: any prices give a valid bound, so
the search for them only decides how tight the bound is, never whether it holds, and a few
batched DP passes get close to the LP's best.
"""

from __future__ import annotations

import math

import numpy as np

from skyjax.plan.bounds.group_terms import GroupBound
from skyjax.plan.certificates.master_lp import master_prices
from skyjax.plan.certificates.priced_chain import TOL, PricedChain

_INF = math.inf
MAX_DP = 20  # batched DP passes (each ~15 ms at paper scale)
MAX_TRIES = 8  # priced passes at one cap while the master says better prices exist
RADII = (0.1, _INF)  # trust-region radii (x the largest price) tried per pass
RENTS = 6  # starting prices tried at the first cap


def _rents(gb: GroupBound, dp: PricedChain, cap: float) -> np.ndarray:
    """Starting prices [P, C]: at a marginal price lam (reference seconds), a device of kind c
    saves (lam - sigma_c)^+ x the reference work it holds at cap (``group_bound``'s fill)."""
    tcap, _ = gb.time_capacity(np.array([cap]))
    held = np.maximum(np.minimum(tcap[0, dp.rep], gb.memcap[dp.rep, 0]), 0.0)
    sig = gb.sigma[dp.rep]
    s = np.unique(sig)
    lams = np.concatenate([(s[:-1] + s[1:]) / 2, s[-1:] * 1.5])
    lams = lams[np.unique(np.linspace(0, len(lams) - 1, RENTS).round().astype(int))]
    return np.maximum(lams[:, None] - sig[None, :], 0.0) * held[None, :]


class Columns:
    """Column generation over caps: every path found (kind counts, unpriced sum, largest
    stage) and every priced evaluation (cap, value, largest stage of its path, its prices,
    whether the master at that cap can do better)."""

    def __init__(self, gb: GroupBound, dp: PricedChain, big: float):
        self.gb, self.dp, self.big = gb, dp, big
        self.cols = np.zeros((0, len(dp.n)))
        self.costs, self.tops = np.zeros(0), np.zeros(0)
        self.evals: list[list] = []  # [cap, value, top, prices, master's value]
        self.passes = 0

    def master(self, cap: float, box: tuple[np.ndarray, np.ndarray] | None = None
               ) -> tuple[np.ndarray, float]:
        """The master LP's prices and value over the paths feasible at cap (within ``box``,
        lower and upper prices, if given)."""
        ok = self.tops <= cap * (1 + TOL)  # paths feasible at this cap
        if not ok.any():
            return np.zeros(len(self.dp.n)), _INF
        return master_prices(self.costs[ok], self.cols[ok], self.dp.n, self.big, box)

    def candidates(self, cap: float) -> np.ndarray:
        """Prices to try at cap: the master's within boxes of a few radii around the best
        prices known at cap (or the nearest cap tried, which is tried too): a trust-region
        column generation, several radii per pass. First: ``_rents``."""
        if not self.evals:
            return _rents(self.gb, self.dp, cap)
        dist = min(abs(math.log(x[0] / cap)) for x in self.evals)
        same = dist <= 1e-12
        center = max((x for x in self.evals if abs(math.log(x[0] / cap)) <= dist + 1e-12),
                     key=lambda x: x[1])[3]
        scale = max(float(center.max()), 1e-12)
        out = [] if same else [center]
        for r in RADII:
            box = (np.maximum(center - r * scale, 0.0), center + r * scale)
            out.append(self.master(cap, box if np.isfinite(r) else None)[0])
        return np.stack(out)

    def run(self, caps: list[float], rounds: int = 1) -> None:
        """Batched DPs over candidate prices at each cap (``rounds`` times, the master
        re-solved in between); records one evaluation per cap and round."""
        for _ in range(rounds):
            if self.passes >= MAX_DP:
                return
            mus = [self.candidates(b) for b in caps]
            at = np.repeat(np.array(caps), [len(x) for x in mus])
            mus = np.concatenate(mus)
            val, counts, total, top = self.dp.price(mus, at)
            self.passes += 1
            fin = np.isfinite(val)
            self.cols = np.concatenate([self.cols, counts[fin]])
            self.costs = np.concatenate([self.costs, total[fin]])
            self.tops = np.concatenate([self.tops, top[fin]])
            done = True
            for b in caps:
                mine = np.flatnonzero(at == b)
                if not fin[mine].any():
                    self.evals.append([b, _INF, 0.0, mus[mine[0]], _INF])  # no plan there
                    continue
                i = mine[np.argmax(np.where(fin[mine], val[mine], -_INF))]
                _, lp = self.master(b)  # >= the chain's best value at b (fewer paths)
                self.evals.append([b, float(val[i]), float(top[i]), mus[i], lp])
                done = done and lp <= val[i] + 1e-6 * abs(val[i])
            if done:
                return

    def prices(self, b: float, n: int = RENTS) -> np.ndarray:
        """[P, C]: the prices of the n evaluations at the caps nearest to b (any prices give
        a valid bound; near caps, good ones), or ``_rents`` at b if none."""
        near = sorted(self.evals, key=lambda x: abs(math.log(x[0] / b)))[:n]
        return np.stack([x[3] for x in near]) if near else _rents(self.gb, self.dp, b)

    def at(self, b: float) -> tuple[float, bool, float | None, float]:
        """The best chain bound known at b (an evaluation at a cap >= b), whether it holds at
        b exactly (its path's largest stage <= b), its cap while passes there are left, and
        the most that better prices could give there (the master over the paths found)."""
        known = [x for x in self.evals if x[0] >= b]
        if not known:
            return -_INF, False, None, _INF
        best = max(known, key=lambda x: x[1])
        tries = sum(1 for x in self.evals if x[0] == best[0])  # passes at that cap
        exact = best[2] <= b * (1 + TOL)
        return best[1], exact, best[0] if tries < MAX_TRIES else None, best[4]
