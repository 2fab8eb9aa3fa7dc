"""``plan``: from a profile to the plan with the least step as it runs. docs/design.md,
"Planning", gives the searches and bounds and the reasons for them; this module chooses among
them:

* the price: the searches minimise the cost model's T (:mod:`skyjax.plan.pricing.cost`), fast
  and with bounds; the plan is then chosen among their candidates by the simulated step
  (:mod:`skyjax.plan.as_run`: the searched plan, the plan searched with links' latency free,
  each with the warm-ups that pay; on small instances every plan), which is the plan's
  ``step_time_s``; its T is ``model_s``. ``searched_plan`` is the cost model's own plan;
* strategy: ``even`` (:mod:`skyjax.plan.search.even`) or ``optimal``, which minimises over
  which devices are used, their order and the cuts, under memory (``dynamic`` is ``optimal`` at
  plan time);
* search: the exact DP (:mod:`skyjax.plan.search.exact`, ``exact: true`` on T) where it fits,
  else the heuristic (:mod:`skyjax.plan.search.heuristic`) with its bound on T, the larger of
  :mod:`skyjax.plan.bounds.step` and :mod:`skyjax.plan.bounds.group_bound`. For GPipe, while
  that gap exceeds ``REGION_GAP``, ``refine`` looks for a lower sum at the plan's bottleneck;
* certificates (``certify=True``; ``python -m skyjax.plan --certify``): while the gap on T still
  exceeds ``REGION_GAP``, :mod:`skyjax.plan.certificates` tightens the searched plan's bound on
  T, never the plan; they can take seconds at scale, so they run only when asked;
* extra cost terms (``extra``, :mod:`skyjax.plan.model.extension`; the optional shared-host
  model): the price carries what they add, which the searches do not see, and the planner asks
  them for better plans (``ExtraCost.best_of``);
* several pipelines (``max_pipelines`` > 1, :mod:`skyjax.plan.data_parallel`): the
  single-pipeline plan is returned where it is best;
* schedule "auto" (``least_schedule``): the above under every schedule, the least step kept.

An infeasible problem raises InfeasibleError naming what does not fit
(:mod:`skyjax.plan.search.infeasible`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from skyjax.names import SCHEDULES, STRATEGIES, WARMUPS
from skyjax.plan.search import exact as exact_search
from skyjax.plan.search import heuristic
from skyjax.plan.data_parallel import split as pipeline_split
from skyjax.plan.bounds.step import lower_bound, min_bottleneck
from skyjax.plan.pricing.classes import device_classes
from skyjax.plan.pricing.cost import Solution, Tables, evaluate_tables, tables
from skyjax.plan.search.even import even_assignment
from skyjax.plan.search.infeasible import infeasible_message
from skyjax.plan.bounds.group_bound import group_bound
from skyjax.plan.bounds.group_terms import GroupBound
from skyjax.plan.search.refine import refine_plan
from skyjax.plan import as_run
from skyjax.plan.data_parallel.pipelines import build_plan
from skyjax.plan.model.extension import ExtraCost
from skyjax.plan.model.types import InfeasibleError, Plan
from skyjax.profile.format import Profile
from skyjax.relax import EXACT, Relaxation

REGION_GAP = 0.01  # try region_bound only while the plan is this far above the other bounds
GOAL_GAP = 0.009  # chain_bound's goal: a gap just inside REGION_GAP (its last step lands on it)


def plan(profile: Profile, strategy: str = "optimal", schedule: str = "1f1b",
         microbatches: int = 8, *, force_heuristic: bool = False, certify: bool = False,
         extra: ExtraCost | None = None, max_pipelines: int = 1,
         relax: Relaxation = EXACT, warmup: str = "auto") -> Plan:
    """Plan a profile. even: all devices in order; optimal/dynamic: the least step as it runs
    (module doc). ``certify``: also compute the cost model's lower-bound certificates (module
    doc); ``extra``: extra cost terms (:mod:`skyjax.plan.model.extension`), None for the core
    model alone. ``max_pipelines``: above 1, up to that many pipelines in data parallel
    (:mod:`skyjax.plan.data_parallel.split`; ``even`` ignores it); 0 (auto): up to
    min(``AUTO_PIPELINES``, devices, micro-batches), 1 with extra cost terms. ``relax``: what the
    plan may relax on slow links (:mod:`skyjax.relax`): each link's codec and the pipelines'
    averaging are then the cheapest allowed under the cost model, and the relaxed plan is taken only
    where its step is at least ``relax.min_gain`` below the exact plan's (a relaxation changes the
    math: it must buy something); the default relaxes nothing. ``schedule`` "auto":
    :func:`least_schedule`. ``warmup`` "auto" (default): 1F1B stages take deeper warm-ups before
    slow links where the simulated step says they pay, in every pipeline; "1f1b": 1F1B's own.

    The plan returned is priced as it runs (:mod:`skyjax.plan.as_run`): ``step_time_s`` is its
    simulated step, ``model_s`` the cost model's T that the searches minimised."""
    if warmup not in WARMUPS:
        raise ValueError(f"warmup: expected one of {WARMUPS}, got {warmup!r}")
    if schedule == AUTO_SCHEDULE:
        return least_schedule(profile, strategy, microbatches, force_heuristic=force_heuristic,
                              certify=certify, extra=extra, max_pipelines=max_pipelines,
                              relax=relax, warmup=warmup)
    kwargs = dict(force_heuristic=force_heuristic, certify=certify, extra=extra,
                  max_pipelines=max_pipelines)
    warm = warmup == "auto"
    return _exact_or_relaxed(profile, strategy, relax, lambda prof, cutoff: _plan_as_run(
        prof, strategy, schedule, microbatches, warm=warm, cutoff=cutoff, **kwargs))


def searched_plan(profile: Profile, strategy: str = "optimal", schedule: str = "1f1b",
                  microbatches: int = 8, *, force_heuristic: bool = False,
                  certify: bool = False, extra: ExtraCost | None = None,
                  max_pipelines: int = 1, relax: Relaxation = EXACT) -> Plan:
    """The plan the cost model's searches find, priced by T (``step_time_s`` is T): the least T
    (exact) or the heuristic's with its bound on T. It is the first candidate :func:`plan`
    simulates; the searches' and bounds' own tests read it."""
    return _exact_or_relaxed(profile, strategy, relax, lambda prof, cutoff: _plan_within(
        prof, strategy, schedule, microbatches, force_heuristic=force_heuristic,
        certify=certify, extra=extra, max_pipelines=max_pipelines, cutoff=cutoff))


def _exact_or_relaxed(profile: Profile, strategy: str, relax: Relaxation, plan_of) -> Plan:
    """``plan_of(profile, cutoff)`` exact, and within ``relax`` where that is at least
    ``relax.min_gain`` faster (a relaxation changes the math: it must buy something). The
    relaxed search starts from the exact plan's T as the best so far (its cutoff), so its
    screen stops sooner. A bound with peer modes is also planned without them, the faster plan
    kept: the searches rank by T, and the candidates they find with the peer modes priced may
    leave out the ordered modes' best (a looser bound never plans slower)."""
    exact = plan_of(dataclasses.replace(profile, relax=EXACT), math.inf)
    if relax.is_exact or strategy == "even":
        return exact
    model = exact.model_s if exact.model_s is not None else exact.step_time_s
    cutoff = exact.step_time_s * (1 - relax.min_gain)
    found = []
    for bound in (relax, relax.ordered_only):  # ordered_only: None, or the bound less its peers
        if bound is None or bound.is_exact:
            continue
        try:
            found.append(plan_of(dataclasses.replace(profile, relax=bound),
                                 model * (1 - relax.min_gain)))
        except InfeasibleError:  # nothing below the cutoff where one pipeline does not fit
            pass
    relaxed = min(found, key=lambda p: p.step_time_s, default=None)
    return relaxed if relaxed is not None and relaxed.step_time_s < cutoff else exact


def _plan_as_run(profile: Profile, strategy: str, schedule: str, microbatches: int, *,
                 force_heuristic: bool, certify: bool, extra: ExtraCost | None,
                 max_pipelines: int, warm: bool, cutoff: float = math.inf) -> Plan:
    """``_plan_within``'s plan and its candidates, chosen by the simulated step
    (:mod:`skyjax.plan.as_run`): on a small instance every plan; else the searched plan and the
    one searched with links' latency free, each with the warm-ups that pay."""
    kwargs = dict(force_heuristic=force_heuristic, certify=certify, extra=extra,
                  max_pipelines=max_pipelines, cutoff=cutoff)
    runners: list[Plan] = []
    searched = _plan_within(profile, strategy, schedule, microbatches, runners_up=runners,
                            **kwargs)
    if strategy == "even":
        return as_run.priced(searched, profile, extra)
    most = _pipelines_cap(profile, strategy, microbatches, max_pipelines, extra)
    bound = as_run.run_bound(profile, schedule, microbatches, most)
    if extra is None and not force_heuristic and as_run.count_plans(
            profile.num_devices, profile.num_units, microbatches, most, schedule if warm
            else "", as_run.EVERY_PLAN_LIMIT) <= as_run.EVERY_PLAN_LIMIT:
        best = as_run.simulated_optimum(profile, schedule, microbatches, most, strategy,
                                        warm=warm)
        if best is not None:
            return as_run.certified(dataclasses.replace(best, strategy=searched.strategy),
                                    bound, exhaustive=True)
    candidates = [searched] + runners
    # where T may charge latency the run hides (a link's round trip on every micro-batch, at
    # least HIDDEN_COMM of T), also what the searches find once latency is hidden
    lat = np.asarray(profile.latency_s)[np.asarray(profile.bandwidth_Bps) > 0]
    hidden = 2 * float(lat.max(initial=0.0)) * (microbatches - 1) \
        > HIDDEN_COMM * searched.step_time_s
    if hidden:
        free = dataclasses.replace(profile, latency_s=np.zeros_like(profile.latency_s))
        more: list[Plan] = []
        try:
            more.insert(0, _plan_within(free, strategy, schedule, microbatches,
                                        runners_up=more, **kwargs))
        except InfeasibleError:
            pass
        for found in more:
            try:
                candidates.append(_repriced(profile, found, extra))
            except InfeasibleError:  # a link it may not cross with latency
                pass
    best = as_run.best_as_run(profile, candidates, warm=warm, extra=extra)
    return as_run.certified(best, bound, exhaustive=False)


def _repriced(profile: Profile, found: Plan, extra: ExtraCost | None) -> Plan:
    """``found`` (searched on another profile of the same devices) priced on ``profile``."""
    if found.num_pipelines == 1:
        t = tables(profile, found.schedule, found.microbatches)
        return evaluate_tables(profile, t, [(s.device, *s.units) for s in found.stages],
                               found.strategy, False, None, extra=extra)
    chains = [[(s.device, *s.units) for s in found.pipeline(i).stages]
              for i in range(found.num_pipelines)]
    return build_plan(profile, found.schedule, chains, found.shares, found.strategy, False, None)


def _pipelines_cap(profile: Profile, strategy: str, microbatches: int, max_pipelines: int,
                   extra: ExtraCost | None) -> int:
    """The most pipelines ``max_pipelines`` allows (0: auto, ``_plan_within``)."""
    if max_pipelines == 0:
        return (min(AUTO_PIPELINES, profile.num_devices, microbatches)
                if strategy != "even" and extra is None else 1)
    return int(max_pipelines)


HIDDEN_COMM = 0.02  # a round trip per micro-batch this share of T: search latency free too
AUTO_PIPELINES = 16  # max_pipelines=0 (auto): up to min(this, devices, micro-batches)


def _plan_within(profile: Profile, strategy: str, schedule: str, microbatches: int, *,
                 force_heuristic: bool, certify: bool, extra: ExtraCost | None,
                 max_pipelines: int, cutoff: float = math.inf,
                 runners_up: list[Plan] | None = None) -> Plan:
    """``plan`` within ``profile.relax``; several pipelines are searched only below ``cutoff``
    (the plan returned is then the single pipeline's where none is found below it).
    ``runners_up``: receives the split search's other least-T plans (``split.search``)."""
    if isinstance(max_pipelines, bool) or int(max_pipelines) != max_pipelines \
            or max_pipelines < 0:
        raise ValueError(f"max_pipelines: expected a positive integer or 0 (auto), got "
                         f"{max_pipelines!r}")
    max_pipelines = _pipelines_cap(profile, strategy, microbatches, max_pipelines, extra)
    if max_pipelines > 1 and strategy != "even":
        if extra is not None:
            raise ValueError("max_pipelines > 1 with extra cost terms: the shared-host model "
                             "plans one pipeline")
        why = None
        try:
            single = _plan(profile, strategy, schedule, microbatches, force_heuristic, certify,
                           None)
        except InfeasibleError as e:  # several pipelines may fit (fewer micro-batches in flight)
            single, why = None, e
        try:
            return pipeline_split.search(profile, schedule, microbatches, int(max_pipelines),
                                         single, strategy=strategy,
                                         force_heuristic=force_heuristic, cutoff=cutoff,
                                         runners_up=runners_up)
        except InfeasibleError as e:  # one pipeline's reason names the device and the bytes
            if why is None:
                raise
            raise InfeasibleError(f"{why} (nor does any split into up to {max_pipelines} "
                                  f"pipelines)") from e
    out = _plan(profile, strategy, schedule, microbatches, force_heuristic, certify, extra)
    if extra is None or strategy == "even":
        return out
    t = tables(profile, schedule, microbatches)
    return extra.best_of(profile, out, lambda restricted: _plan(
        restricted, strategy, schedule, microbatches, force_heuristic, certify, extra),
        lambda a: evaluate_tables(profile, t, a, strategy, False, None, extra=extra))


def _plan(profile: Profile, strategy: str, schedule: str, microbatches: int,
          force_heuristic: bool, certify: bool, extra: ExtraCost | None) -> Plan:
    """``plan`` without ``ExtraCost.best_of``."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: expected one of {STRATEGIES}, got {strategy!r}")
    t = tables(profile, schedule, microbatches)
    if strategy == "even":
        assignment = even_assignment(t.num_units, range(t.num_devices))
        return evaluate_tables(profile, t, assignment, strategy, exact=False, lower_bound_s=None,
                               extra=extra)
    classes = device_classes(t)
    exact = not force_heuristic and exact_search.exact_fits([len(c) for c in classes],
                                                            t.num_units)
    sol = _searched(t, classes, exact)
    if sol is None:
        raise InfeasibleError(infeasible_message(profile, t))
    out = evaluate_tables(profile, t, sol.assignment, strategy, exact, None, extra=extra)
    if not exact:  # bounds on the analytic T: the searches do not see the extra terms
        gb = GroupBound(t)  # shared by the bounds below (chain_bound refines its B grid)
        lb = max(lower_bound(t), group_bound(t, out.analytic_s, gb))
        if out.analytic_s > lb * (1 + REGION_GAP):  # GPipe: least sum at its bottleneck
            out = refine_plan(profile, t, sol, out, extra)
        if certify and out.analytic_s > lb * (1 + REGION_GAP):
            from skyjax.plan.certificates import certificate  # only when asked: seconds at scale

            lb = max(lb, certificate(t, out.analytic_s, gb, GOAL_GAP, REGION_GAP))
        out.lower_bound_s = min(lb, out.analytic_s)
        if out.analytic_s <= lb * (1 + 1e-9):  # the analytic optimum
            if out.extra_s > 0:  # bounds T only (as in evaluate_tables)
                out.lower_bound_s = out.analytic_s
            else:
                out.exact, out.lower_bound_s = True, None
    return out


AUTO_SCHEDULE = "auto"  # names.SCHEDULE_CHOICES' last


def least_schedule(profile: Profile, strategy: str, microbatches: int, **kwargs) -> Plan:
    """``plan`` under every schedule (``names.SCHEDULES``), the least predicted step kept;
    ties go to the least peak memory, then to the earlier schedule. Each plan fits memory under
    its own schedule (an infeasible schedule is skipped); none fits: the first one's error."""
    plans, errors = [], []
    for i, schedule in enumerate(SCHEDULES):
        try:
            p = plan(profile, strategy, schedule, microbatches, **kwargs)
        except InfeasibleError as e:
            errors.append(e)
            continue
        plans.append((p.step_time_s, max(s.memory_bytes for s in p.stages), i, p))
    if not plans:
        raise errors[0]
    return min(plans, key=lambda x: x[:3])[3]


def _searched(t: Tables, classes: list[list[int]], exact: bool) -> Solution | None:
    """The search's least-T solution, None if nothing fits. Zero bubble keeps as many
    micro-batches in flight on every stage as its plan has stages (x2 ZB-H2, at most m), so
    each depth of ``Tables.search_depths`` is searched, plans of at most that many stages
    charged at its count (the exact DP: all of them; the heuristic: on that many devices, those
    with the most memory, ties to the fastest, below the deepest), and the least T is kept; one
    search under the other schedules."""
    best, best_t = None, math.inf
    for depth in t.search_depths():
        td = dataclasses.replace(t, depth=depth)
        if exact:
            sol = exact_search.search(td, classes)
        elif not depth or depth >= td.most_stages:
            sol = heuristic.search(td, min_bottleneck(td))
        else:
            work = td.prefix[:, -1]
            keep = sorted(range(td.num_devices), key=lambda d: (-td.memory[d], work[d], d))[
                :depth]
            sub = td.restrict(keep)
            sol = heuristic.search(sub, min_bottleneck(sub))
            if sol is not None:
                sol = Solution(sol.total, sol.bottleneck,
                               [(keep[d], a, b) for d, a, b in sol.assignment])
        if sol is not None:
            score = sol.total + (t.microbatches - 1) * sol.bottleneck
            if score < best_t:
                best, best_t = sol, score
    return best
