"""The restricted master LP of the chain's column generation
(:mod:`skyjax.plan.certificates.chain_prices`): prices for device kinds from the paths found so
far, by a small dense simplex. Any prices give a valid bound, so it only has to be good, not
exact.
"""

from __future__ import annotations

import math

import numpy as np

_INF = math.inf


def master_prices(costs: np.ndarray, cols: np.ndarray, n: np.ndarray, big: float,
                  box: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, float]:
    """Prices from the restricted master max_mu min_p cost_p + mu . (cols_p - n) over the
    paths found, mu in box [l, u] (default [0, inf)), by a small dense simplex on its dual:
    min sum_p x_p cost'_p + w . (u - l), sum_p x_p cols_p - w <= n, sum_p x_p = 1, x, w >= 0,
    with cost'_p = cost_p + l . (cols_p - n) and a column using every device at cost ``big`` (a
    sum above which the bound is decided; the master is always feasible). Returns the prices
    (l + the duals of the count rows) and the master's value. Any prices give a valid bound,
    so the iteration cap only costs tightness."""
    c_n, p_n = len(n), len(costs)
    low, up = box if box is not None else (np.zeros(c_n), np.full(c_n, _INF))
    fin = np.isfinite(up)
    a = np.zeros((c_n + 1, p_n + 2 * c_n + 1))
    a[:c_n, :p_n], a[c_n, :p_n] = cols.T, 1.0
    a[:c_n, p_n: p_n + c_n] = np.eye(c_n)  # slacks
    a[:c_n, p_n + c_n: p_n + 2 * c_n] = -np.eye(c_n)  # w: the box's upper side
    a[:c_n, -1], a[c_n, -1] = n, 1.0
    c = np.concatenate([costs + (cols - n) @ low, np.zeros(c_n),
                        np.where(fin, up - low, 0.0), [big]])
    keep = np.concatenate([np.ones(p_n + c_n, bool), fin, [True]])
    a, c = a[:, keep], c[keep]
    rhs = np.concatenate([n, [1.0]])
    basis = [p_n + i for i in range(c_n)] + [a.shape[1] - 1]
    y, x = np.zeros(c_n + 1), rhs
    tol = 1e-12 * max(1.0, abs(big))
    for _ in range(8 * a.shape[1]):
        bm = a[:, basis]
        try:
            x = np.linalg.solve(bm, rhs)
            y = np.linalg.solve(bm.T, c[basis])
        except np.linalg.LinAlgError:
            break
        red = c - a.T @ y
        q = int(np.argmin(red))
        if red[q] >= -tol:
            break
        d = np.linalg.solve(bm, a[:, q])
        pos = d > 1e-12
        if not pos.any():
            break
        ratio = np.where(pos, x / np.where(pos, d, 1.0), _INF)
        basis[int(np.argmin(ratio))] = q
    return np.minimum(low + np.maximum(-y[:c_n], 0.0), up), float(c[basis] @ x)
