"""Why no plan fits, in one line naming what does not: a unit larger than the largest device,
the units' total beyond every device's together or beyond every group of devices that links
join, more stages than devices in blocks that fit, the activations a schedule keeps in flight,
or else the cut that fits no order of the devices. The planner raises it as InfeasibleError.
"""

from __future__ import annotations

import numpy as np

from skyjax.plan.pricing.cost import Tables
from skyjax.profile.format import Profile


def infeasible_message(profile: Profile, t: Tables) -> str:
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
    deep = _depth_message(profile, t, group, state, act)
    if deep:
        return deep
    return (f"no feasible plan: no cut of the {t.num_units} units ({int(whole)} bytes in all, "
            f"the largest {int(need[u])}) into blocks, one per device, fits the devices' "
            f"memories ({_listed(group)}: {_numbers([int(x) for x in t.memory[group]])} "
            f"bytes; tightest: {dev})")


_INFLIGHT_RULE = {"gpipe": "GPipe keeps all m on every stage",
                  "1f1b": "1F1B keeps min(m, p - k) on stage k of p",
                  "zb-h1": "ZB-H1 keeps min(m, p) on every stage of p",
                  "zb-h2": "ZB-H2 keeps min(m, 2p) on every stage of p"}


def _depth_message(profile: Profile, t: Tables, group: list[int], state: np.ndarray,
                   act: np.ndarray) -> str | None:
    """Where no number of stages p (up to the group's devices) holds every unit even with
    each stage on the group's largest device, the activations in flight are what does not fit:
    the message names the p that holds the most units (each stage filled greedily from the
    last, which holds the most for a given p) and the first unit left over. None where some p
    would hold them (then the devices' own memories are what does not fit)."""
    u, cap = t.num_units, float(t.memory[group].max())
    best = None  # (first unit held, p, stage 0's in-flight count, its end, its bytes)
    for p in range(1, min(len(group), u) + 1):
        start = u
        for k in range(p - 1, -1, -1):
            infl, size, end = t.inflight_at(p, k), 0.0, start
            while start > 0 and size + state[start - 1] + infl * act[start - 1] <= cap:
                start -= 1
                size += state[start] + infl * act[start]
        if start == 0:
            return None
        if best is None or start < best[0]:
            best = (start, p, infl, end, size)
    start, p, infl, end, size = best
    left = start - 1
    names = ", ".join(profile.units[i]["name"] for i in range(min(start, 3))) + (
        ", ..." if start > 3 else "")
    need = state[left] + infl * act[left]
    held = (f"unit {left} alone needs {int(need)} bytes, {int(need - cap)} more than it has"
            if end == start else
            f"beside {_span(start, end)} ({int(size)} bytes) it has no room for unit "
            f"{left}'s {int(need)} bytes")
    return (f"no feasible plan: the activations of the micro-batches in flight do not fit "
            f"({_INFLIGHT_RULE[t.schedule]}, m = {t.microbatches}): even with every stage as "
            f"large as the largest device ({int(cap)} bytes), no number of stages holds all "
            f"{u} units; the most, {u - start}, with {p} stage{'s' if p > 1 else ''}, leave "
            f"units [0, {start}) ({names}) over: their stage 0 keeps {infl} in flight, and "
            f"{held} (state {int(state[left])} + {infl} x activations {int(act[left])})")


def _span(a: int, b: int) -> str:
    """``unit 3`` / ``units [3, 5)``."""
    return f"unit {a}" if b == a + 1 else f"units [{a}, {b})"


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
