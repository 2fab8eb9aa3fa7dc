"""The heuristic search, for problems too large for the exact DP: ``exact: false`` plans that come
with ``lower_bound_s`` (:mod:`skyjax.plan.bounds`).

1. Link groups (:func:`skyjax.plan.classes.link_groups`: devices whose links are
   interchangeable, typically regions) are kept contiguous; the group path minimises the link
   cost between neighbours (exhaustive up to 7 groups, else nearest neighbour); inside a group
   devices are sorted fast-first or slow-first. Four orders: that path and its reverse, times
   the two sorts. More than ``MAX_LINK_GROUPS`` groups (e.g. noisy measured links) are coarsened
   (``coarse_groups``) and the DP charges each group pair its worst link, so its costs bound the
   true ones from above.
2. For a fixed order, ``_ChainDP`` finds the best plan on any subsequence of it (stages may skip
   devices) in O(n U log U) per cap: a forward DP over the order whose inner step is vectorised
   over units, caps and destination groups (windows from cap and memory, sparse-table range
   minima); runs of identical devices that stop improving are skipped. For 1F1B it charges
   min(m, devices left in the order) in-flight micro-batches, which is exact when the order's
   tail is used and otherwise safe (never more than the true count).
3. Each order gets a cap search (only the best is refined when orders x D x U is large), then a
   budgeted first-improvement local search over orders (:mod:`skyjax.plan.order_search`: new
   group carriers, swaps), each trial screened by one DP run near the incumbent's cap.
4. 1F1B: orders of only the k fastest devices (``_fastest_subsets``), whose in-flight counts
   are not inflated by devices the plan leaves unused; only when the inflated count stopped
   some stage of the plan from growing (``_overcharged``).

Bottleneck (``_CapSearch``). T* = min_t DP(t) + (m - 1) t (:mod:`skyjax.plan.planner`); here
geometric grids of K caps between a lower bound on the bottleneck
(:func:`skyjax.plan.bounds.min_bottleneck`) and (best - DP(inf)) / (m - 1), each round zooming in
on the best.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np

from skyjax.plan import order_search
from skyjax.plan.classes import coarse_groups, device_classes, labels, link_groups, worst_link
from skyjax.plan.cost import Solution, Tables, stage_costs

MAX_LINK_GROUPS = 16  # more link groups are coarsened (worst link per group pair)
CAP_RTOL = 5e-3  # stop refining the cap once the bracket is this narrow
FULL_SEARCH_WORK = 2e5  # refine every candidate order while orders x D x U is below
FASTEST_TRIES = 6  # most device subsets (the k fastest) tried for 1F1B
SCREEN_ROUNDS = 2  # cap rounds that screen a subset order
FASTEST_PATIENCE = 1  # subset sizes tried after the best so far stops improving
_INF = math.inf


def _sparse_table(x: np.ndarray) -> np.ndarray:
    """levels[l, k, i] = min x[k, i : i + 2^l] (clipped); x is [K, n]."""
    k, n = x.shape
    levels = max(1, int(n).bit_length())
    out = np.empty((levels, k, n))
    out[0] = x
    for l in range(1, levels):
        h = 1 << (l - 1)
        np.minimum(out[l - 1, :, : n - h], out[l - 1, :, h:], out=out[l, :, : n - h])
        out[l, :, n - h:] = out[l - 1, :, n - h:]
    return out


def _range_min(tab: np.ndarray, log2: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """min of row k over [lo, hi] for index arrays shaped [..., K, n] (inf where lo > hi)."""
    levels, k_n, n = tab.shape
    length = hi - lo + 1
    ok = length >= 1
    lvl = log2[np.maximum(length, 1)]
    base = lvl * (k_n * n) + np.arange(k_n)[:, None] * n
    flat = tab.reshape(-1)
    a = flat[base + np.where(ok, lo, 0)]
    b = flat[base + np.where(ok, hi - (1 << lvl) + 1, 0)]
    return np.where(ok, np.minimum(a, b), _INF)


class _ChainDP:
    """DP over a fixed device order, stages on any subsequence of it (module doc, step 2).

    arrive[g][k, b]: least sum of the stages before unit b (comm into the next stage included)
    when the stage starting at b runs on a device of link group g not yet processed, for cap k.
    Each device i in order turns arrive[g_i] into arrivals for every later group with one
    vectorised step: a window [lo(c), c) of starts per end c (from the cap and memory) and a
    sparse-table range minimum. When a device changes nothing, the identical devices that follow
    it (same class, same memory window) would change nothing either and are skipped.
    """

    def __init__(self, t: Tables, order: Sequence[int], group_of: np.ndarray,
                 groups: list[list[int]], class_of: np.ndarray | None = None):
        self.t, self.order, self.groups = t, list(order), groups
        u, n = t.num_units, len(self.order)
        self.pre = t.prefix[self.order]  # [n, U+1]
        self.fixed = t.fixed[self.order]  # per stage: call costs
        self.inmsg = t.in_msg[self.order]  # per stage that does not start the chain
        self.first_extra = np.stack([t.first_update(d, np.arange(u + 1)) for d in self.order])
        self.gid = [int(group_of[d]) for d in self.order]
        self.n_groups = len(groups)
        self.log2 = np.zeros(u + 2, dtype=np.int64)
        self.log2[1:] = np.floor(np.log2(np.arange(1, u + 2))).astype(np.int64)
        self.later: list[np.ndarray] = [np.zeros(0, np.int64)] * n
        seen: list[int] = []
        for i in range(n - 1, -1, -1):
            self.later[i] = np.array(seen, dtype=np.int64)
            if self.gid[i] not in seen:
                seen.append(self.gid[i])
        self.mem_lo = np.empty((n, u + 1), dtype=np.int64)  # least start b of a block ending at c
        for i, d in enumerate(self.order):
            q = t.state_prefix + t.inflight(n - i) * t.act_prefix
            self.mem_lo[i] = np.searchsorted(q, q - t.memory[d], "left")
        cls = np.arange(t.num_devices) if class_of is None else class_of
        self.same_as_prev = [i > 0 and cls[self.order[i]] == cls[self.order[i - 1]]
                             and np.array_equal(self.mem_lo[i], self.mem_lo[i - 1])
                             for i in range(n)]
        self.comm = np.full((self.n_groups, self.n_groups, max(u - 1, 0)), _INF)
        out = t.output_bytes[:-1]
        present = sorted(set(self.gid))
        for g, h in itertools.product(present, present):
            lat, bw = worst_link(t, groups[g], groups[h])
            if bw > 0:
                self.comm[g, h] = 2.0 * (lat + out / bw)

    def run(self, caps: np.ndarray, record: bool = False):
        """Least sum per cap ([K]); with record=True also what reconstruct() needs."""
        u, k_n = self.t.num_units, len(caps)
        caps = np.asarray(caps, float)
        arrive = np.full((self.n_groups, k_n, u), _INF)
        src = np.full((self.n_groups, k_n, u), -1) if record else None
        final = np.full(k_n, _INF)
        final_src = np.full(k_n, -1)
        hist = []
        hi_last = np.full((k_n, 1), u - 1)
        ends = np.arange(u - 1)
        stale = False
        with np.errstate(invalid="ignore"):
            for i in range(len(self.order)):
                if stale and self.same_as_prev[i]:
                    hist.append(None)
                    continue
                g, pre, mlo, hs = self.gid[i], self.pre[i], self.mem_lo[i], self.later[i]
                fix, inm, extra = self.fixed[i], self.inmsg[i], self.first_extra[i]
                # x[b] = arrive[b] - P[b] + message calls in, for starts b >= 1; a stage starting
                # the chain (b = 0: no messages in, T adds its update) is priced apart (first0).
                x = arrive[g].copy()
                x[:, 0] = _INF
                x[:, 1:] += inm - pre[None, 1:u]
                if record:
                    hist.append((x[0].copy(), src[g, 0].copy()))
                tab = _sparse_table(x)
                lo = np.maximum(np.searchsorted(pre, pre[u] + fix + inm - caps, "left"), mlo[u])
                last = _range_min(tab, self.log2, np.maximum(lo, 1)[:, None], hi_last)[:, 0]
                last = np.minimum(last + pre[u] + fix,
                                  self._first0(pre[u] + fix, extra[u], mlo[u], caps))
                better = last < final
                final = np.where(better, last, final)
                final_src = np.where(better, i, final_src)
                stale = not better.any()
                if len(hs) == 0 or u < 2:
                    continue
                reach = pre[None, 1:u] + self.comm[g, hs] + fix  # [H, U-1]: P[c] + comm(c)
                thr = reach[:, None, :] + inm - caps[None, :, None]  # [H, K, U-1]
                lo = np.searchsorted(pre, thr.ravel(), "left").reshape(thr.shape)
                lo = np.maximum(np.maximum(lo, mlo[None, None, 1:u]), 1)
                q = _range_min(tab, self.log2, lo, np.broadcast_to(ends, lo.shape))
                q += reach[:, None, :]
                q = np.minimum(q, self._first0(reach[:, None, :], extra[None, None, 1:u],
                                               mlo[None, None, 1:u], caps[None, :, None]))
                cur = arrive[hs, :, 1:]
                improved = q < cur
                if not improved.any():
                    continue
                stale = False
                if record:
                    src[hs, :, 1:] = np.where(improved, i, src[hs, :, 1:])
                arrive[hs, :, 1:] = np.minimum(cur, q)
        if record:
            return final, (final_src, hist)
        return final

    @staticmethod
    def _first0(cost, extra, mlo, caps):
        """Sum of a stage that starts the chain (cost = its t_k), inf where over cap or memory."""
        return np.where((cost <= caps) & (mlo == 0), cost + extra, _INF)

    def reconstruct(self, cap: float) -> Solution | None:
        """The least-sum plan for one cap, or None."""
        final, (fsrc, hist) = self.run(np.array([cap]), record=True)
        if not final[0] < _INF:
            return None
        t, u = self.t, self.t.num_units
        i, end, nxt_group = int(fsrc[0]), u, None
        out = []
        while True:
            pre, (x, src) = self.pre[i], hist[i]
            reach = pre[u] if nxt_group is None else pre[end] + self.comm[self.gid[i], nxt_group,
                                                                          end - 1]
            reach += self.fixed[i]
            mlo = int(self.mem_lo[i][end])
            lo = max(int(np.searchsorted(pre, reach + self.inmsg[i] - cap, "left")), mlo, 1)
            b = lo + int(np.argmin(x[lo:end])) if lo < end else 0
            # the same comparison as run(): x[b] + reach for b >= 1, reach + extra for b = 0
            first = float(self._first0(reach, self.first_extra[i][end], mlo, cap)) - reach
            if first <= (x[b] if b else _INF):
                b = 0
            out.append((self.order[i], b, end))
            if b == 0:
                break
            i, end, nxt_group = int(src[b]), b, self.gid[i]
        out.reverse()
        stages = stage_costs(t, out)
        times = [s.time_s for s in stages]
        return Solution(float(sum(times)) + stages[0].update_s, float(max(times)), out)


class _CapSearch:
    """The cap for one order: DP(inf), then geometric grids of K caps, each round zooming in on
    the best score sum + (m - 1) cap (an upper bound on that plan's T). Caps below cap_lb are
    infeasible, and caps above (best known T - DP(inf)) / (m - 1) cannot beat the best known."""

    def __init__(self, dp: _ChainDP, m: int, cap_lb: float, k: int):
        self.dp, self.m, self.k = dp, m, k
        self.s_inf = float(dp.run(np.array([_INF]))[0])
        self.feasible = self.s_inf < _INF
        self.cap, self.score = _INF, self.s_inf * m
        self.lo, self.hi = max(cap_lb, self.s_inf * 1e-9), self.s_inf

    def refine(self, rounds: int, best_known: float = _INF) -> None:
        if not self.feasible or self.m == 1:
            return
        self.hi = min(self.hi, (best_known - self.s_inf) / (self.m - 1))
        for _ in range(rounds):
            if self.hi < self.lo or (self.cap < _INF and self.hi < self.lo * (1 + CAP_RTOL)):
                return
            caps = np.geomspace(self.lo, self.hi, self.k) if self.hi > self.lo else [self.hi]
            caps = np.asarray(caps)
            score = self.dp.run(caps) + (self.m - 1) * caps
            j = int(np.argmin(score))
            if score[j] < self.score:
                self.score, self.cap = float(score[j]), float(caps[j])
            if len(caps) == 1:
                return
            self.lo, self.hi = caps[max(j - 1, 0)], caps[min(j + 1, len(caps) - 1)]

    def solution(self) -> Solution | None:
        return self.dp.reconstruct(self.cap) if self.feasible else None


def _group_path(t: Tables, groups: list[list[int]]) -> list[int]:
    """An order of link groups with cheap links between neighbours (exhaustive for <= 7)."""
    g_n = len(groups)
    ref = float(np.median(t.output_bytes)) if t.num_units else 0.0
    cost = np.zeros((g_n, g_n))
    for a, b in itertools.product(range(g_n), range(g_n)):
        d, e = groups[a][0], groups[b][0]
        if a != b:
            cost[a, b] = (2 * (t.latency[d, e] + ref / t.bandwidth[d, e])
                          if t.bandwidth[d, e] > 0 else _INF)
    # ties (equal links): 1F1B puts strong groups (most speed) late, where stages keep fewer
    # micro-batches in flight and a fast device's memory holds more (the reverse is tried too)
    speed = np.array([sum(1.0 / max(t.prefix[d, -1], 1e-300) for d in g) for g in groups])
    rank = (np.argsort(np.argsort(speed, kind="stable"), kind="stable")
            if t.schedule == "1f1b" else np.arange(g_n))
    if g_n <= 7:
        best = min(itertools.permutations(range(g_n)),
                   key=lambda p: (sum(cost[p[i], p[i + 1]] for i in range(g_n - 1)),
                                  tuple(rank[list(p)])))
        return list(best)
    speed = [min(t.prefix[d, -1] for d in g) for g in groups]
    path = [int(np.argmin(speed))]
    left = set(range(g_n)) - set(path)
    while left:
        nxt = min(left, key=lambda b: (cost[path[-1], b], b))
        path.append(nxt)
        left.remove(nxt)
    return path


def candidate_orders(t: Tables, groups: list[list[int]],
                     class_of: np.ndarray | None = None) -> list[list[int]]:
    """Device orders the heuristic tries: group path (and reversed) x fast-/slow-first inside a
    group (ties: more memory first, then identical devices together)."""
    path = _group_path(t, groups)
    total = t.prefix[:, -1]
    cls = np.arange(t.num_devices) if class_of is None else class_of
    orders = []
    for gp in (path, path[::-1]):
        for sign in (1, -1):
            order = [d for g in gp for d in
                     sorted(groups[g], key=lambda d: (sign * total[d], -t.memory[d], cls[d], d))]
            if order not in orders:
                orders.append(order)
    return orders


def _overcharged(t: Tables, order: list[int], sol: Solution) -> bool:
    """Whether the chain DP's in-flight count (min(m, devices left in the order)) bound the
    plan: some stage charged more than its true level min(m, stages from it to the end) could,
    at its true level, take one more unit on a side where the charged level stopped it. If not,
    no stage of this plan was shaped by the inflated count and ``_fastest_subsets`` is skipped
    (paper case, m = 8: 0.5 s saved; a cheap test, not a proof that subsets cannot help)."""
    pos = {d: i for i, d in enumerate(order)}
    n, m, u, p = len(order), t.microbatches, t.num_units, len(sol.assignment)

    def fits(d: int, level: int, a: int, b: int) -> bool:
        need = (t.state_prefix[b] - t.state_prefix[a]
                + level * (t.act_prefix[b] - t.act_prefix[a]))
        return bool(need <= t.memory[d])

    for j, (d, a, b) in enumerate(sol.assignment):
        charged, true = min(m, n - pos[d]), min(m, p - j)
        grown = ([(a - 1, b)] if a > 0 else []) + ([(a, b + 1)] if b < u else [])
        if charged > true and any(not fits(d, charged, x, y) and fits(d, true, x, y)
                                  for x, y in grown):
            return True
    return False


def _fastest_subsets(t: Tables, top: "_CapSearch", orders: list[list[int]], make,
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
    found, worse = None, 0  # (cap search, k)
    for k in ks:
        cs = make([d for d in orders[pattern] if rank[d] < k], top.score, SCREEN_ROUNDS)
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
            other = make([d for d in order if rank[d] < k], top.score, SCREEN_ROUNDS)
            if other.feasible and other.score < cs.score:
                cs = other
    cs.refine(rounds - SCREEN_ROUNDS, top.score)
    return cs if cs.score < top.score * (1 - 1e-9) else top


def search(t: Tables, cap_lb: float, rounds: int = 5, k: int = 8) -> Solution | None:
    """Each candidate order gets a cap search (all rounds when n x U is small, otherwise one
    screening round and only the best is refined); then, within a work budget, local search
    over orders (:mod:`skyjax.plan.order_search`)."""
    groups = link_groups(t)
    if len(groups) > MAX_LINK_GROUPS:  # e.g. noisy measured links: coarsen, charge worst links
        groups = coarse_groups(t, MAX_LINK_GROUPS)
    group_of = labels(groups, t.num_devices)
    class_of = labels(device_classes(t), t.num_devices)
    orders = candidate_orders(t, groups, class_of)
    full = len(orders) * t.num_devices * t.num_units <= FULL_SEARCH_WORK

    def cap_search(order: list[int], best: float, n_rounds: int) -> _CapSearch:
        cs = _CapSearch(_ChainDP(t, order, group_of, groups, class_of), t.microbatches, cap_lb, k)
        cs.refine(n_rounds, best)
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
    top = order_search.improve(top, lambda order, best: cap_search(order, best, rounds),
                               class_of, group_of, t.microbatches, t.num_units)
    sol = top.solution()
    if t.schedule == "1f1b" and t.microbatches > 2 and sol is not None \
            and _overcharged(t, top.dp.order, sol):
        found = _fastest_subsets(t, top, orders, cap_search, rounds)
        if found is not top:
            sol = found.solution()
    return sol
