"""A lower bound on GPipe's sum term over the plans that visit every link group once, in one run.

Why. ``chain_bound`` pools each device kind over all link groups (regions), which on the paper
case (GPipe, m = 32) leaves its bound 1.3 % below the optimum. What it loses is which region a
device belongs to, not integrality: at a cap of 0.0497 s the pooled chain with exact counts gives
a sum of 1.2965 s, the least sum of a plan that visits each region once is 1.3747 s. Plans that
revisit a region need a crossing more, which the chain bound prices well; so the chain bound
keeps those, and this module bounds the others (``chain_bound`` takes the lesser of the two).

How. ``refine``'s DP (state: the unit, and how many devices of each kind the current region has
used) gives the exact least sum of stage times (plus the first stage's update) under a cap for
one order of regions. Instead of running it per order (G! orders), the orders are composed by
Held-Karp over visited sets: the arrivals at a cut after visiting the set S with region g last
are the least over S's orders, so a region's pass runs once per (S, g), 2^(G-1) G passes in all
(32 at G = 4 instead of 96), a pass per distinct outgoing link.

Relaxed kinds. A pass costs about the product over its region's kinds of (count + 1) count
vectors. Where that exceeds ``STATE_BUDGET``, the slowest kind is merged into the next slower
kind that dominates it (no slower on any unit, call, message or update, and as much memory):
its devices are priced as that kind. A plan then costs no more, so the least sum is a lower
bound still (paper case: kinds of 6 and 5 merged into 4; at cap 0.0497 s the sum 1.3747 becomes
1.3698, 0.46 s CPU instead of 1.30 s).

Links: link groups are uniform, so a stage's link to the next is exact (``refine._link``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from skyjax.plan.cost import Tables
from skyjax.plan.refine import _kinds, _Search

MAX_GROUPS = 5  # more link groups: 2^(G-1) G passes is too many (80 at G = 5)
STATE_BUDGET = 600  # count vectors per region after merging kinds
_INF = math.inf


class OnceEach:
    """Least-sum bounds for once-each plans at given caps (module doc); ``ok`` False where it
    does not apply (more than ``MAX_GROUPS`` groups, or kinds that cannot be merged enough)."""

    def __init__(self, t: Tables, groups: list[list[int]], budget: int = STATE_BUDGET):
        self.groups = [list(map(int, g)) for g in groups]
        self.t, self.ok = t, len(groups) <= MAX_GROUPS
        devs = [d for g in self.groups for d in g]
        least = t.work[:, devs].min(axis=1)  # per unit, on its fastest device
        self.rest = np.concatenate([np.cumsum(least[::-1])[::-1], [0.0]])  # [U + 1]: from b on
        self.cut = np.full(t.num_units + 1, _INF)
        self.kinds, self.free = [], []
        for g in self.groups:
            ks, free = _split(t, _kinds(t, g), budget)
            self.kinds.append(ks)
            self.free.append(free)

    def least_sum(self, cap: float, enough: float = _INF) -> float:
        """A lower bound on the least sum of stage times plus the first stage's update over
        plans visiting every group once, in one run, with every stage time <= cap (inf if
        none), or ``enough`` if that is less: partial plans that cannot end below it (their
        sum plus the least work left, every unit on its fastest device) are dropped."""
        g_n, u = len(self.groups), self.t.num_units
        self.cut = enough - self.rest
        start = np.full(u + 1, _INF)
        start[0] = 0.0
        layer = {(frozenset(), g): start for g in range(g_n)}  # (visited, group) -> arrivals
        for depth in range(g_n):
            nxt: dict = {}
            for g in range(g_n):
                mine = [(seen, a) for (seen, h), a in layer.items() if h == g]
                if not mine:
                    continue
                rest = [[h for h in range(g_n) if h not in seen and h != g] or [None]
                        for seen, _ in mine]
                outs = self._pass(g, np.stack([a for _, a in mine], axis=1), rest, cap,
                                  depth == 0)
                for (seen, _), hs, out in zip(mine, rest, outs):
                    for h in hs:
                        key = (seen | {g}, h)
                        nxt[key] = np.minimum(nxt[key], out[h]) if key in nxt else out[h]
            layer = nxt
        return min([float(a[u]) for a in layer.values()] + [enough])

    def _pass(self, g: int, arrive: np.ndarray, nexts: list[list], cap: float,
              first: bool) -> list[dict]:
        """Region g's DP from each column of the arrivals [U + 1, B], once per distinct link
        to the next groups (None: g is last): per column, the arrivals at each next group."""
        u = self.t.num_units
        out: list[dict] = [{} for _ in nexts]
        runs: dict = {}  # link key -> (search, columns that need it)
        for j, hs in enumerate(nexts):
            for h in hs:
                order = [g] if h is None else [g, h]
                search = _Search(self.t, order, self.groups, [self.kinds[x] for x in order],
                                 [0] * len(order) + [u], min(cap, np.finfo(float).max),
                                 slack=u, free=[self.free[x] for x in order])
                search.cut = self.cut
                key = search.out[0].tobytes()
                runs.setdefault(key, (search, {}))[1].setdefault(j, []).append(h)
        for search, cols in runs.values():
            idx = sorted(cols)
            res = search._region(0, arrive[:, idx], first)
            for i, j in enumerate(idx):
                for h in cols[j]:
                    out[j][h] = res[:, i]
        return out

def _split(t: Tables, kinds: list[list[int]], budget: int) -> tuple[list[list[int]], set[int]]:
    """A group's kinds and which of them are unlimited: the slowest, until the others have at
    most ``budget`` count vectors; an unlimited kind that another unlimited one dominates is
    dropped (its stages are never better)."""
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


def relaxed(t: Tables, groups: list[list[int]], budget: int) -> Tables | None:
    """t with the slowest kinds priced as faster ones that dominate them (module doc) until
    every group has at most ``budget`` count vectors; None if that cannot be reached."""
    devs = sorted(d for g in groups for d in g)
    for _ in range(len(devs)):
        sizes = [math.prod(len(k) + 1 for k in _kinds(t, g)) for g in groups]
        if max(sizes) <= budget:
            return t
        reps: list[int] = []  # one device per kind over all groups, the slowest first
        for d in sorted(devs, key=lambda d: -t.prefix[d, -1]):
            if not any(_same(t, d, r) for r in reps):
                reps.append(d)
        merged = False
        for i, slow in enumerate(reps):
            into = next((d for d in reps[i + 1:] if _dominates(t, d, slow)), None)
            if into is not None:
                t = _price_as(t, [d for d in devs if _same(t, d, slow)], into)
                merged = True
                break
        if not merged:
            return None
    return None


def _rows(t: Tables, d: int) -> list[np.ndarray]:
    return [np.diff(t.prefix[d]), np.diff(t.update_prefix[d]),
            np.array([t.fixed[d], t.in_msg[d], t.update_call[d]])]


def _dominates(t: Tables, fast: int, slow: int) -> bool:
    """Device ``fast`` is no slower than ``slow`` anywhere the cost reads, with as much
    memory (so pricing slow's devices as fast's lowers every plan's cost)."""
    return t.memory[fast] >= t.memory[slow] and all(
        np.all(a <= b) for a, b in zip(_rows(t, fast), _rows(t, slow)))


def _same(t: Tables, a: int, b: int) -> bool:
    return t.memory[a] == t.memory[b] and all(
        np.array_equal(x, y) for x, y in zip(_rows(t, a), _rows(t, b)))


def _price_as(t: Tables, devs: list[int], into: int) -> Tables:
    """t with the rows of devs replaced by device into's (links unchanged)."""
    work, prefix, upd = t.work.copy(), t.prefix.copy(), t.update_prefix.copy()
    fixed, msg, call, mem = t.fixed.copy(), t.in_msg.copy(), t.update_call.copy(), t.memory.copy()
    for d in devs:
        work[:, d], prefix[d], upd[d] = t.work[:, into], t.prefix[into], t.update_prefix[into]
        fixed[d], msg[d], call[d], mem[d] = t.fixed[into], t.in_msg[into], t.update_call[into], \
            t.memory[into]
    return dataclasses.replace(t, work=work, prefix=prefix, update_prefix=upd, fixed=fixed,
                               in_msg=msg, update_call=call, memory=mem)
