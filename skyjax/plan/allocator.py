"""Allocation of a unit chain to heterogeneous devices: cost model, even and optimal plans.

Cost model (DESIGN.md, stable). A plan is stages k = 0..p-1, each a distinct device d_k and a
non-empty block of units [a_k, b_k), covering all units in order. With m micro-batches:

  compute_k = sum_{u in [a_k, b_k)} forward_s[u][d_k] + backward_s[u][d_k]
  comm_k    = 2 (latency[d_k][d_k+1] + output_bytes[b_k - 1] / bandwidth[d_k][d_k+1]), 0 for the
              last stage; bandwidth 0 means unreachable (comm = inf, such a pair is never adjacent)
  t_k       = compute_k + comm_k
  memory_k  = sum state_bytes + inflight_k * sum activation_bytes <= memory_bytes[d_k],
              inflight_k = m (GPipe) or min(m, p - k) (1F1B)
  T         = sum_k t_k + (m - 1) max_k t_k

Strategies: ``even`` uses every device in profile order, unit counts as equal as possible, the
remainder to the first stages (with more devices than units, the first U devices); ``optimal``
(and ``dynamic``, which is ``optimal`` at plan time) minimises T over which devices are used,
their order and the cuts, under memory.

Bottleneck (all searches). For a cap t on every t_k let DP(t) = min sum_k t_k subject to t_k <= t
and memory. Then T* = min_t DP(t) + (m - 1) t (Alpa's approach). DP(t) is a non-increasing step
function, so only its Pareto points matter:

* ``_pareto_walk`` (exact): DP(inf) (optimal for m = 1); the least feasible cap t_lo by binary
  search over the sorted set of every stage time the DP can produce; then the Pareto points
  downward from (best - DP(inf)) / (m - 1) (no larger bottleneck can beat the best): after DP(t)
  returns sum s and maximum M, the next cap is the largest stage time below M (caps in [M, t] give
  the same plan). It stops once s + (m - 1) t_lo cannot beat the best. Exact.
* ``_CapSearch`` (heuristic): geometric grids of K caps between a lower bound on the bottleneck
  (``min_bottleneck``) and (best - DP(inf)) / (m - 1), each round zooming in on the best.

Order and subset, exact (``_ClassDP``). Devices fall into classes of interchangeable devices: same
forward/backward times and memory, and swapping the two leaves both link matrices unchanged
(``device_classes``). The DP runs backward over suffixes of the chain; its state is (count vector
v of devices used per class in the suffix, class of the suffix's first stage, its first unit b),
and |v| is the number of stages to the end, so 1F1B's in-flight count min(m, p - k) is exact.
With distinct devices v is a subset (a TSP-style DP over subsets, any order); with identical ones
it only counts (search over class counts, not permutations). One DP(t) costs about
sum_states C x U^2 vectorised operations and runs when ``exact_cost`` is within ``EXACT_PAIRS`` /
``EXACT_WORK`` (e.g. <= 8 distinct devices at 40 units, or 64 identical devices at 483 units).
Plans from it have ``exact: true``; tests check them against brute force.

Order and subset, heuristic (otherwise), with ``exact: false`` and ``lower_bound_s``:

1. Link groups (``link_groups``: devices whose links are interchangeable, typically regions)
   are kept contiguous; the group path minimises the link cost between neighbours (exhaustive up
   to 7 groups, else nearest neighbour); inside a group devices are sorted fast-first or
   slow-first. Four orders: that path and its reverse, times the two sorts. More than
   ``MAX_LINK_GROUPS`` groups (e.g. noisy measured links) are coarsened (``coarse_groups``) and
   the DP charges each group pair its worst link, so its costs bound the true ones from above.
2. For a fixed order, ``_ChainDP`` finds the best plan on any subsequence of it (stages may skip
   devices) in O(n U log U) per cap: a forward DP over the order whose inner step is vectorised
   over units, caps and destination groups (windows from cap and memory, sparse-table range
   minima); runs of identical devices that stop improving are skipped. For 1F1B it charges
   min(m, devices left in the order) in-flight micro-batches, which is exact when the order's
   tail is used and otherwise safe (never more than the true count).
3. Each order gets a cap search (only the best is refined when orders x D x U is large), then a
   budgeted first-improvement local search swaps pairs of devices (small problems only).
4. ``lower_bound``: a fractional relaxation (work split over devices by speed and memory,
   comm dropped except one region crossing), solved through its Lagrangian dual. A plan that
   meets its bound is reported exact.

An infeasible problem raises InfeasibleError naming the tightest device and the missing bytes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Iterable, Sequence

import numpy as np

from skyjax.names import SCHEDULES, STRATEGIES
from skyjax.profile.format import Profile

EXACT_PAIRS = 4000  # most (count vector, class) states for the exact DP
EXACT_WORK = 6e7  # most vectorised elements per exact DP(t)
MAX_LINK_GROUPS = 16  # heuristic: more link groups are coarsened (worst link per group pair)
CAP_RTOL = 5e-3  # heuristic: stop refining the cap once the bracket is this narrow
FULL_SEARCH_WORK = 2e5
LOCAL_SEARCH_WORK = 6e6  # heuristic: budget for order swaps, in ~elements (see _heuristic)
LOCAL_SEARCH_TRIES = 200  # heuristic: refine every candidate order while orders x D x U is below
_INF = math.inf


class InfeasibleError(ValueError):
    """No plan fits; the message names the tightest device and the bytes that do not fit."""


@dataclasses.dataclass
class Stage:
    device: int
    units: tuple[int, int]
    compute_s: float
    comm_s: float
    memory_bytes: int

    @property
    def time_s(self) -> float:
        return self.compute_s + self.comm_s

    def to_json(self) -> dict:
        return {"device": self.device, "units": list(self.units), "compute_s": self.compute_s,
                "comm_s": self.comm_s, "memory_bytes": self.memory_bytes}


@dataclasses.dataclass
class Plan:
    strategy: str
    schedule: str
    microbatches: int
    stages: list[Stage]
    step_time_s: float
    bottleneck_s: float
    exact: bool
    lower_bound_s: float | None = None
    device_names: list[str] | None = None

    def to_json(self) -> dict:
        out = {"strategy": self.strategy, "schedule": self.schedule,
               "microbatches": self.microbatches, "stages": [s.to_json() for s in self.stages],
               "step_time_s": self.step_time_s, "bottleneck_s": self.bottleneck_s,
               "exact": self.exact}
        if self.lower_bound_s is not None:
            out["lower_bound_s"] = self.lower_bound_s
        if self.device_names is not None:
            out["device_names"] = list(self.device_names)
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Plan":
        stages = [Stage(int(s["device"]), (int(s["units"][0]), int(s["units"][1])),
                        float(s["compute_s"]), float(s["comm_s"]), int(s["memory_bytes"]))
                  for s in d["stages"]]
        return cls(d["strategy"], d["schedule"], int(d["microbatches"]), stages,
                   float(d["step_time_s"]), float(d["bottleneck_s"]), bool(d["exact"]),
                   d.get("lower_bound_s"), d.get("device_names"))


# ------------------------------------------------------------------------------- cost model


@dataclasses.dataclass(frozen=True)
class Tables:
    """The profile as arrays for one schedule and micro-batch count."""

    work: np.ndarray  # [U, D] forward + backward seconds
    prefix: np.ndarray  # [D, U+1] prefix sums of work per device
    state_prefix: np.ndarray  # [U+1]
    act_prefix: np.ndarray  # [U+1]
    output_bytes: np.ndarray  # [U]
    latency: np.ndarray  # [D, D]
    bandwidth: np.ndarray  # [D, D]
    memory: np.ndarray  # [D]
    schedule: str
    microbatches: int

    @property
    def num_units(self) -> int:
        return self.work.shape[0]

    @property
    def num_devices(self) -> int:
        return self.work.shape[1]

    def inflight(self, stages_from_end: int | np.ndarray) -> int | np.ndarray:
        """Micro-batches whose activations a stage keeps (p - k = stages_from_end)."""
        if self.schedule == "gpipe":
            return self.microbatches
        return np.minimum(self.microbatches, stages_from_end)

    def comm(self, d: int, e: int, cuts: np.ndarray | int) -> np.ndarray:
        """Two-way comm seconds of a stage on d ending at cut(s) (1..U-1), next stage on e."""
        cuts = np.asarray(cuts)
        if self.bandwidth[d, e] <= 0:
            return np.full(cuts.shape, _INF)
        return 2.0 * (self.latency[d, e] + self.output_bytes[cuts - 1] / self.bandwidth[d, e])


def tables(profile: Profile, schedule: str = "1f1b", microbatches: int = 8) -> Tables:
    """Cost tables for a profile (validates schedule and micro-batch count)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {SCHEDULES}, got {schedule!r}")
    if int(microbatches) != microbatches or microbatches < 1:
        raise ValueError(f"microbatches: expected a positive integer, got {microbatches!r}")
    work = np.asarray(profile.forward_s, float) + np.asarray(profile.backward_s, float)
    prefix = np.concatenate([np.zeros((work.shape[1], 1)), np.cumsum(work.T, axis=1)], axis=1)
    units = profile.units
    state = np.array([float(u["state_bytes"]) for u in units])
    act = np.array([float(u["activation_bytes"]) for u in units])
    return Tables(
        work=work, prefix=prefix,
        state_prefix=np.concatenate([[0.0], np.cumsum(state)]),
        act_prefix=np.concatenate([[0.0], np.cumsum(act)]),
        output_bytes=np.array([float(u["output_bytes"]) for u in units]),
        latency=np.asarray(profile.latency_s, float),
        bandwidth=np.asarray(profile.bandwidth_Bps, float),
        memory=np.array([float(d["memory_bytes"]) for d in profile.devices]),
        schedule=schedule, microbatches=int(microbatches))


def stage_costs(t: Tables, assignment: Sequence[tuple[int, int, int]]) -> list[Stage]:
    """Stages (compute, comm, memory) of an assignment [(device, start, end), ...]."""
    p = len(assignment)
    stages = []
    for k, (d, a, b) in enumerate(assignment):
        compute = float(t.work[a:b, d].sum())
        comm = 0.0 if k == p - 1 else float(t.comm(d, assignment[k + 1][0], b))
        mem = (t.state_prefix[b] - t.state_prefix[a]
               + t.inflight(p - k) * (t.act_prefix[b] - t.act_prefix[a]))
        stages.append(Stage(int(d), (int(a), int(b)), compute, comm, int(round(mem))))
    return stages


def step_time(stage_times: Iterable[float], microbatches: int) -> float:
    """T = sum t_k + (m - 1) max t_k."""
    ts = list(stage_times)
    return float(sum(ts) + (microbatches - 1) * max(ts))


def _check_assignment(t: Tables, assignment: Sequence[tuple[int, int, int]]) -> None:
    if not assignment:
        raise ValueError("assignment: empty")
    pos = 0
    seen = set()
    for k, (d, a, b) in enumerate(assignment):
        if not 0 <= d < t.num_devices:
            raise ValueError(f"assignment[{k}]: no device {d}")
        if d in seen:
            raise ValueError(f"assignment[{k}]: device {d} used twice")
        seen.add(d)
        if a != pos or b <= a:
            raise ValueError(f"assignment[{k}]: units [{a}, {b}) do not continue at {pos}")
        pos = b
    if pos != t.num_units:
        raise ValueError(f"assignment: covers units [0, {pos}) of {t.num_units}")


def _check_fits(profile: Profile, t: Tables, stages: list[Stage]) -> None:
    for k, s in enumerate(stages):
        cap = t.memory[s.device]
        if s.memory_bytes > cap:
            raise InfeasibleError(
                f"stage {k} on device {s.device} ({profile.devices[s.device]['name']}): units "
                f"[{s.units[0]}, {s.units[1]}) need {s.memory_bytes} bytes but it has {int(cap)}: "
                f"{int(s.memory_bytes - cap)} bytes do not fit")
        if math.isinf(s.comm_s):
            nxt = stages[k + 1].device
            raise InfeasibleError(f"stage {k}: device {s.device} cannot reach device {nxt} "
                                  f"(bandwidth_Bps[{s.device}][{nxt}] = 0)")


def evaluate(profile: Profile, assignment: Sequence[tuple[int, int, int]], schedule: str = "1f1b",
             microbatches: int = 8, strategy: str = "custom", *, exact: bool = False,
             lower_bound_s: float | None = None, check: bool = True) -> Plan:
    """The Plan of a given assignment under the cost model (raises if it does not fit)."""
    t = tables(profile, schedule, microbatches)
    return _evaluate(profile, t, assignment, strategy, exact, lower_bound_s, check)


def _evaluate(profile: Profile, t: Tables, assignment: Sequence[tuple[int, int, int]],
              strategy: str, exact: bool, lower_bound_s: float | None, check: bool = True) -> Plan:
    _check_assignment(t, assignment)
    stages = stage_costs(t, assignment)
    if check:
        _check_fits(profile, t, stages)
    times = [s.time_s for s in stages]
    return Plan(strategy=strategy, schedule=t.schedule, microbatches=t.microbatches,
                stages=stages, step_time_s=step_time(times, t.microbatches),
                bottleneck_s=float(max(times)), exact=exact,
                lower_bound_s=None if exact else lower_bound_s,
                device_names=[d["name"] for d in profile.devices])


# ------------------------------------------------------------------------------------- even


def even_assignment(num_units: int, devices: Sequence[int]) -> list[tuple[int, int, int]]:
    """Equal unit counts over the devices in order, the remainder to the first stages; with
    more devices than units only the first num_units devices are used."""
    devices = list(devices)[:num_units]
    base, extra = divmod(num_units, len(devices))
    out, pos = [], 0
    for k, d in enumerate(devices):
        n = base + (1 if k < extra else 0)
        out.append((d, pos, pos + n))
        pos += n
    return out


# ------------------------------------------------------------------------ device classes


def _swap_invariant(mats: Sequence[np.ndarray], d: int, e: int) -> bool:
    """Whether exchanging devices d and e leaves every matrix unchanged."""
    n = mats[0].shape[0]
    rest = np.ones(n, bool)
    rest[[d, e]] = False
    for m in mats:
        if not (np.array_equal(m[d, rest], m[e, rest]) and np.array_equal(m[rest, d], m[rest, e])
                and m[d, e] == m[e, d]):
            return False
    return True


def _partition(keys: list[bytes], mats: Sequence[np.ndarray]) -> list[list[int]]:
    """Classes of devices with equal keys that are pairwise swap-invariant under mats.

    Swap-invariance is transitive, so each device is compared with one representative per class.
    Sorted off-diagonal rows/columns enter the key so that unequal devices rarely meet.
    """
    n = len(keys)
    off = ~np.eye(n, dtype=bool)
    sig = [keys[d] for d in range(n)]
    for m in mats:
        rows = np.sort(m[off].reshape(n, n - 1), axis=1) if n > 1 else np.zeros((n, 0))
        cols = np.sort(m.T[off].reshape(n, n - 1), axis=1) if n > 1 else np.zeros((n, 0))
        sig = [s + rows[d].tobytes() + cols[d].tobytes() for d, s in enumerate(sig)]
    buckets: dict[bytes, list[list[int]]] = {}
    classes: list[list[int]] = []
    for d in range(n):
        for cls in buckets.setdefault(sig[d], []):
            if _swap_invariant(mats, cls[0], d):
                cls.append(d)
                break
        else:
            cls = [d]
            buckets[sig[d]].append(cls)
            classes.append(cls)
    return classes


def device_classes(t: Tables) -> list[list[int]]:
    """Interchangeable devices: same times and memory, swap-invariant links."""
    keys = [t.work[:, d].tobytes() + t.memory[d].tobytes() for d in range(t.num_devices)]
    return _partition(keys, [t.latency, t.bandwidth])


def link_groups(t: Tables) -> list[list[int]]:
    """Devices whose links are interchangeable (e.g. one region): comm depends on groups only."""
    return _partition([b""] * t.num_devices, [t.latency, t.bandwidth])


def _worst_link(t: Tables, src: Sequence[int], dst: Sequence[int]) -> tuple[float, float]:
    """Largest latency and least bandwidth from a device of src to another of dst: exact for
    link groups (uniform), an upper bound on comm for coarsened groups. (0, 0) if no pair."""
    lat = t.latency[np.ix_(src, dst)]
    bw = t.bandwidth[np.ix_(src, dst)]
    other = np.asarray(src)[:, None] != np.asarray(dst)[None, :]
    if not other.any():
        return 0.0, 0.0
    return float(lat[other].max()), float(bw[other].min())


def coarse_groups(t: Tables, limit: int) -> list[list[int]]:
    """At most `limit` groups of devices joined by cheap links: a nearest-neighbour path over
    the devices, cut at its `limit` - 1 most expensive hops (single linkage along the path)."""
    ref = float(np.median(t.output_bytes)) if t.num_units else 0.0
    with np.errstate(divide="ignore"):
        cost = 2 * (t.latency + ref / t.bandwidth)
    cost = np.minimum(cost, cost.T)
    n = t.num_devices
    path, left = [int(np.argmin(t.prefix[:, -1]))], np.ones(n, bool)
    left[path[0]] = False
    hops = []
    while left.any():
        row = np.where(left, cost[path[-1]], _INF)
        nxt = int(np.argmin(row)) if np.isfinite(row).any() else int(np.flatnonzero(left)[0])
        hops.append(row[nxt])
        path.append(nxt)
        left[nxt] = False
    cuts = sorted(np.argsort(-np.asarray(hops), kind="stable")[: limit - 1] + 1)
    return [sorted(path[a:b]) for a, b in zip([0] + cuts, cuts + [n])]


def _class_link(t: Tables, classes: list[list[int]], c: int, c2: int) -> tuple[int, int] | None:
    """A (device, device) pair realising the link class c -> class c2, None if impossible."""
    if c != c2:
        return classes[c][0], classes[c2][0]
    return (classes[c][0], classes[c][1]) if len(classes[c]) > 1 else None


# ---------------------------------------------------------------------- exact class DP


@dataclasses.dataclass
class _Sol:
    total: float  # sum of t_k
    bottleneck: float  # max t_k
    assignment: list[tuple[int, int, int]]


def _count_vectors(sizes: Sequence[int]) -> list[tuple[int, ...]]:
    vecs = [v for v in itertools.product(*(range(n + 1) for n in sizes)) if sum(v) > 0]
    return sorted(vecs, key=sum)


def exact_cost(sizes: Sequence[int], num_units: int) -> tuple[int, float]:
    """(states, vectorised elements) of one exact DP(t) over class counts."""
    n_vec = math.prod(n + 1 for n in sizes)
    pairs = int(round(n_vec * sum(n / (n + 1) for n in sizes)))
    return pairs, float(pairs) * len(sizes) * (num_units + 1) ** 2


class _ClassDP:
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
        self.block = np.where(valid[None], pre[:, None, :] - pre[:, :u, None], _INF)  # [C,U,U+1]
        self.last = self.block[:, :, u].copy()  # [C, U]
        cuts = np.arange(1, u)
        self.nonlast = np.full((c_n, c_n, u, u + 1), _INF)  # [C, C2, b, e]
        for c, c2 in itertools.product(range(c_n), range(c_n)):
            pair = _class_link(t, classes, c, c2)
            if pair is None or u < 2:
                continue
            comm = np.full(u + 1, _INF)
            comm[1:u] = t.comm(pair[0], pair[1], cuts)
            self.nonlast[c, c2] = self.block[c] + comm[None, :]
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

    def solve(self, cap: float) -> _Sol | None:
        """min sum t_k with every t_k <= cap and memory; None if infeasible."""
        t, u, c_n = self.t, self.t.num_units, len(self.classes)
        table: dict[tuple[tuple[int, ...], int], tuple] = {}
        best: tuple[float, tuple[int, ...], int] | None = None
        for v in self.vectors:
            s = sum(v)
            infl = t.inflight(s)
            for c in range(c_n):
                if v[c] == 0:
                    continue
                mem = self.mem_ok(c, infl)
                if s == 1:
                    tk = self.last[c]
                    val = np.where((tk <= cap) & mem[:, u], tk, _INF)
                    entry = (val, val, None, None)
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
        nxt = np.full((len(c2s), u + 1), _INF)
        nmx = np.full((len(c2s), u + 1), _INF)
        for i, c2 in enumerate(c2s):
            nxt[i, :u], nmx[i, :u] = table[(v2, c2)][0], table[(v2, c2)][1]
        tot = np.where((tk <= cap) & mem[None], tk + nxt[:, None, :], _INF)
        flat = tot.transpose(1, 0, 2).reshape(u, -1)
        idx = np.argmin(flat, axis=1)
        rows = np.arange(u)
        val = flat[rows, idx]
        ci, e = np.divmod(idx, u + 1)
        mx = np.maximum(tk[ci, rows, e], nmx[ci, e])
        mx = np.where(val < _INF, mx, _INF)
        return val, mx, np.asarray(c2s)[ci], e

    def _reconstruct(self, v: tuple[int, ...], c: int, table: dict) -> _Sol:
        used = [0] * len(self.classes)
        out, b = [], 0
        total, mx = float(table[(v, c)][0][0]), float(table[(v, c)][1][0])
        while True:
            val, _, c2, e = table[(v, c)]
            dev = self.classes[c][used[c]]
            used[c] += 1
            if c2 is None:
                out.append((dev, b, self.t.num_units))
                return _Sol(total, mx, out)
            out.append((dev, b, int(e[b])))
            v = tuple(x - (i == c) for i, x in enumerate(v))
            c, b = int(c2[b]), int(e[b])


def _pareto_walk(solve, candidates: np.ndarray, m: int) -> _Sol | None:
    """min over caps of DP(cap) + (m - 1) * bottleneck, exactly (see module doc)."""
    first = solve(_INF)
    if first is None or m == 1:
        return first
    best = first

    def score(sol: _Sol) -> float:
        return sol.total + (m - 1) * sol.bottleneck

    def probe(cap: float) -> _Sol | None:
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


def _least_cap(solve, candidates: np.ndarray, lo: int, hi: int) -> tuple[int, float]:
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


# -------------------------------------------------------------------- heuristic chain DP


def _sparse_table(x: np.ndarray) -> np.ndarray:
    """levels[l, k, i] = min x[k, i : i + 2^l] (clipped); x is [K, n]."""
    k, n = x.shape
    levels = max(1, int(n).bit_length())
    out = np.empty((levels, k, n))
    out[0] = x
    for l in range(1, levels):
        h = 1 << (l - 1)
        np.minimum(out[l - 1, :, : n - h], out[l - 1, :, h:], out=out[l, :, : n - h])
        out[l, :, n - h:] = out[l - 1, :, n - h:]
    return out


def _range_min(tab: np.ndarray, log2: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """min of row k over [lo, hi] for index arrays shaped [..., K, n] (inf where lo > hi)."""
    levels, k_n, n = tab.shape
    length = hi - lo + 1
    ok = length >= 1
    lvl = log2[np.maximum(length, 1)]
    base = lvl * (k_n * n) + np.arange(k_n)[:, None] * n
    flat = tab.reshape(-1)
    a = flat[base + np.where(ok, lo, 0)]
    b = flat[base + np.where(ok, hi - (1 << lvl) + 1, 0)]
    return np.where(ok, np.minimum(a, b), _INF)


class _ChainDP:
    """DP over a fixed device order, stages on any subsequence of it (see module doc).

    arrive[g][k, b]: least sum of the stages before unit b (comm into the next stage included)
    when the stage starting at b runs on a device of link group g not yet processed, for cap k.
    Each device i in order turns arrive[g_i] into arrivals for every later group with one
    vectorised step: a window [lo(c), c) of starts per end c (from the cap and memory) and a
    sparse-table range minimum. When a device changes nothing, the identical devices that follow
    it (same class, same memory window) would change nothing either and are skipped.
    """

    def __init__(self, t: Tables, order: Sequence[int], group_of: np.ndarray,
                 groups: list[list[int]], class_of: np.ndarray | None = None):
        self.t, self.order = t, list(order)
        u, n = t.num_units, len(self.order)
        self.pre = t.prefix[self.order]  # [n, U+1]
        self.gid = [int(group_of[d]) for d in self.order]
        self.n_groups = len(groups)
        self.log2 = np.zeros(u + 2, dtype=np.int64)
        self.log2[1:] = np.floor(np.log2(np.arange(1, u + 2))).astype(np.int64)
        self.later: list[np.ndarray] = [np.zeros(0, np.int64)] * n
        seen: list[int] = []
        for i in range(n - 1, -1, -1):
            self.later[i] = np.array(seen, dtype=np.int64)
            if self.gid[i] not in seen:
                seen.append(self.gid[i])
        self.mem_lo = np.empty((n, u + 1), dtype=np.int64)  # least start b of a block ending at c
        for i, d in enumerate(self.order):
            q = t.state_prefix + t.inflight(n - i) * t.act_prefix
            self.mem_lo[i] = np.searchsorted(q, q - t.memory[d], "left")
        cls = np.arange(t.num_devices) if class_of is None else class_of
        self.same_as_prev = [i > 0 and cls[self.order[i]] == cls[self.order[i - 1]]
                             and np.array_equal(self.mem_lo[i], self.mem_lo[i - 1])
                             for i in range(n)]
        self.comm = np.full((self.n_groups, self.n_groups, max(u - 1, 0)), _INF)
        out = t.output_bytes[:-1]
        present = sorted(set(self.gid))
        for g, h in itertools.product(present, present):
            lat, bw = _worst_link(t, groups[g], groups[h])
            if bw > 0:
                self.comm[g, h] = 2.0 * (lat + out / bw)

    def run(self, caps: np.ndarray, record: bool = False):
        """Least sum per cap ([K]); with record=True also what reconstruct() needs."""
        u, k_n = self.t.num_units, len(caps)
        caps = np.asarray(caps, float)
        arrive = np.full((self.n_groups, k_n, u), _INF)
        src = np.full((self.n_groups, k_n, u), -1) if record else None
        final = np.full(k_n, _INF)
        final_src = np.full(k_n, -1)
        hist = []
        hi_last = np.full((k_n, 1), u - 1)
        ends = np.arange(u - 1)
        stale = False
        with np.errstate(invalid="ignore"):
            for i in range(len(self.order)):
                if stale and self.same_as_prev[i]:
                    hist.append(None)
                    continue
                g, pre, mlo, hs = self.gid[i], self.pre[i], self.mem_lo[i], self.later[i]
                x = arrive[g].copy()
                x[:, 0] = 0.0
                x -= pre[None, :u]
                if record:
                    hist.append((x[0].copy(), src[g, 0].copy()))
                tab = _sparse_table(x)
                lo = np.maximum(np.searchsorted(pre, pre[u] - caps, "left"), mlo[u])
                last = _range_min(tab, self.log2, lo[:, None], hi_last)[:, 0] + pre[u]
                better = last < final
                final = np.where(better, last, final)
                final_src = np.where(better, i, final_src)
                stale = not better.any()
                if len(hs) == 0 or u < 2:
                    continue
                reach = pre[None, 1:u] + self.comm[g, hs]  # [H, U-1]: P[c] + comm(c)
                thr = reach[:, None, :] - caps[None, :, None]  # [H, K, U-1]
                lo = np.searchsorted(pre, thr.ravel(), "left").reshape(thr.shape)
                lo = np.maximum(lo, mlo[None, None, 1:u])
                q = _range_min(tab, self.log2, lo, np.broadcast_to(ends, lo.shape))
                q += reach[:, None, :]
                cur = arrive[hs, :, 1:]
                improved = q < cur
                if not improved.any():
                    continue
                stale = False
                if record:
                    src[hs, :, 1:] = np.where(improved, i, src[hs, :, 1:])
                arrive[hs, :, 1:] = np.minimum(cur, q)
        if record:
            return final, (final_src, hist)
        return final

    def reconstruct(self, cap: float) -> _Sol | None:
        """The least-sum plan for one cap, or None."""
        final, (fsrc, hist) = self.run(np.array([cap]), record=True)
        if not final[0] < _INF:
            return None
        t, u = self.t, self.t.num_units
        i, end, nxt_group = int(fsrc[0]), u, None
        out = []
        while True:
            pre, (x, src) = self.pre[i], hist[i]
            reach = pre[u] if nxt_group is None else pre[end] + self.comm[self.gid[i], nxt_group,
                                                                          end - 1]
            lo = max(int(np.searchsorted(pre, reach - cap, "left")), int(self.mem_lo[i][end]))
            b = lo + int(np.argmin(x[lo:end]))
            out.append((self.order[i], b, end))
            if b == 0:
                break
            i, end, nxt_group = int(src[b]), b, self.gid[i]
        out.reverse()
        times = [s.time_s for s in stage_costs(t, out)]
        return _Sol(float(sum(times)), float(max(times)), out)


class _CapSearch:
    """The cap for one order: DP(inf), then geometric grids of K caps, each round zooming in on
    the best score sum + (m - 1) cap (an upper bound on that plan's T). Caps below cap_lb are
    infeasible, and caps above (best known T - DP(inf)) / (m - 1) cannot beat the best known."""

    def __init__(self, dp: _ChainDP, m: int, cap_lb: float, k: int):
        self.dp, self.m, self.k = dp, m, k
        self.s_inf = float(dp.run(np.array([_INF]))[0])
        self.feasible = self.s_inf < _INF
        self.cap, self.score = _INF, self.s_inf * m
        self.lo, self.hi = max(cap_lb, self.s_inf * 1e-9), self.s_inf

    def refine(self, rounds: int, best_known: float = _INF) -> None:
        if not self.feasible or self.m == 1:
            return
        self.hi = min(self.hi, (best_known - self.s_inf) / (self.m - 1))
        for _ in range(rounds):
            if self.hi < self.lo or (self.cap < _INF and self.hi < self.lo * (1 + CAP_RTOL)):
                return
            caps = np.geomspace(self.lo, self.hi, self.k) if self.hi > self.lo else [self.hi]
            caps = np.asarray(caps)
            score = self.dp.run(caps) + (self.m - 1) * caps
            j = int(np.argmin(score))
            if score[j] < self.score:
                self.score, self.cap = float(score[j]), float(caps[j])
            if len(caps) == 1:
                return
            self.lo, self.hi = caps[max(j - 1, 0)], caps[min(j + 1, len(caps) - 1)]

    def solution(self) -> _Sol | None:
        return self.dp.reconstruct(self.cap) if self.feasible else None


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
    if g_n <= 7:
        best = min(itertools.permutations(range(g_n)),
                   key=lambda p: (sum(cost[p[i], p[i + 1]] for i in range(g_n - 1)), p))
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


def _labels(parts: list[list[int]], n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.int64)
    for i, members in enumerate(parts):
        out[members] = i
    return out


def _heuristic(t: Tables, cap_lb: float, rounds: int = 4, k: int = 12) -> _Sol | None:
    """Each candidate order gets a cap search (all rounds when n x U is small, otherwise one
    screening round and only the best is refined); then, within a work budget, first-improvement
    local search swaps two devices of different classes in the best order."""
    groups = link_groups(t)
    if len(groups) > MAX_LINK_GROUPS:  # e.g. noisy measured links: coarsen, charge worst links
        groups = coarse_groups(t, MAX_LINK_GROUPS)
    group_of = _labels(groups, t.num_devices)
    class_of = _labels(device_classes(t), t.num_devices)
    orders = candidate_orders(t, groups, class_of)
    full = len(orders) * t.num_devices * t.num_units <= FULL_SEARCH_WORK

    def search(order: list[int], best: float, n_rounds: int) -> _CapSearch:
        cs = _CapSearch(_ChainDP(t, order, group_of, groups, class_of), t.microbatches, cap_lb, k)
        cs.refine(n_rounds, best)
        return cs

    searches, best = [], _INF
    for order in orders:
        cs = search(order, best, rounds if full else 1)
        if cs.feasible:
            best = min(best, cs.score)
            searches.append(cs)
    if not searches:
        return None
    top = min(searches, key=lambda cs: cs.score)
    if not full:
        top.refine(rounds - 1, best)
    per_try = (rounds + 1) * t.num_devices * (2000 + 4 * k * t.num_units)  # ~ numpy overhead
    budget = min(LOCAL_SEARCH_TRIES, int(LOCAL_SEARCH_WORK // per_try))
    order = list(top.dp.order)
    improved = True
    while improved and budget > 0:
        improved = False
        for i, j in itertools.combinations(range(len(order)), 2):
            if budget <= 0:
                break
            if class_of[order[i]] == class_of[order[j]]:
                continue
            trial = list(order)
            trial[i], trial[j] = trial[j], trial[i]
            budget -= 1
            cs = search(trial, top.score, rounds)
            if cs.feasible and cs.score < top.score * (1 - 1e-9):
                top, order, improved = cs, trial, True
    return top.solution()


# ------------------------------------------------------------------------------ bounds


def lower_bound(t: Tables) -> float:
    """A lower bound on T over all plans.

    A plan either stays inside one link group (region) or crosses between groups, and then one
    stage pays at least the cheapest crossing c (2 (latency + least output bytes / bandwidth)):
    min(min over groups of _relaxed_bound(group), _relaxed_bound(all, tau >= c) + c).
    """
    groups = link_groups(t)
    best = min(_relaxed_bound(t, np.array(g)) for g in groups)
    if len(groups) > 1 and t.num_units > 1:
        gid = _labels(groups, t.num_devices)
        cross = gid[:, None] != gid[None, :]
        bw = np.where(cross & (t.bandwidth > 0), t.bandwidth, np.nan)
        if np.isfinite(bw).any():
            c = 2 * float(np.nanmin(t.latency + t.output_bytes.min() / bw))
            best = min(best, _relaxed_bound(t, np.arange(t.num_devices), c) + c)
    return best


def _relaxation(t: Tables, devices: np.ndarray):
    """(W, tau_min, sigma, cap, count) of the fractional relaxation on these devices, per
    distinct (sigma, cap); None if no device can hold a single unit."""
    m = t.microbatches
    state, act = np.diff(t.state_prefix), np.diff(t.act_prefix)
    need = state + (1 if t.schedule == "1f1b" else m) * act
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

    w_ref[u] = least time of unit u on any device; device d is at least sigma_d = min_u
    w[u, d] / w_ref[u] times slower, and its memory holds at most cap_d seconds of reference
    work (fractional knapsack of need_u = state + inflight x activations, inflight m for GPipe
    and 1 for 1F1B). Relaxation: reference work W = sum w_ref is split into x_d >= 0 with
    x_d <= cap_d and sigma_d x_d <= tau (tau >= max_u w_ref[u], the bottleneck);
    T >= min sum_d sigma_d x_d + (m - 1) tau. Comm, granularity and order are dropped. The LP's
    Lagrangian dual g(lambda) = lambda W + min_tau [(m - 1) tau - sum_d (lambda - sigma_d)^+
    min(cap_d, tau / sigma_d)] is a valid bound for every lambda (weak duality); the inner
    minimum is exact (piecewise linear in tau, breakpoints tau_min and sigma_d cap_d) and the
    concave g is maximised by golden-section search. Devices that cannot hold any single unit
    are left out.
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


def _infeasible_message(profile: Profile, t: Tables) -> str:
    """Why nothing fits: the unit or total that exceeds the tightest (largest) device."""
    m = t.microbatches
    state, act = np.diff(t.state_prefix), np.diff(t.act_prefix)
    infl = 1 if t.schedule == "1f1b" else m
    big = int(np.argmax(t.memory))
    cap = t.memory[big]
    dev = f"device {big} ({profile.devices[big]['name']}, {int(cap)} bytes, the largest)"
    need = state + infl * act
    u = int(np.argmax(need))
    if need[u] > cap:
        return (f"no feasible plan: unit {u} ({profile.units[u]['name']}) alone needs "
                f"{int(need[u])} bytes (state {int(state[u])} + {infl} x activations "
                f"{int(act[u])}) but {dev} is short by {int(need[u] - cap)} bytes")
    whole = float(state.sum() + infl * act.sum())
    fit = float(t.memory[t.memory >= need.min()].sum())
    if whole > fit:
        return (f"no feasible plan: the units need at least {int(whole)} bytes in total but all "
                f"devices together have {int(fit)}: {int(whole - fit)} bytes do not fit "
                f"(tightest: {dev}, short by {int(whole - cap)} bytes for the whole model)")
    return (f"no feasible plan: memory would suffice only across devices that cannot reach one "
            f"another (bandwidth 0) or in blocks that do not fit; tightest: {dev}, short by "
            f"{int(max(whole - cap, 0))} bytes for the whole model")


# -------------------------------------------------------------------------------- plan


def plan(profile: Profile, strategy: str = "optimal", schedule: str = "1f1b",
         microbatches: int = 8, *, force_heuristic: bool = False) -> Plan:
    """Plan a profile. even: all devices in order; optimal/dynamic: least T (module doc)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: expected one of {STRATEGIES}, got {strategy!r}")
    t = tables(profile, schedule, microbatches)
    if strategy == "even":
        assignment = even_assignment(t.num_units, range(t.num_devices))
        return _evaluate(profile, t, assignment, strategy, exact=False, lower_bound_s=None)
    lb = lower_bound(t)
    classes = device_classes(t)
    pairs, work = exact_cost([len(c) for c in classes], t.num_units)
    if not force_heuristic and pairs <= EXACT_PAIRS and work <= EXACT_WORK:
        dp = _ClassDP(t, classes)
        sol = _pareto_walk(dp.solve, dp.candidates(), t.microbatches)
        exact = True
    else:
        sol = _heuristic(t, min_bottleneck(t))
        exact = False
    if sol is None:
        raise InfeasibleError(_infeasible_message(profile, t))
    out = _evaluate(profile, t, sol.assignment, strategy, exact, lb)
    if not exact and out.step_time_s <= lb * (1 + 1e-9):
        out.exact, out.lower_bound_s = True, None
    return out
