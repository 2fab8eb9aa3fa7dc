"""Choosing several pipelines: which devices form each pipeline and its share of micro-batches.

The cost (:mod:`skyjax.plan.data_parallel.pipelines`): T = max_i T_i + AR + sync_s, T_i the step of pipeline i
on its devices with its m_i micro-batches (m_i >= 1, sum m_i = m), AR the gradient exchange
between pipelines. Each pipeline gets the least-T_i chain the planner's search finds on its
devices (``pipelines.ChainCache``); devices that chain leaves unused are idle.

* Small instances (``exhaustive``: <= ``EXHAUSTIVE_DEVICES`` devices and the count of
  (partition, composition) pairs and the chain searches they need within budget): every set
  partition of the devices into 1..max_pipelines blocks, every composition of m into as many
  positive parts, each block's least-T_i chain for its share; then every chain of every block
  (:mod:`skyjax.plan.data_parallel.every_chain`: a larger T_i may have a cheaper exchange), pruned by lower
  bounds on AR. ``exact`` when that pass finished within its budgets.
* Larger instances: candidate splits from link groups (regions; ``classes.link_groups``, over
  ``MAX_GROUPS`` coarsened) and speeds (:mod:`skyjax.plan.data_parallel.candidates`): each set
  partition of the groups (or one block, or one group per block, when there are many; groups
  may be left out), each block's devices dealt round-robin, fastest first within a group, into
  r pipelines, for every r with blocks x r <= max_pipelines. Shares by the
  greedy rule: start at 1 each, repeatedly give one micro-batch to the pipeline whose
  T_i(m_i + 1) is least (exact for min max_i T_i when every T_i is non-decreasing in m_i). The
  screen prices T_i(m') by one quick chain per pipeline (``ChainCache.get(quick=True)``) found
  at a share estimated from speeds (rounded up to a power of two) and re-priced at m' (a real
  plan: its memory is checked). Splits go in the order of a lower bound on their T
  (``split_bound``: fractional work, and the exchange each pipeline must make), and the screen
  stops at the first whose bound reaches the best T so far, or after ``SCREEN_SEARCHES``
  chain searches;
  the ``REFINE_TOP`` best candidates then get the full chain search at their final shares. The
  result carries ``lower_bound_s`` (``pipelines.fractional_bound``), never ``exact``.

The single-pipeline plan (the planner's own, handed in) is always a candidate and is returned
unchanged when it is best and the search was exhaustive and exact.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable, Iterator, Sequence

import numpy as np

from skyjax.plan.data_parallel.every_chain import EveryChain
from skyjax.plan.pricing.topk import wire_ratio
from skyjax.topk_wire import bits_of
from skyjax.plan.search.exact import exact_cost
from skyjax.plan.data_parallel.candidates import (Estimator, candidate_splits, rates,
                                                  set_partitions, split_bound)
from skyjax.names import PEER_MODES
from skyjax.plan.data_parallel.pipelines import (INT8_WIRE, ChainCache, Priced, build_plan, evaluate_pipelines,
                                   fractional_bound, grad_prefix, region_groups,
                                   relaxed_exchange)
from skyjax.plan.pricing.cost import stage_costs, tables
from skyjax.plan.model.types import InfeasibleError, Plan
from skyjax.profile.format import Profile

EXHAUSTIVE_DEVICES = 8  # most devices for the exhaustive search
EXHAUSTIVE_COMBOS = 200_000  # most (partition, composition) pairs
EXHAUSTIVE_SEARCHES = 3000  # most (device subset up to symmetry, m_i) chain searches
EXHAUSTIVE_WORK = 1e8  # most vectorised elements of those searches' DPs (exact.exact_cost)
REFINE_TOP = 1  # screened candidates per pipeline count that get the full chain search
REFINE_WITHIN = 1.05  # ... when their screened T is within this factor of the best so far
RUNNERS_UP = 6  # the least-T plans of several pipelines the planner also simulates
SCREEN_SEARCHES = 24  # per pipeline count, the screen stops after this many chain searches
_INF = math.inf


def compositions(m: int, k: int) -> Iterator[tuple[int, ...]]:
    """Every way to write m as an ordered sum of k positive integers."""
    for cuts in itertools.combinations(range(1, m), k - 1):
        b = (0,) + cuts + (m,)
        yield tuple(y - x for x, y in zip(b, b[1:]))


def _stirling(n: int, k: int) -> int:
    """Partitions of n items into exactly k blocks."""
    row = [1] + [0] * k
    for i in range(1, n + 1):
        row = [0] + [j * row[j] + row[j - 1] for j in range(1, min(i, k) + 1)] + [0] * (k - i)
        row = row[: k + 1]
    return row[k]


def exhaustive_fits(cache: ChainCache, max_pipelines: int) -> bool:
    """Whether every split and share can be tried: few devices, (partition, composition) pairs
    and chain searches (subsets up to symmetry x shares) within budget."""
    n, m = cache.t.num_devices, cache.t.microbatches
    if n > EXHAUSTIVE_DEVICES:
        return False
    k_max = min(max_pipelines, m, n)
    combos = sum(_stirling(n, k) * math.comb(m - 1, k - 1) for k in range(1, k_max + 1))
    subsets = {cache.key(s) for r in range(1, n + 1) for s in itertools.combinations(range(n), r)}
    work = sum(exact_cost([x for x in key if x], cache.t.num_units)[1] for key in subsets)
    return (combos <= EXHAUSTIVE_COMBOS and len(subsets) * m <= EXHAUSTIVE_SEARCHES
            and work * m <= EXHAUSTIVE_WORK)


@dataclasses.dataclass
class _Best:
    step_s: float
    chains: list | None = None  # None: the single-pipeline plan
    shares: list[int] | None = None
    # the RUNNERS_UP least-T offers (T, chains, shares), the best among them: what the planner
    # also simulates (skyjax.plan.as_run), since the least T is not always the fastest run
    runners: list = dataclasses.field(default_factory=list)

    def offer(self, step_s: float, priced: Sequence[Priced], shares: Sequence[int]) -> None:
        chains = [p.chain for p in priced]
        if len(self.runners) < RUNNERS_UP or step_s < self.runners[-1][0]:
            key = (chains, list(shares))
            if all((c, s) != key for _, c, s in self.runners):
                self.runners = sorted(self.runners + [(step_s, chains, list(shares))],
                                      key=lambda r: r[0])[:RUNNERS_UP]
        if step_s < self.step_s * (1 - 1e-12):
            self.step_s, self.chains, self.shares = step_s, chains, list(shares)


def search(profile: Profile, schedule: str, microbatches: int, max_pipelines: int,
           single: Plan | None, *, strategy: str = "optimal",
           force_heuristic: bool = False, cutoff: float = _INF,
           runners_up: list[Plan] | None = None) -> Plan:
    """The least-T plan of 1..max_pipelines pipelines (module doc). ``single``: the planner's
    single-pipeline plan (None if nothing fits one pipeline); ``cutoff``: several pipelines
    only below it (else ``single``, or InfeasibleError). ``runners_up``: a list that receives
    the plans of the ``RUNNERS_UP`` least T offered below ``single``'s (the best included)."""
    t = tables(profile, schedule, microbatches)
    cache = ChainCache(profile, schedule, t, force_heuristic)
    gprefix = grad_prefix(profile)
    best = _Best(min(single.step_time_s if single is not None else _INF, cutoff))
    # every split up to the most pipelines that fits; candidates for more (monotone: module doc)
    top = max([k for k in range(2, max_pipelines + 1) if exhaustive_fits(cache, k)], default=1)
    exhaustive = top == max_pipelines
    one_exact = single is None or single.exact
    if top > 1:
        if single is None:  # that no one pipeline fits counts as the search's finding
            cache.get(range(t.num_devices), microbatches)
            one_exact = cache.all_exact
        exhaustive &= _exhaustive(cache, top, gprefix, best)
    if not exhaustive:
        _by_candidates(cache, top + 1, max_pipelines, gprefix, best)
    for _, chains, shares in best.runners if runners_up is not None else ():
        order = sorted(range(len(chains)), key=lambda i: min(d for d, _, _ in chains[i]))
        try:
            runners_up.append(build_plan(profile, schedule, [chains[i] for i in order],
                                         [shares[i] for i in order], strategy, False, None))
        except InfeasibleError:
            pass
    if best.chains is None and single is None:
        raise InfeasibleError("no feasible plan: no split of the devices into at most "
                              f"{max_pipelines} pipelines fits memory and links")
    exact = exhaustive and one_exact
    if best.chains is None:
        if exact:
            return single
        return dataclasses.replace(single, exact=False,
                                   lower_bound_s=min(fractional_bound(t), single.step_time_s))
    order = sorted(range(len(best.chains)), key=lambda i: min(d for d, _, _ in best.chains[i]))
    out = build_plan(profile, schedule, [best.chains[i] for i in order],
                     [best.shares[i] for i in order], strategy, exact, None)
    if not exact:
        out.lower_bound_s = min(fractional_bound(t), out.step_time_s)
    return out


def _exhaustive(cache: ChainCache, max_pipelines: int, gprefix: np.ndarray,
                best: _Best) -> bool:
    """Every partition into 2..max_pipelines blocks x every composition, each block's least-T_i
    chain, then every chain (module doc); whether that finished within its budgets. Counts go
    in turn, so a larger ``max_pipelines`` repeats a smaller one's work before its own (the
    budgets shared: past them only the least-T_i pass goes on), and is never worse."""
    t, m = cache.t, cache.t.microbatches
    parts = [p for p in set_partitions(t.num_devices, min(max_pipelines, m)) if len(p) > 1]
    every = EveryChain(cache, gprefix, best, lambda p: _exchange(p, gprefix, cache.profile))
    for k in range(2, min(max_pipelines, m) + 1):
        _least_chains(cache, [p for p in parts if len(p) == k], gprefix, best)
        if every.complete:
            every.run([p for p in parts if len(p) == k], lambda n: compositions(m, n))
    return every.complete


def _least_chains(cache: ChainCache, parts: list, gprefix: np.ndarray, best: _Best) -> None:
    """Each partition x composition with each block's least-T_i chain."""
    m, sync = cache.t.microbatches, cache.t.sync_s
    for part in parts:
        for shares in compositions(m, len(part)):
            priced = []
            for block, m_i in zip(part, shares):
                p = cache.get(block, m_i)
                if p is None:
                    break
                priced.append(p)
            else:
                top = max(p.step_s for p in priced) + sync
                if top < best.step_s:
                    ar = _exchange(priced, gprefix, cache.profile)
                    best.offer(top + ar, priced, shares)


def greedy_shares(step: Sequence[Callable[[int], float]], m: int) -> list[int] | None:
    """Shares minimising max_i step[i](m_i) for non-decreasing step functions: 1 each, then
    each further micro-batch to the pipeline whose step with it is least (None: no fit)."""
    shares = [1] * len(step)
    if len(step) > m or any(math.isinf(f(1)) for f in step):
        return None
    for _ in range(m - len(step)):
        nxt = [f(s + 1) for f, s in zip(step, shares)]
        i = int(np.argmin(nxt))
        if math.isinf(nxt[i]):
            return None
        shares[i] += 1
    return shares


def _by_candidates(cache: ChainCache, low: int, high: int, gprefix: np.ndarray,
                   best: _Best) -> None:
    """For each pipeline count from ``low`` to ``high`` in turn: screen its candidate splits,
    then the full chain search for its best few (module doc)."""
    t = cache.t
    rate = rates(t)
    relax = cache.profile.relax  # a relaxed exchange sends fewer bytes per step, at least:
    least = min([1.0] + [INT8_WIRE] * any(a.startswith("int8") for a in relax.averagings)
                + [1.0 / relax.outer_every] * any(a.startswith("diloco") for a in relax.averagings)
                + [0.0] * any(a in PEER_MODES for a in relax.averagings))  # async may hide it
    if relax.outer_compression != "none":  # the relaxed averagings' compressed wire
        ratio = wire_ratio(gprefix, relax.outer_topk, bits_of(relax.outer_compression))
        least = min(least, ratio / (relax.outer_every if any(
            a.startswith("diloco") for a in relax.averagings) else 1))
    group = np.empty(t.num_devices, dtype=np.int64)
    for g, members in enumerate(region_groups(cache.profile)):
        group[members] = g
    estimator = Estimator(t, group)
    by_count: dict[int, list] = {}
    for split in candidate_splits(t, high):
        by_count.setdefault(len(split), []).append(split)
    for n in range(low, high + 1):
        splits = by_count.get(n, [])
        est = [estimator.estimate(s, gprefix[-1] * least) for s in splits]
        order = np.argsort(est, kind="stable")
        _screen(cache, [(splits[i], est[i]) for i in order], rate, gprefix, best, estimator)


def _screen(cache: ChainCache, splits: list, rate: np.ndarray, gprefix: np.ndarray,
            best: _Best, estimator: Estimator) -> None:
    """Screen ``splits`` ((split, estimate) of one pipeline count, least estimate first) until
    an estimate reaches the best T so far or after ``SCREEN_SEARCHES`` chain searches, then the
    full search for the ``REFINE_TOP`` best within ``REFINE_WITHIN`` of the best T so far."""
    t, m, sync = cache.t, cache.t.microbatches, cache.t.sync_s
    start = cache.searches
    screened = []
    for split, estimate in splits:
        if cache.searches - start >= SCREEN_SEARCHES or estimate >= best.step_s:
            break
        if estimator.bound(split) >= best.step_s:
            continue
        share = np.array([np.sort(rate[s])[::-1][: t.num_units].sum() for s in split])
        est = m * share / share.sum()
        steps = [_step_fn(cache, s, _pow2(1.25 * e + 1)) for s, e in zip(split, est)]
        shares = greedy_shares(steps, m)
        if shares is None:
            continue
        priced = [f.priced(x) for f, x in zip(steps, shares)]
        ar = _exchange(priced, gprefix, cache.profile)
        step = max(p.step_s for p in priced) + ar + sync
        best.offer(step, priced, shares)
        screened.append((step, split, shares, priced))
    screened.sort(key=lambda x: x[0])
    for step, split, shares, priced in screened[:REFINE_TOP]:
        if step > best.step_s * REFINE_WITHIN:
            break
        full = []
        for s, m_i, p in zip(split, shares, priced):
            q = cache.get(s, m_i)
            full.append(q if q is not None and q.step_s < p.step_s else p)
        ar = _exchange(full, gprefix, cache.profile)
        best.offer(max(p.step_s for p in full) + ar + sync, full, shares)


def _exchange(priced: Sequence[Priced], gprefix: np.ndarray, profile: Profile) -> float:
    """AR of the pipelines in the plan's order (by least device, as ``search`` builds it): the
    routing, so its cost, depends on the pipelines' order."""
    # a mode only where its state fits
    from skyjax.plan.data_parallel.pipelines import fitting_modes, priced_exchange

    modes = fitting_modes(profile.relax.averagings, [p.chain for p in priced],
                          [p.free for p in priced], gprefix, profile.relax)
    chains = sorted((p.chain for p in priced), key=lambda c: min(d for d, _, _ in c))
    return priced_exchange(chains, gprefix, profile, modes,
                           max(p.step_s for p in priced) + float(profile.sync_s))[0]


def _pow2(x: float) -> int:
    """The least power of two >= x (few distinct m_ref, so the screens share chain searches)."""
    return 1 << max(0, math.ceil(math.log2(max(x, 1.0))))


class _step_fn:
    """T_i(m') of one pipeline for the screen: its quick chain found at ``m_ref`` re-priced at
    m' <= m_ref, a quick search above. Below m_ref the chain fits (memory only shrinks with
    fewer micro-batches) and its stage times do not depend on m': T_i(m') = sum t_k +
    (m' - 1) max t_k + update_0(m'), the arithmetic of ``pipelines.pipeline_step``."""

    def __init__(self, cache: ChainCache, devices: list[int], m_ref: int):
        self.cache, self.devices = cache, devices
        self.m_ref = min(m_ref, cache.t.microbatches)
        self.ref = cache.get(devices, self.m_ref, quick=True)
        self._memo: dict[int, Priced | None] = {}
        if self.ref is not None:
            ts = [s.time_s for s in stage_costs(cache.tables_for(self.m_ref), self.ref.chain)]
            self._sum, self._max = sum(ts), max(ts)

    def priced(self, m: int) -> Priced | None:
        if m not in self._memo:
            p = None
            if self.ref is not None and m <= self.m_ref:
                d, _, b = self.ref.chain[0]
                step = float(self._sum + (m - 1) * self._max
                             + float(self.cache.tables_for(m).first_update(d, b)))
                p = Priced(self.ref.chain, step, False, self._free(m))
            if p is None:
                p = self.cache.get(self.devices, m, quick=True)
            self._memo[m] = p
        return self._memo[m]

    def _free(self, m: int) -> tuple[float, ...] | None:
        """``ChainCache.free_of`` of the chain at m without its stage times: each stage's
        memory, as ``cost.stage_costs`` charges it, off its device's."""
        if len(self.cache.profile.relax.averagings) < 2:
            return None
        t, chain = self.cache.tables_for(m), self.ref.chain
        return tuple(float(t.memory[d] - int(round(
            t.state_prefix[b] - t.state_prefix[a]
            + t.inflight_at(len(chain), k) * (t.act_prefix[b] - t.act_prefix[a]))))
            for k, (d, a, b) in enumerate(chain))

    def __call__(self, m: int) -> float:
        p = self.priced(m)
        return _INF if p is None else p.step_s


def without_devices(profile: Profile, plan: Plan, lost: Sequence[int]) -> Plan | None:
    """The plan after losing ``lost`` devices: the pipelines that keep every device, each with
    its cuts, the global batch re-split among them (:func:`greedy_shares` over their T_i);
    None when no pipeline is left or none fits its share. Every process derives the same plan
    from the same plan and profile, so survivors agree on it without exchanging a message."""
    gone = set(lost)
    chains = [[(s.device, *s.units) for s in plan.pipeline(i).stages]
              for i in range(plan.num_pipelines)]
    chains = [c for c in chains if not any(d in gone for d, _, _ in c)]
    if not chains:
        return None

    def step_fn(chain):
        def step(m: int) -> float:
            try:
                return evaluate_pipelines(profile, [chain], [m], plan.schedule).step_time_s
            except InfeasibleError:
                return math.inf
        return step

    shares = greedy_shares([step_fn(c) for c in chains], plan.microbatches)
    if shares is None:
        return None
    out = evaluate_pipelines(profile, chains, shares, plan.schedule, plan.strategy,
                             averaging=plan.averaging if len(chains) > 1 else None)
    # what the plan relaxed stays relaxed: each kept stage's codec, and the averaging
    codec = {(s.device, s.units): s.codec for s in plan.stages}
    out.stages = [dataclasses.replace(s, codec=codec[s.device, s.units]) for s in out.stages]
    if out.num_pipelines > 1:
        out.outer_every = plan.outer_every  # the averaging: as priced (evaluate_pipelines)
        out.outer_lr, out.outer_momentum = plan.outer_lr, plan.outer_momentum
        out.outer_compression, out.outer_topk = plan.outer_compression, plan.outer_topk
    return out
