"""The chain relaxation behind ``chain_bound`` (GPipe): device kinds priced along an exact chain
of blocks, and its least priced path at a cap B (:class:`PricedChain`).

``group_bound`` fills the work fractionally over devices, so it cannot see that stages hold
whole blocks that must line up with memory (a fast device holds 17 units of one alignment and
16 of the other), that a crossing's stage loses the crossing's comm from its budget B, or that
a device used for a small carrier is gone for a big block. The chain keeps all of that exactly
and relaxes only which device of a kind each stage uses (and links to their least per cut):

* Kinds: usable devices with equal prefix rows, call costs and memory (c = 1..C, N_c of
  them, pooled over all link groups). Every plan is a chain of stages over the units; stage k
  is a block [a, e) on a device of some kind c with t_k = compute + in-message (a > 0) + comm
  out.
* Comm out to a device of the same link group costs at least the least intra link at cut e
  (``GroupBound.intra``, min over groups), to another group at least the least crossing
  (``GroupBound.cross``, min over group pairs), plus the device's message calls; the last
  stage has none. Memory is checked at GPipe's m in flight on kind c's memory.
* A plan visiting all G link groups has at least K = G - 1 crossings. So with every
  t_k <= B, its relaxed chain is a path of the DP over (unit, crossings so far capped at K)
  that ends at (U, K), uses only blocks whose relaxed time is <= B, and uses kind c at most
  N_c times.
* Weak duality: for ANY prices mu >= 0,

      sum_k t_k >= sum_k r_k >= sum_k (r_k + mu_{c_k}) - mu . N >= DP_mu(B) - mu . N,

  with r_k the relaxed stage times and DP_mu(B) the least priced path. So every priced DP
  gives a valid bound on the sum of stage times; good prices only make it tighter
  (:mod:`skyjax.plan.certificates.chain_prices` finds them).

docs/design.md, "Planning", "Lower bounds", places this among the planner's bounds.
"""

from __future__ import annotations

import math

import numpy as np

from skyjax.plan.bounds.group_terms import GroupBound

_INF = math.inf
MAX_CELLS = 400_000  # kinds x units x longest block (x 2 x prices per pass): else not ok
TOL = 1e-12  # relative slack that only admits more paths (a lower bound stays valid)


class PricedChain:
    """The least priced chain of blocks (module doc) at a cap B, for a batch of prices."""

    def __init__(self, gb: GroupBound, hi: float, crossings: int | None = None):
        t = gb.t
        self.gb, u = gb, t.num_units
        self.k = len(gb.groups) - 1 if crossings is None else crossings
        devs = np.concatenate(gb.groups)
        key = np.concatenate([t.prefix[devs], t.fixed[devs, None], t.in_msg[devs, None],
                              t.memory[devs, None]], axis=1)
        _, first, counts = np.unique(key, axis=0, return_index=True, return_counts=True)
        self.rep, self.n = devs[first], counts.astype(float)
        need = t.state_prefix + t.microbatches * t.act_prefix
        cut = np.arange(1, u + 1)  # block end e; the cut after it is e (index e - 1)
        g_n = len(gb.groups)
        cross = (np.min([gb.cross[a, b] for a in range(g_n) for b in range(g_n) if a != b],
                        axis=0) if self.k and g_n > 1 else np.full(u - 1, _INF))
        intra = gb.intra.min(axis=0)
        pre = t.prefix[self.rep]  # [C, U + 1]
        fixed, msg = t.fixed[self.rep, None], t.in_msg[self.rep, None]
        # longest block that fits memory on some kind and time <= hi on it
        mem = t.memory[self.rep, None] * (1 + TOL) + 0.5
        lo_mem = np.searchsorted(need, need[None, cut] - mem, "left")  # [C, U]
        lo_time = np.stack([np.searchsorted(p, p[cut] - (hi - f) * (1 + TOL), "left")
                            for p, f in zip(pre, fixed[:, 0])])
        self.lmax = int(max((cut[None] - np.maximum(lo_mem, lo_time)).max(), 1))
        self.ok = len(self.rep) * u * self.lmax <= MAX_CELLS
        if not self.ok:
            return
        length = np.arange(1, self.lmax + 1)
        start = cut[:, None] - length[None, :]  # [U, L]
        valid = (start >= 0)[None] & (need[None, cut, None] - need[np.maximum(start, 0)][None]
                                      <= mem[:, :, None])
        comp = (pre[:, cut, None] - pre[:, np.maximum(start, 0)] + fixed[:, :, None]
                + np.where(start > 0, msg[:, :, None], 0.0))
        last = cut == u
        out0 = np.where(last, 0.0, np.concatenate([intra, [0.0]])[None] + msg)  # [C, U]
        out1 = np.where(last, _INF, np.concatenate([cross, [_INF]])[None] + msg)
        self.cost = np.stack([np.where(valid, comp + o[:, :, None], _INF) for o in (out0, out1)])
        self.cost = np.moveaxis(self.cost, 2, 0)  # [U, 2, C, L]: per end, dj, kind, length

    def price(self, mu: np.ndarray, caps: np.ndarray):
        """For prices mu [P, C], each at its cap: the least priced path value less mu . N [P]
        (a bound on sum t_k), and per price its path's kind counts [P, C], unpriced sum [P] and
        largest stage [P] (inf where no path)."""
        u, k, lm = self.cost.shape[0], self.k, self.lmax
        n_p, c_n = mu.shape
        lim = (caps * (1 + TOL))[None, :, None, None, None]
        cost = np.where(self.cost[:, None] <= lim, self.cost[:, None], _INF)  # [U, P, 2, C, L]
        cost = np.ascontiguousarray((cost[..., ::-1] + mu[None, :, None, :, None])[:, :, :, None])
        # rounding is monotone, so min_c fl(f + x_c) = fl(f + min_c x_c): the kinds' least
        # priced block per (end, length) first, then one add per length in the loop
        least = np.ascontiguousarray(cost.min(axis=-2))  # [U, P, 2, 1, L]
        f = np.full((n_p, k + 1, lm + u + 1), _INF)  # f[:, j, lm + x]: unit x, j crossings
        f[:, 0, lm] = 0.0
        won = np.zeros((u, n_p, 2, k + 1))  # per end: best per (dj, source crossings)
        for e in range(1, u + 1):
            prev = f[:, None, :, e: e + lm]  # [P, 1, K + 1, L]: starts e - lm .. e - 1
            best = won[e - 1] = (prev + least[e - 1]).min(axis=-1)
            col = f[:, :, lm + e]
            col[:, 0] = best[:, 0, 0]
            if k:
                np.minimum(best[:, 0, 1:], best[:, 1, :-1], out=col[:, 1:])
                np.minimum(col[:, k], best[:, 1, k], out=col[:, k])
            f[:, :, lm + e] = col
        val = f[:, k, lm + u] - mu @ self.n
        counts = np.zeros_like(mu)
        total, top = np.zeros(n_p), np.full(n_p, _INF)
        for p in np.flatnonzero(np.isfinite(val)):
            counts[p], total[p], top[p] = self._path(f[p], won[:, p], cost[:, p, :, 0],
                                                     mu[p])
        return val, counts, total, top

    def _path(self, f: np.ndarray, won: np.ndarray, priced: np.ndarray, mu: np.ndarray):
        """Walk one DP back from (U, K) (won: [U, 2, K + 1] per end the best per move; priced:
        [U, 2, C, L]): kind counts, unpriced sum, largest stage."""
        u, k, lm = priced.shape[0], self.k, self.lmax
        counts, total, top = np.zeros(len(mu)), 0.0, 0.0
        e, j = u, k
        while e > 0:
            src = [(0, j)] + ([(1, j - 1)] if j >= 1 else []) + ([(1, k)] if j == k and k else [])
            dj, js = min(src, key=lambda x: won[e - 1, x[0], x[1]])
            c, i = divmod(int(np.argmin(f[js, e: e + lm][None] + priced[e - 1, dj])), lm)
            stage = float(priced[e - 1, dj, c, i] - mu[c])
            counts[c] += 1
            total, top, j = total + stage, max(top, stage), js
            e -= lm - i
        return counts, total, top

