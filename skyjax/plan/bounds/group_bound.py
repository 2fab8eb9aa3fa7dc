"""A lower bound on T that counts region crossings, whole blocks and 1F1B's in-flight levels,
cheap enough to run on every plan.

``bounds.lower_bound`` splits the work fractionally over devices and charges at most one
region crossing. On clusters of several regions whose links are slow, the best plan crosses
several times, its stages hold whole contiguous blocks, and under 1F1B a stage's memory depends
on its place in the pipeline. ``group_bound`` keeps all three, still as a relaxation of the cost
model, so it is a proof, not an estimate; the terms per set of link groups visited live in
:mod:`skyjax.plan.bounds.group_terms`.

T >= sum t_k + (m - 1) B + update floor + sync. The sum bound does not increase with B, so on
an interval [B_i, B_j] the bound is sum(B_j) + (m - 1) B_i; intervals are split where the bound
is lowest (a small branch and bound over B), and B above the plan's T / (m - 1) cannot hold the
optimum. Zero bubble: T + credit obeys all of the above with memory at the schedule's least
in-flight count (``Tables.least_inflight``), and the credit is at most ``Tables.max_credit``, so
the bound is the one on T + credit less that (docs/design.md, "Planning", "Lower bounds").
"""

from __future__ import annotations

import math

import numpy as np

from skyjax.plan.bounds.group_terms import GroupBound
from skyjax.plan.pricing.cost import Tables

ROUNDS, SPLIT, KEEP = 10, 8, 3  # branch and bound over B: rounds, pieces per split, splits
_INF = math.inf


def group_bound(t: Tables, upper: float = _INF, gb: GroupBound | None = None) -> float:
    """A lower bound on T over all plans (module doc); ``upper``: a known plan's T. ``gb``: the
    caller's ``GroupBound(t)``, to share with the other bounds (its ``b_grid`` is set here).
    Zero bubble: the bound on T + credit, less ``Tables.max_credit`` (at least any plan's)."""
    credit = t.max_credit()
    return _group_bound(t, upper + credit, gb) - credit


def _group_bound(t: Tables, upper: float, gb: GroupBound | None) -> float:
    """``group_bound`` without the zero-bubble credit."""
    gb = GroupBound(t) if gb is None else gb
    if not gb.ok:
        return _INF
    m = t.microbatches
    first = float((t.update_call + t.update_prefix[:, min(1, t.num_units)]).min())
    const = first + t.sync_s
    g_n = len(gb.groups)
    terms = [x for s in gb.subsets() for x in gb.cases(s, len(s) == g_n)]
    if not terms:
        return _INF
    inf_cap = gb.capacities(np.array([_INF]))
    top = gb.sum_bounds(terms, np.array([_INF]), inf_cap)[:, 0]
    if m == 1 or not np.isfinite(top).any():
        return float(top.min()) + const
    floors = np.array([x[4] for x in terms])
    lo = float(floors.min())
    upper = upper - const
    if np.isfinite(upper):  # a plan with B > hi has T > upper: it cannot be the optimum
        hi, tail = (upper - gb.total) / (m - 1), _INF
        if hi <= lo:
            return upper + const
    else:  # B >= hi: sum >= top
        hi = lo + float(top[np.isfinite(top)].max())
        tail = float(top.min()) + (m - 1) * hi
    return min(_bound_over_b(gb, terms, floors, m, lo, hi), tail) + const


def _bound_over_b(gb: GroupBound, terms, floors: np.ndarray, m: int, lo: float,
                  hi: float) -> float:
    """min over S and B in [lo, hi] of sum_S(B) + (m - 1) B, by interval branch and bound: on
    [B_i, B_j] sum_S(B_j) + (m - 1) max(B_i, floor_S) is a bound (module doc)."""

    def evaluate(b: np.ndarray) -> np.ndarray:
        return gb.sum_bounds(terms, b, gb.capacities(b))  # [S, K]

    def lows() -> np.ndarray:
        left = np.maximum(pts[None, :-1], floors[:, None])
        return (vals[:, 1:] + (m - 1) * left).min(axis=0)

    pts = np.geomspace(lo, hi, 4 * SPLIT + 1)
    vals = evaluate(pts)
    for _ in range(ROUNDS):
        low = lows()
        order = np.argsort(low)[:KEEP]
        if pts[order[0] + 1] - pts[order[0]] <= 1e-7 * pts[order[0]]:
            break
        new = np.concatenate([np.linspace(pts[i], pts[i + 1], SPLIT + 1)[1:-1] for i in order])
        pts = np.concatenate([pts, new])
        vals = np.concatenate([vals, evaluate(new)], axis=1)
        o = np.argsort(pts, kind="stable")
        pts, vals = pts[o], vals[:, o]
    gb.b_grid = (pts, vals)
    return float(lows().min())
