"""``plan``: from a profile to the plan with the least predicted step time T (the cost model:
:mod:`skyjax.plan.pricing.cost`). docs/design.md, "Planning", gives the searches and bounds and
the reasons for them; this module chooses among them:

* strategy: ``even`` (:mod:`skyjax.plan.search.even`) or ``optimal``, which minimises T over
  which devices are used, their order and the cuts, under memory (``dynamic`` is ``optimal`` at
  plan time);
* search: the exact DP (:mod:`skyjax.plan.search.exact`, ``exact: true``) where it fits, else the
  heuristic (:mod:`skyjax.plan.search.heuristic`), whose plan carries ``lower_bound_s``, the
  larger of :mod:`skyjax.plan.bounds.step` and :mod:`skyjax.plan.bounds.group_bound`. For GPipe,
  while that gap exceeds ``REGION_GAP``, ``refine`` looks for a lower sum at the plan's
  bottleneck. A plan that meets its bound is reported exact;
* certificates (``certify=True``; ``python -m skyjax.plan --certify``): while the gap still
  exceeds ``REGION_GAP``, :mod:`skyjax.plan.certificates` tightens ``lower_bound_s`` and the
  ``exact`` flag, never the plan; they can take seconds at scale, so they run only when asked;
* extra cost terms (``extra``, :mod:`skyjax.plan.model.extension`; the optional shared-host
  model): T carries what they add, which the searches do not see, and the planner asks them for
  better plans (``ExtraCost.best_of``);
* several pipelines (``max_pipelines`` > 1, :mod:`skyjax.plan.data_parallel`): the
  single-pipeline plan is returned where it is best;
* schedule "auto" (``least_schedule``): the above under every schedule, the least T kept.

An infeasible problem raises InfeasibleError naming the tightest device and the missing bytes.
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
from skyjax.plan.pricing.cost import Tables, evaluate_tables, tables
from skyjax.plan.search.even import even_assignment
from skyjax.plan.bounds.group_bound import group_bound
from skyjax.plan.bounds.group_terms import GroupBound
from skyjax.plan.search.warmup import linkless, plan_auto
from skyjax.plan.search.refine import refine_plan
from skyjax.plan.model.extension import ExtraCost
from skyjax.plan.model.types import InfeasibleError, Plan
from skyjax.profile.format import Profile
from skyjax.relax import EXACT, Relaxation

REGION_GAP = 0.01  # try region_bound only while the plan is this far above the other bounds
GOAL_GAP = 0.009  # chain_bound's goal: a gap just inside REGION_GAP (its last step lands on it)


def plan(profile: Profile, strategy: str = "optimal", schedule: str = "1f1b",
         microbatches: int = 8, *, force_heuristic: bool = False, certify: bool = False,
         extra: ExtraCost | None = None, max_pipelines: int = 1,
         relax: Relaxation = EXACT, warmup: str = "1f1b") -> Plan:
    """Plan a profile. even: all devices in order; optimal/dynamic: least T (module doc).
    ``certify``: also compute the lower-bound certificates (module doc); ``extra``: extra cost terms
    (:mod:`skyjax.plan.model.extension`), None for the core model alone. ``max_pipelines``: above 1,
    the least T over 1..max_pipelines pipelines in data parallel
    (:mod:`skyjax.plan.data_parallel.split`; ``even`` ignores it); 0 (auto): up to
    min(``AUTO_PIPELINES``, devices, micro-batches), 1 with extra cost terms. ``relax``: what the
    plan may relax on slow links (:mod:`skyjax.relax`): each link's codec and the pipelines'
    averaging are then the cheapest allowed under the cost model, and the relaxed plan is taken only
    where its T is at least ``relax.min_gain`` below the exact plan's (a relaxation changes the
    math: it must buy something); the default relaxes nothing. ``schedule`` "auto":
    :func:`least_schedule`. ``warmup`` "auto": a one-pipeline 1F1B plan takes deeper warm-ups before
    slow links where the window model says they pay (:mod:`skyjax.plan.search.warmup`)."""
    if warmup not in WARMUPS:
        raise ValueError(f"warmup: expected one of {WARMUPS}, got {warmup!r}")
    if schedule == AUTO_SCHEDULE:
        return least_schedule(profile, strategy, microbatches, force_heuristic=force_heuristic,
                              certify=certify, extra=extra, max_pipelines=max_pipelines,
                              relax=relax, warmup=warmup)
    kwargs = dict(force_heuristic=force_heuristic, certify=certify, extra=extra,
                  max_pipelines=max_pipelines, deep=warmup == "auto")
    exact = _plan_within(dataclasses.replace(profile, relax=EXACT), strategy, schedule,
                         microbatches, **kwargs)
    if relax.is_exact or strategy == "even":
        return exact
    # the relaxed plan is taken only below the cutoff: its split search starts from it as the
    # best so far, so its screen stops sooner (the paper-scale table: the same plans)
    cutoff = exact.step_time_s * (1 - relax.min_gain)
    try:
        relaxed = _plan_within(dataclasses.replace(profile, relax=relax), strategy, schedule,
                               microbatches, cutoff=cutoff, **kwargs)
    except InfeasibleError:  # nothing below the cutoff where one pipeline does not fit
        return exact
    return relaxed if relaxed.step_time_s < cutoff else exact


AUTO_PIPELINES = 16  # max_pipelines=0 (auto): up to min(this, devices, micro-batches)


def _plan_within(profile: Profile, strategy: str, schedule: str, microbatches: int, *,
                 force_heuristic: bool, certify: bool, extra: ExtraCost | None,
                 max_pipelines: int, deep: bool = False, cutoff: float = math.inf) -> Plan:
    """``plan`` within ``profile.relax``; several pipelines are searched only below ``cutoff``
    (the plan returned is then the single pipeline's where none is found below it)."""
    if isinstance(max_pipelines, bool) or int(max_pipelines) != max_pipelines \
            or max_pipelines < 0:
        raise ValueError(f"max_pipelines: expected a positive integer or 0 (auto), got "
                         f"{max_pipelines!r}")
    if max_pipelines == 0:  # auto: as many as the planner finds worthwhile, within a cap
        max_pipelines = (min(AUTO_PIPELINES, profile.num_devices, microbatches)
                         if strategy != "even" and extra is None else 1)
    if max_pipelines > 1 and strategy != "even":
        if extra is not None:
            raise ValueError("max_pipelines > 1 with extra cost terms: the shared-host model "
                             "plans one pipeline")
        why = None
        try:
            single = _plan(profile, strategy, schedule, microbatches, force_heuristic, certify,
                           None, deep)
        except InfeasibleError as e:  # several pipelines may fit (fewer micro-batches in flight)
            single, why = None, e
        try:
            return pipeline_split.search(profile, schedule, microbatches, int(max_pipelines),
                                         single, strategy=strategy,
                                         force_heuristic=force_heuristic, cutoff=cutoff)
        except InfeasibleError as e:  # one pipeline's reason names the device and the bytes
            if why is None:
                raise
            raise InfeasibleError(f"{why} (nor does any split into up to {max_pipelines} "
                                  f"pipelines)") from e
    out = _plan(profile, strategy, schedule, microbatches, force_heuristic, certify, extra, deep)
    if extra is None or strategy == "even":
        return out
    t = tables(profile, schedule, microbatches)
    return extra.best_of(profile, out, lambda restricted: _plan(
        restricted, strategy, schedule, microbatches, force_heuristic, certify, extra),
        lambda a: evaluate_tables(profile, t, a, strategy, False, None, extra=extra))


def _plan(profile: Profile, strategy: str, schedule: str, microbatches: int,
          force_heuristic: bool, certify: bool, extra: ExtraCost | None,
          deep: bool = False) -> Plan:
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
    sol = exact_search.search(t, classes) if exact else heuristic.search(t, min_bottleneck(t))
    if sol is None:
        raise InfeasibleError(_infeasible_message(profile, t))
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
    if deep and extra is None:  # 1F1B: deeper warm-ups before slow links, where they pay
        out = plan_auto(profile, t, out, lambda t0: exact_search.search(
            t0, device_classes(t0)) if exact else heuristic.search(t0, min_bottleneck(t0)),
            lambda: lower_bound(linkless(t)))
    return out


AUTO_SCHEDULE = "auto"  # names.SCHEDULE_CHOICES' last


def least_schedule(profile: Profile, strategy: str, microbatches: int, **kwargs) -> Plan:
    """``plan`` under every schedule (``names.SCHEDULES``), the least predicted step T kept;
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


def _infeasible_message(profile: Profile, t: Tables) -> str:
    """Why nothing fits, naming what does not: a unit larger than the largest device; the
    units' total beyond every device's together; beyond every group of devices that links join
    (bandwidth above 0); more stages, in blocks that fit the largest device, than there are
    devices; else the cut into blocks that fits no order of the devices."""
    m = t.least_inflight  # the fewest micro-batches in flight on any stage (1F1B's last: one)
    state, act = np.diff(t.state_prefix), np.diff(t.act_prefix)
    big = int(np.argmax(t.memory))
    cap = t.memory[big]
    dev = f"device {big} ({profile.devices[big]['name']}, {int(cap)} bytes, the largest)"
    need = state + m * act
    u = int(np.argmax(need))
    if need[u] > cap:
        return (f"no feasible plan: unit {u} ({profile.units[u]['name']}) alone needs "
                f"{int(need[u])} bytes (state {int(state[u])} + {m} x activations "
                f"{int(act[u])}) but {dev} is short by {int(need[u] - cap)} bytes")
    whole = float(need.sum())
    usable = t.memory >= need.min()  # a device that holds no unit takes no stage
    fit = float(t.memory[usable].sum())
    if whole > fit:
        return (f"no feasible plan: the units need at least {int(whole)} bytes in total but all "
                f"devices together have {int(fit)}: {int(whole - fit)} bytes do not fit "
                f"(tightest: {dev}, short by {int(whole - cap)} bytes for the whole model)")
    groups = _linked_groups(t.bandwidth, usable)
    group = max(groups, key=lambda g: float(t.memory[g].sum()))
    held = float(t.memory[group].sum())
    apart = "" if len(groups) == 1 else "; bandwidth_Bps is 0 between it and the other devices"
    if whole > held:
        return (f"no feasible plan: the units need at least {int(whole)} bytes in total but the "
                f"devices that links join hold at most {int(held)} ({_listed(group)}"
                f"{apart}): {int(whole - held)} bytes do not fit")
    # a stage per block, each block within its device: fewest stages, by the largest device
    least = [(_least_blocks(need, float(t.memory[g].max())), g) for g in groups]
    if all(stages > len(g) for stages, g in least):
        stages, g = min(least, key=lambda x: x[0] - len(x[1]))
        where = ("" if len(groups) == 1 else
                 f" in the group of devices that links join ({_listed(g)}{apart})")
        return (f"no feasible plan: in blocks that fit the largest device's "
                f"{int(t.memory[g].max())} bytes, the {t.num_units} units need at least "
                f"{stages} stages, but only {len(g)} devices can hold one{where}")
    return (f"no feasible plan: no cut of the {t.num_units} units ({int(whole)} bytes in all, "
            f"the largest {int(need[u])}) into blocks, one per device, fits the devices' "
            f"memories ({_listed(group)}: {_numbers([int(x) for x in t.memory[group]])} "
            f"bytes; tightest: {dev})")


def _linked_groups(bandwidth: np.ndarray, usable: np.ndarray) -> list[list[int]]:
    """The usable devices in groups joined by links with bandwidth above 0 in either direction
    (a pipeline's devices are all in one group)."""
    left, groups = [d for d in range(len(usable)) if usable[d]], []
    while left:
        group, todo = [], [left.pop(0)]
        while todo:
            d = todo.pop()
            group.append(d)
            near = [e for e in left if bandwidth[d, e] > 0 or bandwidth[e, d] > 0]
            left = [e for e in left if e not in near]
            todo += near
        groups.append(sorted(group))
    return groups


def _least_blocks(need: np.ndarray, cap: float) -> int:
    """The fewest contiguous blocks of units, each needing at most ``cap`` (greedy: exact)."""
    blocks, size = 1, 0.0
    for x in need:
        if size + x > cap:
            blocks, size = blocks + 1, 0.0
        size += x
    return blocks


def _listed(devices: list[int]) -> str:
    """``device 3`` / ``devices 0, 1, 2``."""
    return f"device {devices[0]}" if len(devices) == 1 else f"devices {_numbers(devices)}"


def _numbers(items: list[int], most: int = 8) -> str:
    """``a, b, c``; past ``most`` items, the first ones and the count."""
    return ", ".join(map(str, items[:most])) + (f", ... ({len(items)})" if len(items) > most
                                                else "")
