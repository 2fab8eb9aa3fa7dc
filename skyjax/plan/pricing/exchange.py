"""How the pipelines' replicated gradients travel: the exchange's routing, as plain data.

Every unit has one owner per pipeline (the stage holding it). Owners fall into link groups
(regions, ``Plan.exchange_groups``; a device in no group is a group of its own). Per unit:

1. *in its group*: every owner but the group's representative sends its gradient to the
   representative, which sums its group's gradients in pipeline order (the group's partial sum);
2. *between groups*: each representative sends its partial sum to the other groups'
   representatives of the unit, and each sums the partial sums in group order (groups ordered by
   their first pipeline), so every representative computes the same additions in one order;
3. *back*: each representative sends the total to the other owners of its group.

Every owner then holds the same sum, bit for bit. With every group of one device only step 2
runs: each owner sends its gradient to every other and sums them in pipeline order (the direct
exchange, bit for bit what it was). Representatives are chosen per unit, balancing the
gradient bytes a device represents, preferring the previous unit's representative so that
messages bundle (a message is one (phase, sender, receiver) with all the units it carries); the
plan records them (``Plan.exchange_reps``), so the runtime routes from the plan alone.

Cost (:func:`routing_s`): a device's sends in a phase go one after another, each ``latency +
bytes / bandwidth`` (plus coding), the phases one after another:

  AR = sum over phases of max_d sum over d's messages in the phase of c(message)

the direct exchange's AR when every group is one device. Averaging per link class
(``skyjax.relax``) runs some phases relaxed: ``int8-across`` sends phase 2's partial sums in the
int8 codec (``coded``), ``diloco-across`` runs phases 1 and 3 every step and phases 2 and 3 at
its outer step (``phases``). ``routing`` and ``routing_s`` are what
the planner (``pipelines.build_plan``, ``pipeline_split``), the declared times
(``plan.replay.rehearsal``) and the runtime (``runtime.exchange``) share; :func:`relaxed_exchange`
prices each averaging mode on them (``skyjax.relax``) and keeps the least, :func:`same_math`
maps a kept plan's mode onto pipelines that no longer offer it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from skyjax.names import CODEC_BLOCK
from skyjax.plan.pricing import topk
from skyjax.profile.format import Profile

# The phases, numbered as in the module doc and docs/design.md ("Several pipelines")
IN_GROUP, BETWEEN, BACK = 1, 2, 3
PHASES = (IN_GROUP, BETWEEN, BACK)
Chains = Sequence[Sequence[tuple[int, int, int]]]  # pipelines: [(device, start, end), ...] each


@dataclasses.dataclass(frozen=True)
class Message:
    phase: int  # IN_GROUP, BETWEEN or BACK
    src: int  # device
    dst: int  # device
    units: tuple[int, ...]


@dataclasses.dataclass
class Routing:
    """Per unit its owners' groups in summing order, each a list of devices in pipeline order
    (``order[u][g][0]`` is not necessarily the representative: ``rep[u][g]`` is), and the
    bundled messages in phase order."""

    order: dict[int, list[list[int]]]
    rep: dict[int, list[int]]
    messages: list[Message]

    def of(self, device: int) -> list[Message]:
        """The messages ``device`` sends or receives, in phase order."""
        return [m for m in self.messages if device in (m.src, m.dst)]


def group_labels(groups: Sequence[Sequence[int]] | None, devices: Sequence[int]) -> dict[int, int]:
    """A group label per device: the index of the group listing it, else a label of its own."""
    out = {int(d): -1 - int(d) for d in devices}
    for g, members in enumerate(groups or ()):
        for d in members:
            out[int(d)] = g
    return out


def routing(chains: Chains,
            groups: Sequence[Sequence[int]] | None,
            weights: Sequence[float] | None = None,
            given: Sequence[Sequence[int]] | None = None) -> Routing:
    """The routing of pipelines given as chains of (device, start, end) in pipeline order.
    ``given[u]``: the representatives of unit u's groups in summing order, as a plan records
    them (``Plan.exchange_reps``); else chosen balancing ``weights`` per unit (the gradient
    bytes; None: 1 each), a device keeping the previous unit's groups while within half a mean
    unit of the least loaded (so messages bundle)."""
    if len(chains) < 2:
        return Routing({}, {}, [])
    label = group_labels(groups, [d for c in chains for d, _, _ in c])
    units = max(b for c in chains for _, _, b in c)
    owner = [[0] * units for _ in chains]
    for i, chain in enumerate(chains):
        for d, a, b in chain:
            for u in range(a, b):
                owner[i][u] = d
    w = [1.0] * units if weights is None else [float(x) for x in weights]
    slack = 0.5 * sum(w) / max(units, 1)
    load: dict[int, float] = {}
    order: dict[int, list[list[int]]] = {}
    rep: dict[int, list[int]] = {}
    prev: dict[int, int] = {}  # group label -> the previous unit's representative
    bundles: dict[tuple[int, int, int], list[int]] = {}
    for u in range(units):
        byg: dict[int, list[int]] = {}
        for i in range(len(chains)):
            byg.setdefault(label[owner[i][u]], []).append(owner[i][u])
        order[u] = list(byg.values())  # dicts keep insertion order: groups by first pipeline
        reps = []
        for j, (g, members) in enumerate(byg.items()):
            if given is not None:
                r = int(given[u][j])
                if r not in members:
                    raise ValueError(f"exchange_reps[{u}][{j}]: device {r} does not own unit "
                                     f"{u} (its group's owners: {members})")
            else:
                keep = prev.get(g)
                r = min(members, key=lambda d: load.get(d, 0.0) + (0 if d == keep else slack))
            load[r] = load.get(r, 0.0) + w[u]
            prev[g] = r
            reps.append(r)
            for d in members:
                if d != r:
                    bundles.setdefault((IN_GROUP, d, r), []).append(u)
                    bundles.setdefault((BACK, r, d), []).append(u)
        for r in reps:
            for q in reps:
                if q != r:
                    bundles.setdefault((BETWEEN, r, q), []).append(u)
        rep[u] = reps
    msgs = [Message(p, s, d, tuple(us)) for (p, s, d), us in sorted(bundles.items())]
    return Routing(order, rep, msgs)


def routing_s(r: Routing, gprefix: np.ndarray, latency: np.ndarray, bandwidth: np.ndarray,
              wire: float = 1.0, coder_s: np.ndarray | None = None,
              phases: Sequence[int] = PHASES, coded: Sequence[int] = PHASES
              ) -> tuple[float, dict[int, float]]:
    """AR of a routing (module doc) over the ``phases`` that run, and each sending device's
    seconds summed over them. ``gprefix`` [U+1]: prefix sums of a unit's gradient bytes;
    ``wire``: bytes on the wire per gradient byte and ``coder_s`` [D]: a sender's coding seconds
    per gradient byte, in the ``coded`` phases (the others send float32)."""
    per_phase: dict[int, dict[int, float]] = {p: {} for p in PHASES}
    for m in r.messages:
        if m.phase not in phases:
            continue
        g = float(sum(gprefix[u + 1] - gprefix[u] for u in m.units))
        bw = float(bandwidth[m.src, m.dst])
        w = wire if m.phase in coded else 1.0
        cost = float(latency[m.src, m.dst]) + g * w / bw if bw > 0 else math.inf
        if coder_s is not None and m.phase in coded:
            cost += float(coder_s[m.src]) * g
        ph = per_phase[m.phase]
        ph[m.src] = ph.get(m.src, 0.0) + cost
    total = sum(max(ph.values()) for ph in per_phase.values() if ph)
    per: dict[int, float] = {}
    for ph in per_phase.values():
        for d, s in ph.items():
            per[d] = per.get(d, 0.0) + s
    return float(total), per


def pipeline_groups(chains: Chains,
                    groups: Sequence[Sequence[int]] | None) -> list[int] | None:
    """Per pipeline the index of its link group, groups numbered by their first pipeline; None
    when a pipeline's devices lie in several groups (``diloco-across`` needs each pipeline in
    one group: the group's pipelines are then one data-parallel replica set)."""
    label = group_labels(groups, [d for c in chains for d, _, _ in c])
    seen: dict[int, int] = {}
    out = []
    for chain in chains:
        mine = {label[d] for d, _, _ in chain}
        if len(mine) != 1:
            return None
        out.append(seen.setdefault(mine.pop(), len(seen)))
    return out


def message_bytes(r: Routing, gprefix: np.ndarray) -> dict[tuple[int, int], list[float]]:
    """Per directed device pair the gradient bytes of each of its messages, in phase order."""
    out: dict[tuple[int, int], list[float]] = {}
    for m in r.messages:
        g = float(sum(gprefix[u + 1] - gprefix[u] for u in m.units))
        out.setdefault((m.src, m.dst), []).append(g)
    return out


def region_groups(profile: Profile) -> list[list[int]]:
    """The link groups the exchange may reduce in first: the devices of each region (the
    profile's ``region``; all devices one group when none is named)."""
    names = [str(d.get("region") or "") for d in profile.devices]
    out: dict[str, list[int]] = {}
    for d, r in enumerate(names):
        out.setdefault(r, []).append(d)
    return list(out.values())


INT8_WIRE = (1 + 4 / CODEC_BLOCK) / 4  # int8 bytes + a float32 scale per block, per fp32 byte


def _int8_rate(profile: Profile) -> np.ndarray:
    """The int8 codec's seconds per byte per device; a clear error where the profile lacks it."""
    if "int8" in profile.codecs:
        return np.asarray(profile.codecs["int8"]["seconds_per_byte"], float)
    named = profile.relax.averaging  # the bound allows every mode up to the one it names
    why = (": pricing the int8 exchange" if named.startswith("int8") else " also allows the "
           "int8 exchange (every mode up to the one named): pricing it")
    raise ValueError(f"relax.averaging={named}{why} needs the int8 codec's timings "
                     "(profile.codecs.int8), which this profile lacks: profile again with this "
                     "bound")


def unpriced_modes(profile: Profile) -> tuple[str, ...]:
    """The averaging modes ``profile.relax`` allows that the planner leaves out: the int8 ones
    where the profile lacks the int8 codec's timings and the bound names a mode past them (a
    DiLoCo one: it allows every mode up to it); none otherwise (a bound that names an int8
    mode needs its timings: :func:`_int8_rate` says so)."""
    named = profile.relax.averaging
    if "int8" in profile.codecs or named.startswith("int8") or profile.relax.compressed:
        return ()
    return tuple(m for m in profile.relax.averagings if m.startswith("int8"))


def unpriced_note(profile: Profile) -> str | None:
    """One line naming the modes :func:`unpriced_modes` leaves out and why; None if none."""
    skipped = unpriced_modes(profile)
    if not skipped:
        return None
    return (f"note: relax.averaging={profile.relax.averaging} also allows "
            f"{' and '.join(skipped)}, left out: the profile lacks the int8 codec's timings "
            f"(profile.codecs.int8; profile with this bound to price them)")


def relaxed_exchange(chains: Chains, gprefix: np.ndarray, profile: Profile,
                     modes: Sequence[str] | None = None
                     ) -> tuple[float, str, list[list[int]] | None]:
    """The least AR over the averaging modes ``profile.relax`` allows (or ``modes``), that mode
    (ties go to the less relaxed) and the exchange's groups (None: direct).

    * ``exact``: the cheaper of the direct exchange and the one through the regions
      (:func:`region_groups`, the devices used; ties to direct);
    * ``int8-across``: through the regions, phase 2 (the partial sums between representatives)
      in the int8 codec's bytes plus its coding time, phases 1 and 3 exact;
    * ``int8``: the direct exchange in the int8 codec's bytes plus its coding time;
    * ``diloco-across`` (each pipeline inside one region, two regions or more): phases 1 and 3
      every step, plus phases 2 and 3 of the outer step's exchange / H;
    * ``diloco``: the direct exact exchange of the pseudo-gradients once every ``outer_every``
      steps, AR / H per step;
    * ``decentral``, ``async`` (a bound per axis): left to :mod:`skyjax.plan.pricing.peers`
      (``pipelines.priced_exchange`` takes the least of both).

    With ``relax.outer_compression`` the coded messages of ``int8``, ``int8-across``, ``diloco``
    (its outer step) and ``diloco-across`` (its phase 2) are priced in top-k instead
    (:mod:`skyjax.plan.pricing.topk`: its bytes and coding time).

    The int8 modes are left out where the profile cannot price them and the bound names a mode
    past them (:func:`unpriced_modes`).

    The per-class modes are priced only where they differ from both exact and their
    all-pipelines mode (:func:`_offered`)."""
    lat, bw = profile.latency_s, profile.bandwidth_Bps
    modes = profile.relax.averagings if modes is None else tuple(modes)
    skipped = unpriced_modes(profile)
    modes = tuple(m for m in modes if m not in skipped) or modes
    direct = routing_s(routing(chains, None), gprefix, lat, bw)[0]
    if len(chains) < 2:
        return direct, "exact", None
    top = topk.relax_coder(profile, gprefix)  # outer_compression: the relaxed modes' wire
    groups = _used_groups(chains, profile)
    route = routing(chains, groups, np.diff(gprefix)) if groups else None
    offered = _offered(chains, groups, route)
    best = (math.inf, "", None)
    for mode in modes:
        if mode == "exact":
            ar, via = direct, None
            if route is not None:
                grouped = routing_s(route, gprefix, lat, bw)[0]
                if grouped < direct:
                    ar, via = grouped, groups
        elif mode == "int8-across" and "int8-across" in offered:
            ar, via = routing_s(route, gprefix, lat, bw,
                                *(top or (INT8_WIRE, _int8_rate(profile))),
                                coded=(BETWEEN,))[0], groups
        elif mode == "int8":
            ar, via = routing_s(routing(chains, None), gprefix, lat, bw,
                                *(top or (INT8_WIRE, _int8_rate(profile))))[0], None
        elif mode == "diloco-across" and "diloco-across" in offered:
            ar = (routing_s(route, gprefix, lat, bw, phases=(IN_GROUP, BACK))[0]
                  + routing_s(route, gprefix, lat, bw, *(top or (1.0, None)),
                              phases=(BETWEEN, BACK), coded=(BETWEEN,))[0]
                  / profile.relax.outer_every)
            via = groups
        elif mode == "diloco":
            outer = direct if top is None else routing_s(routing(chains, None), gprefix, lat, bw,
                                                         *top)[0]
            ar, via = outer / profile.relax.outer_every, None
        else:
            continue
        if ar < best[0] or not best[1]:
            best = (ar, mode, via)
    return best if best[1] else (math.inf, modes[0], None)


def _used_groups(chains: Chains, profile: Profile) -> list[list[int]]:
    """The regions' devices that ``chains`` use, regions with two or more of them."""
    used = {d for c in chains for d, _, _ in c}
    groups = [sorted(used & set(g)) for g in region_groups(profile)]
    return [g for g in groups if len(g) > 1]


def _offered(chains: Chains, groups: Sequence[Sequence[int]] | None,
             route: Routing | None) -> set[str]:
    """The per-class modes that are neither exact nor their all-pipelines mode here:
    ``int8-across`` where some unit sums inside a group (phase 1) and crosses groups (phase 2);
    ``diloco-across`` where every pipeline lies in one group, some group holds two pipelines
    and there are two groups or more."""
    out = set()
    if route is None:
        return out
    if {m.phase for m in route.messages} >= {IN_GROUP, BETWEEN}:
        out.add("int8-across")
    pg = pipeline_groups(chains, groups)
    if pg is not None and 1 < len(set(pg)) < len(pg):
        out.add("diloco-across")
    return out


def same_math(mode: str, chains: Chains, profile: Profile) -> str:
    """``mode`` kept for other pipelines (a plan after a loss), or the mode of the same math on
    ``chains`` where they do not offer it (:func:`_offered`): ``int8-across`` is ``exact``
    with nothing crossing a group, else ``int8``; ``diloco-across`` is ``exact`` with every
    pipeline in one group, ``diloco`` with every pipeline a group of its own (and where a
    pipeline spans groups, the nearest)."""
    if not mode.endswith("-across") or len(chains) < 2:
        return mode
    groups = _used_groups(chains, profile)
    route = routing(chains, groups) if groups else None
    if mode in _offered(chains, groups, route):
        return mode
    if mode == "int8-across":
        crosses = route is None or any(m.phase == BETWEEN for m in route.messages)
        return "int8" if crosses else "exact"
    pg = pipeline_groups(chains, groups) if groups else None
    return "exact" if pg is not None and len(set(pg)) == 1 else "diloco"
