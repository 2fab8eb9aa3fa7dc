"""GPipe plan refinement: the least-sum plan at the incumbent's bottleneck, by an exact DP over
how many devices of each kind every region has used.

Why. The heuristic (:mod:`skyjax.plan.search.heuristic`) places stages on a subsequence of one fixed
device order. Under GPipe with memory binding, what a device holds depends on where its block
starts (paper case, m = 32: 17 sublayers from an intermediate sublayer, 16 otherwise), so the best
plan interleaves fast and slow devices in patterns no small set of orders contains (paper case,
GPipe m = 32: T 2.885 -> 2.873). Here the order inside a region (link group) is free: a stage only
names the *kind* of device it runs on (devices of one group with identical time, call, message,
update and memory rows are interchangeable, and so are their links), and the DP's state is the
unit where the next stage starts plus the count of each kind the current region has used.

The DP. Regions are visited in the incumbent's order, once each, and every stage obeys the cap B =
the incumbent's bottleneck and GPipe's memory (m micro-batches in flight on every stage). Per
region a table f[unit, state] of least sums (stage times, plus the first stage's update) is filled
layer by layer (layer = stages used in the region); a stage on kind c from a to b costs
(P_c[b] + link[b]) - P_c[a] + constants, so for all ends at once the best start is a window
minimum over a (sparse table, vectorised over the layer's states), the window [lo_c(b), b) coming
from the cap and memory. An entry that a state with no more devices of any kind matches at the
same unit is dropped (that state can finish the same way), which leaves about a tenth of the
entries live. Each region's units are limited to the incumbent's region span plus ``SLACK``
units on either side. Paper case: 4 regions of 540 to 1800 count vectors, 0.09 s CPU. A
stage's link is the worst pair of its two groups (:func:`skyjax.plan.pricing.classes.worst_link`), exact
for link groups, an upper bound otherwise.

Valid and never worse. The incumbent is one of the DP's plans (same order, cap, spans), so the DP
finds a sum no larger; the result is rebuilt as distinct devices, priced by
:func:`skyjax.plan.pricing.cost.stage_costs` (exact cost model) and kept only if its T is lower. Every
other case returns the incumbent unchanged: not GPipe, a region visited twice, more than
``MAX_STATES`` count vectors in a region, or no improvement.
"""

from __future__ import annotations

import math

import numpy as np

from skyjax.plan.pricing.classes import link_groups, worst_link
from skyjax.plan.pricing.cost import Solution, Tables, check_assignment, evaluate_tables, stage_costs
from skyjax.plan.model.extension import ExtraCost
from skyjax.plan.model.types import Plan
from skyjax.profile.format import Profile

MAX_STATES = 4096  # per region: product over its device kinds of (count + 1)
SLACK = 8  # units a region's span may move against the incumbent's, each side
_INF = math.inf


def refine_plan(profile: Profile, t: Tables, sol: Solution, plan: Plan,
                extra: ExtraCost | None = None) -> Plan:
    """The planner's hook: ``plan`` (sol priced) or, where ``refine`` finds a better
    assignment, that one priced, whichever has the lower step time (``extra``'s terms, which
    the DP does not see, included)."""
    new = refine(t, sol)
    if new is sol:
        return plan
    out = evaluate_tables(profile, t, new.assignment, plan.strategy, False, None, extra=extra)
    return out if out.step_time_s < plan.step_time_s else plan


def refine(t: Tables, sol: Solution, groups: list[list[int]] | None = None) -> Solution:
    """A plan with lower T at sol's bottleneck over sol's region order (module doc), or sol."""
    if t.schedule != "gpipe" or not sol.assignment:
        return sol
    groups = link_groups(t) if groups is None else groups
    group_of = {d: g for g, devs in enumerate(groups) for d in devs}
    order, starts = [], []
    for d, a, _ in sol.assignment:
        g = group_of.get(int(d))
        if g is None or (order and order[-1] != g and g in order):
            return sol  # unknown device or a region visited twice
        if not order or order[-1] != g:
            order.append(g)
            starts.append(int(a))
    new = _least(t, order, groups, starts + [t.num_units], sol.bottleneck * (1 + 1e-10))
    m1 = t.microbatches - 1
    if new is not None and (new.total + m1 * new.bottleneck
                            < (sol.total + m1 * sol.bottleneck) * (1 - 1e-12)):
        return new
    return sol


def least_sum(t: Tables, order: list[int], cap: float,
              groups: list[list[int]] | None = None) -> Solution | None:
    """The exact least-sum GPipe plan (sum of stage times plus the first stage's update) among
    plans that visit the link groups in ``order``, each once and in one run, with every stage
    time <= cap; None if there is none or a group has more than ``MAX_STATES`` count vectors.
    The same DP as ``refine`` with every region's span the whole model (a proof tool: seconds
    at paper scale per order, :mod:`experiments.gpipe_optimum`)."""
    if t.schedule != "gpipe" or not order:
        return None
    groups = link_groups(t) if groups is None else groups
    u = t.num_units
    cap = min(cap, np.finfo(float).max)  # an infinite cap: no inf - inf on unreachable links
    return _least(t, list(order), groups, [0] * len(order) + [u], cap, slack=u)


def _least(t: Tables, order: list[int], groups: list[list[int]], bounds: list[int], cap: float,
           slack: int = SLACK) -> Solution | None:
    """The DP's plan (region spans: ``bounds`` +- slack) priced by the cost model; None where
    it finds none or a region has more than ``MAX_STATES`` count vectors."""
    kinds = [interchangeable(t, groups[g]) for g in order]
    if max(math.prod(len(k) + 1 for k in ks) for ks in kinds) > MAX_STATES:
        return None
    found = RegionSearch(t, order, groups, kinds, bounds, cap, slack).run()
    if found is None:
        return None
    check_assignment(t, found)
    stages = stage_costs(t, found)
    times = [s.time_s for s in stages]
    return Solution(float(sum(times)) + stages[0].update_s, float(max(times)), found)


def interchangeable(t: Tables, devs: list[int]) -> list[list[int]]:
    """Devices of one group that are interchangeable (same rows everywhere the cost reads)."""
    out: dict[bytes, list[int]] = {}
    for d in devs:
        key = b"".join(np.asarray(x, float).tobytes() for x in (
            t.prefix[d], t.update_prefix[d],
            [t.fixed[d], t.in_msg[d], t.memory[d], t.update_call[d], t.alone[d]]))
        out.setdefault(key, []).append(int(d))
    return list(out.values())


def group_link(t: Tables, a: list[int], b: list[int]) -> np.ndarray:
    """[U + 1]: two-way link seconds at each cut, group a to b (the sender's message calls are
    added per kind: ``RegionSearch._send``)."""
    u = t.num_units
    out = np.full(u + 1, _INF)
    lat, bw = worst_link(t, a, b)
    if bw > 0 and u > 1:  # with codecs, each group's slowest coder (as worst_link)
        out[1:u] = t.crossing_s(lat, bw, t.codec_rate[:, a].max(axis=1),
                                t.codec_rate[:, b].max(axis=1))
    return out


class RegionSearch:
    """The DP of the module doc; ``run`` returns an assignment or None. For bounds
    (:mod:`skyjax.plan.certificates.once_bound`), not plans: ``free`` kinds per region are unlimited (out of
    the state, closed over within a layer) and ``cut`` drops entries at or above it."""

    def __init__(self, t: Tables, order: list[int], groups: list[list[int]],
                 kinds: list[list[list[int]]], bounds: list[int], cap: float,
                 slack: int = SLACK, free: list[set[int]] | None = None):
        self.t, self.order, self.kinds, self.cap = t, order, kinds, cap
        self.free = free if free is not None else [set() for _ in order]  # unlimited kinds
        self.cut: np.ndarray | None = None  # [U + 1, B]: entries at a cut >= this are dropped
        self.need = t.state_prefix + t.microbatches * t.act_prefix
        u, n_r = t.num_units, len(order)
        self.span = [(0 if r == 0 else max(bounds[r] - slack, 1),
                      u if r == n_r - 1 else min(bounds[r + 1] + slack, u - 1))
                     for r in range(n_r)]
        self.intra = [group_link(t, groups[g], groups[g]) for g in order]
        nolink = np.full(u + 1, _INF)
        nolink[u] = 0.0
        self.out = [group_link(t, groups[g], groups[order[r + 1]]) if r + 1 < n_r else nolink
                    for r, g in enumerate(order)]
        self.f: list[np.ndarray] = []
        self._links: dict[int, tuple[list, list[int]]] = {}  # per region, for fill_region

    def _rep(self, r: int, c: int) -> int:
        return self.kinds[r][c][0]

    def _cost_b(self, r: int, c: int, link: np.ndarray, b: np.ndarray) -> np.ndarray:
        """P_c[b] + calls + messages + link[b]: a stage's time (not first) less -P_c[a]."""
        t, d = self.t, self._rep(r, c)
        return t.prefix[d, b] + t.fixed[d] + t.in_msg[d] + self._send(d, link, b)

    def _send(self, d: int, link: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The link at b plus d's two outgoing message calls (none after the last unit)."""
        return link[b] + np.where(b < self.t.num_units, self.t.in_msg[d], 0.0)

    def _lo(self, r: int, c: int, link: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Least start a (> 0) of a stage on kind c ending at b within cap and memory."""
        t, d = self.t, self._rep(r, c)
        lo_t = np.searchsorted(t.prefix[d], self._cost_b(r, c, link, b) - self.cap, "left")
        lo_m = np.searchsorted(self.need, self.need[b] - t.memory[d], "left")
        return np.maximum(np.maximum(lo_t, lo_m), 1)

    def _first(self, r: int, c: int, link: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Sum term of the plan's first stage (unit 0 to b) on kind c; inf where not allowed."""
        t, d = self.t, self._rep(r, c)
        comp = t.prefix[d, b] + t.fixed[d] + self._send(d, link, b)
        ok = (comp <= self.cap) & (self.need[b] <= t.memory[d])
        return np.where(ok, comp + t.first_update(d, b), _INF)

    def run(self) -> list[tuple[int, int, int]] | None:
        u = self.t.num_units
        arrive = np.full(u + 1, _INF)
        arrive[0] = 0.0
        for r in range(len(self.order)):
            arrive = self.fill_region(r, arrive)
        if not math.isfinite(arrive[u]):
            return None
        return self._walk_back()

    def fill_region(self, r: int, arrive: np.ndarray, first: bool | None = None) -> np.ndarray:
        """Fill region r's table f[unit, state] from the arrivals; returns the next region's
        arrivals. Layer by layer (stages used in the region); a layer's entries that a state
        with fewer devices of every kind matches or beats are dropped (it can finish the same
        way), which leaves a few starts per state. ``first``: the region holds the plan's first
        stage (default: r = 0). ``arrive`` [U + 1, B] runs B arrival vectors at once (columns
        state * B + j; returns [U + 1, B]; the table kept for the walk back needs B = 1)."""
        t, ks, (lo, hi) = self.t, self.kinds[r], self.span[r]
        first = r == 0 if first is None else first
        free = sorted(self.free[r])  # unlimited: not in the state, any number per layer
        arr = arrive.reshape(t.num_units + 1, -1)
        n_b = arr.shape[1]
        cnt = np.array([0 if c in free else len(k) for c, k in enumerate(ks)])
        stride = np.cumprod(np.concatenate([[1], cnt[:-1] + 1])) * n_b  # in columns
        n_s = int(np.prod(cnt + 1))
        digit = np.repeat((np.arange(n_s)[:, None] // (stride[None, :] // n_b))
                          % (cnt[None, :] + 1), n_b, axis=0)  # per column
        layer = digit.sum(axis=1)
        f = np.full((hi - lo + 1, n_s * n_b), _INF)
        f[:, :n_b] = arr[lo:hi + 1]
        best_le = f.copy()  # least f over states <= this one (componentwise)
        nxt = np.full((t.num_units + 1, n_b), _INF)
        ends = np.arange(lo + 1, hi + 1)
        if r not in self._links:  # per kind and link: cost less -P_c[a], least start
            links = [self._ends(r, c, link, ends) for link in (self.intra[r], self.out[r])
                     for c in range(len(ks))]
            longest = [int(max((ends - links[i][1]).max(), (ends - links[len(ks) + i][1]).max()))
                       for i in range(len(ks))]  # per kind: the longest window of starts
            self._links[r] = links, longest
        links, longest = self._links[r]
        if first:  # the plan's first stage starts at unit 0
            for c in range(len(ks)):
                to = stride[c] if c not in free else 0
                f[1:, to:to + n_b] = np.minimum(f[1:, to:to + n_b], self._first(
                    r, c, self.intra[r], ends)[:, None])
                sel = np.isfinite(self.out[r][ends])
                nxt[ends[sel]] = np.minimum(nxt[ends[sel]], self._first(
                    r, c, self.out[r], ends[sel])[:, None])
        for k in range(int(cnt.sum()) + 1):
            here = np.flatnonzero(layer == k)
            fh = f[:, here]
            below = np.full(fh.shape, _INF)  # least f of the states below (componentwise)
            if k > 0:
                for c in range(len(ks)):
                    has = np.flatnonzero(digit[here, c] > 0)
                    below[:, has] = np.minimum(below[:, has], best_le[:, here[has] - stride[c]])
            if self.cut is not None:  # a state below can finish as this one: drop it too
                below = np.minimum(below, self.cut[lo:hi + 1][:, here % n_b])
            fh[fh >= below] = _INF
            if free:  # close the layer under stages on unlimited kinds
                fh = self._close(r, free, fh, links, longest, below)
            if k > 0:
                best_le[:, here] = np.minimum(fh, below)
            f[:, here] = fh
            live = np.isfinite(fh)
            if not live.any():
                break
            for c in range(len(ks)):
                ok = ((digit[here, c] < cnt[c]) | (c in free)) & live.any(axis=0)
                if not ok.any():
                    continue
                src = here[ok]
                rows = np.flatnonzero(live[:, ok].any(axis=1))
                ca, cb = int(rows[0]), int(rows[-1])
                g = f[ca:cb + 1, src] - t.prefix[self._rep(r, c), lo + ca:lo + cb + 1, None]
                table = _SparseMin(g, longest[c])
                for tgt, (cost, least) in ((True, links[c]), (False, links[len(ks) + c])):
                    if tgt and c in free:
                        continue  # done by _close
                    a0 = np.maximum(least[ca:], lo + ca) - lo - ca
                    a1 = np.minimum(ends[ca:] - 1, lo + cb) - lo - ca
                    ok_b = np.flatnonzero(a0 <= a1)
                    if not len(ok_b):
                        continue
                    i0, i1 = ca + int(ok_b[0]), ca + int(ok_b[-1]) + 1
                    val = table.query(a0[i0 - ca:i1 - ca], a1[i0 - ca:i1 - ca]) + cost[i0:i1, None]
                    if tgt:
                        cur = f[i0 + 1:i1 + 1, src + stride[c]]
                        f[i0 + 1:i1 + 1, src + stride[c]] = np.minimum(cur, val)
                        continue
                    out = nxt[i0 + lo + 1:i1 + lo + 1]
                    for j in range(n_b):  # the region's last stage: least over states
                        mine = src % n_b == j
                        if mine.any():
                            out[:, j] = np.minimum(out[:, j], val[:, mine].min(axis=1))
        self.f.append(f)
        return nxt if arrive.ndim == 2 else nxt[:, 0]

    def _close(self, r: int, free: list[int], fh: np.ndarray, links: list,
               longest: list[int], below: np.ndarray) -> np.ndarray:
        """fh [rows, cols] with stages on the unlimited kinds (intra links) appended, in any
        mix, up to as many in a row as the region has such devices (no plan has more), or
        until no entry improves. Columns are independent (the state does not change) and a
        round only needs the starts the last round improved, so each round works on those."""
        lo = self.span[r][0]
        fin = np.isfinite(fh)
        cols, rows = np.flatnonzero(fin.any(axis=0)), np.flatnonzero(fin.any(axis=1))
        if not len(cols):
            return fh
        reach = max(longest[c] for c in free)
        r0, last = 0, int(rows[-1])  # rows before r0 did not change in the last round
        for _ in range(sum(len(self.kinds[r][c]) for c in free)):
            if not len(cols):
                break
            r1 = min(last + reach + 1, fh.shape[0])  # rows a stage can reach
            sub = fh[r0:r1, cols]
            ends = np.arange(lo + r0 + 1, lo + r1)
            val = np.full((len(ends), len(cols)), _INF)
            for c in free:
                cost, least = links[c]
                p = self.t.prefix[self._rep(r, c), lo + r0:lo + r1, None]
                got = _SparseMin(sub - p, longest[c]).query(
                    np.maximum(least[r0:r1 - 1], lo + r0) - lo - r0, ends - 1 - lo - r0)
                val = np.minimum(val, got + cost[r0:r1 - 1, None])
            better = val < np.minimum(sub[1:], below[r0 + 1:r1, cols])
            if not better.any():
                break
            fh[r0 + 1:r1, cols] = np.where(better, val, sub[1:])
            moved = np.flatnonzero(better.any(axis=1))
            r0, last = r0 + 1 + int(moved[0]), max(last, r0 + 1 + int(moved[-1]))
            cols = cols[better.any(axis=0)]
        return fh

    def _ends(self, r: int, c: int, link: np.ndarray, ends: np.ndarray):
        """Per end b: a stage's time on kind c less -P_c[a], and its least start a."""
        return self._cost_b(r, c, link, ends), self._lo(r, c, link, ends)

    def _pred(self, r: int, c: int, link: np.ndarray, rows: np.ndarray,
              b: int) -> tuple[float, int, int]:
        """Best (value, row, start) of a stage on kind c ending at b from f[r][rows]."""
        lo, hi = self.span[r]
        f = self.f[r]
        bb = np.array([b])
        best = (_INF, -1, -1)
        if r == 0 and 0 in rows:  # the plan's first stage, from unit 0
            best = (float(self._first(r, c, link, bb)[0]), 0, 0)
        a0 = max(int(self._lo(r, c, link, bb)[0]), lo)
        if a0 >= b:
            return best
        p = self.t.prefix[self._rep(r, c)]
        vals = f[a0 - lo:b - lo, rows].T - p[a0:b] + self._cost_b(r, c, link, bb)[0]
        i, j = np.unravel_index(int(np.argmin(vals)), vals.shape)
        return min(best, (float(vals[i, j]), int(rows[i]), a0 + int(j)))

    def _walk_back(self) -> list[tuple[int, int, int]] | None:
        """The stages of the best plan from the stored tables; kinds mapped to devices."""
        r, b, s = len(self.order) - 1, self.t.num_units, -1
        stages = []
        while True:
            ks = self.kinds[r]
            cnt = np.array([len(k) for k in ks])
            stride = np.cumprod(np.concatenate([[1], cnt[:-1] + 1]))
            digit = lambda x: (np.asarray(x)[..., None] // stride) % (cnt + 1)  # noqa: E731
            best = (_INF, -1, -1, -1)
            for c in range(len(ks)):
                if s < 0:  # the region's last stage: from any state with a kind-c device left
                    rows = np.flatnonzero(digit(np.arange(self.f[r].shape[1]))[:, c] < cnt[c])
                    cand = self._pred(r, c, self.out[r], rows, b)
                elif digit(s)[c] > 0:
                    cand = self._pred(r, c, self.intra[r], np.array([s - stride[c]]), b)
                else:
                    continue
                if cand[0] < best[0]:
                    best = (cand[0], c, cand[1], cand[2])
            if not math.isfinite(best[0]):
                return None  # not reached: every finite entry has a finite predecessor
            _, c, s, a = best
            stages.append((r, c, a, b))
            b = a
            if a == 0:
                break
            if s == 0:  # the region's first stage: arrived from the region before
                r, s = r - 1, -1
        free = [[list(k) for k in ks] for ks in self.kinds]
        return [(free[r][c].pop(0), a, b) for r, c, a, b in reversed(stages)]


class _SparseMin:
    """Range minima over the rows of g [n, cols], for many ranges at once (sparse table)."""

    def __init__(self, g: np.ndarray, longest: int | None = None):
        n, h = g.shape[0], 1
        depth = max(int(min(n, n if longest is None else max(longest, 1))).bit_length(), 1)
        self.levels = np.empty((depth,) + g.shape)  # level j: rows [0, n - 2^j] only
        self.levels[0] = g
        for j in range(1, depth):
            self.levels[j, :n - 2 * h + 1] = np.minimum(self.levels[j - 1, :n - 2 * h + 1],
                                                         self.levels[j - 1, h:n - h + 1])
            h *= 2

    def query(self, a0: np.ndarray, a1: np.ndarray) -> np.ndarray:
        """[len(a0), cols]: min of g[a0:a1 + 1] per range (inf where empty); ranges no longer
        than the ``longest`` the table was built for."""
        length = np.maximum(a1 - a0 + 1, 1)
        lvl = np.log2(length).astype(np.int64)
        out = np.minimum(self.levels[lvl, np.minimum(a0, a1)],
                         self.levels[lvl, a1 - (1 << lvl) + 1])
        out[a1 < a0] = _INF
        return out
