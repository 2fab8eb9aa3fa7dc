"""The terms of ``group_bound`` (:class:`GroupBound`): per set S of link groups a plan may
visit, the crossings it must pay and a lower bound on its sum of stage times when every stage
fits a cap B.

Each piece below relaxes the cost model (docs/design.md, "The cost model"), so every term is a
proof, not an estimate; ``group_bound`` (:mod:`skyjax.plan.bounds.group_bound`) takes the least
over S and B, and the certificates reuse the terms.

* Crossings: every plan visits a set S of link groups
  (:func:`skyjax.plan.pricing.classes.link_groups`) and so has k >= |S| - 1 crossings at
  distinct cuts. The sum of its stage times pays at least the k cheapest crossing costs of S,
  and its bottleneck B is at least the k-th cheapest crossing plus the least time of the unit
  before that cut. Cuts with tiny outputs at the model's end (a cheap tail) are split off
  (``cases``): either no crossing uses the tail, or a group is visited twice (k >= |S|), or
  the last crossing is in the tail and the last group holds only the tail's units.
* Work: measured in reference seconds (least time of each unit on any device); device d is at
  least sigma_d times slower. Under a cap B it holds at most the most reference work of any
  contiguous block whose time on d fits B less its call costs, and whose memory fits at its
  in-flight level. The sum of stage times is at least the cheapest fractional fill of the
  total reference work W over these capacities (devices by sigma, fastest first).
* In-flight levels (1F1B): a plan of p stages has levels min(m, j), j = 1..p, one each. With
  a common memory cap per level (the largest device in S: a relaxation) and capacities
  min(a_d, M(level)) with a_d non-increasing in sigma (a running maximum keeps this true), an
  exchange argument gives the fastest devices the lowest levels and the rank-j device level
  min(m, j).
* Stages: at least p >= max(|S|, fewest devices that can hold W); the p - 1 - k transitions
  that are not counted crossings still pay the cheapest links at distinct cuts. A block's time
  includes the least comm out of its end; the few ends with cheap comm (the last unit, tiny
  outputs) serve one stage each, so only that many stages get their extra capacity.
* Carriers (GPipe): a crossing's stage keeps only B less the crossing cost for compute; the
  work it cannot keep costs at least the fill's marginal price (``_carrier_cost``).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from skyjax.plan.pricing.classes import link_groups
from skyjax.plan.pricing.cost import Tables

MAX_SUBSET_GROUPS = 6  # more link groups: only single groups and all devices (no crossings)
MAX_COLUMNS = 64  # distinct device time columns for whole-block capacities (else fractional)
MAX_EXEMPT = 8  # most cheap ends (tiny outputs) kept apart in whole-block capacities
_INF = math.inf


def _block_capacity(pre: np.ndarray, ref: np.ndarray, x: np.ndarray,
                    out: np.ndarray | None = None) -> np.ndarray:
    """For budgets x [K]: the most of ``ref`` (prefix sums [U+1]) in a contiguous block [a, e)
    whose ``pre`` span (prefix sums, non-decreasing) plus out[e] (comm after a block ending at
    e; inf: e may not end a block) is <= x; -inf where no block fits. Per end e, the best
    start is the first a with pre[a] >= pre[e] + out[e] - x."""
    u = len(pre) - 1
    ends = np.arange(1, u + 1) if out is None else np.flatnonzero(np.isfinite(out[1:])) + 1
    if not len(ends):
        return np.full(len(x), -_INF)
    extra = 0.0 if out is None else out[ends][None, :]
    thr = pre[ends][None, :] + extra - x[:, None] - 1e-12 * pre[-1]
    starts = np.searchsorted(pre, thr, "left")
    held = np.where(starts < ends[None, :], ref[ends][None, :] - ref[np.minimum(starts, u)],
                    -_INF)
    return held.max(axis=1)


class GroupBound:
    """The pieces of ``group_bound`` that do not depend on B (module doc)."""

    def __init__(self, t: Tables):
        self.t = t
        # group_bound's final B points and term values [terms, points], for chain_bound
        self.b_grid: tuple[np.ndarray, np.ndarray] | None = None
        m, u = t.microbatches, t.num_units
        state, act = np.diff(t.state_prefix), np.diff(t.act_prefix)
        levels = (np.arange(1, min(m, t.num_devices) + 1) if t.schedule == "1f1b"
                  else [t.least_inflight])  # zero bubble: its levels' least (a relaxation)
        self.levels = np.asarray(levels)
        least = float((state + self.levels[0] * act).min()) if u else 0.0
        self.devices = np.flatnonzero(t.memory >= least)  # can hold some unit at its best level
        if not len(self.devices):
            self.ok = False
            return
        self.ok = True
        w = t.work[:, self.devices]
        self.wref = w.min(axis=1)
        self.ref = np.concatenate([[0.0], np.cumsum(self.wref)])
        self.total = float(self.ref[-1])
        pos = self.wref > 0
        sig = np.ones(t.num_devices)
        if pos.any():
            sig[self.devices] = (w[pos] / self.wref[pos, None]).min(axis=0)
        self.sigma = sig
        # memory capacity per device and level: most reference work of a fitting block
        self.memcap = np.full((t.num_devices, len(self.levels)), -_INF)
        for j, lv in enumerate(self.levels):
            need = t.state_prefix + lv * t.act_prefix
            for mem in np.unique(t.memory[self.devices]):
                sel = self.devices[t.memory[self.devices] == mem]
                self.memcap[sel, j] = _block_capacity(need, self.ref, np.array([mem]))[0]
        # time columns: devices with the same prefix row share whole-block capacities
        rows = t.prefix[self.devices]
        _, self.col_of, inv = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        self.col_index = np.full(t.num_devices, -1)
        self.col_index[self.devices] = inv.ravel()
        self.whole_blocks = len(self.col_of) <= MAX_COLUMNS
        self._groups(t)

    def _groups(self, t: Tables) -> None:
        usable = set(self.devices.tolist())
        groups = [np.array([d for d in g if d in usable]) for g in link_groups(t)]
        self.groups = [g for g in groups if len(g)]
        g_n, u = len(self.groups), t.num_units
        self.cross = np.full((g_n, g_n, max(u - 1, 0)), _INF)  # least comm at each cut
        self.intra = np.full((g_n, max(u - 1, 0)), _INF)  # inside a group, at each cut
        for a, b in itertools.product(range(g_n), range(g_n)):
            src, dst = self.groups[a], self.groups[b]
            lat = t.latency[np.ix_(src, dst)]
            bw = t.bandwidth[np.ix_(src, dst)]
            other = src[:, None] != dst[None, :]
            ok = other & (bw > 0)
            if not ok.any() or u < 2:
                continue
            # with codecs: each group's fastest coder (a bound, as the least latency)
            cost = t.crossing_s(lat[ok].min(), bw[ok].max(), t.codec_rate[:, src].min(axis=1),
                                t.codec_rate[:, dst].min(axis=1))

            if a == b:
                self.intra[a] = cost
            else:
                self.cross[a, b] = cost
        self.unit_min = t.work[:, self.devices].min(axis=1)  # least time of each unit
        # least comm out of a stage ending at each cut (any link), 0 for the last stage
        self.out_cut = np.zeros(u + 1)
        if g_n and u > 1:
            least = np.minimum(self.cross.min(axis=(0, 1)), self.intra.min(axis=0))
            self.out_cut[1:u] = np.where(np.isfinite(least), least, 0.0)
        # ends whose comm out is cheap (the last unit, tiny outputs): each ends one stage only,
        # so all but n_exempt stages may be held to the other ends
        cheap = np.flatnonzero(self.out_cut[1:u] < np.median(self.out_cut[1:u])) + 1 \
            if u > 1 else np.zeros(0, int)
        self.restricted = self.out_cut.copy()
        self.n_exempt = 0
        if len(cheap) <= MAX_EXEMPT and u > 1:
            self.restricted[cheap] = self.restricted[u] = _INF
            self.n_exempt = len(cheap) + 1
        self.cheap_cuts = cheap if self.n_exempt else np.zeros(0, int)
        self.exempt = np.where(np.isfinite(self.restricted), _INF, self.out_cut)
        # carriers (crossing stages) not at a cheap end: their crossing costs, cheapest first
        k_max = max(min(g_n, MAX_SUBSET_GROUPS + 1) - len(self.cheap_cuts), 0) if g_n > 1 else 0
        costs = self.cross.min(axis=(0, 1)) if g_n and u > 1 else np.zeros(0)
        costs = np.sort(costs[np.isfinite(self.restricted[1:u])])
        # carrier j (0-based) ends at a cut other than the j easiest (least last-unit time):
        # the carriers' cuts are distinct. All pay at least the cheapest crossing cost.
        allowed = np.flatnonzero(np.isfinite(self.restricted[: u]))[1:] if u > 1 else []
        easy = np.asarray(allowed)[np.argsort(self.unit_min[np.asarray(allowed, int) - 1],
                                              kind="stable")] if len(allowed) else []
        self.carrier_cost = float(costs[0]) if len(costs) and np.isfinite(costs[0]) else _INF
        self.carrier_ends = []
        for j in range(min(k_max, len(easy)) if np.isfinite(self.carrier_cost) else 0):
            ends = np.full(u + 1, _INF)
            ends[easy[j:]] = 0.0  # comm is in B - carrier_cost
            self.carrier_ends.append(ends)

    def subsets(self) -> list[tuple[int, ...]]:
        g_n = len(self.groups)
        if g_n <= MAX_SUBSET_GROUPS:
            return [s for r in range(1, g_n + 1) for s in itertools.combinations(range(g_n), r)]
        return [(g,) for g in range(g_n)] + [tuple(range(g_n))]

    def cases(self, s: tuple[int, ...], all_groups: bool) -> list[tuple]:
        """Cases that cover every plan visiting exactly the groups s (module doc): each is
        (devices by sigma, tail work, crossings k, their least total, B floor, cumulative least
        costs of the other transitions)."""
        t, u = self.t, self.t.num_units
        devs = self.ranked(s)
        fix = float(t.fixed[devs].min())
        floor = float(self.unit_min.max()) + fix
        k = len(s) - 1 if not (all_groups and len(s) > MAX_SUBSET_GROUPS) else 0
        pairs = [(a, b) for a in s for b in s if a != b]
        cut = (np.min([self.cross[a, b] for a, b in pairs], axis=0) if pairs
               else np.full(max(u - 1, 0), _INF))
        other = np.sort(np.minimum(self.intra[list(s)].min(axis=0), cut))
        other = np.concatenate([[0.0], np.cumsum(np.where(np.isfinite(other), other, 0.0))])
        reach = np.sort(cut + self.unit_min[:-1])

        def crossings(n: int, costs: np.ndarray):
            order = np.sort(costs)
            if len(order) < n or (n and not np.isfinite(order[n - 1])):
                return None
            return float(order[:n].sum()), max(floor, float(reach[n - 1]) + fix if n else 0.0)

        if k == 0:
            return [(devs, 0.0, 0, 0.0, floor, other, 0)]
        free = len(self.cheap_cuts)  # carriers that may end at a cheap end
        fin = np.isfinite(cut)
        cheap = fin & (cut < np.median(cut[fin])) if fin.any() else fin
        tail = int(np.argmin(cheap[::-1])) if not cheap.all() else len(cut)
        e0 = len(cut) + 1 - tail  # cuts e >= e0 (index e - 1) form the cheap tail
        if tail == 0 or tail == len(cut):
            got = crossings(k, cut)
            return [] if got is None else [(devs, 0.0, k, got[0], got[1], other, free)]
        out = []
        below = int((self.cheap_cuts < e0).sum())
        for n, costs, f in ((k, cut[: e0 - 1], below), (k + 1, cut, free)):  # tail unused;
            got = crossings(n, costs)  # a group revisited
            if got is not None:
                out.append((devs, 0.0, n, got[0], got[1], other, f))
        # no revisit, last crossing in the tail: the last group holds only units >= e0
        order = np.argsort(cut, kind="stable")
        rank = np.empty(len(cut), int)
        rank[order] = np.arange(len(cut))
        best = _INF
        for e in range(e0 - 1, len(cut)):
            rest = order[: k] if rank[e] < k - 1 else order[: k - 1]
            best = min(best, cut[e] + float(cut[rest[rest != e]][: k - 1].sum()))
        got = crossings(k, cut)
        if np.isfinite(best) and got is not None:
            held = float(self.ref[u] - self.ref[e0])
            for g in s:
                rest_devs = self.ranked(tuple(x for x in s if x != g))
                out.append((rest_devs, held, k, best, got[1], other, free))
        return out

    def ranked(self, s: tuple[int, ...]) -> np.ndarray:
        """The usable devices of the groups s, fastest (least sigma) first."""
        devs = np.concatenate([self.groups[g] for g in s])
        return devs[np.argsort(self.sigma[devs], kind="stable")]

    def time_capacity(self, b: np.ndarray,
                      ends: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Two [K, D]: most reference work each device can hold with stage time <= B (call
        costs and the least comm out taken out) in a block that does not end at a cheap end,
        and in any block (only n_exempt stages may end at a cheap end); by whole blocks when
        the time columns are few, else B / sigma (no cheap ends then). ``ends``: instead, only
        the first, with these comm costs out per end (inf: not an end)."""
        t = self.t
        x = b[:, None] - t.fixed[None, :]
        if not self.whole_blocks:
            frac = np.maximum(x, 0.0) / self.sigma[None, :]
            return frac, frac
        out = np.zeros((len(b), t.num_devices))
        anyend = np.zeros((len(b), t.num_devices))
        devs = self.devices
        keys = np.stack([self.col_index[devs], t.fixed[devs]], axis=1)
        for key in np.unique(keys, axis=0):
            same = devs[(keys == key).all(axis=1)]
            pre = t.prefix[same[0]]
            held = _block_capacity(pre, self.ref, b - key[1],
                                   self.restricted if ends is None else ends)
            full = (np.maximum(held, _block_capacity(pre, self.ref, b - key[1], self.exempt))
                    if self.n_exempt and ends is None else held)
            out[:, same], anyend[:, same] = held[:, None], full[:, None]
        return out, anyend

    def capacities(self, b: np.ndarray) -> tuple:
        """What ``sum_bound`` reads: ``time_capacity`` at b, and (GPipe) per carrier j what a
        crossing stage can hold at b less the cheapest crossing (``_carrier_cost``)."""
        carriers = []
        if len(self.levels) == 1:
            carriers = [self.time_capacity(b - self.carrier_cost, ends)[0]
                        for ends in self.carrier_ends]
        return self.time_capacity(b), carriers

    def sum_bounds(self, terms: list, b: np.ndarray, caps: tuple) -> np.ndarray:
        """[len(terms), K]: ``sum_bound`` of each; its devices' parts computed once per set."""
        cache: dict = {}
        return np.stack([self.sum_bound(x, b, caps, cache) for x in terms]) if terms \
            else np.zeros((0, len(b)))

    def _per_devs(self, devs: np.ndarray, caps: tuple, cache: dict | None):
        """The parts of ``sum_bound`` that depend only on the devices (memoised in cache)."""
        key, cache = devs.tobytes(), {} if cache is None else cache
        if key in cache:
            return cache[key]
        (tcap, anyend), carriers = caps
        mem = self.memcap[devs, 0][None, :]
        gain = (np.maximum(np.minimum(anyend[:, devs], mem), 0.0)
                - np.maximum(np.minimum(tcap[:, devs], mem), 0.0)).max(axis=1)
        a = np.minimum(tcap[:, devs], self.memcap[devs, 0][None, :])
        lv = np.minimum(np.arange(1, len(devs) + 1), self.levels[-1]) - self.levels[0]
        if len(self.levels) > 1:  # 1F1B: rank j gets level min(m, j) (module doc)
            a = np.maximum.accumulate(a[:, ::-1], axis=1)[:, ::-1]
            mcap = self.memcap[devs].max(axis=0)[lv]
            cap = np.minimum(a, mcap[None, :])
        else:
            cap = a
        cap = np.maximum(cap, 0.0)
        cum = np.cumsum(cap, axis=1)
        most = -np.sort(-cap, axis=1) if len(self.levels) == 1 else cap
        sig = self.sigma[devs]
        keeps = []  # per carrier: (keep, what it cannot keep) (``_carrier_cost``)
        for left in carriers:
            keep = np.maximum(np.minimum(left[:, devs], mem), 0.0)
            keeps.append((keep, np.maximum(cap - keep, 0.0)))
        fix = float(self.t.fixed[devs].min()) if len(devs) else 0.0
        out = cache[key] = (gain, cap, cum, cum - cap, np.cumsum(most, axis=1), sig, keeps, fix)
        return out

    def sum_bound(self, terms, b: np.ndarray, caps: tuple, cache: dict | None = None
                  ) -> np.ndarray:
        """[K]: a lower bound on sum t_k over plans visiting S with bottleneck <= b (caps:
        ``capacities(b)``)."""
        devs, held, k, cross_sum, floor, other, free = terms
        gain, cap, cum, prev, cum_most, sig, keeps, fix = self._per_devs(devs, caps, cache)
        # the tail group's work and the cheap ends' gains, at the least price (sigma >= 1)
        bonus = np.minimum(self.n_exempt * gain, self.total - held)
        total = (self.total - held - bonus)[:, None]
        x = np.clip(total - prev, 0.0, cap)
        fill = x @ sig + held + bonus
        need = total[:, 0] * (1 - 1e-12)
        feasible = cum[:, -1] >= need
        p = np.maximum(1 + (cum_most < need[:, None]).sum(axis=1) + (held > 0), k + 1)
        extra = p * fix + cross_sum + other[np.minimum(np.maximum(p - 1 - k, 0), len(other) - 1)]
        out = fill + extra + self._carrier_cost(sig, x, keeps[: max(k - free, 0)])
        return np.where(feasible & (b >= floor), out, _INF)

    def _carrier_cost(self, sig, x, keeps) -> np.ndarray | float:
        """GPipe: the j-th crossing's stage (carrier) not at a cheap end, on some device of S,
        keeps at most its capacity at B less the cheapest such crossing, ending at a cut other
        than the j - 1 easiest (``carrier_ends``), so the work it cannot keep moves to a device
        no cheaper than the fill's marginal one: >= (sigma_marg - sigma_d) x loss_d, least over
        the devices that can carry at all (none: infeasible), summed over carriers (distinct
        devices not required: a relaxation). keeps: per carrier (its capacity, the loss)."""
        if not keeps:
            return 0.0
        marg = np.where(x > 0, sig[None, :], -_INF).max(axis=1, keepdims=True)
        out = 0.0
        for keep, loss in keeps:
            cost = np.maximum(marg - sig[None, :], 0.0) * loss
            out = out + np.where(keep > 0, cost, _INF).min(axis=1)
        return out
