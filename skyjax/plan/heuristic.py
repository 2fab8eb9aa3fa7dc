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
4. GPipe, where memory binds: the best order with slow devices between fast ones
   (:func:`skyjax.plan.order_search.interleaved`), which re-align memory-bound blocks.
5. 1F1B: orders of only the k fastest devices (``_fastest_subsets``), whose in-flight counts
   are not inflated by devices the plan leaves unused; only when the inflated count stopped
   some stage of the plan from growing (``order_search.overcharged``).

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
from skyjax.plan.order_search import candidate_orders
from skyjax.plan.order_search import overcharged as _overcharged

MAX_LINK_GROUPS = 16  # more link groups are coarsened (worst link per group pair)
CAP_RTOL = 5e-3  # stop refining the cap once the bracket is this narrow
FULL_SEARCH_WORK = 2e5  # refine every candidate order while orders x D x U is below
FASTEST_TRIES = 6  # most device subsets (the k fastest) tried for 1F1B
SCREEN_ROUNDS = 2  # cap rounds that screen a subset order
FASTEST_PATIENCE = 1  # subset sizes tried after the best so far stops improving
_INF = math.inf


def _sparse_table(x: np.ndarray, longest: int | None = None) -> np.ndarray:
    """tab[l, k, i] = min x[k, i : i + 2^(l - 1)] for l >= 1 and i + 2^(l - 1) <= n (the rest of
    a level is left unset: no query reads it), and tab[0] = inf (what an empty range reads); x is
    [K, n]. ``longest``: the longest range that will be queried (fewer levels: blocks are short
    next to the chain)."""
    k, n = x.shape
    levels = max(1, int(n if longest is None else min(max(longest, 1), n)).bit_length())
    out = np.empty((levels + 1, k, n))
    out[0] = _INF
    out[1] = x
    for l in range(2, levels + 1):  # the last h entries of level l are never read
        h = 1 << (l - 2)
        np.minimum(out[l - 1, :, : n - h], out[l - 1, :, h:], out=out[l, :, : n - h])
    return out


def _levels(n: int) -> tuple[np.ndarray, np.ndarray]:
    """For ``_range_min``: the table level of each range length 0..n (0: empty) and the span
    2^(l - 1) of each level (1 for level 0, so that both reads stay on the inf level)."""
    level = np.zeros(n + 1, dtype=np.int64)
    level[1:] = np.floor(np.log2(np.arange(1, n + 1))).astype(np.int64) + 1
    span = np.concatenate([[1], 1 << np.arange(int(level[-1]) + 1)]).astype(np.int64)
    return level, span


def _range_min(tab: np.ndarray, levels: tuple[np.ndarray, np.ndarray], lo: np.ndarray,
               hi: np.ndarray) -> np.ndarray:
    """min of row k over [lo, hi] for index arrays shaped [..., K, n] (inf where lo > hi),
    lo >= 0, hi <= n - 1: two reads of level floor(log2(length)) + 1 (level 0 when empty)."""
    _, k_n, n = tab.shape
    level, span = levels
    lvl = level[np.maximum(hi - lo + 1, 0)]
    base = lvl * (k_n * n) + np.arange(k_n)[:, None] * n
    flat = tab.reshape(-1)
    return np.minimum(flat[base + np.minimum(lo, n - 1)], flat[base + (hi + 1) - span[lvl]])


class _ChainDP:
    """DP over a fixed device order, stages on any subsequence of it (module doc, step 2).

    arrive[g][k, b]: least sum of the stages before unit b (comm into the next stage included)
    when the stage starting at b runs on a device of link group g not yet processed, for cap k.
    Each device i in order turns arrive[g_i] into arrivals for every later group with one
    vectorised step: a window [lo(c), c) of starts per end c (from the cap and memory) and a
    sparse-table range minimum. When a device changes nothing, the identical devices that follow
    it (same class, same memory window) would change nothing either and are skipped. Each step
    works only on the starts earlier stages reach and the ends within a block of them (the
    sparse table gets as many levels as the longest block needs), and the starts time allows
    are searched once per run for identical devices (paper scale: ~40 % less time).
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
        self.levels = _levels(u + 1)
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
        # a stage starting the chain, [0, c), fits in memory for c = 1 .. first_ends[i]
        self.first_ends = [int(np.searchsorted(lo[1:u], 1, "left")) for lo in self.mem_lo]
        cls = np.arange(t.num_devices) if class_of is None else class_of
        self.cls_of_pos = [int(cls[d]) for d in self.order]
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
        ends = np.arange(u - 1)
        stale = False
        lo_cache: dict = {}
        cls = self.cls_of_pos
        with np.errstate(invalid="ignore"):
            for i in range(len(self.order)):
                if stale and self.same_as_prev[i]:
                    hist.append(None)
                    continue
                g, pre, mlo, hs = self.gid[i], self.pre[i], self.mem_lo[i], self.later[i]
                fix, inm, extra = self.fixed[i], self.inmsg[i], self.first_extra[i]
                # x[b] = arrive[b] - P[b] + message calls in, for starts b >= 1; a stage starting
                # the chain (b = 0: no messages in, T adds its update) is priced apart (first0).
                if record:
                    x = arrive[g].copy()
                    x[:, 0] = _INF
                    x[:, 1:] += inm - pre[None, 1:u]
                    hist.append((x[0].copy(), src[g, 0].copy()))
                key = (cls[i], fix, inm, g, hs.tobytes())  # the same for identical devices
                if key not in lo_cache:  # block starts allowed by time (memory comes below)
                    lo_l = np.searchsorted(pre, pre[u] + fix + inm - caps, "left")[:, None]
                    reach = lo_t = None
                    longest_t = u - int(lo_l.min())
                    if len(hs) and u > 1:  # blocks ending at c, next stage in group h
                        reach = pre[None, 1:u] + self.comm[g, hs] + fix  # [H, U-1]: P[c] + comm
                        thr = reach[:, None, :] + inm - caps[None, :, None]  # [H, K, U-1]
                        lo_t = np.maximum(np.searchsorted(pre, thr.ravel(), "left")
                                          .reshape(thr.shape), 1)
                        longest_t = max(longest_t, int((ends[None, None, :] - lo_t).max()) + 1)
                    lo_cache[key] = lo_l, reach, lo_t, longest_t
                lo_l, reach, lo_t, longest = lo_cache[key]
                # only starts [b0, b1] that some earlier stage reaches can be chosen
                fin = np.flatnonzero(np.isfinite(arrive[g, :, 1:]).any(axis=0))
                b0, b1 = (int(fin[0]) + 1, int(fin[-1]) + 1) if len(fin) else (u, u - 1)
                if len(fin):
                    tab = _sparse_table(arrive[g, :, b0:b1 + 1] + (inm - pre[None, b0:b1 + 1]),
                                        longest)
                    last = _range_min(tab, self.levels, np.maximum(lo_l, max(mlo[u], 1, b0)) - b0,
                                      np.full((k_n, 1), b1 - b0))[:, 0]
                else:
                    last = np.full(k_n, _INF)
                last = last + pre[u] + fix
                if mlo[u] == 0:  # one stage holds everything
                    last = np.minimum(last, self._first0(pre[u] + fix, extra[u], 0, caps))
                better = last < final
                final = np.where(better, last, final)
                final_src = np.where(better, i, final_src)
                stale = not better.any()
                if reach is None:
                    continue
                # ends (index c - 1) in [w0, w1) can improve: windows meeting [b0, b1], and a
                # first stage [0, c) where it fits memory (c <= c0; mlo is non-decreasing)
                c0 = self.first_ends[i]
                e1 = min(u - 1, b1 + longest + 1)
                w0, w1 = (0 if c0 else b0), max(e1 if b0 < e1 else 0, c0)
                if w1 <= w0:
                    continue
                if b0 < e1:
                    lo = np.maximum(np.maximum(lo_t[:, :, b0:e1], mlo[None, None, 1 + b0:1 + e1]),
                                    b0) - b0
                    hi = np.minimum(ends[b0:e1], b1) - b0
                    got = _range_min(tab, self.levels, lo, np.broadcast_to(hi, lo.shape))
                    if (w0, w1) == (b0, e1):
                        q = got
                    else:
                        q = np.full((len(hs), k_n, w1 - w0), _INF)
                        q[:, :, b0 - w0:e1 - w0] = got
                else:
                    q = np.full((len(hs), k_n, w1 - w0), _INF)
                q += reach[:, None, w0:w1]
                if c0:  # (w0 = 0 then)
                    q[:, :, :c0] = np.minimum(q[:, :, :c0], self._first0(
                        reach[:, None, :c0], extra[None, None, 1:c0 + 1], 0,
                        caps[None, :, None]))
                cur = arrive[hs, :, 1 + w0:1 + w1]
                improved = q < cur
                if not improved.any():
                    continue
                stale = False
                if record:
                    src[hs, :, 1 + w0:1 + w1] = np.where(improved, i, src[hs, :, 1 + w0:1 + w1])
                arrive[hs, :, 1 + w0:1 + w1] = np.minimum(cur, q)
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
    if t.schedule == "gpipe" and sol is not None and order_search.memory_bound(t, sol):
        # slow devices between fast ones re-align memory-bound blocks: screened near the
        # incumbent's cap (as order_search screens a trial), refined only if it wins there
        mixed = order_search.interleaved(top.dp.order, group_of, t.prefix[:, -1])
        if order_search.screen(_ChainDP(t, mixed, group_of, groups, class_of), top,
                               t.microbatches):
            cs = cap_search(mixed, top.score, rounds)
            if cs.feasible and cs.score < top.score * (1 - 1e-9):
                top, sol = cs, cs.solution()
    if t.schedule == "1f1b" and t.microbatches > 2 and sol is not None \
            and _overcharged(t, top.dp.order, sol):
        found = _fastest_subsets(t, top, orders, cap_search, rounds)
        if found is not top:
            sol = found.solution()
    return sol
