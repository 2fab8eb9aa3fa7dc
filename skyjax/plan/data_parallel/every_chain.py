"""Small instances: the split search exact over every chain of every pipeline. docs/design.md,
"Planning", "Several pipelines", gives the bounds that keep it small and why the pass is needed.

T = max_i T_i + AR + sync_s, and AR depends on which units each device owns, so a chain with a
larger T_i may win by a cheaper exchange. The exhaustive split search
(:mod:`skyjax.plan.data_parallel.split`) first prices every (partition, shares) with each
block's least-T_i chain, the incumbent ``best``; this pass then takes, per (partition, shares),
the least T over every tuple of chains (one per block: any ordered subset of its devices, any
cuts), pruned by lower bounds on AR:

* ``Floors``: a device holding units [a, b) sends their gradients at least once to another
  pipeline, F(d, a, b) = L_d + g(a, b) / B_d (less with the relaxed modes allowed), and a cut
  of the devices into some blocks and the rest sends all gradient bytes across it;
* chains: per (block, m_i), those with T_i + F < best - sync_s, found depth first and cut where
  the partial sum reaches the bound, then priced by ``ChainCache.step_of``;
* tuples: chains in T_i order, dropped where max T_i + max F + sync_s >= best; AR is priced once
  per tuple of chains, whatever the shares.

Within ``NODES`` partial chains and ``TUPLES`` priced tuples the result is exact
(``tests/test_pipelines_plan.py`` checks it against brute force); past them the pass keeps the
best it has found, and the plan is not marked exact.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from skyjax.names import PEER_MODES
from skyjax.plan.data_parallel.pipelines import INT8_WIRE, ChainCache, Priced, region_groups

NODES = 100_000  # most partial chains the depth-first searches visit, all blocks together
TUPLES = 3000  # most tuples of chains whose exchange is priced
SLACK = 1e-9  # relative: what the bounds keep beyond the incumbent (their sums round otherwise)


class Floors:
    """Lower bounds on AR (module doc): F(d, a, b) per block, and per partition over cuts."""

    def __init__(self, cache: ChainCache, gprefix: np.ndarray):
        prof = cache.profile
        self.lat = np.asarray(prof.latency_s, float)
        self.bw = np.asarray(prof.bandwidth_Bps, float)
        self.gprefix = gprefix
        self.units = cache.t.num_units
        self.regions = [np.asarray(g) for g in region_groups(prof)]
        modes = prof.relax.averagings  # the least factors of any mode allowed: latency, bytes
        slow = 1.0 / prof.relax.outer_every if any(x.startswith("diloco") for x in modes) else 1
        wire = INT8_WIRE if any(x.startswith("int8") for x in modes) else 1.0
        self.lat_f, self.byte_f = slow, min(slow, wire)
        if any(x in PEER_MODES for x in modes):  # a pair may not cross a cut; async hides it
            self.lat_f = self.byte_f = 0.0

    def _cut(self, inside: np.ndarray, outside: np.ndarray, g: float, senders: int) -> float:
        top = float(self.bw[np.ix_(inside, outside)].max())
        if top <= 0:
            return math.inf
        return (self.lat_f * float(self.lat[np.ix_(inside, outside)].min())
                + self.byte_f * g / (senders * top))

    def of_partition(self, part: Sequence[Sequence[int]]) -> float:
        """AR >= L + G / (n B) over every cut S | rest of the devices such that S is a union
        of blocks: one block, the blocks inside one region, and their complements. Every unit
        has an owner on both sides, so G bytes leave S, sent by its n <= sum min(|block|, U)
        devices at bandwidth B <= the most across, each message at latency >= L."""
        g = float(self.gprefix[-1])
        blocks = [np.asarray(b) for b in part]
        region_of = {}
        for r, members in enumerate(self.regions):
            for d in members:
                region_of[int(d)] = r
        k = len(blocks)
        sides = {frozenset([i]) for i in range(k)}
        for r in range(len(self.regions)):
            sides.add(frozenset(i for i, b in enumerate(blocks)
                                if all(region_of[int(d)] == r for d in b)))
        sides |= {frozenset(range(k)) - x for x in sides}
        best = 0.0
        for cut in sorted(sorted(x) for x in sides if 0 < len(x) < k):
            rest = [i for i in range(k) if i not in cut]
            inside = np.concatenate([blocks[i] for i in cut])
            outside = np.concatenate([blocks[i] for i in rest])
            n = sum(min(len(blocks[i]), self.units) for i in cut)
            best = max(best, self._cut(inside, outside, g, n))
        return best

    def of_block(self, block: Sequence[int]) -> Callable[[int, int, int], float]:
        """F(d, a, b) of a device of ``block`` holding [a, b) (receivers: outside the block)."""
        rest = np.setdiff1d(np.arange(len(self.lat)), np.asarray(block, dtype=np.int64))
        lat = {d: float(self.lat[d, rest].min()) for d in block}
        top = {d: float(self.bw[d, rest].max()) for d in block}
        g, lf, bf = self.gprefix, self.lat_f, self.byte_f

        def floor(d: int, a: int, b: int) -> float:
            if top[d] <= 0:
                return math.inf
            return lf * lat[d] + bf * (g[b] - g[a]) / top[d]
        return floor


class EveryChain:
    """The pass of the module doc over one search's partitions (``run``)."""

    def __init__(self, cache: ChainCache, gprefix: np.ndarray, best, exchange: Callable):
        self.cache, self.best, self.exchange = cache, best, exchange
        self.floors = Floors(cache, gprefix)
        self.sync = cache.t.sync_s
        self.nodes = self.tuples = 0
        self.complete = True
        self._ar: dict[tuple, float] = {}

    def least(self, block: Sequence[int], m: int) -> float | None:
        """A lower bound on T_i over the chains on ``block`` at m_i = m (None: none fits):
        the least-T_i chain's where its search was exact (zero bubble: the searches minimise
        T_i less the credit, which T_i does not take off, so that), else 0."""
        p = self.cache.get(block, m)
        if not self.cache.exact_at(block, m):
            return 0.0
        if p is None or not self.cache.t.credit_factor:
            return None if p is None else p.step_s
        t = self.cache.tables_for(m)  # zero bubble: the searches' T_i less the chain's credit
        return p.step_s - sum(float(t.credit(d, a, b)) for d, a, b in p.chain[:-1])

    def run(self, parts: Sequence[Sequence[Sequence[int]]], shares_of: Callable) -> bool:
        """Every (partition, shares) whose bound is below the incumbent, every tuple of chains
        on it offered to ``best``; whether it finished within the budgets."""
        best, sync = self.best, self.sync
        limit = best.step_s - sync
        live = []
        for part in parts:
            floor = None
            for shares in shares_of(len(part)):
                lows = [self.least(b, m_i) for b, m_i in zip(part, shares)]
                if None in lows or max(lows) + sync >= best.step_s:
                    continue
                if floor is None:
                    floor = self.floors.of_partition(part)
                if max(lows) + floor + sync < best.step_s:
                    live.append((max(lows), part, shares, floor))
        # a chain on a block is kept if T_i + its floor stays below the bound, with the least
        # partition floor of the live splits it is part of
        need: dict[tuple, float] = {}
        for _, part, shares, floor in live:
            for b, m_i in zip(part, shares):
                need[tuple(b), m_i] = min(need.get((tuple(b), m_i), math.inf), floor)
        found: dict[tuple, list] = {}
        for low, part, shares, floor in sorted(live, key=lambda x: x[0]):
            if low + floor + sync >= best.step_s:
                continue
            lists = []
            for b, m_i in zip(part, shares):
                key = (tuple(b), m_i)
                if key not in found:
                    found[key] = sorted(self._search(list(b), m_i, limit, need[key]),
                                        key=lambda x: x[0])
                if not self.complete:
                    return False
                lists.append(found[key])
            if all(lists):
                self._offer(lists, shares, floor)
            if not self.complete:
                return False
        return True

    def _search(self, block: list[int], m: int, limit: float, floor0: float) -> list[tuple]:
        """(T_i, F, chain, ``free_of``) of every chain on ``block`` at m_i = m with T_i + F <
        ``limit``, F the chain's floor and at least ``floor0`` (the search is cut when over
        budget)."""
        cache = self.cache
        t = cache.tables_for(m)
        u = t.num_units
        lim = limit * (1 + SLACK) if math.isfinite(limit) else math.inf
        floor = self.floors.of_block(block)
        least = t.least_inflight
        cuts = np.arange(1, u)
        links: dict[tuple[int, int], list[float]] = {}
        out: list[tuple] = []
        stages: list[tuple[int, int, int]] = []

        def fits(d: int, a: int, b: int) -> bool:
            return (t.state_prefix[b] - t.state_prefix[a]
                    + least * (t.act_prefix[b] - t.act_prefix[a])) <= t.memory[d]

        def base(d: int, a: int, b: int) -> float:  # compute + incoming message calls
            return float(t.prefix[d, b] - t.prefix[d, a] + t.fixed[d]
                         + (t.in_msg[d] if a > 0 else 0.0))

        def grow(a: int, done: float, top: float, upd0: float, fmax: float, last: float,
                 used: set[int]) -> None:
            self.nodes += 1
            if self.nodes > NODES:
                self.complete = False
                return
            if a == u:
                chain = list(stages)
                step = cache.step_of(chain, m)
                if math.isfinite(step) and step + fmax < lim:
                    out.append((step, fmax, chain, cache.free_of(chain, m)))
                return
            prev = stages[-1][0]
            for e in block:
                if e in used or not self.complete:
                    continue
                if (prev, e) not in links:
                    links[prev, e] = t.comm(prev, e, cuts).tolist()
                t_prev = last + links[prev, e][a - 1]
                if math.isinf(t_prev):
                    continue
                s, mx = done + t_prev, max(top, t_prev)
                for b in range(a + 1, u + 1):  # every term grows with b: cut at the bound
                    if not fits(e, a, b):
                        break
                    x, f = base(e, a, b), max(fmax, floor(e, a, b))
                    if s + x + (m - 1) * max(mx, x) + upd0 + f >= lim:
                        break
                    stages.append((e, a, b))
                    used.add(e)
                    grow(b, s, mx, upd0, f, x, used)
                    used.discard(e)
                    stages.pop()

        for d in block:
            for b in range(1, u + 1):
                if not fits(d, 0, b):
                    break
                x, upd0 = base(d, 0, b), float(t.first_update(d, b))
                f = max(floor0, floor(d, 0, b))
                if m * x + upd0 + f >= lim:
                    break
                stages.append((d, 0, b))
                grow(b, 0.0, 0.0, upd0, f, x, {d})
                stages.pop()
        return out

    def _offer(self, lists: list[list], shares: Sequence[int], floor: float) -> None:
        """The least T over every tuple of chains, one from each list, offered to ``best``."""
        best, sync = self.best, self.sync
        picked: list[tuple] = []

        def pick(i: int, tmax: float, fmax: float) -> None:
            if not self.complete:
                return
            if i == len(lists):  # AR: of the chains, and of the relaxed modes their memory fits
                key = tuple(sorted((tuple(c), free) for _, _, c, free in picked))
                priced = [Priced(c, s, True, free) for s, _, c, free in picked]
                if key not in self._ar:
                    self.tuples += 1
                    if self.tuples > TUPLES:
                        self.complete = False
                        return
                    self._ar[key] = self.exchange(priced)
                best.offer(tmax + self._ar[key] + sync, priced, shares)
                return
            for item in lists[i]:
                step, f = item[:2]
                if step + fmax + sync >= best.step_s:
                    break  # least T_i first
                if max(tmax, step) + max(fmax, f) + sync >= best.step_s:
                    continue
                picked.append(item)
                pick(i + 1, max(tmax, step), max(fmax, f))
                picked.pop()

        pick(0, 0.0, floor)
