"""Several pipelines in data parallel: what they cost, and one pipeline's chain on a device subset.

docs/design.md, "Several pipelines", gives the model: pipeline i runs a chain on its own devices
with a share of m_i whole micro-batches (its T_i), the replicated gradients are exchanged
between the pipelines (AR, routed by :mod:`skyjax.plan.pricing.exchange`), and
T = max_i T_i + AR + sync_s.

Here: ``exchange_s`` (AR); the relaxed averagings' state and the modes that fit
(``state_copies``, ``fitting_modes``); ``build_plan`` and ``evaluate_pipelines`` (the Plan of
given pipelines and shares); ``restrict_tables`` and ``ChainCache`` (one pipeline's chain search
on a subset with its m_i, memoised up to interchangeable devices); ``fractional_bound`` (a lower
bound on T over every plan of any number of pipelines). The search over splits and shares is
:mod:`skyjax.plan.data_parallel.split`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from skyjax.plan.search import exact as exact_search

from skyjax.plan.search import heuristic
from skyjax.plan.bounds.step import min_bottleneck
from skyjax.plan.pricing.classes import device_classes, labels
from skyjax.plan.pricing.cost import Tables, check_assignment, check_fits, stage_costs, tables
from skyjax.plan.pricing.exchange import (INT8_WIRE, pipeline_groups, region_groups,  # noqa: F401
                                  relaxed_exchange, routing, routing_s, same_math)
from skyjax.names import PEER_MODES
from skyjax.plan.model.types import InfeasibleError, Plan, Stage
from skyjax.plan.pricing import peers, topk
from skyjax.profile.format import Profile

_INF = math.inf

Chain = list[tuple[int, int, int]]  # [(device, first unit, end unit), ...] in pipeline order


def grad_prefix(profile: Profile) -> np.ndarray:
    """Prefix sums [U+1] of the gradient bytes a stage exchanges per unit: ``param_bytes``.
    Profiles without it (hand-made ones, older files) fall back to state_bytes / 4: the state is
    parameters, gradients and Adam's two moments, four copies of the parameters' size."""
    g = [float(u["param_bytes"]) if "param_bytes" in u else float(u["state_bytes"]) / 4
         for u in profile.units]
    return np.concatenate([[0.0], np.cumsum(g)])


def state_copies(mode: str, pipelines: int = 2, relax=None) -> int:
    """Copies of a stage's gradients (float32, ``grad_bytes`` of its units) a stage keeps for an
    averaging mode (``runtime.averaging``): the int8 error-feedback residual 1, DiLoCo's anchor
    and outer momentum 2, exact 0; the peer modes' as ``pricing.peers.state_copies`` says (of
    ``pipelines`` and ``relax``'s staleness and peer schedule)."""
    if mode in PEER_MODES:
        return peers.state_copies(mode, pipelines, relax.async_steps if relax else 1,
                                  relax.peers if relax else "ring")
    return (1 if mode.startswith("int8") else 2 if mode.startswith("diloco") else 0) + int(
        mode.startswith("diloco") and relax is not None and relax.compressed)  # its residual


def state_charge(mode: str, gprefix: np.ndarray, a: int, b: int, pipelines: int = 2,
                 relax=None) -> int:
    """Bytes of ``mode``'s state on a stage over units [a, b) (what its memory_k adds)."""
    return int(round(state_copies(mode, pipelines, relax) * float(gprefix[b] - gprefix[a])))


def free_bytes(t: Tables, chain: Chain) -> tuple[float, ...]:
    """Per stage of ``chain`` (on ``t``'s micro-batches) the memory its device has left."""
    return tuple(float(t.memory[s.device] - s.memory_bytes) for s in stage_costs(t, chain))


def fitting_modes(modes: Sequence[str], chains: Sequence[Chain],
                  free: Sequence[Sequence[float] | None], gprefix: np.ndarray,
                  relax=None) -> tuple[str, ...]:
    """The modes of ``modes`` whose state fits on every stage (``free[i]``: ``free_bytes`` of
    chain i; None: not known, not checked): a relaxed mode that does not fit is not priced."""
    n = len(chains)
    return tuple(m for m in modes if not state_copies(m, n, relax) or all(
        f is None or all(state_charge(m, gprefix, a, b, n, relax) <= x
                         for (_, a, b), x in zip(c, f))
        for c, f in zip(chains, free)))


def priced_exchange(chains: Sequence[Chain], gprefix: np.ndarray, profile: Profile,
                    modes: Sequence[str], compute_s: float
                    ) -> tuple[float, str, list[list[int]] | None]:
    """``relaxed_exchange`` over the ordered modes of ``modes``, and the peer modes priced by
    :mod:`skyjax.plan.pricing.peers` (async beyond ``compute_s`` = max_i T_i + sync_s): the
    least AR, its mode (ties to the earlier) and the exchange's groups."""
    ordered = [m for m in modes if m not in PEER_MODES]
    best = (relaxed_exchange(chains, gprefix, profile, ordered) if ordered or len(chains) < 2
            else (math.inf, "", None))
    if len(chains) < 2:
        return best
    lat, bw, relax = profile.latency_s, profile.bandwidth_Bps, profile.relax
    for m in modes:
        if m in PEER_MODES:
            ar = (peers.async_s(chains, gprefix, lat, bw, relax.async_steps, compute_s)
                  if m == "async" else peers.decentral_s(chains, gprefix, lat, bw, relax.peers,
                                                         *peers.peer_wire(m, profile)))
            if ar < best[0] or not best[1]:
                best = (ar, m, None)
    return best


def exchange_s(chains: Sequence[Chain], gprefix: np.ndarray, latency: np.ndarray,
               bandwidth: np.ndarray, wire: float = 1.0,
               coder_s: np.ndarray | None = None,
               groups: Sequence[Sequence[int]] | None = None) -> tuple[float, dict[int, float]]:
    """AR of pipelines given as chains of global devices, exchanging over ``groups``
    (:mod:`skyjax.plan.pricing.exchange`; None: the direct exchange), and each sending device's
    seconds (0 and {} for one pipeline). ``wire``: bytes sent per gradient byte, ``coder_s`` [D]: a
    device's seconds per gradient byte to encode and decode (a coded exchange:
    :func:`relaxed_exchange`)."""
    return routing_s(routing(chains, groups, np.diff(gprefix)), gprefix, latency, bandwidth,
                     wire, coder_s)


def pipeline_step(stages: Sequence[Stage], microbatches: int) -> float:
    """T_i = sum t_k + (m_i - 1) max t_k + update_0 (no sync_s)."""
    ts = [s.time_s for s in stages]
    return float(sum(ts) + (microbatches - 1) * max(ts) + stages[0].update_s)


def restrict_tables(t: Tables, devices: Sequence[int], microbatches: int,
                    input_s: np.ndarray | None = None) -> Tables:
    """``t`` on a device subset (indices 0..n-1 in the order given) with m_i micro-batches: the
    in-flight counts follow ``microbatches`` and ``alone`` = m_i input_s (``input_s`` [D] from
    the profile; else recovered as alone / m)."""
    idx = np.asarray(devices, dtype=np.int64)
    ix = np.ix_(idx, idx)
    per = (np.asarray(input_s, float) if input_s is not None else t.alone / t.microbatches)
    return dataclasses.replace(
        t, work=t.work[:, idx], prefix=t.prefix[idx], fixed=t.fixed[idx], in_msg=t.in_msg[idx],
        update_prefix=t.update_prefix[idx], update_call=t.update_call[idx],
        alone=int(microbatches) * per[idx], latency=t.latency[ix], bandwidth=t.bandwidth[ix],
        memory=t.memory[idx], microbatches=int(microbatches), codec_rate=t.codec_rate[:, idx])


def fractional_bound(t: Tables) -> float:
    """A lower bound on T over every plan with any number of pipelines (a proof).

    Let w[u] = min_d work[u][d] and s_d = max_u w[u] / work[u][d] (<= 1: d's speed against the
    fastest, on the unit it does best), so any block B on d takes compute >= sum_{u in B} w[u] / s_d. A stage k of
    pipeline i on d has T - sync_s >= T_i >= m_i t_k >= m_i compute_k, so the reference work
    m_i sum_{u in B_k} w[u] it does per step is at most s_d (T - sync_s). Summed over all stages
    (each device holds at most one), every micro-batch's whole model: m sum_u w[u] <=
    (T - sync_s) sum_d s_d. Memory, comm, call costs and updates are dropped (all >= 0).
    Also T >= min_d sum_u work[u][d] + sync_s (one micro-batch through a whole chain). Zero
    bubble: T_i + credit_i obeys both, so less ``Tables.max_credit``."""
    w = t.work.min(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(t.work > 0, w[:, None] / t.work, 1.0)
    s = ratio.max(axis=0)
    frac = t.microbatches * float(w.sum()) / float(s.sum()) if s.sum() > 0 else 0.0
    return max(frac, float(t.prefix[:, -1].min())) + t.sync_s - t.max_credit()


def build_plan(profile: Profile, schedule: str, chains: Sequence[Chain], shares: Sequence[int],
               strategy: str, exact: bool, lower_bound_s: float | None,
               check: bool = True, averaging: str | None = None) -> Plan:
    """The Plan of pipelines (chains of global devices) and their shares, priced as the module
    doc says: pipeline i on tables with m_i micro-batches; raises InfeasibleError (``check``).
    ``averaging``: that mode (a plan kept after losing devices), else the cheapest allowed."""
    if len(chains) != len(shares) or not chains:
        raise ValueError(f"need one share per pipeline: {len(chains)} pipelines, "
                         f"{len(shares)} shares")
    seen: set[int] = set()
    stages: list[Stage] = []
    steps, free = [], []
    for i, (chain, m_i) in enumerate(zip(chains, shares)):
        if int(m_i) != m_i or m_i < 1:
            raise ValueError(f"shares[{i}]: expected a positive integer, got {m_i!r}")
        t = tables(profile, schedule, int(m_i))
        check_assignment(t, chain)
        if seen & {d for d, _, _ in chain}:
            raise ValueError(f"pipeline {i}: device {sorted(seen & {d for d, _, _ in chain})[0]}"
                             f" is already in another pipeline")
        seen |= {d for d, _, _ in chain}
        own = stage_costs(t, chain)
        if check:
            try:
                check_fits(profile, t, own)
            except InfeasibleError as e:
                raise InfeasibleError(f"pipeline {i}: {e}") from None
        steps.append(pipeline_step(own, int(m_i)))
        stages += [dataclasses.replace(s, pipeline=i) for s in own]
        free.append(tuple(float(t.memory[s.device] - s.memory_bytes) for s in own))
    gprefix = grad_prefix(profile)
    if averaging is not None:
        averaging = same_math(averaging, chains, profile)
    allowed = profile.relax.averagings if averaging is None else (averaging,)
    modes = fitting_modes(allowed, chains, free, gprefix, profile.relax)
    if not modes:  # a given relaxed mode (exact always fits)
        if check:
            raise InfeasibleError(f"{averaging} averaging: its state "
                                  f"({state_copies(averaging, len(chains), profile.relax)} "
                                  f"copies of each stage's gradients) does not fit the memory "
                                  f"of every stage")
        modes = allowed
    ar, averaging, groups = priced_exchange(chains, gprefix, profile, modes,
                                            max(steps) + float(profile.sync_s))
    stages = [dataclasses.replace(s, memory_bytes=s.memory_bytes + state_charge(
        averaging, gprefix, *s.units, len(chains), profile.relax))
        for s in stages]  # the mode's state, as priced
    if check and math.isinf(ar):
        raise InfeasibleError("gradient exchange: two stages that share units cannot reach "
                              "one another (bandwidth_Bps 0)")
    step = max(steps) + ar + float(profile.sync_s)
    return Plan(strategy=strategy, schedule=schedule, microbatches=int(sum(shares)),
                stages=stages, step_time_s=step, bottleneck_s=max(s.time_s for s in stages),
                exact=exact, lower_bound_s=None if exact else lower_bound_s,
                device_names=[d["name"] for d in profile.devices],
                shares=[int(x) for x in shares], allreduce_s=ar, pipeline_step_s=steps,
                averaging=averaging, exchange_groups=groups,
                exchange_reps=None if groups is None else [
                    list(r) for _, r in sorted(routing(chains, groups,
                                                       np.diff(grad_prefix(profile))).rep.items())],
                **(outer_step(profile.relax) if averaging.startswith("diloco") else {}),
                **peers.plan_fields(averaging, profile.relax),
                **topk.plan_fields(profile.relax, averaging))


def evaluate_pipelines(profile: Profile, assignments: Sequence[Chain], shares: Sequence[int],
                       schedule: str = "1f1b", strategy: str = "custom",
                       averaging: str | None = None) -> Plan:
    """The Plan of given pipelines ([(device, start, end), ...] each, disjoint devices) and
    shares (micro-batches per pipeline) under the cost model; raises InfeasibleError if a stage
    does not fit or two peers cannot reach one another, ValueError for a malformed input. One
    pipeline gives what ``cost.evaluate`` gives (``shares`` None). ``averaging``: price that
    mode (else the cheapest ``profile.relax`` allows)."""
    if len(assignments) == 1 and len(shares) == 1:
        from skyjax.plan.pricing.cost import evaluate

        return evaluate(profile, assignments[0], schedule, int(shares[0]), strategy)
    return build_plan(profile, schedule, [list(a) for a in assignments], shares, strategy,
                      False, None, averaging=averaging)


@dataclasses.dataclass
class Priced:
    """One pipeline's chain (global devices) on a subset with m_i micro-batches, its T_i, and
    whether the chain search that found it was exact."""

    chain: Chain
    step_s: float
    exact: bool
    free: tuple[float, ...] | None = None  # free_bytes at m_i, where relaxed modes are allowed


class ChainCache:
    """One pipeline's least-T_i chain per (device subset, m_i), memoised up to interchangeable
    devices: the key is the subset's count of devices per class of the whole problem
    (``device_classes``: swapping two devices of a class changes no cost), and a chain found on
    one subset is mapped class by class to another with the same counts.

    ``get`` runs the planner's search on ``restrict_tables``: the exact DP where ``exact_fits``
    (and not ``force_heuristic``), else the heuristic; ``quick`` runs the heuristic without its
    local search over orders (screening at scale). ``reprice`` prices a chain at another m_i."""

    def __init__(self, profile: Profile, schedule: str, t: Tables, force_heuristic: bool):
        self.profile, self.schedule, self.t = profile, schedule, t
        self.force_heuristic = force_heuristic
        self.class_of = labels(device_classes(t), t.num_devices)
        self.n_classes = int(self.class_of.max()) + 1
        self._found: dict[tuple, tuple[list[int], Chain | None, bool]] = {}
        self._tables: dict[int, Tables] = {}
        self.all_exact = True  # every search run so far was the exact DP
        self.searches = 0

    def tables_for(self, m: int) -> Tables:
        if m not in self._tables:
            self._tables[m] = tables(self.profile, self.schedule, m)
        return self._tables[m]

    def key(self, devices: Sequence[int]) -> tuple[int, ...]:
        return tuple(np.bincount(self.class_of[list(devices)], minlength=self.n_classes))

    def get(self, devices: Sequence[int], m: int, quick: bool = False) -> Priced | None:
        """The chain on ``devices`` (sorted) for m_i = m, or None if nothing fits."""
        devices = sorted(devices)
        vec = self.key(devices)
        hit = self._found.get((vec, m, False)) or (self._found.get((vec, m, True)) if quick
                                                   else None)
        if hit is None:
            hit = self._search(devices, m, quick)
            self._found[(vec, m, quick)] = hit
        rep, chain, exact = hit
        if chain is None:
            return None
        mapped = self._map(rep, devices, chain)
        return Priced(mapped, self.step_of(mapped, m), exact, self.free_of(mapped, m))

    def exact_at(self, devices: Sequence[int], m: int) -> bool:
        """Whether ``get(devices, m)`` came from the exact DP (its T_i the least, or no chain
        fits); False before it is asked."""
        hit = self._found.get((self.key(sorted(devices)), m, False))
        return hit is not None and hit[2]

    def _search(self, devices: list[int], m: int, quick: bool):
        sub = restrict_tables(self.t, devices, m, self.profile.input_s)
        self.searches += 1
        classes = device_classes(sub)
        exact = (not quick and not self.force_heuristic
                 and exact_search.exact_fits([len(c) for c in classes], sub.num_units))
        if exact:
            sol = exact_search.search(sub, classes)
        else:
            sol = heuristic.search(sub, min_bottleneck(sub), improve=not quick)
        self.all_exact &= exact
        chain = None if sol is None else [(devices[d], a, b) for d, a, b in sol.assignment]
        return devices, chain, exact

    def _map(self, rep: list[int], devices: list[int], chain: Chain) -> Chain:
        """``chain`` on ``rep`` moved to ``devices`` (same class counts), class by class."""
        if rep == devices:
            return chain
        to: dict[int, int] = {}
        for c in range(self.n_classes):
            src = [d for d in rep if self.class_of[d] == c]
            dst = [d for d in devices if self.class_of[d] == c]
            to.update(zip(src, dst))
        return [(to[d], a, b) for d, a, b in chain]

    def free_of(self, chain: Chain, m: int) -> tuple[float, ...] | None:
        """``free_bytes`` of a chain at m_i = m, where the bound allows a relaxed averaging
        (its state must fit: ``fitting_modes``); None otherwise."""
        if len(self.profile.relax.averagings) < 2:
            return None
        return free_bytes(self.tables_for(m), chain)

    def step_of(self, chain: Chain, m: int) -> float:
        """T_i of a chain at m_i = m; inf if it does not fit memory or links at m."""
        t = self.tables_for(m)
        stages = stage_costs(t, chain)
        if any(s.memory_bytes > t.memory[s.device] or math.isinf(s.comm_s) for s in stages):
            return _INF
        return pipeline_step(stages, m)


def outer_step(relax) -> dict:
    """The Plan fields of a DiLoCo outer step (``skyjax.relax.Relaxation``)."""
    return {"outer_every": relax.outer_every, "outer_lr": relax.outer_lr,
            "outer_momentum": relax.outer_momentum}
