"""A lower bound on T (GPipe) that prices device kinds along an exact chain of blocks.

``group_bound`` fills the work fractionally over devices, so it cannot see that stages hold
whole blocks that must line up with memory (a fast device holds 17 units of one alignment and
16 of the other), that a crossing's stage loses the crossing's comm from its budget B, or that a
device used for a small carrier is gone for a big block; on the paper case (GPipe, m = 32) it
leaves a 2 % gap. The bound here keeps all of that exactly and relaxes only which device of a
kind each stage uses (and links to their least per cut). It is a proof, not an estimate:

* Kinds: usable devices with equal prefix rows, call costs and memory (c = 1..C, N_c of them,
  pooled over all link groups). Every plan is a chain of stages over the units; stage k is a
  block [a, e) on a device of some kind c with t_k = compute + in-message (a > 0) + comm out.
  Comm out to a device of the same link group costs at least the least intra link at cut e
  (``GroupBound.intra``, min over groups), to another group at least the least crossing
  (``GroupBound.cross``, min over group pairs), plus the device's message calls; the last
  stage has none. Memory is checked at GPipe's m in flight on kind c's memory.
* A plan visiting all G link groups has at least K = G - 1 crossings. So with every t_k <= B,
  its relaxed chain is a path of the DP over (unit, crossings so far capped at K) that ends at
  (U, K), uses only blocks whose relaxed time is <= B, and uses kind c at most N_c times.
* Weak duality: for ANY prices mu >= 0,
      sum_k t_k >= sum_k r_k >= sum_k (r_k + mu_{c_k}) - mu . N >= DP_mu(B) - mu . N,
  with r_k the relaxed stage times and DP_mu(B) the least priced path (exact, ``PricedChain``).
  So the prices need not be optimal: they come from a few rounds of column generation (a tiny
  simplex on the paths found, :mod:`skyjax.plan.certificates.master_lp`), and every priced DP gives a valid
  bound.
* Over B: a plan whose bottleneck lies in [B_i, B_j] has T >= s(B_j) + (m - 1) B_i + update
  floor + sync, for any valid sum bound s at cap B_j (a plan with bottleneck <= B_j is feasible
  there). The DP's best path at B_j has some largest stage b*; with the same prices its value
  holds down to b*, so b* (just below) is where the next step starts.
* Other plans: plans visiting fewer groups are bounded by ``group_bound``'s terms for their
  subsets, plans visiting all groups also by its full-set terms (the larger of the two holds);
  a sum bound at cap p holds for every interval ending at or left of p. Plans with
  B > (upper - W - const) / (m - 1) have T > upper >= T*, B below every case's floor is
  impossible. Revisits need no case of their own: they have >= K crossings, so they are paths
  of the DP too. The result is the least over a cover of [lo, hi] by intervals of
  min(others, max(full set, chain)) + (m - 1) B_i, refined by branch and bound: the lowest
  interval gets a priced DP at (or a little right of) its right end, better prices there, or a
  split of the group terms, until it cannot rise or the budget (``MAX_DP`` passes) is spent.
  Which interval, cap or prices are tried only changes how tight the result is, never whether
  it is a bound.

* Apart (with a ``goal``, the planner's T / 1.009): pooling kinds over regions is this
  relaxation's ceiling (paper case, GPipe m = 32, T 2.873: 2.835 after ~15 passes; the chain's
  LP ends at 2.8375). So after the first cap's rounds (``ONCE_AFTER`` passes), while intervals
  stay below the goal, plans visiting every group are split: those visiting each group once,
  in one run, get ``once_bound``'s least sum at the highest such interval's right end, those
  that do not the chain with G crossings (same DP, best prices known); the lesser of the two
  holds there and left of it, up to ``MAX_ONCE`` caps. The B&B then stops once every interval
  reaches the goal. Paper case: two caps, 2.835 -> 2.847 (T / 1.009), ~0.3 s of ~1 s.

1F1B is left out (a stage's memory depends on its place from the pipeline's end; region_bound
covers it). Checked against brute force in tests/test_chain_bound.py and tests/test_once_bound.py.
"""

from __future__ import annotations

import math

import numpy as np

from skyjax.plan.pricing.cost import Tables
from skyjax.plan.bounds.group_bound import MAX_SUBSET_GROUPS, GroupBound
from skyjax.plan.certificates.master_lp import master_prices
from skyjax.plan.certificates.once_bound import OnceEach

_INF = math.inf
MAX_CELLS = 400_000  # kinds x units x longest block (x 2 x prices per pass): else -inf
MAX_DP = 20  # batched DP passes (each ~15 ms at paper scale)
MAX_ROUNDS = 30  # interval branch-and-bound rounds
FIRST_ROUNDS = 4  # column-generation rounds at the first caps (later: one per visit)
MAX_TRIES = 8  # priced passes at one cap while the master says better prices exist
RADII = (0.1, _INF)  # trust-region radii (x the largest price) tried per pass
MIN_WIDTH = 1e-5  # narrower intervals are not split (the loss is (m - 1) x width)
REACH = 0.01  # a new chain cap: the furthest interval end within this factor
SCAN, WIDTH = 12, 1  # intervals looked at per round, most caps or splits per round
GRID, SPLIT = 33, 4  # group terms: first grid over [lo, hi], pieces per refinement
RENTS = 6  # starting prices tried at the first cap
MAX_ONCE = 4  # caps at which the once-each bound (once_bound) is tried, while below the goal
ONCE_AFTER = 4  # chain passes before it (then the chain goes on only where still below)
_TOL = 1e-12  # relative slack that only admits more paths (a lower bound stays valid)


class PricedChain:
    """The least priced chain of blocks (module doc) at a cap B, for a batch of prices."""

    def __init__(self, gb: GroupBound, hi: float, crossings: int | None = None):
        t = gb.t
        self.gb, u = gb, t.num_units
        self.k = len(gb.groups) - 1 if crossings is None else crossings
        devs = np.concatenate(gb.groups)
        key = np.concatenate([t.prefix[devs], t.fixed[devs, None], t.in_msg[devs, None],
                              t.memory[devs, None]], axis=1)
        _, first, counts = np.unique(key, axis=0, return_index=True, return_counts=True)
        self.rep, self.n = devs[first], counts.astype(float)
        need = t.state_prefix + t.microbatches * t.act_prefix
        cut = np.arange(1, u + 1)  # block end e; the cut after it is e (index e - 1)
        g_n = len(gb.groups)
        cross = (np.min([gb.cross[a, b] for a in range(g_n) for b in range(g_n) if a != b],
                        axis=0) if self.k and g_n > 1 else np.full(u - 1, _INF))
        intra = gb.intra.min(axis=0)
        pre = t.prefix[self.rep]  # [C, U + 1]
        fixed, msg = t.fixed[self.rep, None], t.in_msg[self.rep, None]
        # longest block that fits memory on some kind and time <= hi on it
        mem = t.memory[self.rep, None] * (1 + _TOL) + 0.5
        lo_mem = np.searchsorted(need, need[None, cut] - mem, "left")  # [C, U]
        lo_time = np.stack([np.searchsorted(p, p[cut] - (hi - f) * (1 + _TOL), "left")
                            for p, f in zip(pre, fixed[:, 0])])
        self.lmax = int(max((cut[None] - np.maximum(lo_mem, lo_time)).max(), 1))
        self.ok = len(self.rep) * u * self.lmax <= MAX_CELLS
        if not self.ok:
            return
        length = np.arange(1, self.lmax + 1)
        start = cut[:, None] - length[None, :]  # [U, L]
        valid = (start >= 0)[None] & (need[None, cut, None] - need[np.maximum(start, 0)][None]
                                      <= mem[:, :, None])
        comp = (pre[:, cut, None] - pre[:, np.maximum(start, 0)] + fixed[:, :, None]
                + np.where(start > 0, msg[:, :, None], 0.0))
        last = cut == u
        out0 = np.where(last, 0.0, np.concatenate([intra, [0.0]])[None] + msg)  # [C, U]
        out1 = np.where(last, _INF, np.concatenate([cross, [_INF]])[None] + msg)
        self.cost = np.stack([np.where(valid, comp + o[:, :, None], _INF) for o in (out0, out1)])
        self.cost = np.moveaxis(self.cost, 2, 0)  # [U, 2, C, L]: per end, dj, kind, length

    def price(self, mu: np.ndarray, caps: np.ndarray):
        """For prices mu [P, C], each at its cap: the least priced path value less mu . N [P]
        (a bound on sum t_k), and per price its path's kind counts [P, C], unpriced sum [P] and
        largest stage [P] (inf where no path)."""
        u, k, lm = self.cost.shape[0], self.k, self.lmax
        n_p, c_n = mu.shape
        lim = (caps * (1 + _TOL))[None, :, None, None, None]
        cost = np.where(self.cost[:, None] <= lim, self.cost[:, None], _INF)  # [U, P, 2, C, L]
        cost = np.ascontiguousarray((cost[..., ::-1] + mu[None, :, None, :, None])[:, :, :, None])
        # rounding is monotone, so min_c fl(f + x_c) = fl(f + min_c x_c): the kinds' least
        # priced block per (end, length) first, then one add per length in the loop
        least = np.ascontiguousarray(cost.min(axis=-2))  # [U, P, 2, 1, L]
        f = np.full((n_p, k + 1, lm + u + 1), _INF)  # f[:, j, lm + x]: unit x, j crossings
        f[:, 0, lm] = 0.0
        won = np.zeros((u, n_p, 2, k + 1))  # per end: best per (dj, source crossings)
        for e in range(1, u + 1):
            prev = f[:, None, :, e: e + lm]  # [P, 1, K + 1, L]: starts e - lm .. e - 1
            best = won[e - 1] = (prev + least[e - 1]).min(axis=-1)
            col = f[:, :, lm + e]
            col[:, 0] = best[:, 0, 0]
            if k:
                np.minimum(best[:, 0, 1:], best[:, 1, :-1], out=col[:, 1:])
                np.minimum(col[:, k], best[:, 1, k], out=col[:, k])
            f[:, :, lm + e] = col
        val = f[:, k, lm + u] - mu @ self.n
        counts = np.zeros_like(mu)
        total, top = np.zeros(n_p), np.full(n_p, _INF)
        for p in np.flatnonzero(np.isfinite(val)):
            counts[p], total[p], top[p] = self._path(f[p], won[:, p], cost[:, p, :, 0],
                                                     mu[p])
        return val, counts, total, top

    def _path(self, f: np.ndarray, won: np.ndarray, priced: np.ndarray, mu: np.ndarray):
        """Walk one DP back from (U, K) (won: [U, 2, K + 1] per end the best per move; priced:
        [U, 2, C, L]): kind counts, unpriced sum, largest stage."""
        u, k, lm = priced.shape[0], self.k, self.lmax
        counts, total, top = np.zeros(len(mu)), 0.0, 0.0
        e, j = u, k
        while e > 0:
            src = [(0, j)] + ([(1, j - 1)] if j >= 1 else []) + ([(1, k)] if j == k and k else [])
            dj, js = min(src, key=lambda x: won[e - 1, x[0], x[1]])
            c, i = divmod(int(np.argmin(f[js, e: e + lm][None] + priced[e - 1, dj])), lm)
            stage = float(priced[e - 1, dj, c, i] - mu[c])
            counts[c] += 1
            total, top, j = total + stage, max(top, stage), js
            e -= lm - i
        return counts, total, top


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


class _Columns:
    """Column generation over caps: every path found (kind counts, unpriced sum, largest
    stage) and every priced evaluation (cap, value, largest stage of its path, its prices,
    whether the master at that cap can do better)."""

    def __init__(self, gb: GroupBound, dp: PricedChain, big: float):
        self.gb, self.dp, self.big = gb, dp, big
        self.cols = np.zeros((0, len(dp.n)))
        self.costs, self.tops = np.zeros(0), np.zeros(0)
        self.evals: list[list] = []  # [cap, value, top, prices, master's value]
        self.passes = 0

    def master(self, cap: float, box=None) -> tuple[np.ndarray, float]:
        ok = self.tops <= cap * (1 + _TOL)  # paths feasible at this cap
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
        exact = best[2] <= b * (1 + _TOL)
        return best[1], exact, best[0] if tries < MAX_TRIES else None, best[4]


def chain_bound(t: Tables, upper: float = _INF, gb: GroupBound | None = None, *,
                revisits: bool = False, goal: float | None = None) -> float:
    """A lower bound on T over all plans (module doc), -inf where it does not apply (1F1B,
    m = 1, no known plan, too many link groups, too large a DP); ``upper``: a known plan's T.
    ``gb``: a ``GroupBound(t)`` shared with the caller; once ``group_bound`` has run on it, its
    B grid (``b_grid``) is refined here instead of a new one. ``revisits``: bound only the plans
    that do not visit every group exactly once in one run (the chain then needs G crossings;
    the plans left out are the ones ``refine.least_sum`` solves exactly). ``goal``: where the
    chain leaves plans visiting every group below it (the planner: T / 1.009), those that visit
    each once are bounded apart (``once_bound``) and the others by the chain with G crossings,
    at up to ``MAX_ONCE`` caps."""
    m = t.microbatches
    if t.schedule != "gpipe" or m == 1 or not np.isfinite(upper) or t.num_units < 2:
        return -_INF
    gb = GroupBound(t) if gb is None else gb
    if not gb.ok or not 1 <= len(gb.groups) <= MAX_SUBSET_GROUPS:
        return -_INF
    g_n = len(gb.groups)
    if revisits and g_n == 1:
        return upper  # one group: every plan visits it once, in one run
    const = float((t.update_call + t.update_prefix[:, 1]).min()) + t.sync_s
    terms = [(len(s) == g_n, x) for s in gb.subsets() for x in gb.cases(s, len(s) == g_n)]
    full = np.array([f for f, _ in terms])
    floors = np.array([x[4] for _, x in terms])
    lo = float(floors.min())
    hi = (upper - const - gb.total) / (m - 1)
    if hi <= lo:
        return upper
    def evaluate(b: np.ndarray) -> np.ndarray:
        caps = gb.capacities(b)
        return gb.sum_bounds([x for _, x in terms], b, caps)  # [terms, K]

    known = gb.b_grid  # group_bound's own B grid, refined where it is lowest
    if known is not None and known[0][0] <= lo and known[0][-1] >= hi:  # it covers [lo, hi]
        grid, vals = known
    else:
        grid = np.geomspace(lo, hi, GRID)
        vals = evaluate(grid)
    pts = grid.copy()  # interval ends: the grid and where chain steps start
    dp = PricedChain(gb, float(grid[-1]), g_n if revisits else None)  # every block that fits
    if not dp.ok:
        return -_INF
    cols = _Columns(gb, dp, upper - const - (m - 1) * lo)
    seps: list[tuple[float, float, float]] = []  # (cap, once-each term, G-crossings chain)

    def apart(b: np.ndarray) -> np.ndarray:
        """Per interval end b, plans visiting every group: the lesser of the best once-each
        term and the best G-crossings chain at caps >= b (-inf where none)."""
        once = [max([x[1] for x in seps if x[0] >= e], default=-_INF) for e in b]
        rev = [max([x[2] for x in seps if x[0] >= e], default=-_INF) for e in b]
        return np.minimum(once, rev)

    def lows():
        """Per interval [a, b] of pts: the bound on T - const; the full-set group terms', the
        chain's (both: plans visiting all groups), the others' (fewer groups); whether the
        group terms are known only at a point right of b."""
        a, b = pts[:-1], pts[1:]
        g = np.searchsorted(grid, b, "left")  # group terms at grid[g] >= b
        per = vals[:, g] + (m - 1) * np.maximum(a[None], floors[:, None])
        chain = np.array([cols.at(x)[0] for x in b]) + (m - 1) * a
        if seps:
            chain = np.maximum(chain, apart(b) + (m - 1) * a)

        def part(sel: np.ndarray) -> np.ndarray:  # a bound at any grid point >= b holds too
            if not sel.any():
                return np.full(len(b), _INF)
            right = np.maximum.accumulate(vals[sel].min(axis=0)[::-1])[::-1]
            return np.maximum(per[sel].min(axis=0), right[g] + (m - 1) * a)

        group, other = part(full), part(~full)
        return np.minimum(np.maximum(group, chain), other), group, chain, other, grid[g] > b

    once = OnceEach(t, gb.groups) if goal is not None and not revisits and g_n > 1 else None

    def lift_apart() -> None:
        """Below the goal, plans visiting every group: once-each (``once_bound``) and G
        crossings bounded apart, at the highest cap left below it, then the next."""
        rev = None
        for _ in range(MAX_ONCE):
            low, _, _, other, _ = lows()
            weak = np.flatnonzero(low + const < goal)
            if not len(weak) or (other[weak] + const < goal).any():
                return  # at the goal, or plans visiting fewer groups limit it
            cap = float(pts[weak.max() + 1])
            if any(x[0] == cap for x in seps):
                return
            rev = PricedChain(gb, float(grid[-1]), g_n) if rev is None else rev
            if not rev.ok:
                return
            mus = cols.prices(cap)
            rev_v = float(rev.price(mus, np.full(len(mus), cap))[0].max())
            a_min = float(pts[weak[pts[weak + 1] <= cap]].min())  # the lowest it should lift
            enough = goal - t.sync_s - (m - 1) * a_min
            once_v = once.least_sum(cap * (1 + 1e-9), enough * (1 + 1e-9)) + t.sync_s - const
            seps.append((cap, once_v, rev_v))

    pending = once is not None and once.ok
    for _ in range(MAX_ROUNDS):
        if pending and cols.passes >= ONCE_AFTER:
            lift_apart()
            pending = False
        low, group, chain, other, loose = lows()
        if goal is not None and low.min() + const >= goal:
            break  # the caller needs no more
        caps, split = [], []
        for i in np.argsort(low, kind="stable")[:SCAN]:
            a, b = pts[i], pts[i + 1]
            if not np.isfinite(low[i]):
                break
            _, exact, again, most = cols.at(b)
            wide = b - a > MIN_WIDTH * b
            rise = again is not None and most + (m - 1) * a > low[i] * (1 + 1e-9)
            if wide and (other[i] <= low[i] or loose[i]):
                split.append(i)  # the other groups' terms limit it, or group terms are stale
            elif other[i] > low[i] and cols.passes < MAX_DP and (not exact or rise):
                if not exact:  # reach right (one path often holds over many intervals),
                    # below the paths found at caps >= b that do not fit b
                    reach = min([b * (1 + REACH)] + [x[2] * (1 - 1e-9) for x in cols.evals
                                                     if x[0] >= b and x[2] > b])
                    b = pts[np.searchsorted(pts, max(reach, b), "right") - 1]
                else:
                    b = again  # better prices at the cap that holds here
                if b not in caps:
                    caps.append(b)
            elif wide and group[i] > chain[i]:
                split.append(i)  # the full-set group terms limit it: refine them
            else:
                break  # the lowest left cannot rise: the bound is decided
            if len(caps) >= WIDTH or len(split) >= WIDTH:
                break
        if not caps and not split:
            break
        if caps:
            n_ev = len(cols.evals)
            cols.run(caps, FIRST_ROUNDS if not n_ev else 1)
            for x in cols.evals[n_ev:]:  # the next steps start just below the paths' tops
                k = np.searchsorted(pts, x[2] * (1 - 1e-9))
                if 0 < k < len(pts) and min(pts[k] - x[2] * (1 - 1e-9), x[2] * (1 - 1e-9)
                                            - pts[k - 1]) > 1e-12 * x[2]:
                    pts = np.insert(pts, k, x[2] * (1 - 1e-9))
        if split:
            new = np.concatenate([np.linspace(pts[i], pts[i + 1], SPLIT + 1)[1:] for i in split])
            vals = np.concatenate([vals, evaluate(new)], axis=1)
            grid = np.concatenate([grid, new])
            o = np.argsort(grid, kind="stable")
            grid, vals = grid[o], vals[:, o]
            pts = np.unique(np.concatenate([pts, new]))
    if pending:
        lift_apart()
    low = float(lows()[0].min()) + const
    return min(low, upper) if not math.isnan(low) else -_INF
