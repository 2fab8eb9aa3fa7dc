"""A lower bound on T (1F1B) for plans that visit each link group (region) in one run, in order.

:mod:`skyjax.plan.bounds.group_bound` relaxes 1F1B's in-flight levels globally (the fastest devices of
the whole cluster take the lowest levels) and gives each crossing's stage (its carrier) a full
stage of room. In a plan that visits the groups of S once each, in some order, neither holds:
the last group's stages take levels 1..p_last, the group before it the next levels, and so on;
and the last stage of every run but the last is a carrier, which holds only what fits in B less
the crossing's comm, at its run's lowest level. With memory that binds (many micro-batches in
flight) this is most of the gap. The bound here keeps both, and is still a relaxation:

* Lagrangian in the work: for any price lambda, sum_k t_k >= lambda W - max over structures of
  sum over stages of ((lambda - sigma_d)^+ cap_stage - c_stage), where cap_stage is the most
  reference work the stage can hold (time under B, memory at its level; ``GroupBound``) and
  c_stage its least call and comm cost. Weak duality: valid for every lambda; the best of a
  grid is kept.
* Inside a run, the non-carrier stages take contiguous levels; with a common memory cap per
  level (the group's largest) and time capacities made non-increasing in sigma (running maximum),
  an exchange argument gives the group's q fastest devices the run's q lowest non-carrier levels,
  fastest lowest. The carrier (or the pipeline's last stage, which ends at the last unit) uses
  up some device c of the group; the others are then the q fastest but c (``_runs``).
* A DP over (groups visited so far, stages so far, capped at the in-flight cap) adds runs from
  the pipeline's end to its front; every group pair's crossing is charged its least cost, and
  the k = |S| - 1 cheapest crossings at distinct cuts are restored at the end. A stage whose
  next stage is in its group pays the intra link at its cut, all but the J cheapest cuts at
  least s_J (cuts are distinct; ``intra_back`` gives the difference back once).
* A carrier ending at cut 1 holds only unit 0 (the embeddings): the first run is that one
  stage. A carrier ending at cut U - 1 leaves unit U - 1 (the classifier) to the last stage,
  in another group: the last run is that one stage. Other carriers end elsewhere.

``region_bound`` takes, per group set S, the least of this (no revisit) and ``group_bound``'s
case with k = |S| crossings (a group visited twice), ``group_bound``'s cases for single groups,
and the least over B by interval branch and bound as in ``group_bound`` (T >= sum + (m - 1) B).
Paper case, 1F1B m = 32: 2.288 -> 2.321 (plan 2.342); checked against brute force in
tests/test_bounds.py. Cost: one DP per B point, vectorised over B (~0.2 s at paper scale).
"""

from __future__ import annotations

import math

import numpy as np

from skyjax.plan.bounds.step import min_bottleneck
from skyjax.plan.pricing.cost import Tables
from skyjax.plan.bounds.group_terms import MAX_SUBSET_GROUPS, GroupBound

_INF = math.inf
_NEG = -1e30  # a gain that cannot be (kept finite so that sums and differences stay defined)
LAMBDAS = 12  # prices tried (distinct sigmas of the devices, and above)
MAX_EASY = 4  # most cuts whose carriers are counted apart (one carrier each)
BIG_PRICES = np.array([2.0, 10.0, 100.0])  # prices above every sigma: capacity short of W shows


def _prices(sig: np.ndarray) -> np.ndarray:
    """Lagrange prices to try: the distinct sigmas (where the fill's marginal price lies) and a
    little above each, at most LAMBDAS of them."""
    s = np.unique(sig)
    if len(s) > LAMBDAS // 2:
        s = s[np.linspace(0, len(s) - 1, LAMBDAS // 2).round().astype(int)]
    return np.unique(np.concatenate([s, s * 1.02, s[-1:] * BIG_PRICES]))


class RegionBound:
    """The B-independent pieces of the run DP for one ``GroupBound`` (module doc)."""

    def __init__(self, gb: GroupBound):
        self.gb = gb
        t = gb.t
        self.m = t.microbatches
        self.one_level = len(gb.levels) == 1
        n_dev = sum(len(g) for g in gb.groups)
        self.lcap = 1 if self.one_level else min(self.m, n_dev)
        self.lams = _prices(gb.sigma[gb.devices])
        g_n = len(gb.groups)
        self.order = [g[np.argsort(gb.sigma[g], kind="stable")] for g in gb.groups]
        self.fix = [float(t.fixed[g].min()) for g in gb.groups]
        finite = lambda x: float(x[np.isfinite(x)].min()) if np.isfinite(x).any() else _INF  # noqa
        # a stage whose next stage is in its group pays the intra link at its cut; cuts are
        # distinct, so all but the J cheapest cuts cost >= s_J: charge max(its group's least,
        # s_J) per stage and give back sum_{i<J} (s_J - s_i) once (``intra_back``)
        least = np.sort(gb.intra.min(axis=0)) if t.num_units > 1 else np.zeros(1)
        least = least[np.isfinite(least)] if np.isfinite(least).any() else np.zeros(1)
        j = min(int((least < np.median(least)).sum()), MAX_EASY, len(least) - 1)
        self.intra_back = float((least[j] - least[:j]).sum())
        self.c_intra = [max(finite(gb.intra[g]), float(least[j])) if t.num_units > 1 else 0.0
                        for g in range(g_n)]
        u = t.num_units
        self.cross_end = []  # per group: least crossing comm out of a stage ending at each cut
        for g in range(g_n):
            ends = np.full(u + 1, _INF)
            if u > 1 and g_n > 1:
                ends[1:u] = np.delete(gb.cross[g], g, axis=0).min(axis=0)
            self.cross_end.append(ends)
        # carriers end at distinct cuts: at most J of them at the J easiest cuts (a tiny unit
        # before, or a tiny output after: the embeddings, the pooler), the others elsewhere;
        # any J is a relaxation, this one makes the others' capacity small when crossings cost
        self.cheap = self._easy_cuts(gb)
        # cuts 1 and U - 1 get their own rule (head-only / tail-only runs, module doc)
        self.ht = [e for e in (1, u - 1) if 1 <= e <= u - 1] if g_n > 1 else []
        self.other = np.array([e for e in self.cheap if e not in self.ht], int)
        self.cross_tail = [np.where(np.arange(u + 1) == u - 1, e, _INF) for e in self.cross_end]
        self.cross_any = [np.where(np.isin(np.arange(u + 1), self.ht), _INF, e)
                          for e in self.cross_end]
        self.cross_rest = [np.where(np.isin(np.arange(u + 1), self.cheap), _INF, e)
                           for e in self.cross_end]
        self.c_cross = min(finite(e) for e in self.cross_end) if g_n > 1 else _INF
        self.c_rest = min(finite(e) for e in self.cross_rest) if g_n > 1 else _INF
        # memory cap per level (levels 1 .. lcap + largest group), the group's largest
        n_lv = self.lcap + max(len(g) for g in gb.groups) + 1
        col = np.minimum(np.arange(1, n_lv + 1), len(gb.levels)) - 1
        self.mem = [gb.memcap[g][:, col].max(axis=0) for g in gb.groups]  # [levels]

    def _easy_cuts(self, gb) -> np.ndarray:
        """Cuts where a carrier is much cheaper than at the typical cut (at most MAX_EASY)."""
        u = gb.t.num_units
        if u < 2 or len(self.cross_end) < 2:
            return np.zeros(0, int)
        cross = np.min([e[1:u] for e in self.cross_end], axis=0)
        unit = gb.unit_min[: u - 1]
        ok = np.isfinite(cross)
        if not ok.any():
            return np.zeros(0, int)
        easy = ok & ((unit < 0.25 * np.median(unit[ok])) | (cross < 0.9 * np.median(cross[ok])))
        reach = np.where(easy, cross + unit, _INF)
        return np.sort(np.argsort(reach, kind="stable")[: min(int(easy.sum()), MAX_EASY)] + 1)

    def _caps(self, b: np.ndarray, tcap: tuple | None = None):
        """Per group at caps b: non-carrier capacity [K, n] (running max over slower devices,
        0 where only a cheap end fits), the cheap-end capacity, the carrier's [K, n]; tcap:
        ``time_capacity(b)`` if known. Carriers' capacities are shared by equal comm costs."""
        gb, memo = self.gb, {}
        tcap, anyend = gb.time_capacity(b) if tcap is None else tcap
        out = []
        for g, devs in enumerate(self.order):
            a = np.where(np.isfinite(anyend[:, devs]), np.maximum(tcap[:, devs], 0.0), -_INF)
            a = np.maximum.accumulate(a[:, ::-1], axis=1)[:, ::-1]
            c_any, c, c_tail = (self._carrier(b, devs, ends, cost, memo) for ends, cost in
                                ((self.cross_any[g], self.c_cross),
                                 (self.cross_rest[g], self.c_rest),
                                 (self.cross_tail[g], self.c_cross)))
            out.append((a, anyend[:, devs], c, c_any, c_tail))
        return out

    def _carrier(self, b: np.ndarray, devs: np.ndarray, ends: np.ndarray, least: float,
                 memo: dict):
        """[K, n]: most reference work a carrier on each device holds, its block ending where
        ``ends`` (comm out per end) is finite."""
        gb = self.gb
        if gb.whole_blocks:
            key = ends.tobytes()
            if key not in memo:
                memo[key] = gb.time_capacity(b, ends)[0]
            return memo[key][:, devs]
        x = b[:, None] - gb.t.fixed[devs][None, :] - least
        return np.where(x >= 0, x / gb.sigma[devs][None, :], -_INF)

    def bounds(self, b: np.ndarray, subsets: list[tuple[int, ...]], tcap=None) -> np.ndarray:
        """[len(subsets), K]: a lower bound on sum t_k (the first stage's update and sync left
        out, as in ``GroupBound.sum_bound``) over plans that visit exactly the groups of each
        subset, each in one run, with every t_k <= b; inf where none can."""
        gb = self.gb
        k_n, lams = len(b), self.lams
        caps = self._caps(b, tcap)
        n_cheap = min(len(self.other), len(gb.groups) - 1)
        # runs[g][v]: [L + 1, P + 1, K, Lam]; v = 1: its carrier ends at a cheap end
        runs = [[self._runs(g, caps[g], lams, v) for v in range(1 + (n_cheap > 0))]
                for g in range(len(gb.groups))]
        lc = self.lcap
        # best[mask]: [L + 1, J + 1, K, Lam] most gain of the runs of these groups with L
        # stages (capped), J carriers at cheap ends
        best = {0: np.full((lc + 1, n_cheap + 1, k_n, len(lams)), -_INF)}
        best[0][0, 0] = 0.0
        full = (1 << len(gb.groups)) - 1
        wanted = {sum(1 << g for g in s) for s in subsets}
        sig_of = [gb.sigma[o] for o in self.order]
        w0, wl = float(gb.wref[0]), float(gb.wref[-1])

        def single(g: int, w: float, less: float) -> np.ndarray:  # [K, Lam]
            pr = np.maximum(lams[None, :] - sig_of[g][:, None], 0.0).max(axis=0)
            return np.broadcast_to(pr[None, :] * w - less, (k_n, len(lams)))

        if (gb.t.num_units - 1) in self.ht:  # the last run: one stage holding unit U - 1
            before = [self._runs(g, caps[g], lams, 2, rows=(1,))[1] for g in range(len(gb.groups))]
            for g1 in range(len(gb.groups)):
                tail = single(g1, wl, self.fix[g1])
                for g2 in range(len(gb.groups)):
                    if g2 == g1:
                        continue
                    row = before[g2] + tail[None]  # [P + 1, K, Lam]
                    key = (1 << g1) | (1 << g2)
                    dst = best.setdefault(key, np.full((lc + 1, n_cheap + 1, k_n, len(lams)),
                                                       -_INF))
                    for p in range(1, row.shape[0]):
                        lv = min(1 + p, lc)
                        np.maximum(dst[lv, 0], row[p], out=dst[lv, 0])
        for mask in sorted(range(full + 1), key=lambda x: bin(x).count("1")):
            if mask not in best or not any((w & mask) == mask for w in wanted):
                continue
            cur = best[mask]
            for g in range(len(gb.groups)):
                if not mask >> g & 1:
                    nxt = best.setdefault(mask | 1 << g, np.full_like(cur, -_INF))
                    self._extend(cur, nxt, runs[g], first=not mask)
        out = np.full((len(subsets), k_n), _INF)
        total = gb.total
        for i, s in enumerate(subsets):
            mask = sum(1 << g for g in s)
            if mask not in best:
                continue
            gain = best[mask].max(axis=(0, 1))  # [K, Lam]
            if 1 in self.ht and len(s) > 1:  # the first run: one stage holding unit 0
                for g in s:
                    rest = mask & ~(1 << g)
                    if rest in best:
                        gain = np.maximum(gain, best[rest].max(axis=(0, 1))
                                          + single(g, w0, self.fix[g] + self.c_cross))
            bonus = self._bonus(caps, s, lams)
            val = total * lams[None, :] - gain - bonus - self.intra_back
            k = len(s) - 1
            val = val + self._cross_extra(s, k)
            out[i] = np.where(np.isfinite(gain).any(axis=1), val.max(axis=1), _INF)
        return out

    def _extend(self, cur: np.ndarray, nxt: np.ndarray, runs: list, first: bool) -> None:
        """nxt = max(nxt, cur + a run of one more group in front): levels add up (capped)."""
        lc = self.lcap
        if first:  # the pipeline's last run: l0 = 0, its carrier-free table only
            for j in range(cur.shape[1]):
                row = runs[0][0] + cur[0, j][None]  # [P + 1, K, Lam] (p stages, p >= 1)
                below = min(lc - 1, row.shape[0] - 1)  # runs ending under the cap
                dst = nxt[:, j]
                if below > 0:
                    np.maximum(dst[1: 1 + below], row[1: 1 + below], out=dst[1: 1 + below])
                if row.shape[0] > max(lc, 1):
                    np.maximum(dst[lc], row[max(lc, 1):].max(axis=0), out=dst[lc])
            return
        # all l0 = 1 .. lc at once: p stages after l0 reach level l0 + p, capped at lc
        n_p = runs[0].shape[1]
        top = (np.arange(1, lc + 1)[:, None] + np.arange(n_p)[None, :] >= lc)
        top[:, 0] = False
        for v, table in enumerate(runs):
            for j in range(cur.shape[1] - v):
                rows = table[1:] + cur[1:, j][:, None]  # [lc (l0 - 1), P + 1, K, Lam]
                dst = nxt[:, j + v]
                for p in range(1, min(n_p, lc - 1)):  # l0 = 1 .. lc - 1 - p, under the cap
                    np.maximum(dst[1 + p: lc], rows[: lc - 1 - p, p], out=dst[1 + p: lc])
                if top.any():
                    np.maximum(dst[lc], rows[top].max(axis=0), out=dst[lc])

    def _runs(self, g: int, caps, lams: np.ndarray, cheap: int, rows=None) -> np.ndarray:
        """[L + 1, P + 1, K, Lam]: the most gain of a run of p stages in group g after L stages
        (L = 0: the pipeline's last run, whose level-1 stage ends at the last unit; else its
        level-(L + 1) stage is the carrier); -inf where impossible.

        The run's special stage (carrier or last) uses some device c of the group; its q = p - 1
        other stages are then the q fastest devices but c, fastest lowest: those before c at
        levels L + 2 + j, those after c one level lower (L + 1 + j). cheap: the carrier ends at
        a cut that is not easy (0), at an easy one other than 1 and U - 1 (1), at U - 1 (2)."""
        a, anyend, carrier, c_any, c_tail = caps
        k_n, n = a.shape
        lc, mem = self.lcap, self.mem[g]
        sig = self.gb.sigma[self.order[g]]
        price = np.maximum(lams[None, :] - sig[:, None], 0.0)[None]  # [1, n, Lam]
        out = np.full((lc + 1, n + 1, k_n, len(lams)), -_INF)
        cost = min(self.fix[g] + self.c_intra[g], -_NEG)  # no intra link: no such stage

        def gains(held: np.ndarray, less) -> np.ndarray:  # [R, K, n, Lam], _NEG: cannot
            return np.where(np.isfinite(held)[..., None],
                            price * np.maximum(held, 0.0)[..., None] - less, _NEG)

        rows = np.arange(lc + 1) if rows is None else np.asarray(rows)
        lv = rows[:, None] + np.arange(n)  # [R, n]: level - 2 of device j's stage (see above)
        zero = np.zeros((len(rows), k_n, 1, len(lams)))
        cum_a = np.concatenate([zero, np.cumsum(gains(np.minimum(
            a[None], mem[lv + 1][:, None]), cost), axis=2)], axis=2)  # [R, K, n + 1, Lam]
        cum_b = np.concatenate([zero, np.cumsum(gains(np.minimum(a[None], mem[lv][:, None]),
                                                      cost), axis=2)], axis=2)
        last = (rows == 0)[:, None, None]  # l0 = 0: the last stage, ending at the last unit
        h = np.minimum(np.where(last, anyend[None], (carrier, c_any, c_tail)[cheap][None]),
                       mem[np.where(rows == 0, 0, np.minimum(rows, len(mem) - 1))][:, None, None])
        less = np.where(rows == 0, self.fix[g], self.fix[g] + self.c_cross)[:, None, None, None]
        sp = gains(h, less)  # [R, K, n, Lam]: the special stage on device c
        after = np.maximum.accumulate(sp[:, :, ::-1], axis=2)[:, :, ::-1]  # c >= q
        val = after + cum_a[:, :, :n]  # q = 0 .. n - 1
        before = np.maximum.accumulate(sp + cum_a[:, :, :n] - cum_b[:, :, 1:], axis=2)  # c <= q
        val[:, :, 1:] = np.maximum(val[:, :, 1:], before[:, :, :-1] + cum_b[:, :, 2:])
        out[rows, 1:] = np.where(val > _NEG / 2, val, -_INF).transpose(0, 2, 1, 3)
        return out

    def _bonus(self, caps, s: tuple[int, ...], lams: np.ndarray) -> np.ndarray:
        """[K, Lam]: what the stages ending at the cheap ends (tiny outputs; one stage each)
        may hold more than a non-carrier's capacity elsewhere (carriers: counted in the DP)."""
        n_more = len(self.gb.cheap_cuts)
        if not n_more:
            return 0.0
        best = 0.0
        for g in s:
            a, anyend, rest, c_any, _ = caps[g]
            price = np.maximum(lams[None, :] - self.gb.sigma[self.order[g]][:, None], 0.0)
            for more, base in ((anyend, a),):
                extra = np.maximum(np.where(np.isfinite(more), more, 0.0)
                                   - np.maximum(base, 0.0), 0.0)  # [K, n]
                best = np.maximum(best, (extra[:, :, None] * price[None]).max(axis=1))
        return n_more * best

    def _cross_extra(self, s: tuple[int, ...], k: int) -> float:
        """The k cheapest crossings at distinct cuts between groups of s, less k least ones
        (already charged per carrier)."""
        if k == 0:
            return 0.0
        gb = self.gb
        pairs = [(a, c) for a in s for c in s if a != c]
        cut = np.min([gb.cross[a, c] for a, c in pairs], axis=0)
        order = np.sort(cut)
        if len(order) < k or not np.isfinite(order[k - 1]):
            return _INF
        return max(float(order[:k].sum()) - k * self.c_cross, 0.0)


def region_bound(t: Tables, upper: float = _INF, rounds: int = 4, split: int = 4,
                 gb: GroupBound | None = None) -> float:
    """A lower bound on T over all plans (module doc), -inf where it does not apply (GPipe,
    m = 1, one link group, or too many); ``upper``: a known plan's T (B above
    (upper - W) / (m - 1) cannot hold the optimum); ``gb``: a ``GroupBound(t)`` shared with
    the caller."""
    m = t.microbatches
    if t.schedule != "1f1b" or m == 1 or not np.isfinite(upper):
        return -_INF
    gb = GroupBound(t) if gb is None else gb
    if not gb.ok or not 2 <= len(gb.groups) <= MAX_SUBSET_GROUPS:
        return -_INF
    rb = RegionBound(gb)
    const = float((t.update_call + t.update_prefix[:, min(1, t.num_units)]).min()) + t.sync_s
    subs = gb.subsets()
    single = [x for s in subs if len(s) == 1 for x in gb.cases(s, False)]
    multi = [s for s in subs if len(s) > 1]
    revisit = [_revisit_term(gb, s) for s in multi]
    lo = max(min(x[4] for x in single), min_bottleneck(t))  # no plan has a smaller B
    hi = (upper - const - gb.total) / (m - 1)
    if hi <= lo:
        return upper

    def evaluate(b: np.ndarray) -> np.ndarray:  # [K]: least sum bound over all plans at B <= b
        caps = gb.capacities(b)
        cache: dict = {}  # sum_bound's parts per device set
        vals = [gb.sum_bound(x, b, caps, cache) for x in single]
        region = rb.bounds(b, multi, caps[0])
        for i, x in enumerate(revisit):
            again = gb.sum_bound(x, b, caps, cache) if x is not None else np.full(len(b), _INF)
            vals.append(np.minimum(again, region[i]))
        return np.min(vals, axis=0)

    pts = np.geomspace(lo, hi, 2 * split + 1)
    vals = evaluate(pts)
    for _ in range(rounds):  # on [B_i, B_j]: sum(B_j) + (m - 1) B_i; split the lowest
        i = int(np.argmin(vals[1:] + (m - 1) * pts[:-1]))
        new = np.linspace(pts[i], pts[i + 1], split + 1)[1:-1]
        pts = np.concatenate([pts[: i + 1], new, pts[i + 1:]])
        vals = np.concatenate([vals[: i + 1], evaluate(new), vals[i + 1:]])
    low = float((vals[1:] + (m - 1) * pts[:-1]).min()) + const
    return min(low, upper) if not math.isnan(low) else -_INF


def _revisit_term(gb: GroupBound, s: tuple[int, ...]):
    """``GroupBound.sum_bound``'s terms for plans visiting exactly S with k >= |S| crossings (a
    group visited twice): the |S| cheapest crossings at distinct cuts; None if impossible."""
    t, k = gb.t, len(s)
    devs = gb.ranked(s)
    fix = float(t.fixed[devs].min())
    cut = np.min([gb.cross[a, b] for a in s for b in s if a != b], axis=0)
    other = np.sort(np.minimum(gb.intra[list(s)].min(axis=0), cut))
    other = np.concatenate([[0.0], np.cumsum(np.where(np.isfinite(other), other, 0.0))])
    order, reach = np.sort(cut), np.sort(cut + gb.unit_min[:-1])
    if len(order) < k or not np.isfinite(order[k - 1]):
        return None
    floor = max(float(gb.unit_min.max()), float(reach[k - 1])) + fix
    return devs, 0.0, k, float(order[:k].sum()), floor, other, len(gb.cheap_cuts)
