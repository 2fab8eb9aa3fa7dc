"""Lower bounds on the step time T and on the bottleneck max_k t_k, over all plans.

The heuristic search cannot prove its plans optimal; these bounds say how far from optimal they
can be (``Plan.lower_bound_s``), and a plan that meets its bound is reported exact.

``lower_bound``: a fractional relaxation (work split over devices by speed and memory, comm
dropped except one region crossing), solved through its Lagrangian dual (``_relaxed_bound``).
``min_bottleneck``: the least cap on every stage time at which that relaxation can still hold all
the work; the heuristic's cap search starts there.
"""

from __future__ import annotations

import math

import numpy as np

from skyjax.plan.pricing.classes import labels, link_groups
from skyjax.plan.pricing.cost import Tables

_INF = math.inf


def lower_bound(t: Tables) -> float:
    """A lower bound on T over all plans.

    A plan either stays inside one link group (region) or crosses between groups, and then one
    stage pays at least the cheapest crossing c (2 (latency + least output bytes / bandwidth)):
    min(min over groups of _relaxed_bound(group), _relaxed_bound(all, tau >= c) + c). Zero
    bubble: less ``Tables.max_credit``, at least what any plan's credit takes off its T.
    """
    groups = link_groups(t)
    best = min(_relaxed_bound(t, np.array(g)) for g in groups) + fixed_floor(t)
    if len(groups) > 1 and t.num_units > 1:
        gid = labels(groups, t.num_devices)
        cross = gid[:, None] != gid[None, :]
        bw = np.where(cross & (t.bandwidth > 0), t.bandwidth, np.nan)
        if np.isfinite(bw).any():
            c = 2 * float(np.nanmin(t.latency + t.least_bytes.min() / bw))
            best = min(best, _relaxed_bound(t, np.arange(t.num_devices), c) + c
                       + fixed_floor(t))
    return best - t.max_credit()


def fixed_floor(t: Tables) -> float:
    """What the fixed costs add to any plan's T at least: every t_k pays some device's call
    costs, so sum t_k + (m - 1) max t_k grows by >= m min_d fixed_d over the relaxation (which
    leaves them out); the first stage's update (of unit 0 at least) and the synchronisation."""
    first = float((t.update_call + t.update_prefix[:, min(1, t.num_units)]).min())
    return t.microbatches * float(t.fixed.min()) + first + t.sync_s


def _relaxation(t: Tables, devices: np.ndarray):
    """(W, tau_min, sigma, cap, count) of the fractional relaxation on these devices, per
    distinct (sigma, cap); None if no device can hold a single unit."""
    state, act = np.diff(t.state_prefix), np.diff(t.act_prefix)
    need = state + t.least_inflight * act
    usable = devices[[bool((need <= t.memory[d]).any()) for d in devices]]
    if not len(usable):
        return None
    w = t.work[:, usable]
    w_ref = w.min(axis=1)
    pos = w_ref > 0
    total, tau_min = float(w_ref.sum()), float(w_ref.max())
    if not pos.any():
        return total, tau_min, np.zeros(1), np.full(1, _INF), np.ones(1)
    sigma = (w[pos] / w_ref[pos, None]).min(axis=0)
    # fractional knapsack: the most reference work a device's memory can hold
    dens = np.argsort(need[pos] / w_ref[pos], kind="stable")
    cum_need = np.concatenate([[0.0], np.cumsum(need[pos][dens])])
    cum_work = np.concatenate([[0.0], np.cumsum(w_ref[pos][dens])])
    cap = np.interp(t.memory[usable], cum_need, cum_work)
    kinds, count = np.unique(np.stack([sigma, cap], axis=1), axis=0, return_counts=True)
    return total, tau_min, kinds[:, 0], kinds[:, 1], count


def min_bottleneck(t: Tables) -> float:
    """A lower bound on max_k t_k: the least tau at which the relaxation can hold all work."""
    rel = _relaxation(t, np.arange(t.num_devices))
    if rel is None:
        return _INF
    return _min_relaxed_bottleneck(rel) + float(t.fixed.min())


def _min_relaxed_bottleneck(rel) -> float:
    total, tau_min, sig, cap, count = rel
    if sig.min() == 0:
        return tau_min
    held = lambda tau: float(count @ np.minimum(cap, tau / sig))  # noqa: E731
    target = total * (1 - 1e-12)
    lo, hi = tau_min, max(tau_min, float(sig.max() * cap.max()) * 2 + tau_min)
    if held(hi) < target:
        return _INF
    if held(lo) >= target:
        return lo
    for _ in range(100):  # invariant: held(lo) < target <= held(hi)
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if held(mid) >= target else (mid, hi)
    return lo


def _relaxed_bound(t: Tables, devices: np.ndarray, tau_floor: float = 0.0) -> float:
    """A lower bound on T for plans on these devices: a fractional relaxation via its dual.

    w_ref[u] = least time of unit u on any device; device d is at least sigma_d = min_u w[u, d] /
    w_ref[u] times slower, and its memory holds at most cap_d seconds of reference work (fractional
    knapsack of need_u = state + inflight x activations, inflight ``Tables.least_inflight``: m for
    GPipe, 1 for 1F1B and ZB-H1, min(m, 2) for ZB-H2). Relaxation: reference work W = sum w_ref is
    split into x_d >= 0 with x_d <= cap_d and sigma_d x_d <= tau (tau >= max_u w_ref[u], the
    bottleneck); T >= min sum_d sigma_d x_d + (m - 1) tau. Comm, granularity and order are dropped.
    The LP's Lagrangian dual g(lambda) = lambda W + min_tau [(m - 1) tau - sum_d (lambda -
    sigma_d)^+ min(cap_d, tau / sigma_d)] is a valid bound for every lambda (weak duality); the
    inner minimum is exact (piecewise linear in tau, breakpoints tau_min and sigma_d cap_d) and the
    concave g is maximised by golden-section search. Devices that cannot hold any single unit are
    left out.
    """
    m = t.microbatches
    rel = _relaxation(t, devices)
    if rel is None:
        return _INF
    total, tau_min, sig, cap, count = rel
    tau_min = max(tau_min, tau_floor)
    if sig.min() == 0:
        return (m - 1) * tau_min
    taus = np.concatenate([[tau_min], (sig * cap)[np.isfinite(cap)]])
    taus = np.unique(taus[taus >= tau_min])
    held = np.minimum(cap[None, :], taus[:, None] / sig[None, :])  # [tau, kind]
    slope = np.where(np.isfinite(cap), 0.0, count / sig)  # held beyond the last breakpoint

    def dual(lam: float) -> float:
        gain = count * np.maximum(lam - sig, 0.0)
        if (m - 1) - slope @ np.maximum(lam - sig, 0.0) < -1e-12:
            return -_INF  # inner minimum unbounded below
        return float(lam * total + ((m - 1) * taus - held @ gain).min())

    lo, hi = float(sig.min()), float(sig.max()) * (m + 1)
    best = max(dual(lo), total)  # lambda = sigma_min gives at least sum of w_ref
    phi = (math.sqrt(5) - 1) / 2
    a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
    fa, fb = dual(a), dual(b)
    for _ in range(80):
        best = max(best, fa, fb)
        if fa < fb:
            lo, a, fa = a, b, fb
            b = lo + phi * (hi - lo)
            fb = dual(b)
        else:
            hi, b, fb = b, a, fa
            a = hi - phi * (hi - lo)
            fa = dual(a)
    return max(best, fa, fb)
