"""Device orders for the heuristic (:mod:`skyjax.plan.search.heuristic`): the candidate orders
(``candidate_orders``: group path x fast-/slow-first), local search over orders, GPipe's
interleaved orders, and the checks that decide whether the last two steps run.

The chain DP finds the best plan on any subsequence of one device order, so the order decides
which device takes which block, and which device ends a link group's run (and so carries the
crossing to the next group: a slow carrier with one unit can set the bottleneck). Fast-first or
slow-first orders are often far from the best (docs/design.md: on a 96-unit chain over 16
devices in 6 speed classes the least bottleneck needs a mixed order).

Moves, first improvement, tried in this order: move the first device of a class to the end of
its group's run (a new carrier), then swap two devices of different classes (same group first).
Each trial is screened cheaply: one DP run at five caps around the incumbent's bottleneck (an
upper bound on the trial's best score); only a trial that beats the incumbent there gets a full
cap search. The work budget (in ~array elements) keeps the search deterministic and bounded.

``interleaved``: where memory binds under GPipe (every stage keeps m micro-batches, so a block's
memory depends on where it starts: at paper scale a 16 GiB device holds 17 sublayers only from
an intermediate sublayer on, 16 otherwise), a slow device holding one or two units between two
fast ones re-aligns their blocks. Fast-first and slow-first orders cannot place it there; an
order that puts the slowest devices of each run one after each of its fastest lets the chain DP
do so where it pays (paper GPipe m = 32: T 2.903 -> 2.885; its remaining gap is the bounds',
which do not see alignment).
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Iterator

import numpy as np

from skyjax.plan.pricing.cost import Solution, Tables

SCREEN_WORK = 1.2e7  # budget for screened trials, in ~array elements
SCREEN_TRIES = 400  # most trials screened
SCREEN_MAX_SIZE = 1.5e4  # devices x units above which the search is skipped (paper scale: the
# ~1 s goal leaves no room; its orders already keep regions together)
_SCREEN_CAPS = np.array([0.98, 0.99, 1.0, 1.01, 1.02])
_INF = math.inf
INTERLEAVE = 0.4  # share of each group's run (its slowest devices) placed between its fastest


def interleaved(order: list[int], group_of: np.ndarray, total: np.ndarray,
                share: float = INTERLEAVE) -> list[int]:
    """The order with, in each group's run, the slowest ``share`` of its devices placed one
    after each of the fastest (both fastest first), the rest after them (module doc)."""
    runs: list[list[int]] = []
    for d in order:
        if runs and group_of[runs[-1][-1]] == group_of[d]:
            runs[-1].append(d)
        else:
            runs.append([d])
    out = []
    for run in runs:
        k = int(round(share * len(run)))
        ranked = sorted(run, key=lambda d: (total[d], d))
        fast, slow = ranked[: len(run) - k], ranked[len(run) - k:]
        for j, d in enumerate(fast):
            out.append(d)
            if j < len(slow):
                out.append(slow[j])
        out += slow[len(fast):]
    return out


def memory_bound(t: Tables, sol: Solution) -> bool:
    """Whether memory stopped some stage of the plan from taking one more unit on a side."""
    p, u = len(sol.assignment), t.num_units
    for j, (d, a, b) in enumerate(sol.assignment):
        level = t.inflight(p - j)
        for x, y in ([(a - 1, b)] if a > 0 else []) + ([(a, b + 1)] if b < u else []):
            need = t.state_prefix[y] - t.state_prefix[x] + level * (t.act_prefix[y]
                                                                   - t.act_prefix[x])
            if need > t.memory[d]:
                return True
    return False


def _moves(order: list[int], class_of: np.ndarray, group_of: np.ndarray) -> Iterator[list[int]]:
    """Neighbouring orders (module doc)."""
    n = len(order)
    runs: list[tuple[int, int]] = []  # [start, end) of each group's run in the order
    start = 0
    for i in range(1, n + 1):
        if i == n or group_of[order[i]] != group_of[order[start]]:
            runs.append((start, i))
            start = i
    for a, b in runs:  # a new carrier at the end of the run
        seen = {int(class_of[order[b - 1]])}
        for i in range(a, b - 1):
            c = int(class_of[order[i]])
            if c in seen:
                continue
            seen.add(c)
            yield order[:i] + order[i + 1:b] + [order[i]] + order[b:]
    pairs = sorted(itertools.combinations(range(n), 2),
                   key=lambda ij: group_of[order[ij[0]]] != group_of[order[ij[1]]])
    for i, j in pairs:
        if class_of[order[i]] != class_of[order[j]]:
            trial = list(order)
            trial[i], trial[j] = trial[j], trial[i]
            yield trial


def screen(dp, top, m: int) -> bool:
    """Whether an order's chain DP (:class:`skyjax.plan.search.chain_dp.ChainDP`) beats the
    incumbent cap search ``top`` at five caps around its bottleneck (upper bounds on its best
    score)."""
    caps = top.cap * _SCREEN_CAPS if m > 1 and np.isfinite(top.cap) else np.array([np.inf])
    run = dp.run(caps)  # as _CapSearch scores
    quick = run + (m - 1) * caps if np.isfinite(caps).all() else run * m
    return bool(quick.min() < top.score * (1 - 1e-9))


def improve(top, make: Callable, class_of: np.ndarray, group_of: np.ndarray, m: int,
            num_units: int):
    """A cap search (``heuristic._CapSearch``) at least as good as ``top``, by local search over
    orders. ``make(order, best)`` builds and refines a cap search for an order."""
    n = len(top.dp.order)
    per_try = n * (3000 + (len(_SCREEN_CAPS) + 1) * num_units)
    budget = min(SCREEN_TRIES, int(SCREEN_WORK // per_try)) if n * num_units <= SCREEN_MAX_SIZE \
        else 0
    improved = True
    while improved and budget > 0 and np.isfinite(top.score):
        improved = False
        for trial in _moves(list(top.dp.order), class_of, group_of):
            if budget <= 0:
                break
            budget -= 1
            if not screen(type(top.dp)(top.dp.t, trial, group_of, top.dp.groups, class_of,
                                       top.dp.links), top, m):
                continue
            cs = make(trial, top.score)
            if cs.feasible and cs.score < top.score * (1 - 1e-9):
                top, improved = cs, True
                break
    return top


def overcharged(t: Tables, order: list[int], sol: Solution) -> bool:
    """Whether the chain DP's in-flight count (min(m, devices left in the order)) bound the
    plan: some stage charged more than its true level min(m, stages from it to the end) could,
    at its true level, take one more unit on a side where the charged level stopped it. If not,
    no stage of this plan was shaped by the inflated count and the heuristic skips its fastest
    subsets (paper case, m = 8: 0.5 s saved; a cheap test, not a proof that subsets cannot
    help)."""
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
