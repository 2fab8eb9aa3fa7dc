"""The larger instances' candidate splits into pipelines, and the order the screen tries them.

Splits come from link groups (regions; ``classes.link_groups``, over ``MAX_GROUPS`` coarsened)
and speeds (:func:`candidate_splits`); :func:`split_bound` is a lower bound on any plan's T on a
split, :func:`split_estimate` the order in which :mod:`skyjax.plan.data_parallel.split`'s screen
tries them (that bound, fill and drain, the cheaper exchange's bytes and latency, hand-offs
across regions).
"""

from __future__ import annotations

import itertools
from typing import Iterator

import numpy as np

from skyjax.plan.pricing.classes import coarse_groups, link_groups
from skyjax.plan.pricing.cost import Tables

MAX_GROUPS = 6  # more link groups are coarsened for the candidate splits
ALL_GROUP_PARTITIONS = 5  # every partition of the groups up to this many groups
_INF = float("inf")


def set_partitions(n: int, max_blocks: int) -> Iterator[list[list[int]]]:
    """Every partition of 0..n-1 into 1..max_blocks blocks (restricted growth strings)."""
    def grow(i: int, blocks: list[list[int]]) -> Iterator[list[list[int]]]:
        if i == n:
            yield [list(b) for b in blocks]
            return
        for b in blocks:
            b.append(i)
            yield from grow(i + 1, blocks)
            b.pop()
        if len(blocks) < max_blocks:
            blocks.append([i])
            yield from grow(i + 1, blocks)
            blocks.pop()
    if n > 0:
        yield from grow(0, [])


def candidate_splits(t: Tables, max_pipelines: int) -> list[list[list[int]]]:
    """Splits into 2..max_pipelines pipelines from link groups and speeds (module doc); devices
    of groups a split leaves out are idle."""
    groups = link_groups(t)
    if len(groups) > MAX_GROUPS:
        groups = coarse_groups(t, MAX_GROUPS)
    g = len(groups)
    if g <= ALL_GROUP_PARTITIONS:  # every subset of the groups, every partition of it
        gparts = [[[sub[i] for i in b] for b in part] for r in range(1, g + 1)
                  for sub in itertools.combinations(range(g), r)
                  for part in set_partitions(r, max_pipelines)]
    else:
        gparts = [[list(range(g))]] + ([[[i] for i in range(g)]] if g <= max_pipelines else [])
    speed = t.prefix[:, -1]  # one micro-batch through the whole model
    out, seen = [], set()
    for gp in gparts:
        for r in range(1, max_pipelines // len(gp) + 1):
            for chunked in (False, True):
                split = []
                for block in gp:
                    pipes: list[list[int]] = [[] for _ in range(r)]
                    for gi in block:  # fastest first: a group's r fastest in r pipelines
                        ds = sorted(groups[gi], key=lambda d: speed[d])
                        for j, d in enumerate(ds):  # or by speed, r contiguous chunks
                            pipes[j * r // len(ds) if chunked else j % r].append(int(d))
                    split += pipes
                key = frozenset(frozenset(p) for p in split)
                if 1 < len(split) <= t.microbatches and all(split) and key not in seen:
                    seen.add(key)
                    out.append(split)
    return out


def split_bound(t: Tables, split: list[list[int]]) -> float:
    """A lower bound on T for any chains and shares on this split: the fractional bound
    (``pipelines.fractional_bound``) over the at most U devices each pipeline can use (the
    exchange can be as cheap as its groups allow: not counted)."""
    return Estimator(t, np.zeros(t.num_devices, dtype=np.int64)).bound(split)


def rates(t: Tables) -> np.ndarray:
    """s_d of ``pipelines.fractional_bound``: d's speed against the fastest, per unit."""
    w = t.work.min(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(t.work > 0, w[:, None] / t.work, 1.0).min(axis=0)


def split_estimate(t: Tables, split: list[list[int]], gbytes: float, group: np.ndarray) -> float:
    """:meth:`Estimator.estimate` of one split."""
    return Estimator(t, group).estimate(split, gbytes)


class Estimator:
    """``split_bound`` and the screen's order of splits on one problem, with what every split
    shares computed once (rates, the most bandwidth from each device into each group, the
    slowest latency across groups). ``group`` [D]: each device's link group."""

    def __init__(self, t: Tables, group: np.ndarray):
        self.t, self.group = t, group
        self.rates = rates(t)
        self.work = float(t.work.min(axis=1).sum())
        self.credit = t.max_credit()  # zero bubble: its credit
        across = group[:, None] != group[None, :]
        self.cross = float(t.latency[across].max()) if across.any() else 0.0
        groups = int(group.max()) + 1
        self.to_group = np.zeros((t.num_devices, groups))  # [d, h]: most bandwidth d -> h
        for h in range(groups):
            self.to_group[:, h] = t.bandwidth[:, group == h].max(axis=1)

    def bound(self, split: list[list[int]]) -> float:
        t = self.t
        cap = sum(np.sort(self.rates[s])[::-1][: t.num_units].sum() for s in split)
        return t.microbatches * self.work / cap + t.sync_s - self.credit

    def estimate(self, split: list[list[int]], gbytes: float) -> float:
        """The order in which the screen tries splits: ``split_bound`` plus an estimate of the
        cheaper exchange. Direct: pipeline i's devices send every other pipeline all G
        gradient bytes, spread over its n_i <= U devices, at their best bandwidth. Through the
        groups: each group sends G once to every other group the split uses, spread over its
        devices there (at most U per pipeline), and twice G (k - 1) / k inside among its k
        pipelines."""
        t, group, bw = self.t, self.group, self.t.bandwidth
        order = np.concatenate(split)
        starts = np.cumsum([0] + [len(x) for x in split[:-1]])
        most = np.maximum.reduceat(np.maximum.reduceat(bw[np.ix_(order, order)], starts,
                                                       axis=0), starts, axis=1)  # i -> j
        direct = 0.0
        for i, si in enumerate(split):
            total = sum(gbytes / top if (top := float(most[i, j])) > 0 else _INF
                        for j in range(len(split)) if i != j)
            direct = max(direct, total / min(t.num_units, len(si)))
        used = sorted({int(group[d]) for s in split for d in s})
        grouped = 0.0
        for g in used:
            mine = [[d for d in s if group[d] == g] for s in split]
            mine = [x for x in mine if x]
            n = sum(min(t.num_units, len(x)) for x in mine)
            inside = [d for x in mine for d in x]
            others = [h for h in used if h != g]
            cost = 0.0
            if others:  # every device of the other groups the split uses
                top = float(self.to_group[np.ix_(inside, others)].max())
                cost += (len(used) - 1) * gbytes / (n * top) if top > 0 else _INF
            if len(mine) > 1:
                top = float(bw[np.ix_(inside, inside)].max())
                cost += (2 * gbytes * (len(mine) - 1) / len(mine) / (n * top) if top > 0
                         else _INF)
            grouped = max(grouped, cost)
        if len(used) > 1:  # a message per other group, at least, over the slowest latency across
            grouped += (len(used) - 1) * self.cross
        # the fill and drain: p_i stages at m_i micro-batches take (m_i + p_i - 1) bottlenecks
        fill = (np.mean([min(t.num_units, len(s)) - 1 for s in split]) * len(split)
                / t.microbatches)
        # a pipeline across k groups hands off over k - 1 of their links, both ways, per
        # micro-batch
        span = max(len({int(group[d]) for d in s}) - 1 for s in split)
        cross = self.cross if span else 0.0
        return (self.bound(split) * (1 + fill) + min(direct, grouped)
                + 2 * span * cross * t.microbatches / len(split))
