"""The exact search: least T over device subsets, orders and cuts, by a DP over class counts.
docs/design.md, "Planning", "Exact search", gives the state and why it is exact.

``ClassDP``: devices fall into classes of interchangeable devices
(:func:`skyjax.plan.pricing.classes.device_classes`). The DP runs backward over suffixes of the
chain with state (devices used per class, class of the suffix's first stage, its first unit),
so it counts devices instead of permuting them, and 1F1B's in-flight count min(m, p - k) is
exact. It runs when ``exact_cost`` is within ``EXACT_PAIRS`` / ``EXACT_WORK``.

``pareto_walk``: DP(t), the least sum of stage times with every t_k <= t, is a non-increasing
step function of the cap t, so only its Pareto points matter. The walk visits them downward,
from the largest cap that could still win; each next cap is the largest stage time below the
last plan's bottleneck, and it stops once no smaller cap can beat the best. Plans from it are
``exact: true``; tests check them against brute force.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Sequence

import numpy as np

from skyjax.plan.pricing.cost import Solution, Tables

EXACT_PAIRS = 4000  # most (count vector, class) states for the exact DP
EXACT_WORK = 6e7  # most vectorised elements per exact DP(t)
_INF = math.inf

Solve = Callable[[float], "Solution | None"]  # DP(cap): the least-sum plan under a cap, or None


def _count_vectors(sizes: Sequence[int]) -> list[tuple[int, ...]]:
    vecs = [v for v in itertools.product(*(range(n + 1) for n in sizes)) if sum(v) > 0]
    return sorted(vecs, key=sum)


def exact_cost(sizes: Sequence[int], num_units: int) -> tuple[int, float]:
    """(states, vectorised elements) of one exact DP(t) over class counts."""
    n_vec = math.prod(n + 1 for n in sizes)
    pairs = int(round(n_vec * sum(n / (n + 1) for n in sizes)))
    return pairs, float(pairs) * len(sizes) * (num_units + 1) ** 2


def exact_fits(sizes: Sequence[int], num_units: int) -> bool:
    """Whether the exact DP is cheap enough for classes of these sizes."""
    pairs, work = exact_cost(sizes, num_units)
    return pairs <= EXACT_PAIRS and work <= EXACT_WORK


def _class_link(classes: list[list[int]], c: int, c2: int) -> tuple[int, int] | None:
    """A (device, device) pair realising the link class c -> class c2, None if impossible."""
    if c != c2:
        return classes[c][0], classes[c2][0]
    return (classes[c][0], classes[c][1]) if len(classes[c]) > 1 else None


class ClassDP:
    """Exact DP(t) over (class count vector, class, first unit) for suffixes of the chain."""

    def __init__(self, t: Tables, classes: list[list[int]]):
        self.t, self.classes = t, classes
        u, c_n = t.num_units, len(classes)
        self.vectors = _count_vectors([len(c) for c in classes])
        reps = [c[0] for c in classes]
        pre = t.prefix[reps]  # [C, U+1]
        b = np.arange(u)[:, None]
        e = np.arange(u + 1)[None, :]
        valid = e > b
        fixed = (t.fixed[reps][:, None, None]
                 + np.where(b > 0, t.in_msg[reps][:, None, None], 0.0))  # [C, U, 1]
        self.block = np.where(valid[None], pre[:, None, :] - pre[:, :u, None] + fixed,
                              _INF)  # [C, U, U+1]
        # T adds the first stage's update (a sum-only term, not part of any t_k): [C, U+1]
        self.first_extra = np.stack([t.first_update(r, np.arange(u + 1)) for r in reps])
        self.last = self.block[:, :, u].copy()  # [C, U]
        cuts = np.arange(1, u)
        self.nonlast = np.full((c_n, c_n, u, u + 1), _INF)  # [C, C2, b, e]
        for c, c2 in itertools.product(range(c_n), range(c_n)):
            pair = _class_link(classes, c, c2)
            if pair is None or u < 2:
                continue
            comm = np.full(u + 1, _INF)
            comm[1:u] = t.comm(pair[0], pair[1], cuts)
            self.nonlast[c, c2] = self.block[c] + comm[None, :]
        # what a non-last stage adds to the sum: t_k less the zero-bubble credit (0 otherwise)
        credit = np.stack([np.where(valid, t.credit(r, np.arange(u)[:, None],
                                                    np.arange(u + 1)[None, :]), 0.0)
                           for r in reps])  # [C, U, U+1]
        self.nonlast_sum = self.nonlast - credit[:, None]
        self._mem_cache: dict[tuple[int, int], np.ndarray] = {}
        self.lengths = [len(c) for c in classes]

    def mem_ok(self, c: int, inflight: int) -> np.ndarray:
        key = (c, int(inflight))
        if key not in self._mem_cache:
            t = self.t
            need = (t.state_prefix[None, :] - t.state_prefix[:-1, None]
                    + inflight * (t.act_prefix[None, :] - t.act_prefix[:-1, None]))
            self._mem_cache[key] = need <= t.memory[self.classes[c][0]]
        return self._mem_cache[key]

    def candidates(self) -> np.ndarray:
        """Every finite stage time the DP can produce, sorted and unique."""
        vals = np.concatenate([self.nonlast.ravel(), self.last.ravel()])
        return np.unique(vals[np.isfinite(vals)])

    def solve(self, cap: float) -> Solution | None:
        """min sum t_k with every t_k <= cap and memory; None if infeasible."""
        t, u, c_n = self.t, self.t.num_units, len(self.classes)
        table: dict[tuple[tuple[int, ...], int], tuple] = {}
        best: tuple[float, tuple[int, ...], int] | None = None
        for v in self.vectors:
            s = sum(v)
            if t.depth and s > t.depth:  # zero bubble's depth: plans of at most depth stages
                continue
            infl = t.inflight(s)
            for c in range(c_n):
                if v[c] == 0:
                    continue
                mem = self.mem_ok(c, infl)
                if s == 1:
                    tk = self.last[c]
                    val = np.where((tk <= cap) & mem[:, u], tk, _INF)
                    tot = val.copy()
                    tot[0] += self.first_extra[c, u]
                    entry = (tot, val, None, None)
                else:
                    entry = self._step(v, c, cap, mem, table)
                table[(v, c)] = entry
                if entry[0][0] < _INF and (best is None or entry[0][0] < best[0]):
                    best = (float(entry[0][0]), v, c)
        if best is None:
            return None
        return self._reconstruct(best[1], best[2], table)

    def _step(self, v: tuple[int, ...], c: int, cap: float, mem: np.ndarray,
              table: dict) -> tuple:
        u = self.t.num_units
        v2 = tuple(x - (i == c) for i, x in enumerate(v))
        c2s = [i for i, x in enumerate(v2) if x > 0]
        tk = self.nonlast[c, c2s]  # [k, U, U+1]
        tk_sum = self.nonlast_sum[c, c2s]
        nxt = np.full((len(c2s), u + 1), _INF)
        nmx = np.full((len(c2s), u + 1), _INF)
        for i, c2 in enumerate(c2s):
            nxt[i, :u], nmx[i, :u] = table[(v2, c2)][0], table[(v2, c2)][1]
        tot = np.where((tk <= cap) & mem[None], tk_sum + nxt[:, None, :], _INF)
        tot[:, 0, :] += self.first_extra[c][None, :]  # row 0 starts the chain: T adds update_0
        flat = tot.transpose(1, 0, 2).reshape(u, -1)
        idx = np.argmin(flat, axis=1)
        rows = np.arange(u)
        val = flat[rows, idx]
        ci, e = np.divmod(idx, u + 1)
        mx = np.maximum(tk[ci, rows, e], nmx[ci, e])
        mx = np.where(val < _INF, mx, _INF)
        return val, mx, np.asarray(c2s)[ci], e

    def _reconstruct(self, v: tuple[int, ...], c: int, table: dict) -> Solution:
        used = [0] * len(self.classes)
        out, b = [], 0
        total, mx = float(table[(v, c)][0][0]), float(table[(v, c)][1][0])
        while True:
            val, _, c2, e = table[(v, c)]
            dev = self.classes[c][used[c]]
            used[c] += 1
            if c2 is None:
                out.append((dev, b, self.t.num_units))
                return Solution(total, mx, out)
            out.append((dev, b, int(e[b])))
            v = tuple(x - (i == c) for i, x in enumerate(v))
            c, b = int(c2[b]), int(e[b])


def pareto_walk(solve: Solve, candidates: np.ndarray, m: int) -> Solution | None:
    """min over caps of DP(cap) + (m - 1) * bottleneck, exactly (module doc)."""
    first = solve(_INF)
    if first is None or m == 1:
        return first
    best = first

    def score(sol: Solution) -> float:
        return sol.total + (m - 1) * sol.bottleneck

    def probe(cap: float) -> Solution | None:
        nonlocal best
        sol = solve(cap)
        if sol is not None and score(sol) < score(best):
            best = sol
        return sol

    s0 = first.total  # every plan has sum >= s0
    top = int(np.searchsorted(candidates, first.bottleneck, "left"))
    lo, t_lo = _least_cap(probe, candidates, 0, top - 1)
    idx = top - 1
    while True:
        stop = int(np.searchsorted(candidates, (score(best) - s0) / (m - 1), "right")) - 1
        idx = min(idx, stop)
        if idx < lo:
            return best
        sol = probe(candidates[idx])
        if sol is None or sol.total + (m - 1) * t_lo >= score(best):
            return best
        idx = int(np.searchsorted(candidates, sol.bottleneck, "left")) - 1


def _least_cap(solve: Solve, candidates: np.ndarray, lo: int, hi: int) -> tuple[int, float]:
    """Smallest index in [lo, hi] whose cap is feasible (hi + 1 if none), and its value."""
    ans = hi + 1
    while lo <= hi:
        mid = (lo + hi) // 2
        sol = solve(candidates[mid])
        if sol is None:
            lo = mid + 1
        else:  # feasible: the least cap is at most this plan's bottleneck
            ans = int(np.searchsorted(candidates, sol.bottleneck, "left"))
            hi = ans - 1
    return ans, (float(candidates[ans]) if ans < len(candidates) else _INF)


def search(t: Tables, classes: list[list[int]]) -> Solution | None:
    """The least-T assignment over all subsets, orders and cuts (None if nothing fits)."""
    dp = ClassDP(t, classes)
    return pareto_walk(dp.solve, dp.candidates(), t.microbatches)
