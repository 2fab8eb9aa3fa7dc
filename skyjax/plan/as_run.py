"""The price a plan is chosen by and shown with: the step as it runs, which the simulator
replays (:mod:`skyjax.plan.replay.simulate`, the spec of what runs). docs/design.md,
"Planning", "The price: the step as it runs", gives the reasons; in three sentences:

The cost model's T charges every link's latency and both transfers inside a stage, once per
micro-batch, and the exchange between pipelines after the slowest one; the runtime sends beside
compute, pays latency only where the micro-batches in flight cannot hide it, and starts each
device's exchange after its own last backward. So T is what the searches minimise (fast, with
bounds and proofs), and the plan is then chosen among candidates by the simulated step: the
searched plan, the plan the search finds with links' latency free (what the steady state pays),
each with the warm-ups that pay (deeper 1F1B warm-ups before slow links, per pipeline), the best
one's pipelines in every other averaging mode allowed, and, on
small instances, every plan there is (:func:`every_plan`), so that the plan is the simulator's
optimum there. The plan's ``step_time_s`` is that price, ``model_s`` its T, and
``lower_bound_s`` a bound that holds for every plan's simulated step (:func:`run_bound`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from skyjax.plan.bounds.step import min_bottleneck
from skyjax.plan.data_parallel.pipelines import build_plan, fractional_bound
from skyjax.plan.data_parallel.split import compositions
from skyjax.plan.model.extension import ExtraCost
from skyjax.plan.model.schedules import warmups
from skyjax.plan.model.types import InfeasibleError, Plan
from skyjax.plan.pricing.cost import Tables, evaluate_tables, tables
from skyjax.plan.pricing.exchange import unpriced_modes
from skyjax.plan.replay.simulate import simulate_plan
from skyjax.plan.search.warmup import choose, linkless, window
from skyjax.profile.format import Profile

EVERY_PLAN_LIMIT = 3000  # plans up to which the planner simulates every one (small instances)


def run_step(plan: Plan, profile: Profile, extra: ExtraCost | None = None) -> float:
    """The simulated step of ``plan`` on ``profile`` (with ``extra``'s terms where given)."""
    return float(simulate_plan(plan, profile, extra=extra).step_time_s)


def priced(plan: Plan, profile: Profile, extra: ExtraCost | None = None) -> Plan:
    """``plan`` with ``step_time_s`` its simulated step and ``model_s`` its T (once)."""
    if plan.model_s is not None:
        return plan
    return dataclasses.replace(plan, model_s=plan.step_time_s,
                               step_time_s=run_step(plan, profile, extra))


def run_bound(profile: Profile, schedule: str, microbatches: int, max_pipelines: int) -> float:
    """A lower bound on the simulated step of every plan. Every stage runs its m_i forwards and
    backwards (and W passes) one after another, so the step is at least m_i times each stage's
    linkless t_k (its passes and message calls) plus sync_s: summed over the devices' speeds,
    ``fractional_bound``'s first term (the step's work spread over every device at its speed),
    and with one pipeline at least m times the least bottleneck of any linkless chain. Outside
    zero bubble also one micro-batch through a whole chain; under it a W pass leaves the chain."""
    t = linkless(tables(profile, schedule, microbatches))
    if t.credit_factor:
        w = t.work.min(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            speed = np.where(t.work > 0, w[:, None] / t.work, 1.0).max(axis=0)
        out = (microbatches * float(w.sum()) / float(speed.sum()) if speed.sum() > 0
               else 0.0) + t.sync_s
    else:
        out = fractional_bound(t)
    if max_pipelines == 1:
        out = max(out, microbatches * min_bottleneck(t) + t.sync_s)
    return float(out)


def with_warmups(t_of: Callable[[int], Tables], plan: Plan, warm: Sequence[Sequence[int]]
                 ) -> Plan | None:
    """``plan`` (1F1B) with pipeline i's stages taking ``warm[i]`` warm-up forwards, their
    memory charged at min(m_i, w + 1) micro-batches in flight; None where a stage no longer fits
    its device (``t_of(m_i)``: the tables with m_i micro-batches)."""
    stages = list(plan.stages)
    for i in range(plan.num_pipelines):
        ids = plan.stage_ids(i)
        m = plan.pipeline_shares()[i]
        t = t_of(m)
        own = warmups(len(ids), m)
        for k, g in enumerate(ids):
            s = stages[g]
            w = int(warm[i][k])
            a, b = s.units
            act = float(t.act_prefix[b] - t.act_prefix[a])
            mem = s.memory_bytes + int(round((min(m, w + 1) - min(m, own[k] + 1)) * act))
            if mem > t.memory[s.device]:
                return None
            stages[g] = dataclasses.replace(s, warmup=w if w > own[k] else None,
                                            memory_bytes=mem)
    return dataclasses.replace(plan, stages=stages)


def warmup_options(t_of: Callable[[int], Tables], plan: Plan) -> list[list[list[int]]]:
    """Per-pipeline warm-ups worth simulating for a 1F1B plan: the window model's choice
    (:func:`skyjax.plan.search.warmup.choose`) and the deepest that memory allows (each stage
    at most the one before it), beside 1F1B's own."""
    if plan.schedule != "1f1b":
        return []
    chosen, deepest = [], []
    for i in range(plan.num_pipelines):
        sub = plan.pipeline(i)
        m, p = sub.microbatches, len(sub.stages)
        t = t_of(m)
        own = warmups(p, m)
        chosen.append(choose(t, sub, window(t, sub)) if p > 1 else own)
        prev, row = m - 1, []
        for k, s in enumerate(sub.stages):
            a, b = s.units
            act = float(t.act_prefix[b] - t.act_prefix[a])
            room = t.memory[s.device] - s.memory_bytes
            extra = int(room // act) if act > 0 else m
            w = max(own[k], min(prev, own[k] + extra, m - 1 if k < p - 1 else own[k]))
            row.append(w)
            prev = w
        deepest.append(row)
    out = []
    for option in (chosen, deepest):
        if option not in out and any(w != o for row, sub_own in zip(option, [
                warmups(len(plan.stage_ids(i)), plan.pipeline_shares()[i])
                for i in range(plan.num_pipelines)]) for w, o in zip(row, sub_own)):
            out.append(option)
    return out


def best_as_run(profile: Profile, candidates: Iterable[Plan], *, warm: bool = True,
                extra: ExtraCost | None = None) -> Plan:
    """The candidate with the least simulated step, each also tried with the warm-ups that
    might pay (``warm``, 1F1B); then the best one's pipelines in every other averaging mode
    allowed that fits (the cost model's T ranks the modes otherwise than the simulator may).
    Ties go to the earlier candidate, a plan's own warm-ups before deeper ones.
    ``step_time_s`` is then the simulated step and ``model_s`` its T."""
    cache: dict[int, Tables] = {}

    def t_of(m: int) -> Tables:
        if m not in cache:
            cache[m] = tables(profile, "1f1b", m)
        return cache[m]

    def better(plans: Iterable[Plan], best: Plan | None) -> Plan | None:
        for plan in plans:
            options = [plan] + ([x for x in (with_warmups(t_of, plan, w)
                                             for w in warmup_options(t_of, plan))
                                 if x is not None] if warm and extra is None else [])
            for option in options:
                got = priced(option, profile, extra)
                if best is None or got.step_time_s < best.step_time_s * (1 - 1e-12):
                    best = got
        return best

    unique: dict[tuple, Plan] = {}
    for plan in candidates:
        unique.setdefault(json_key(plan), plan)
    best = better(unique.values(), None)
    if best is None:
        raise InfeasibleError("no candidate plan")
    if best.num_pipelines > 1 and len(profile.relax.averagings) > 1 and extra is None:
        pipes = [[(s.device, *s.units) for s in best.pipeline(i).stages]
                 for i in range(best.num_pipelines)]
        best = better((p for p in _each_mode(profile, t_of, best.schedule, pipes,
                                             best.pipeline_shares(), best.strategy,
                                             profile.relax.averagings)
                       if p.averaging != best.averaging), best)
    return best


def json_key(plan: Plan) -> tuple:
    """What makes two plans the same run: stages (device, units, codec, warm-up, pipeline),
    shares and averaging."""
    return (tuple((s.device, s.units, s.codec, s.warmup, s.pipeline) for s in plan.stages),
            tuple(plan.pipeline_shares()), plan.averaging)


def certified(plan: Plan, bound_s: float, exhaustive: bool) -> Plan:
    """``plan`` marked exact where it is the simulator's optimum (``exhaustive``: every plan was
    simulated) or meets ``bound_s``; else carrying the bound."""
    if exhaustive or plan.step_time_s <= bound_s * (1 + 1e-9):
        return dataclasses.replace(plan, exact=True, lower_bound_s=None)
    return dataclasses.replace(plan, exact=False, lower_bound_s=min(bound_s, plan.step_time_s))


# ---- every plan of a small instance ---------------------------------------------------------

def chains(devices: Sequence[int], num_units: int) -> Iterator[list[tuple[int, int, int]]]:
    """Every chain on ``devices`` (all of them, every order, every cut)."""
    p = len(devices)
    if p > num_units:
        return
    for order in itertools.permutations(devices):
        for cuts in itertools.combinations(range(1, num_units), p - 1):
            bounds = (0, *cuts, num_units)
            yield [(d, bounds[k], bounds[k + 1]) for k, d in enumerate(order)]


def _set_partitions(items: list[int], blocks: int) -> Iterator[list[list[int]]]:
    """Partitions of ``items`` into ``blocks`` non-empty blocks, each block in order and the
    blocks ordered by their first item."""
    if blocks == 1:
        yield [items]
        return
    if len(items) < blocks:
        return
    first, rest = items[0], items[1:]
    for part in _set_partitions(rest, blocks - 1):  # first alone
        yield [[first]] + part
    for part in _set_partitions(rest, blocks):  # first joins a block
        for j in range(len(part)):
            yield sorted([sorted([first] + part[j])] + part[:j] + part[j + 1:])


def every_assignment(num_devices: int, num_units: int, microbatches: int, max_pipelines: int
                     ) -> Iterator[tuple[list[list[tuple[int, int, int]]], tuple[int, ...]]]:
    """Every (pipelines as chains, shares) of a cluster: the devices used, their split into
    pipelines, each pipeline's order and cuts, and the micro-batches per pipeline."""
    for size in range(1, num_devices + 1):
        for used in itertools.combinations(range(num_devices), size):
            for k in range(1, min(max_pipelines, size, microbatches) + 1):
                for part in _set_partitions(list(used), k):
                    for combo in itertools.product(*[list(chains(b, num_units)) for b in part]):
                        for shares in (compositions(microbatches, k) if k > 1
                                       else [(microbatches,)]):
                            yield [list(c) for c in combo], tuple(shares)


def count_plans(num_devices: int, num_units: int, microbatches: int, max_pipelines: int,
                schedule: str, limit: int) -> int:
    """How many plans ``every_plan`` would simulate at most (warm-ups counted under 1F1B),
    counting stopped past ``limit``."""
    n = 0
    for pipes, shares in every_assignment(num_devices, num_units, microbatches, max_pipelines):
        n += 1 if schedule != "1f1b" else math.prod(
            _warmup_count(len(c), m) for c, m in zip(pipes, shares))
        if n > limit:
            break
    return n


def _warmup_count(p: int, m: int) -> int:
    """How many warm-up rows ``every_warmup`` gives one pipeline of p stages and m
    micro-batches."""
    own = warmups(p, m)
    ranges = [range(own[k], max(own[k], m - 1) + 1) if k < p - 1 else [own[k]]
              for k in range(p)]
    return sum(1 for w in itertools.product(*ranges) if all(a >= b for a, b in zip(w, w[1:])))


def every_warmup(plan: Plan) -> Iterator[list[list[int]]]:
    """Every choice of 1F1B warm-ups per pipeline: at least 1F1B's own, at most m - 1, not
    increasing along the pipeline."""
    rows = []
    for i in range(plan.num_pipelines):
        p, m = len(plan.stage_ids(i)), plan.pipeline_shares()[i]
        own = warmups(p, m)
        ranges = [range(own[k], max(own[k], m - 1) + 1) if k < p - 1 else [own[k]]
                  for k in range(p)]
        rows.append([list(w) for w in itertools.product(*ranges)
                     if all(a >= b for a, b in zip(w, w[1:]))])
    for combo in itertools.product(*rows):
        yield [list(r) for r in combo]


def every_plan(profile: Profile, schedule: str, microbatches: int, max_pipelines: int,
               strategy: str = "optimal", warm: bool = True) -> Iterator[Plan]:
    """Every plan that fits (cost-model pricing, routes as ``build_plan`` chooses them), in
    every averaging mode allowed that fits, with every warm-up choice under 1F1B (``warm``):
    what brute force simulates."""
    cache: dict[int, Tables] = {}

    def t_of(m: int) -> Tables:
        if m not in cache:
            cache[m] = tables(profile, schedule, m)
        return cache[m]

    modes = profile.relax.averagings if len(profile.relax.averagings) > 1 else (None,)
    for pipes, shares in every_assignment(profile.num_devices, profile.num_units, microbatches,
                                          max_pipelines):
        for plan in _each_mode(profile, t_of, schedule, pipes, shares, strategy, modes):
            yield plan
            if schedule == "1f1b" and warm:
                yield from _deeper(t_of, plan)


def _each_mode(profile: Profile, t_of: Callable[[int], Tables], schedule: str, pipes: list,
               shares: Sequence[int], strategy: str, modes: Sequence[str | None]
               ) -> Iterator[Plan]:
    """The plan of ``pipes`` and ``shares`` in each averaging mode allowed that fits and the
    profile can price (one plan per mode it runs; one pipeline: the one plan), so that the
    simulator prices every mode."""
    seen, unpriced = set(), unpriced_modes(profile)
    for mode in (m for m in modes if m not in unpriced) if len(pipes) > 1 else (None,):
        try:
            if len(pipes) == 1:
                plan = evaluate_tables(profile, t_of(shares[0]), pipes[0], strategy, False,
                                       None)
            else:
                plan = build_plan(profile, schedule, pipes, shares, strategy, False, None,
                                  averaging=mode)
        except InfeasibleError:
            continue
        if math.isinf(plan.step_time_s) or plan.averaging in seen:
            continue
        seen.add(plan.averaging)
        yield plan


def _deeper(t_of: Callable[[int], Tables], plan: Plan) -> Iterator[Plan]:
    """``plan`` with each deeper choice of 1F1B warm-ups that fits."""
    for warm in every_warmup(plan):
        if any(w > o for row, i in zip(warm, range(plan.num_pipelines)) for w, o in
               zip(row, warmups(len(plan.stage_ids(i)), plan.pipeline_shares()[i]))):
            deeper = with_warmups(t_of, plan, warm)
            if deeper is not None:
                yield deeper


def simulated_optimum(profile: Profile, schedule: str, microbatches: int, max_pipelines: int,
                      strategy: str = "optimal", warm: bool = True) -> Plan | None:
    """The plan of least simulated step among ``every_plan`` (ties: the first), priced."""
    best = None
    for plan in every_plan(profile, schedule, microbatches, max_pipelines, strategy, warm):
        got = priced(plan, profile)
        if best is None or got.step_time_s < best.step_time_s * (1 - 1e-12):
            best = got
    return best
