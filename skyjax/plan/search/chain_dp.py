"""The heuristic's chain DP (:mod:`skyjax.plan.search.heuristic`, step 2): for a fixed device order
and a batch of caps on every stage time, the least sum of stage times (plus the first stage's
update) of any plan whose stages run on a subsequence of the order, under memory; and the plan
itself.

O(n U log U) per cap: a forward DP over the order whose inner step is vectorised over units,
caps and destination groups (windows from cap and memory, sparse-table range minima); runs of
identical devices that stop improving are skipped. For 1F1B it charges min(m, devices left in
the order) in-flight micro-batches, which is exact when the order's tail is used and otherwise
safe (never more than the true count). A step costs mostly numpy calls (paper scale: ~25 of
them on arrays of a few thousand elements), so everything that does not depend on the DP's
state is computed once per run (per device and link row) or once per DP (per device).
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np

from skyjax.plan.pricing.classes import worst_link
from skyjax.plan.pricing.cost import Solution, Tables, stage_costs

_INF = math.inf


def _read_offsets(u: int, plane: int) -> tuple[np.ndarray, np.ndarray]:
    """For ``ChainDP``'s range minima, indexed by (range length + u), lengths -u .. u (<= 0:
    empty): the sparse table's level l = floor(log2(length)) + 1 (level 0, all inf, when empty)
    times the plane size, and that plus 1 - 2^(l - 1) (where the second read starts, from the
    range's last index)."""
    length = np.arange(-u, u + 1)
    lvl = np.zeros(len(length), dtype=np.int64)
    pos = length > 0
    lvl[pos] = np.floor(np.log2(length[pos])).astype(np.int64) + 1
    span = np.where(lvl > 0, np.left_shift(1, np.maximum(lvl - 1, 0)), 1)
    return lvl * plane, lvl * plane + 1 - span


def group_links(t: Tables, groups: list[list[int]]) -> np.ndarray:
    """[G, G, U-1]: comm of a stage ending at cut c on a device of group g whose next stage is
    in group h (the pair's worst link; inf where unreachable or g = h has a single device)."""
    comm = np.full((len(groups), len(groups), max(t.num_units - 1, 0)), _INF)
    for g, h in itertools.product(range(len(groups)), range(len(groups))):
        lat, bw = worst_link(t, groups[g], groups[h])
        if bw > 0:  # with codecs, each group's slowest coder (an upper bound, as worst_link)
            comm[g, h] = t.crossing_s(lat, bw, t.codec_rate[:, groups[g]].max(axis=1),
                                      t.codec_rate[:, groups[h]].max(axis=1))
    return comm


class ChainDP:
    """DP over a fixed device order, stages on any subsequence of it (module doc).

    arrive[g][k, b]: least sum of the stages before unit b (comm into the next stage included)
    when the stage starting at b runs on a device of link group g not yet processed, for cap k.
    Each device i in order turns arrive[g_i] into arrivals for every later group with one
    vectorised step: a window [lo(c), c) of starts per end c (from the cap and memory) and a
    sparse-table range minimum. When a device changes nothing, the identical devices that follow
    it (same class, same memory window) would change nothing either and are skipped. Each step
    works only on the starts earlier stages reach and the ends within a block of them (the
    sparse table gets as many levels as the longest block needs).

    A step's cost is mostly numpy calls, so what does not depend on arrive is computed once per
    run: windows by time per device and distinct link row (``_rows_raw``), then per kind of
    step (``kind``: device, memory window, group, later groups) with memory
    (``_windows``), and the stages that start the chain once per device, group and later
    groups (``_first_rows``; applied once: arrive only falls). Groups are labelled by their
    last position in the order, so a step's later groups are a slice of arrive; later groups
    with the same links from g share one window computation (paper scale: all cross-region
    links alike). The sparse table keeps starts at their own columns in one buffer per run, so
    a range minimum is two flat reads at offsets looked up by length (``_read_offsets``).
    """

    def __init__(self, t: Tables, order: Sequence[int], group_of: np.ndarray,
                 groups: list[list[int]], class_of: np.ndarray | None = None,
                 links: np.ndarray | None = None):
        """``links``: ``group_links(t, groups)`` when the caller has it (else computed)."""
        self.t, self.order, self.groups = t, list(order), groups
        u, n = t.num_units, len(self.order)
        self.pre = t.prefix[self.order]  # [n, U+1]
        self.fixed = t.fixed[self.order]  # per stage: call costs
        self.inmsg = t.in_msg[self.order]  # per stage that does not start the chain
        # per stage that starts the chain, ending at c: update_0 (Tables.first_update)
        self.first_extra = t.update_call[self.order][:, None] + t.update_prefix[self.order]
        self.first_extra[:, u] += t.alone[self.order]  # a stage that also ends it: one stage
        orig = [int(group_of[d]) for d in self.order]
        last_at = {g: i for i, g in enumerate(orig)}
        present = sorted(last_at, key=last_at.get)  # label = rank of the group's last position
        self.gid = [present.index(g) for g in orig]
        self.n_groups = len(present)
        # groups with a device after position i: labels later_from[i] .. n_groups - 1
        self.later_from = [sum(last_at[g] <= i for g in present) for i in range(n)]
        self.mem_lo = np.empty((n, u + 1), dtype=np.int64)  # least start b of a block ending at c
        mem_of: dict[tuple, np.ndarray] = {}
        for i, d in enumerate(self.order):
            key = (int(t.inflight(n - i)), float(t.memory[d]))
            if key not in mem_of:
                q = t.state_prefix + key[0] * t.act_prefix
                mem_of[key] = np.searchsorted(q, q - key[1], "left")
            self.mem_lo[i] = mem_of[key]
        self.mem1 = np.maximum(self.mem_lo[:, 1:u], 1)  # least start of a block ending at c
        self.mem_longest = [int((np.arange(u - 1) - np.maximum(lo[1:u], 1)).max()) + 1
                            if u > 1 else 1 for lo in self.mem_lo]  # longest block memory allows
        # a stage starting the chain, [0, c), fits in memory for c = 1 .. first_ends[i]
        self.first_ends = [int(np.searchsorted(lo[1:u], 1, "left")) for lo in self.mem_lo]
        self.max_first = max(self.first_ends)
        cls = np.arange(t.num_devices) if class_of is None else class_of
        self.same_as_prev = [i > 0 and cls[self.order[i]] == cls[self.order[i - 1]]
                             and np.array_equal(self.mem_lo[i], self.mem_lo[i - 1])
                             for i in range(n)]
        self.links = group_links(t, groups) if links is None else links
        self.comm = self.links[np.ix_(present, present)]  # [G, G, U-1] in local labels
        # devices alike (times, calls, first-stage update), memory windows, link rows; a kind
        # of step is all of them with the group and the later groups
        ids: dict = {}
        self.base = [ids.setdefault((self.pre[i].tobytes(), float(self.fixed[i]),
                                     float(self.inmsg[i]), self.first_extra[i].tobytes()),
                                    len(ids)) for i in range(n)]
        rid: dict[bytes, int] = {}
        self.rows: dict[tuple[int, int], tuple[list[int], np.ndarray | None]] = {}
        for g, s in set(zip(self.gid, self.later_from)):
            if s < self.n_groups:
                ids_gs = [rid.setdefault(r.tobytes(), len(rid)) for r in self.comm[g, s:]]
                uniq = list(dict.fromkeys(ids_gs))
                inv = np.array([uniq.index(r) for r in ids_gs])
                self.rows[g, s] = uniq, (None if len(uniq) == len(inv) else inv)
        self.row_of = {r: np.frombuffer(b) for b, r in rid.items()}
        kinds: dict = {}
        self.kind = [kinds.setdefault((self.base[i], self.mem_lo[i].tobytes(), self.gid[i],
                                       self.later_from[i]), len(kinds)) for i in range(n)]
        self._reach: dict[tuple, np.ndarray] = {}

    def _reach_row(self, i: int, r: int) -> np.ndarray:
        """P[c] + comm (link row r) + calls for blocks ending at c = 1 .. U-1 on device i: its
        action calls and, since such a block sends, its outgoing message calls (``in_msg``)."""
        key = (self.base[i], r)
        if key not in self._reach:
            u = self.t.num_units
            self._reach[key] = self.pre[i][1:u] + self.row_of[r] + self.fixed[i] + self.inmsg[i]
        return self._reach[key]

    def _reach_rows(self, i: int) -> np.ndarray:
        """``_reach_row`` for each distinct link row to device i's later groups: [H', U-1]."""
        key = (self.base[i], self.gid[i], self.later_from[i])
        if key not in self._reach:
            uniq = self.rows[key[1:]][0]
            self._reach[key] = np.stack([self._reach_row(i, r) for r in uniq])
        return self._reach[key]

    def _windows(self, i: int, caps: np.ndarray, rowoff: np.ndarray, raw: dict) -> tuple:
        """A kind's windows for these caps: starts allowed for the stage that ends the chain
        ([K, 1], plus row offsets), the least start per distinct later link row, cap and end
        ([H', K, U-1], memory and start >= 1 included, plus row offsets), the longest block,
        a stage that holds all units, ``_reach_rows`` and which later group takes which row.
        ``raw``: per run, what memory does not change."""
        u, pre, mlo = self.t.num_units, self.pre[i], self.mem_lo[i]
        fix, inm, extra, base = self.fixed[i], self.inmsg[i], self.first_extra[i], self.base[i]
        if base not in raw:
            raw[base] = np.searchsorted(pre, pre[u] + fix + inm - caps, "left")
        lo_l = np.minimum(np.maximum(raw[base], max(int(mlo[u]), 1)), u)
        longest = u - int(lo_l.min())
        lo_l = lo_l[:, None] + rowoff
        whole = self._first0(pre[u] + fix, extra[u], 0, caps) if mlo[u] == 0 else None
        g, s = self.gid[i], self.later_from[i]
        if s >= self.n_groups or u < 2:
            return lo_l, None, max(longest, 1), whole, None, None
        if (base, g, s) not in raw:
            raw[base, g, s] = self._rows_raw(i, caps, rowoff, raw)
        lo_t, long_t = raw[base, g, s]
        lo_t = np.maximum(lo_t, self.mem1[i] + rowoff)  # memory, and start >= 1
        # the longest block: e - max(time, memory) + 1 <= either term's largest
        longest = max(longest, min(long_t, self.mem_longest[i]))
        return lo_l, lo_t, max(longest, 1), whole, self._reach_rows(i), self.rows[g, s][1]

    def _rows_raw(self, i: int, caps: np.ndarray, rowoff: np.ndarray, raw: dict) -> tuple:
        """Device i's least starts by time per distinct later link row ([H', K, U-1], plus row
        offsets; searched once per device and row), the longest such block, and its stages
        that start the chain ([H, K, U-1], per later group; None when none fits memory)."""
        u, pre, base = self.t.num_units, self.pre[i], self.base[i]
        uniq, inv = self.rows[self.gid[i], self.later_from[i]]
        lo_t = np.empty((len(uniq), len(caps), u - 1), dtype=np.int64)
        long_t = 0
        for j, r in enumerate(uniq):
            if (base, r) not in raw:
                reach = self._reach_row(i, r)
                lo_r = np.searchsorted(pre, (reach[None, :] + self.inmsg[i] - caps[:, None])
                                       .ravel(), "left").reshape(len(caps), u - 1)
                lo_r = np.minimum(lo_r, u)
                raw[base, r] = lo_r + rowoff, int((np.arange(u - 1) - lo_r).max()) + 1
            lo_t[j], long_r = raw[base, r]
            long_t = max(long_t, long_r)
        return lo_t, long_t

    def _first_rows(self, i: int, caps: np.ndarray, raw: dict) -> np.ndarray:
        """[H, K, c]: device i's stage [0, c) per later group, as arrived there (inf over the
        cap; memory is the caller's), for these caps, up to the largest c that any device's
        memory allows; once per run for a base, group and later groups."""
        key = ("first", self.base[i], self.gid[i], self.later_from[i])
        if key not in raw:
            c, inv = self.max_first, self.rows[self.gid[i], self.later_from[i]][1]
            reach = self._reach_rows(i)[:, None, :c]
            first = np.where(reach <= caps[None, :, None],
                             reach + self.first_extra[i][None, None, 1:c + 1], _INF)
            raw[key] = first if inv is None else first[inv]
        return raw[key]

    def run(self, caps: np.ndarray, record: bool = False):
        """Least sum per cap ([K]); with record=True also what reconstruct() needs."""
        u, k_n, n = self.t.num_units, len(caps), len(self.order)
        caps = np.asarray(caps, float)
        arrive = np.full((self.n_groups, k_n, u), _INF)
        src = np.full((self.n_groups, k_n, u), -1) if record else None
        lasts: list[np.ndarray] = []  # per step that can end the chain: its sums per cap
        last_at: list[int] = []
        final = np.full(k_n, _INF)  # the least of lasts[:done]
        done = 0
        hist = []
        # sparse table over starts, at their own columns; level 0 is all inf (empty ranges)
        tab = np.empty((max(u, 1).bit_length() + 1, k_n, u + 1))
        tab[0] = _INF
        flat = tab.reshape(-1)
        rowoff = (np.arange(k_n) * (u + 1))[:, None]
        ends = np.arange(u - 1) + rowoff  # [K, U-1]
        off1, off2 = _read_offsets(u, k_n * (u + 1))
        stale = False
        wins: dict[int, tuple] = {}
        raw: dict = {}
        first_done: dict[tuple, int] = {}
        with np.errstate(invalid="ignore"):
            for i in range(n):
                if stale and self.same_as_prev[i]:
                    hist.append(None)
                    continue
                g, pre, s, kind = self.gid[i], self.pre[i], self.later_from[i], self.kind[i]
                # stale: whether this step changed nothing, needed when the next is the same
                need = i + 1 < n and self.same_as_prev[i + 1]
                check = record or need
                # x[b] = arrive[b] - P[b] + message calls in, for starts b >= 1; a stage starting
                # the chain (b = 0: no messages in, T adds its update) is priced apart (first0).
                if record:
                    x0 = arrive[g, 0].copy()
                    x0[0] = _INF
                    x0[1:] += self.inmsg[i] - pre[1:u]
                    hist.append((x0, src[g, 0].copy()))
                if kind not in wins:
                    wins[kind] = self._windows(i, caps, rowoff, raw)
                lo_l, lo_t, longest, whole, reach, inv = wins[kind]
                # only starts [b0, b1] that some earlier stage reaches can be chosen
                fin = np.flatnonzero(arrive[g, :, 1:].min(axis=0) < _INF)
                b0, b1 = (int(fin[0]) + 1, int(fin[-1]) + 1) if len(fin) else (u, u - 1)
                last = whole
                if len(fin):
                    np.add(arrive[g, :, b0:b1 + 1], self.inmsg[i] - pre[None, b0:b1 + 1],
                           out=tab[1, :, b0:b1 + 1])
                    for lvl in range(2, min(longest, b1 - b0 + 1).bit_length() + 1):
                        h = 1 << (lvl - 2)
                        np.minimum(tab[lvl - 1, :, b0:b1 + 1 - h], tab[lvl - 1, :, b0 + h:b1 + 1],
                                   out=tab[lvl, :, b0:b1 + 1 - h])
                    rb0, rb1 = rowoff + b0, rowoff + b1
                    lo = np.maximum(lo_l, rb0)  # [K, 1]
                    length = (rb1 + (1 + u)) - lo
                    last = np.minimum(flat[off1[length] + lo], flat[off2[length] + rb1])[:, 0]
                    last = last + pre[u] + self.fixed[i]
                    if whole is not None:  # one stage holds everything
                        last = np.minimum(last, whole)
                stale = False
                if last is not None:
                    if need:
                        if done < len(lasts):
                            final = np.min([final, *lasts[done:]], axis=0)
                            done = len(lasts)
                        stale = not (last < final).any()
                    lasts.append(last)
                    last_at.append(i)
                elif need:
                    stale = True
                if lo_t is None:
                    continue
                c0, done0 = self.first_ends[i], first_done.get((self.base[i], g, s), 0)
                if c0 > done0:  # stages [0, c), c <= c0 (the same for all of a base: once)
                    first_done[self.base[i], g, s] = c0
                    first = self._first_rows(i, caps, raw)[:, :, done0:c0]
                    stale = self._update(arrive, src, i, s, done0, c0, first, check) and stale
                # ends (index c - 1) in [b0, e1) can improve: windows meeting [b0, b1]
                e1 = min(u - 1, b1 + longest + 1)
                if b0 >= e1:
                    continue
                lo = np.maximum(lo_t[:, :, b0:e1], rb0)
                hi = np.minimum(ends[:, b0:e1], rb1)  # [K, W]
                length = (hi + (1 + u)) - lo
                q = flat[off1[length] + lo]
                np.minimum(q, flat[off2[length] + hi], out=q)
                q += reach[:, None, b0:e1]
                if inv is not None:
                    q = q[inv]
                stale = self._update(arrive, src, i, s, b0, e1, q, check) and stale
        if not lasts:
            final, final_src = np.full(k_n, _INF), np.full(k_n, -1)
        else:  # the first step reaching each cap's least sum (as a strict running minimum)
            all_last = np.array(lasts)
            final = all_last.min(axis=0)
            final_src = np.where(final < _INF, np.array(last_at)[all_last.argmin(axis=0)], -1)
        if record:
            return final, (final_src, hist)
        return final

    @staticmethod
    def _update(arrive, src, i: int, s: int, w0: int, w1: int, q: np.ndarray,
                check: bool) -> bool:
        """arrive[s:, :, 1 + w0 : 1 + w1] = min(itself, q), src = i where q is lower;
        returns whether nothing improved (False when not checked)."""
        view = arrive[s:, :, 1 + w0:1 + w1]
        if not check:
            np.minimum(view, q, out=view)
            return False
        improved = q < view
        if not improved.any():
            return True
        if src is not None:
            src[s:, :, 1 + w0:1 + w1][improved] = i
        np.minimum(view, q, out=view)
        return False

    @staticmethod
    def _first0(cost, extra, mlo, caps):
        """Sum of a stage that starts the chain (cost = its t_k), inf where over cap or memory."""
        return np.where((cost <= caps) & (mlo == 0), cost + extra, _INF)

    def reconstruct(self, cap: float) -> Solution | None:
        """The least-sum plan for one cap, or None."""
        final, (fsrc, hist) = self.run(np.array([cap]), record=True)
        if not final[0] < _INF:
            return None
        t, u = self.t, self.t.num_units
        i, end, nxt_group = int(fsrc[0]), u, None
        out = []
        while True:
            pre, (x, src) = self.pre[i], hist[i]
            reach = pre[u] if nxt_group is None else (
                pre[end] + self.comm[self.gid[i], nxt_group, end - 1] + self.inmsg[i])
            reach += self.fixed[i]
            mlo = int(self.mem_lo[i][end])
            lo = max(int(np.searchsorted(pre, reach + self.inmsg[i] - cap, "left")), mlo, 1)
            b = lo + int(np.argmin(x[lo:end])) if lo < end else 0
            # the same comparison as run(): x[b] + reach for b >= 1, reach + extra for b = 0
            first = float(self._first0(reach, self.first_extra[i][end], mlo, cap)) - reach
            if first <= (x[b] if b else _INF):
                b = 0
            out.append((self.order[i], b, end))
            if b == 0:
                break
            i, end, nxt_group = int(src[b]), b, self.gid[i]
        out.reverse()
        stages = stage_costs(t, out)
        times = [s.time_s for s in stages]
        return Solution(float(sum(times)) + stages[0].update_s, float(max(times)), out)
