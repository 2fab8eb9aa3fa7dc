"""A lower bound on GPipe's sum term over the plans that visit every link group once, in one run.

Why. ``chain_bound`` pools each device kind over all link groups (regions), which on the paper
case (GPipe, m = 32) leaves its bound 1.3 % below the optimum. What it loses is which region a
device belongs to, not integrality: at a cap of 0.0497 s the pooled chain with exact counts gives
a sum of 1.2965 s, the least sum of a plan that visits each region once is 1.3747 s. Plans that
revisit a region need a crossing more, which the chain prices well; so ``chain_bound`` bounds
plans visiting every group by the lesser of the two (this module; the chain with G crossings).

How. ``refine``'s DP (state: the unit, and how many devices of each kind the current region has
used) gives the exact least sum of stage times (plus the first stage's update) under a cap for
one order of regions. Instead of running it per order (G! orders), the orders are composed by
Held-Karp over visited sets: the arrivals at a cut after visiting the set S with region g last
are the least over S's orders, so region g's pass runs once per visited set, the sets of one
size batched as columns of one pass: G passes per size, G^2 in all (16 at G = 4, instead of 96
per-order passes). A pass runs once per distinct link to the next region.

Relaxed. A pass costs about the product over its region's kinds of (count + 1) count vectors.
Beyond ``STATE_BUDGET``, the slowest kinds are unlimited: out of the state, closed over within
a layer (any number of their stages in a row, up to how many such devices the region has), and
an unlimited kind that another unlimited one dominates (no slower anywhere, as much memory)
counts as that one. More plans are allowed, none costs more: still a lower bound. Paper case:
one kind per region unlimited, the exact 1.37468 at cap 0.0497 becomes 1.3721.

Cut. Asked for no more than ``enough`` (the sum that lifts the caller's intervals to its goal),
a partial plan is dropped where its sum plus a lower bound on the rest reaches it: the work of
the units left, the largest unit weights (their fastest time) on the least slow-downs of the
devices of the regions left, each device holding at most the most units any of its blocks can
(a rearrangement bound), plus the crossings left at the least link. The optimum's partial plans
are never dropped below ``enough``, so the result is at most min(that optimum, enough).

Checked against brute force over every plan in tests/test_once_bound.py.
"""

from __future__ import annotations

import math

import numpy as np

from skyjax.plan.pricing.cost import Tables
from skyjax.plan.search.refine import RegionSearch, group_link, interchangeable

MAX_GROUPS = 5  # more link groups: too many visited sets (2^G)
STATE_BUDGET = 100  # count vectors per region (the slowest kinds unlimited beyond it)
TAIL_CUTS = 1024  # cuts at which the least work left is computed (memory: TAIL_CUTS x U)
_INF = math.inf


class OnceEach:
    """Least-sum bounds for once-each plans at given caps (module doc); ``ok`` False where it
    does not apply (more than ``MAX_GROUPS`` groups)."""

    def __init__(self, t: Tables, groups: list[list[int]], budget: int = STATE_BUDGET):
        self.groups = [list(map(int, g)) for g in groups]
        self.t, self.ok = t, len(groups) <= MAX_GROUPS
        if not self.ok:
            return
        u, devs = t.num_units, [d for g in self.groups for d in g]
        omega = t.work[:, devs].min(axis=1)  # per unit, on its fastest device
        pos = omega > 0
        ratio = t.work[np.ix_(pos, devs)] / omega[pos, None]
        low = ratio.min(axis=0) if pos.any() else np.ones(len(devs))
        # work[i, d] >= alpha_d omega_i; at most 1e300, so that 0 x alpha is 0
        self.alpha = dict(zip(devs, np.minimum(low, 1e300).tolist()))
        self.omega, self._tails = omega, None
        cross = np.min([group_link(t, a, b) for a in self.groups for b in self.groups if a is not b]
                       or [np.zeros(u + 1)], axis=0)  # [U + 1] per cut
        self.cross = np.minimum.accumulate(np.concatenate([cross[1:], [_INF]])[::-1])[::-1]
        self.kinds, self.free = [], []
        for g in self.groups:
            ks, free = _split(t, interchangeable(t, g), budget)
            self.kinds.append(ks)
            self.free.append(free)

    def least_sum(self, cap: float, enough: float = _INF) -> float:
        """A lower bound on the least sum of stage times plus the first stage's update over
        plans visiting every group once, in one run, with every stage time <= cap (inf if
        none), or ``enough`` if that is less (partial plans that cannot end below it are
        dropped: module doc)."""
        g_n, u = len(self.groups), self.t.num_units
        held = self._held(cap)
        searches: dict = {}  # (group, next group) -> its RegionSearch at this cap
        work: dict = {}  # groups still open -> least work of the units from each cut on

        def cut(seen: frozenset) -> np.ndarray:  # a region's entries at or above are dropped
            left = frozenset(range(g_n)) - seen
            if left not in work:
                work[left] = self._least_work([d for g in left for d in self.groups[g]], held)
            need = work[left] + (len(left) - 1) * self.cross if len(left) > 1 else work[left]
            with np.errstate(invalid="ignore"):  # inf - inf where it is not used
                return np.where(np.isfinite(need), enough - need, -_INF)  # inf: no way on
        start = np.full(u + 1, _INF)
        start[0] = 0.0
        layer = {(frozenset(), g): start for g in range(g_n)}  # (visited, group) -> arrivals
        for depth in range(g_n):
            nxt: dict = {}
            for g in range(g_n):
                mine = [(seen, a, cut(seen)) for (seen, h), a in layer.items() if h == g]
                mine = [x for x in mine if (x[1] < x[2]).any()]
                if not mine:
                    continue
                rest = [[h for h in range(g_n) if h not in seen and h != g] or [None]
                        for seen, _, _ in mine]
                outs = self._pass(g, np.stack([a for _, a, _ in mine], axis=1), rest, cap,
                                  depth == 0, np.stack([c for _, _, c in mine], axis=1),
                                  searches)
                for (seen, _, _), hs, out in zip(mine, rest, outs):
                    for h in hs:
                        key = (seen | {g}, h)
                        nxt[key] = np.minimum(nxt[key], out[h]) if key in nxt else out[h]
            layer = nxt
        return min([float(a[u]) for a in layer.values()] + [enough])

    def _held(self, cap: float) -> tuple[dict[int, int], int]:
        """Per device, the most units one of its blocks can hold within cap and memory (its
        calls and links, which only shorten blocks, left out) among blocks that hold neither
        the first nor the last unit; and the most any device gains on those with one that
        does (at most two blocks of a plan do)."""
        t, u = self.t, self.t.num_units
        need = t.state_prefix + t.microbatches * t.act_prefix
        b = np.arange(1, u + 1)
        held, gain = {}, 0
        for d in self.alpha:
            lo_t = np.searchsorted(t.prefix[d], t.prefix[d, b] + t.fixed[d] - cap, "left")
            lo_m = np.searchsorted(need, need[b] - t.memory[d], "left")
            lo = np.maximum(lo_t, lo_m)
            inner = (lo >= 1) & (b <= u - 1)
            held[d] = int(np.max((b - lo)[inner], initial=0))
            gain = max(gain, int(np.max(b - lo, initial=0)) - held[d])
        return held, gain

    def _least_work(self, devs: list[int], held: tuple[dict[int, int], int]) -> np.ndarray:
        """[U + 1]: per cut b, the least work of the units from b on over the devices devs,
        each holding at most its ``held`` units, two of them more by the gain (the largest
        unit weights on the least alphas: a rearrangement bound, blocks not kept contiguous);
        inf where they cannot hold them."""
        u, (most, gain) = self.t.num_units, held
        alphas = [self.alpha[d] for d in devs]
        slots = np.sort(np.concatenate([np.repeat(alphas, [most[d] for d in devs]),
                                        np.full(2 * gain, min(alphas, default=0.0))]))[:u]
        if self._tails is None:  # omega of the units from each cut on, largest first; at
            # most TAIL_CUTS cuts (the least work left does not grow with the cut, so the next
            # cut's value holds for the ones before it)
            at = np.unique(np.linspace(0, u, min(u + 1, TAIL_CUTS)).round().astype(int))
            tail = np.where(np.arange(u)[None, :] >= at[:, None], self.omega[None, :], 0.0)
            self._tails = at, -np.sort(-tail, axis=1), (tail > 0).sum(axis=1)
        at, tails, units = self._tails
        per = np.where(units <= len(slots), tails[:, :len(slots)] @ slots, _INF)
        return per[np.searchsorted(at, np.arange(u + 1), "left")]

    def _pass(self, g: int, arrive: np.ndarray, nexts: list[list], cap: float,
              first: bool, cut: np.ndarray, searches: dict) -> list[dict]:
        """Region g's DP from each column of the arrivals [U + 1, B], once per distinct link
        to the next groups (None: g is last): per column, the arrivals at each next group.
        ``searches``: the RegionSearch per (group, next group) at this cap, reused across depths."""
        u = self.t.num_units
        out: list[dict] = [{} for _ in nexts]
        runs: dict = {}  # link key -> (search, columns that need it)
        for j, hs in enumerate(nexts):
            for h in hs:
                order = [g] if h is None else [g, h]
                if (g, h) not in searches:
                    searches[(g, h)] = RegionSearch(
                        self.t, order, self.groups, [self.kinds[x] for x in order],
                        [0] * len(order) + [u], min(cap, np.finfo(float).max), slack=u,
                        free=[self.free[x] for x in order])
                search = searches[(g, h)]
                key = search.out[0].tobytes()
                runs.setdefault(key, (search, {}))[1].setdefault(j, []).append(h)
        for search, cols in runs.values():
            idx = sorted(cols)
            search.cut = cut[:, idx]
            res = search.fill_region(0, arrive[:, idx], first)
            search.f.clear()  # kept for refine's walk back only
            for i, j in enumerate(idx):
                for h in cols[j]:
                    out[j][h] = res[:, i]
        return out


def _split(t: Tables, kinds: list[list[int]], budget: int) -> tuple[list[list[int]], set[int]]:
    """A group's kinds and which of them are unlimited: the slowest, until the others have at
    most ``budget`` count vectors; an unlimited kind that another unlimited one dominates is
    merged into it (its stages are never better; its devices still count for the run-length
    cap)."""
    order = sorted(range(len(kinds)), key=lambda c: -t.prefix[kinds[c][0], -1])
    free: set[int] = set()
    for c in order:
        if math.prod(len(k) + 1 for i, k in enumerate(kinds) if i not in free) <= budget:
            break
        free.add(c)
    kinds = [list(k) for k in kinds]
    for c in sorted(free, key=lambda c: -t.prefix[kinds[c][0], -1]):  # the slowest first
        into = [d for d in free if d != c and kinds[d] and kinds[c]
                and _dominates(t, kinds[d][0], kinds[c][0])]
        if into:  # its devices count as the dominating kind's (the run-length cap)
            kinds[into[0]] += kinds[c]
            kinds[c] = []
    keep = [c for c in range(len(kinds)) if kinds[c]]
    return [kinds[c] for c in keep], {i for i, c in enumerate(keep) if c in free}


def _rows(t: Tables, d: int) -> list[np.ndarray]:
    return [np.diff(t.prefix[d]), np.diff(t.update_prefix[d]),
            np.array([t.fixed[d], t.in_msg[d], t.update_call[d], t.alone[d]])]


def _dominates(t: Tables, fast: int, slow: int) -> bool:
    """Device ``fast`` is no slower than ``slow`` anywhere the cost reads, with as much
    memory (so pricing slow's devices as fast's lowers every plan's cost)."""
    return t.memory[fast] >= t.memory[slow] and all(
        np.all(a <= b) for a, b in zip(_rows(t, fast), _rows(t, slow)))
