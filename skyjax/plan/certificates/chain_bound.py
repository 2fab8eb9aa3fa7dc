"""A lower bound on T (GPipe) from device kinds priced along an exact chain of blocks: the
planner's certificate where ``group_bound`` leaves a gap (paper case, GPipe m = 32: 2 %).

It is a proof, not an estimate. The chain (:mod:`skyjax.plan.certificates.priced_chain`)
bounds the sum of stage times of every plan whose stages all fit a cap B, for any prices of
the device kinds (:mod:`skyjax.plan.certificates.chain_prices` finds good ones). This module
turns those sums into a bound on T:

* Over B: a plan whose bottleneck lies in [B_i, B_j] has
  T >= s(B_j) + (m - 1) B_i + update floor + sync, for any valid sum bound s at cap B_j (a
  plan with bottleneck <= B_j is feasible there). The DP's best path at B_j has some largest
  stage b*; with the same prices its value holds down to b*, so b* (just below) is where the
  next step starts.
* Other plans: plans visiting fewer groups are bounded by ``group_bound``'s terms for their
  subsets, plans visiting all groups also by its full-set terms (the larger of the two
  holds); a sum bound at cap p holds for every interval ending at or left of p. Plans with
  B > (upper - W - const) / (m - 1) have T > upper >= T*; B below every case's floor is
  impossible. Revisits need no case of their own: they have >= K crossings, so they are paths
  of the DP too.
* The result is the least over a cover of [lo, hi] by intervals of
  min(others, max(full set, chain)) + (m - 1) B_i, refined by branch and bound: the lowest
  interval gets a priced DP at (or a little right of) its right end, better prices there, or
  a split of the group terms, until it cannot rise or the budget (``MAX_DP`` passes) is
  spent. Which interval, cap or prices are tried only changes how tight the result is, never
  whether it is a bound.
* Apart (with a ``goal``, the planner's T / 1.009): pooling kinds over regions is this
  relaxation's ceiling (paper case, T 2.873: 2.835 after ~15 passes; the chain's LP ends at
  2.8375). So after the first cap's rounds (``ONCE_AFTER`` passes), while intervals stay below
  the goal, plans visiting every group are split: those visiting each group once, in one run,
  get ``once_bound``'s least sum at the highest such interval's right end, those that do not
  the chain with G crossings (same DP, best prices known). The lesser of the two holds there
  and left of it, up to ``MAX_ONCE`` caps; the branch and bound then stops once every
  interval reaches the goal (paper case: two caps, 2.835 -> 2.847, i.e. T / 1.009).

1F1B is left out (a stage's memory depends on its place from the pipeline's end;
``region_bound`` covers it). docs/design.md, "Planning", "Lower bounds", places this among the
planner's bounds; tests/test_chain_bound.py and tests/test_once_bound.py check it against brute
force.
"""

from __future__ import annotations

import math

import numpy as np

from skyjax.plan.pricing.cost import Tables
from skyjax.plan.bounds.group_terms import MAX_SUBSET_GROUPS, GroupBound
from skyjax.plan.certificates.chain_prices import MAX_DP, Columns
from skyjax.plan.certificates.once_bound import OnceEach
from skyjax.plan.certificates.priced_chain import PricedChain

_INF = math.inf
MAX_ROUNDS = 30  # interval branch-and-bound rounds
FIRST_ROUNDS = 4  # column-generation rounds at the first caps (later: one per visit)
MIN_WIDTH = 1e-5  # narrower intervals are not split (the loss is (m - 1) x width)
REACH = 0.01  # a new chain cap: the furthest interval end within this factor
SCAN, WIDTH = 12, 1  # intervals looked at per round, most caps or splits per round
GRID, SPLIT = 33, 4  # group terms: first grid over [lo, hi], pieces per refinement
MAX_ONCE = 4  # caps at which the once-each bound (once_bound) is tried, while below the goal
ONCE_AFTER = 4  # chain passes before it (then the chain goes on only where still below)


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
    cols = Columns(gb, dp, upper - const - (m - 1) * lo)
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
