"""Processes that share a host's cores: what their contention adds to a plan's step time.

Emulated devices are processes on one host; several stages may share a host's cores the same
way elsewhere. XLA's CPU backend spreads one call over every core, so two processes computing at
once each run at about half speed, while
the part of a call that is not CPU work (an emulated device's sleep, a GPU's kernel) does not
slow down. How much a stage slows therefore depends on how many *other* stages of the same host
compute at the same moment: a plan whose stages are idle more often runs faster than a profile
timed one device at a time predicts, and one that keeps all busy slower. A per-device factor
cannot express that; this module models it.

The model (docs/design.md, "Optional: emulated clusters sharing a host's cores"): each device d has a CPU share phi_d of its call
time (an emulated CPU device slowed k times computes for 1/k of it and sleeps the rest; other
kinds 0: their host time is dispatch, which the call costs already hold) and, while computing,
needs u_d of its host's C cores (``cpu_demand``: its measured average use ``cpu_cores`` rounded
up to whole cores, at most ``host_cores``; both measured by the profiler). An action of
(uncontended) duration t runs its CPU part phi_d t first, then the rest; while the CPU parts
running on a host ask for D = sum u_j > C cores, each progresses at rate C / D (processor
sharing). ``simulate_shared`` replays the schedule's action lists with
this rule, event by event; T is the replayed step where that is longer than the analytic T
(``replay_effect``'s replay also has the calls after idle of ``skyjax.hostmodel.wake_cost`` and the
lateness of messages that a CPU device's receive waited for, ``skyjax.transport.polling``), so that where
no host is shared and no call pays after idle nothing changes.

Pure functions over profile data; no JAX.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable, Sequence

from skyjax.plan.model.schedules import actions
from skyjax.plan.pricing.stage_times import stage_actions_s
from skyjax.hostmodel.wake_cost import Table, stage_work_s, wake_extra, wake_table
from skyjax.transport.polling import expected_lateness
from skyjax.profile.format import Profile

_EPS = 1e-12


def host_groups(profile: Profile) -> list[int | None] | None:
    """Per device, the index of the group of cores it shares with another process's CPU device
    (None for a device that shares with nobody); None when no device shares. Devices are CPU
    devices of distinct processes on the same host (``devices[d]["host"]``, recorded by the
    profiler; older profiles have none and are taken as unshared) whose cores overlap: processes
    bound to disjoint cores (``devices[d]["cpus"]``: ``skyjax.launch --bind_cores``, SLURM's
    core binding) share nothing; where a device's cores are unknown it shares the whole host."""
    devs = [(d, str(dv["host"]), _cpus(dv)) for d, dv in enumerate(profile.devices)
            if dv.get("host") and dv.get("kind") == "cpu"]
    parent = {d: d for d, _, _ in devs}

    def root(d: int) -> int:
        while parent[d] != d:
            d = parent[d]
        return d

    for (a, ha, ca), (b, hb, cb) in itertools.combinations(devs, 2):
        if ha == hb and (ca is None or cb is None or ca & cb):
            parent[root(a)] = root(b)
    procs: dict[int, set[int]] = {}
    for d, _, _ in devs:
        procs.setdefault(root(d), set()).add(int(profile.devices[d].get("process_index", 0)))
    shared = sorted(r for r, ps in procs.items() if len(ps) > 1)
    if not shared:
        return None
    out: list[int | None] = [None] * len(profile.devices)
    for d, _, _ in devs:
        if root(d) in shared:
            out[d] = shared.index(root(d))
    return out


def _cpus(device: dict) -> set[int] | None:
    cpus = device.get("cpus")
    return {int(c) for c in cpus} if isinstance(cpus, (list, tuple)) and cpus else None


def cpu_shares(profile: Profile) -> list[float]:
    """Per device, the share of its call time that is CPU work on its host: 1 / slow-down for an
    emulated CPU device (it computes, then sleeps (k - 1) times as long), 0 for others."""
    return [1.0 / max(float(dv.get("slowdown") or 1.0), 1.0) if dv.get("kind") == "cpu" else 0.0
            for dv in profile.devices]


def simulate_shared(forward_s: Sequence[float], backward_s: Sequence[float],
                    delay_s: Sequence[float], schedule: str, microbatches: int,
                    host: Sequence[int | None], share: Sequence[float],
                    update_s: Sequence[float] | None = None, sync_s: float = 0.0,
                    demand: Sequence[float] | None = None,
                    capacity: Sequence[float] | None = None,
                    wake: Sequence[Table | None] | None = None,
                    poll: Sequence[bool | None] | None = None) -> tuple[float, list[float]]:
    """The step period and per-stage busy time of a schedule whose stages share hosts.

    Per stage k: forward / backward action durations when uncontended, ``delay_s[k]`` the link
    delay to stage k + 1 (transfers overlap compute, as ``simulate(overlap_comm=True)``),
    ``host[k]`` (None: shares with nobody), ``share[k]`` the CPU part of its time,
    ``demand[k]`` the cores that part keeps busy (default 1) and ``capacity[h]`` host h's cores
    (default 1: one process alone fills the host). Each stage
    starts the step with its update (``update_s[k]``, shared like an action); the step ends
    ``sync_s`` after the last action. ``wake[k]`` (``skyjax.hostmodel.wake_cost``): an action
    takes that much longer after its stage idled (the wait since its previous action ended,
    plus that action's part that is not CPU work where the stage has any: an emulated slow
    device's sleep), as CPU work where the stage has any. ``poll[k]`` (None: not charged):
    whether stage k's device is a CPU device, for the lateness of a message its receive waited
    for (``skyjax.transport.polling.expected_lateness`` of the wait). With no shared host, no wake costs
    and no ``poll`` this equals ``simulate``'s result.
    """
    p, m = len(forward_s), microbatches
    lists = actions(schedule, p, m)
    delay = [float(c) for c in delay_s] + [0.0]
    upd = [float(u) for u in update_s] if update_s is not None else [0.0] * p
    end: dict[tuple[str, int, int], float] = {}
    pos, free, busy = [0] * p, [0.0] * p, [0.0] * p
    # running[k] = [start, cpu seconds left (uncontended), rest left, action or None (update)]
    running: list[list | None] = [[0.0, share[k] * upd[k], (1 - share[k]) * upd[k], None]
                                  for k in range(p)]
    cores = [float(c) for c in demand] if demand is not None else [1.0] * p
    cap = {h: (float(capacity[h]) if capacity is not None else 1.0) for h in host if h is not None}
    wake = list(wake) if wake is not None else [None] * p
    poll = list(poll) if poll is not None else [None] * p
    slept = [0.0] * p  # of the stage's previous action (none after the update)
    now, remaining = 0.0, sum(len(a) for a in lists)
    while remaining or any(r is not None for r in running):
        pending = []
        for k in range(p):
            if running[k] is not None or pos[k] >= len(lists[k]):
                continue
            ready = _ready(lists[k][pos[k]], k, p, end, delay)
            if ready is None:
                continue
            if poll[k] is not None and ready > free[k] and _receives(lists[k][pos[k]], k, p):
                ready += expected_lateness(ready - free[k], poll[k])
            start = max(free[k], ready)
            if start <= now + _EPS:
                a = lists[k][pos[k]]
                dur = float(forward_s[k] if a.kind == "F" else backward_s[k])
                extra = wake_extra(wake[k], now - free[k] + slept[k])
                slept[k] = (1 - share[k]) * dur if share[k] > 0 else 0.0
                cpu = share[k] * dur + (extra if share[k] > 0 else 0.0)
                running[k] = [now, cpu, dur + extra - cpu, a]
            else:
                pending.append(start)
        load: dict[int, float] = {}  # cores the running CPU parts of each host ask for
        for k, r in enumerate(running):
            if r is not None and r[1] > _EPS and host[k] is not None:
                load[host[k]] = load.get(host[k], 0.0) + cores[k]
        rate = [min(1.0, cap[host[k]] / load[host[k]]) if running[k] is not None
                and running[k][1] > _EPS and host[k] is not None else 1.0 for k in range(p)]
        steps = [(r[1] / rate[k] if r[1] > _EPS else r[2]) for k, r in enumerate(running)
                 if r is not None] + [s - now for s in pending]
        if not steps:
            raise RuntimeError("schedule deadlocked")  # cannot happen for gpipe / 1f1b
        dt = max(min(steps), 0.0)
        now += dt
        for k, r in enumerate(running):
            if r is None:
                continue
            if r[1] > _EPS:
                r[1] -= dt * rate[k]
            else:
                r[2] -= dt
            if r[1] <= _EPS and r[2] <= _EPS:
                free[k] = now
                if r[3] is not None:
                    busy[k] += now - r[0]
                    end[(r[3].kind, k, r[3].microbatch)] = now
                    pos[k] += 1
                    remaining -= 1
                running[k] = None
    return max(free) + float(sync_s), busy


def _receives(a, k: int, p: int) -> bool:
    """Whether action ``a`` of stage k waits for a message (a forward's input from stage k - 1,
    a backward's gradient from stage k + 1)."""
    return k > 0 if a.kind == "F" else k < p - 1


def _ready(a, k: int, p: int, end: dict, delay: list[float]) -> float | None:
    """When action ``a`` of stage k may start as far as its input is concerned (None: unknown)."""
    if not _receives(a, k, p):  # the first stage's forward, the last stage's backward
        return 0.0 if a.kind == "F" else end.get(("F", k, a.microbatch))
    src, link = (k - 1, k - 1) if a.kind == "F" else (k + 1, k)
    dep = end.get((a.kind, src, a.microbatch))
    return None if dep is None else dep + delay[link]


def stage_sharing(plan, profile: Profile) -> dict | None:
    """``simulate_shared``'s host, share, demand and capacity for a plan's stages; None when no
    two of its stages share a host."""
    groups = host_groups(profile)
    if groups is None:
        return None
    host = [groups[s.device] for s in plan.stages]
    counts = {h: host.count(h) for h in host if h is not None}
    if not any(c > 1 for c in counts.values()):
        return None
    shares, demand, capacity = cpu_shares(profile), cpu_demand(profile), host_capacity(profile)
    return {"host": host, "share": [shares[s.device] for s in plan.stages],
            "demand": [demand[s.device] for s in plan.stages], "capacity": capacity}


def cpu_demand(profile: Profile) -> list[float]:
    """Per device, the host cores its calls need while computing: the whole number of cores
    its measured average use (``cpu_cores``: process CPU time / wall time of unslowed calls)
    rounds up to, at most the cores its process may use (``host_cores``); 1 where unknown.
    Not the average itself: processes that compute at once slow each other by between what the
    two predict, moving from run to run, and the average under-charges two- and three-stage
    plans enough for the planner to prefer them over one stage that runs faster; whole cores
    err the safe way (docs/design.md, "Optional: emulated clusters sharing a host's cores")."""
    out = []
    for dv in profile.devices:
        c = dv.get("cpu_cores")
        if not (isinstance(c, (int, float)) and c == c and c > 0):
            out.append(1.0)
            continue
        cores = dv.get("host_cores")
        out.append(whole_cores(float(c), float(cores) if isinstance(cores, (int, float))
                               and cores > 0 else None))
    return out


def whole_cores(cpu_cores: float, host_cores: float | None = None) -> float:
    """The whole cores an average use of ``cpu_cores`` rounds up to (at least 1, at most
    ``host_cores`` where known): ``cpu_demand``'s rule for one device."""
    need = float(math.ceil(cpu_cores - 0.05))  # ~1.0 measured for a one-thread call is 1
    if host_cores is not None:
        need = min(need, host_cores)
    return max(need, 1.0)


def host_capacity(profile: Profile) -> list[float]:
    """Per group of shared cores (``host_groups`` index), its cores: the union of its devices'
    ``cpus`` where all are known, else their ``host_cores``, or, where unknown, the most any of
    its devices' calls use (one process alone fills it)."""
    groups = host_groups(profile) or []
    demand = cpu_demand(profile)
    cap: dict[int, float] = {}
    union: dict[int, set[int] | None] = {}
    for d, h in enumerate(groups):
        if h is None:
            continue
        cores = profile.devices[d].get("host_cores")
        value = float(cores) if isinstance(cores, (int, float)) and cores > 0 else demand[d]
        cap[h] = max(cap.get(h, 0.0), value)
        cpus = _cpus(profile.devices[d])
        union[h] = None if cpus is None or union.get(h, set()) is None else union.get(
            h, set()) | cpus
    return [float(len(union[h])) if union.get(h) else cap[h] for h in range(len(cap))]


def replay_effect(plan, profile: Profile) -> tuple[float, list[float], float] | None:
    """What host sharing and calls after idle (``skyjax.hostmodel.wake_cost``) add to a plan's
    simulated step (seconds), each stage's busy-time ratio (replayed / without them), and the
    replayed step itself; None when neither applies to its stages."""
    replay = _replay(plan, profile)
    if replay is None:
        return None
    full, busy_full, plain = replay
    alone, busy_alone = plain()
    return full - alone, [b / a if a > 0 else 1.0 for a, b in zip(busy_alone, busy_full)], full


def replayed_step(plan, profile: Profile) -> float | None:
    """``replay_effect``'s replayed step alone, without the plain replay it is compared with
    (the cost model needs only this); None where neither sharing nor calls after idle apply."""
    replay = _replay(plan, profile)
    return None if replay is None else replay[0]


def _replay(plan, profile: Profile
            ) -> tuple[float, list[float], Callable[[], tuple[float, list[float]]]] | None:
    """The plan's replay with host sharing, calls after idle and poll lateness: its step, its
    per-stage busy time, and the same replay without them (a call, run only where wanted)."""
    sharing = stage_sharing(plan, profile)
    wake = [wake_table(profile.devices[s.device], stage_work_s(profile, s.device, s.units))
            for s in plan.stages]
    if sharing is None and all(w is None for w in wake):
        return None
    fwd, bwd, link = stage_actions_s(plan, profile)
    args = (fwd, bwd, link, plan.schedule, plan.microbatches)
    kw = {"update_s": [s.update_s for s in plan.stages], "sync_s": float(profile.sync_s)}
    shares = cpu_shares(profile)
    share = sharing["share"] if sharing else [shares[s.device] for s in plan.stages]
    replay = sharing or {"host": [None] * len(fwd), "share": share}
    poll = [profile.devices[s.device].get("kind") == "cpu" for s in plan.stages]
    full, busy_full = simulate_shared(*args, **replay, **kw, wake=wake, poll=poll)
    return full, busy_full, lambda: simulate_shared(*args, [None] * len(fwd), share, **kw)


MAX_SUBSET_DEVICES = 8  # devices on shared hosts up to which every subset of them is tried


def best_subset(profile: Profile, base, plan_on: Callable[[Profile], object],
                evaluate: Callable[[list], object]):
    """The best of ``base`` and the plans on every proper subset of the shared hosts' devices.

    The searches optimise the analytic T, without the replay, which favours spreading work over
    every device; on a shared host, leaving a slow device out can be faster because the others
    then compete less. ``plan_on(restricted)`` plans a profile whose left-out devices hold no
    memory; ``evaluate(assignment)`` prices an assignment on the full profile. The
    result is not exact under the model with sharing; its ``lower_bound_s`` is the analytic
    optimum's (a plan's T is never below its analytic T).
    """
    groups = host_groups(profile)
    if groups is None or base.strategy == "even":
        return base
    shared = [d for d, h in enumerate(groups) if h is not None]
    floor = base.lower_bound_s if base.lower_bound_s is not None else base.analytic_s
    best = base
    # An exact plan that pays no penalty is at the analytic optimum, below every plan's T.
    if len(shared) <= MAX_SUBSET_DEVICES and not (base.exact and base.extra_s == 0):
        for r in range(1, len(shared)):
            for dropped in itertools.combinations(shared, r):
                devices = [dict(dv, memory_bytes=0) if d in dropped else dv
                           for d, dv in enumerate(profile.devices)]
                try:
                    found = plan_on(dataclasses.replace(profile, devices=devices))
                except ValueError:  # InfeasibleError: the rest cannot hold the model
                    continue
                cand = evaluate([(s.device, *s.units) for s in found.stages])
                if cand.step_time_s < best.step_time_s * (1 - 1e-9):
                    best = cand
    best.exact, best.lower_bound_s = False, min(floor, best.step_time_s)
    best.strategy = base.strategy
    return best
