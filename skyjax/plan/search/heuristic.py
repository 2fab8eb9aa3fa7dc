"""The heuristic search, for problems too large for the exact DP: ``exact: false`` plans that
carry ``lower_bound_s`` (:mod:`skyjax.plan.bounds.step`). docs/design.md, "Planning",
"Heuristic", gives its steps and their reasons.

Device orders keep link groups contiguous (:mod:`skyjax.plan.search.order_search`). For each
order, :class:`skyjax.plan.search.chain_dp.ChainDP` finds the best plan on any subsequence of
it for a batch of caps at once, and ``_CapSearch`` zooms geometric grids of caps in on
T* = min_t DP(t) + (m - 1) t, starting from a lower bound on the bottleneck
(:func:`skyjax.plan.bounds.step.min_bottleneck`) and never running a cap twice. Then come a
budgeted local search over orders, GPipe's interleaved orders where memory binds, and for 1F1B
orders of only the fastest devices (``fastest_subsets``) where unused devices inflated the
in-flight counts.
"""

from __future__ import annotations

import math

import numpy as np

from skyjax.plan.search import order_search
from skyjax.plan.search.chain_dp import ChainDP, group_links
from skyjax.plan.pricing.classes import coarse_groups, device_classes, labels, link_groups
from skyjax.plan.pricing.cost import Solution, Tables
from skyjax.plan.search.order_search import candidate_orders
from skyjax.plan.search.order_search import overcharged

MAX_LINK_GROUPS = 16  # more link groups are coarsened (worst link per group pair)
CAP_RTOL = 5e-3  # stop refining the cap once the bracket is this narrow
FULL_SEARCH_WORK = 2e5  # refine every candidate order while orders x D x U is below
FASTEST_TRIES = 6  # most device subsets (the k fastest) tried for 1F1B
SCREEN_ROUNDS = 2  # cap rounds that screen a subset order
FASTEST_PATIENCE = 1  # subset sizes tried after the best so far stops improving
_INF = math.inf


class _CapSearch:
    """The cap for one order: DP(inf), then geometric grids of K caps, each round zooming in on
    the best score sum + (m - 1) cap (an upper bound on that plan's T). Caps below cap_lb are
    infeasible, and caps above (best known T - DP(inf)) / (m - 1) cannot beat the best known."""

    def __init__(self, dp: ChainDP, m: int, cap_lb: float, k: int):
        self.dp, self.m, self.k = dp, m, k
        self.s_inf = float(dp.run(np.array([_INF]))[0])
        self.feasible = self.s_inf < _INF
        self.cap, self.score = _INF, self.s_inf * m
        self.lo, self.hi = max(cap_lb, self.s_inf * 1e-9), self.s_inf
        self.seen: dict[float, float] = {}

    def refine(self, rounds: int, best_known: float = _INF, prune: float | None = None) -> None:
        """Caps above (best_known - DP(inf)) / (m - 1) are not tried. ``prune`` (default
        best_known): stop once no cap left in the bracket can score below it (DP is
        non-increasing in the cap, so on [c_a, c_j] the score is >= DP(c_j) + (m - 1) c_a and
        on [c_j, c_b] >= DP(c_b) + (m - 1) c_j): every score below it comes out the same, one
        that cannot beat it may stay coarser (so callers prune at the score to beat)."""
        prune = best_known if prune is None else prune
        if not self.feasible or self.m == 1:
            return
        self.hi = min(self.hi, (best_known - self.s_inf) / (self.m - 1))
        for _ in range(rounds):
            if self.hi < self.lo or (self.cap < _INF and self.hi < self.lo * (1 + CAP_RTOL)):
                return
            caps = np.geomspace(self.lo, self.hi, self.k) if self.hi > self.lo else [self.hi]
            caps = np.asarray(caps)
            dp = self._run(caps)
            score = dp + (self.m - 1) * caps
            j = int(np.argmin(score))
            if score[j] < self.score:
                self.score, self.cap = float(score[j]), float(caps[j])
            if len(caps) == 1:
                return
            a, b = max(j - 1, 0), min(j + 1, len(caps) - 1)
            self.lo, self.hi = caps[a], caps[b]
            if min(dp[j] + (self.m - 1) * caps[a], dp[b] + (self.m - 1) * caps[j]) >= prune:
                return

    def _run(self, caps: np.ndarray) -> np.ndarray:
        """DP per cap; a round's ends are the last round's caps, which are not run again."""
        new = np.array([c for c in caps if float(c) not in self.seen])
        if len(new):
            self.seen.update(zip(new.tolist(), self.dp.run(new).tolist()))
        return np.array([self.seen[float(c)] for c in caps])

    def solution(self) -> Solution | None:
        return self.dp.reconstruct(self.cap) if self.feasible else None


def fastest_subsets(t: Tables, top: "_CapSearch", orders: list[list[int]], make,
                    rounds: int) -> "_CapSearch":
    """1F1B: the chain DP charges a stage min(m, devices left in the order) micro-batches in
    flight, unused devices included, so with many micro-batches a full order starves the early
    stages' memory (paper case, m = 32: T 2.57 from full orders, 2.34 from the fastest 22).
    Orders restricted to the k fastest devices (k over the distinct speeds, fewest first, while
    the score improves; ``FASTEST_TRIES`` at most) are screened (``SCREEN_ROUNDS`` cap rounds)
    with the top order's pattern; the best k is screened with every pattern and the best
    refined. Unused devices are dropped, never added, so the plan only gets better."""
    total = t.prefix[:, -1]
    ks = np.searchsorted(np.sort(total), np.unique(total), "right")
    ks = ks[ks < t.num_devices]
    if len(ks) > FASTEST_TRIES:
        ks = ks[np.linspace(0, len(ks) - 1, FASTEST_TRIES).round().astype(int)]
    rank = np.argsort(np.argsort(total, kind="stable"), kind="stable")
    pattern = orders.index(top.dp.order) if top.dp.order in orders else 0
    found, worse = None, 0  # (cap search, k); a screen is pruned at the score it must beat
    for k in ks:
        cs = make([d for d in orders[pattern] if rank[d] < k], top.score, SCREEN_ROUNDS,
                  _INF if found is None else found[0].score)
        if not cs.feasible:
            continue
        if found is None or cs.score < found[0].score:
            found, worse = (cs, k), 0
        else:
            worse += 1
            if worse >= FASTEST_PATIENCE:
                break
    if found is None:
        return top
    cs, k = found
    for i, order in enumerate(orders):
        if i != pattern:
            other = make([d for d in order if rank[d] < k], top.score, SCREEN_ROUNDS, cs.score)
            if other.feasible and other.score < cs.score:
                cs = other
    cs.refine(rounds - SCREEN_ROUNDS, top.score)
    return cs if cs.score < top.score * (1 - 1e-9) else top


def search(t: Tables, cap_lb: float, rounds: int = 5, k: int = 8,
           improve: bool = True) -> Solution | None:
    """Each candidate order gets a cap search (all rounds when n x U is small, otherwise one
    screening round and only the best is refined); then, within a work budget, local search
    over orders (:mod:`skyjax.plan.search.order_search`; ``improve=False`` skips it: a quicker
    screen, used by :mod:`skyjax.plan.data_parallel.split` at scale)."""
    groups = link_groups(t)
    if len(groups) > MAX_LINK_GROUPS:  # e.g. noisy measured links: coarsen, charge worst links
        groups = coarse_groups(t, MAX_LINK_GROUPS)
    group_of = labels(groups, t.num_devices)
    class_of = labels(device_classes(t), t.num_devices)
    orders = candidate_orders(t, groups, class_of)
    links = group_links(t, groups)
    full = len(orders) * t.num_devices * t.num_units <= FULL_SEARCH_WORK

    def cap_search(order: list[int], best: float, n_rounds: int,
                   prune: float | None = None) -> _CapSearch:
        dp = ChainDP(t, order, group_of, groups, class_of, links)
        cs = _CapSearch(dp, t.microbatches, cap_lb, k)
        cs.refine(n_rounds, best, prune)
        return cs

    searches, best = [], _INF
    for order in orders:
        cs = cap_search(order, best, rounds if full else 1)
        if cs.feasible:
            best = min(best, cs.score)
            searches.append(cs)
    if not searches:
        return None
    top = min(searches, key=lambda cs: cs.score)
    if not full:
        top.refine(rounds - 1, best)
    if improve:
        top = order_search.improve(top, lambda order, best: cap_search(order, best, rounds),
                                   class_of, group_of, t.microbatches, t.num_units)
    sol = top.solution()
    if t.schedule == "gpipe" and sol is not None and order_search.memory_bound(t, sol):
        # slow devices between fast ones re-align memory-bound blocks: screened near the
        # incumbent's cap (as order_search screens a trial), refined only if it wins there
        mixed = order_search.interleaved(top.dp.order, group_of, t.prefix[:, -1])
        if order_search.screen(ChainDP(t, mixed, group_of, groups, class_of, links), top,
                               t.microbatches):
            cs = cap_search(mixed, top.score, rounds)
            if cs.feasible and cs.score < top.score * (1 - 1e-9):
                top, sol = cs, cs.solution()
    if t.schedule == "1f1b" and t.microbatches > 2 and sol is not None \
            and overcharged(t, top.dp.order, sol):
        found = fastest_subsets(t, top, orders, cap_search, rounds)
        if found is not top:
            sol = found.solution()
    return sol
