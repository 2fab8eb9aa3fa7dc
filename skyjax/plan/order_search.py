"""Local search over device orders for the heuristic (:mod:`skyjax.plan.heuristic`).

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
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterator

import numpy as np

SCREEN_WORK = 1.2e7  # budget for screened trials, in ~array elements
SCREEN_TRIES = 400  # most trials screened
SCREEN_MAX_SIZE = 1.5e4  # devices x units above which the search is skipped (paper scale: the
# ~1 s goal leaves no room; its orders already keep regions together)
_SCREEN_CAPS = np.array([0.98, 0.99, 1.0, 1.01, 1.02])


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
        caps = top.cap * _SCREEN_CAPS if m > 1 and np.isfinite(top.cap) else np.array([np.inf])
        for trial in _moves(list(top.dp.order), class_of, group_of):
            if budget <= 0:
                break
            budget -= 1
            dp = type(top.dp)(top.dp.t, trial, group_of, top.dp.groups, class_of)
            run = dp.run(caps)  # upper bounds on the trial's score, as _CapSearch scores
            quick = run + (m - 1) * caps if np.isfinite(caps).all() else run * m
            if not quick.min() < top.score * (1 - 1e-9):
                continue
            cs = make(trial, top.score)
            if cs.feasible and cs.score < top.score * (1 - 1e-9):
                top, improved = cs, True
                break
    return top
