"""The gradient exchange between pipelines as the runtime runs it, event by event: what the
simulator replays after each device's own last backward.

The runtime (``runtime.exchange.Routes.run``) runs a device's messages phase by phase: it sends
the phase's messages without blocking, receives those addressed to it, sums, and goes on to the
next phase; each directed link carries one message at a time (``transport.base.LinkClock``: a
message holds the link for its bytes over the bandwidth, plus its coding where coded, and
arrives a latency later). So a device starts its exchange when its own last backward ends, not
when the slowest pipeline's does, and a phase waits only for the messages it receives.

The averaging modes (:mod:`skyjax.relax`) run the same routes: ``int8`` codes every message,
``int8-across`` the partial sums between groups (phase 2), in top-k where the plan names an
``outer_compression``, which also codes ``diloco``'s outer step and ``diloco-across``'s phase 2
(``replay.coding``); ``diloco-across`` runs phases 1 and 3
every step and, at its outer step, phases 2 and 3 after them; ``diloco`` exchanges nothing
between outer steps and the direct exchange at them. A step of a mode with an outer step every
H steps is priced as the mean: inner step + (outer step - inner step) / H.

Under the exact exchange each stage runs its last backward bucket by bucket
(:mod:`skyjax.plan.pricing.buckets`) and sends the pieces that carry its own gradients as each
bucket is final (``unit_ready``: per device, per unit, when that unit's gradient is final); the
rest of the exchange runs after the backward, phase by phase, as above.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from skyjax.plan.data_parallel.pipelines import grad_prefix
from skyjax.plan.model.types import Plan
from skyjax.plan.pricing.buckets import bucket_of, bucket_ready_s, early_units, pieces
from skyjax.plan.pricing.exchange import BACK, BETWEEN, IN_GROUP, PHASES, Routing, routing
from skyjax.plan.replay.coding import coded_phases, wire_coder
from skyjax.profile.format import Profile
from skyjax.spans import EXCHANGE_PHASE, Span


@dataclasses.dataclass(frozen=True)
class ExchangeRun:
    """How a plan's pipelines exchange: the routing, the phases of an ordinary step and of an
    outer step (empty: none), which phases are coded, and the outer period H (0: none)."""

    route: Routing
    every_step: tuple[tuple[int, ...], ...]  # runs of phases, one after another
    outer_step: tuple[tuple[int, ...], ...]
    coded: tuple[int, ...]
    outer_every: int
    compression: str = "none"  # the coded phases in top-k (plan.outer_compression), else int8
    topk: float = 0.0


def bucketed(plan: Plan) -> bool:
    """Whether ``plan``'s stages run their last backward by buckets, the exchange behind it
    (the exact exchange of several pipelines under GPipe or 1F1B: ``runtime.pipeline``)."""
    return (plan.num_pipelines > 1 and plan.averaging == "exact"
            and plan.schedule in ("gpipe", "1f1b"))


def unit_ready_s(plan: Plan, profile: Profile, last_backward: dict[int, tuple[float, float]]
                 ) -> dict[int, dict[int, float]]:
    """Per device, per unit of its stage, when the unit's gradient is final: its last backward
    ``last_backward[d]`` = (start, end) shared among its buckets as their units' backward
    seconds (``buckets.bucket_ready_s``; what a rehearsal declares)."""
    out: dict[int, dict[int, float]] = {}
    bwd = np.asarray(profile.backward_s, float)
    for s in plan.stages:
        start, end = last_backward[s.device]
        a, b = s.units
        ready = bucket_ready_s(a, b, bwd[:, s.device])
        total = ready[-1][1] if ready and ready[-1][1] > 0 else 1.0
        out[s.device] = {u: start + (end - start) * t / total
                         for (lo, hi), t in ready for u in range(lo, hi)}
    return out


def exchange_of(plan: Plan) -> ExchangeRun:
    """The exchange ``plan``'s averaging runs (module doc)."""
    chains = [[(s.device, *s.units) for s in plan.pipeline(i).stages]
              for i in range(plan.num_pipelines)]
    mode = plan.averaging
    direct = mode in ("int8", "diloco")
    route = routing(chains, None if direct else plan.exchange_groups,
                    given=None if direct else plan.exchange_reps)
    coded, wire = coded_phases(plan), (plan.outer_compression, plan.outer_topk)
    if mode == "diloco-across":
        return ExchangeRun(route, ((IN_GROUP, BACK),), ((IN_GROUP, BACK), (BETWEEN, BACK)),
                           coded, plan.outer_every, *wire)
    if mode == "diloco":
        return ExchangeRun(route, (), (PHASES,), coded, plan.outer_every, *wire)
    return ExchangeRun(route, (PHASES,), (), coded, 0, *wire)


def run_exchange(run: ExchangeRun, runs: Sequence[Sequence[int]], ready: dict[int, float],
                 profile: Profile, stage_of: dict[int, int] | None = None,
                 unit_ready: dict[int, dict[int, float]] | None = None
                 ) -> tuple[dict[int, float], list[Span]]:
    """Each device's end of the exchange ``runs`` (phase runs, one after another), starting at
    ``ready[d]`` (its last action's end), and the phases' spans (``stage_of[d]``: the row of
    device d; none without it). ``unit_ready``: the bucketed exchange (module doc)."""
    gprefix = grad_prefix(profile)
    lat, bw = np.asarray(profile.latency_s, float), np.asarray(profile.bandwidth_Bps, float)
    wire, rate = (wire_coder(profile, run.compression, run.topk) if run.coded
                  else (1.0, None))
    at = dict(ready)
    free: dict[tuple[int, int], float] = {}
    spans: list[Span] = []
    arrived: dict[tuple[int, int, int], float] = {}  # (phase, src, dst) -> its early pieces'

    def send(src: int, dst: int, units: Sequence[int], phase: int, when: float) -> float:
        """One message or piece on the link src -> dst, sent at ``when``: its arrival."""
        g = float(sum(gprefix[u + 1] - gprefix[u] for u in units))
        coded = phase in run.coded
        hold = g * (wire if coded else 1.0) / float(bw[src, dst])
        if coded:
            hold += float(rate[src]) * g
        depart = max(when, free.get((src, dst), 0.0))
        free[(src, dst)] = depart + hold
        return depart + hold + float(lat[src, dst])

    if unit_ready is not None:  # the pieces that leave as their bucket is final
        first = [(max(unit_ready[m.src][u] for u in piece), m, piece)
                 for m in run.route.messages if m.phase in {p for r in runs for p in r}
                 for piece in pieces(m.units, early_units(m, run.route.order))[
                     :len({bucket_of(u) for u in early_units(m, run.route.order)})]]
        for when, m, piece in sorted(first, key=lambda x: x[0]):
            key = (m.phase, m.src, m.dst)
            arrived[key] = max(arrived.get(key, 0.0), send(m.src, m.dst, piece, m.phase, when))
    for phases in runs:
        for phase in phases:
            msgs = [m for m in run.route.messages if m.phase == phase]
            if not msgs:
                continue
            start = dict(at)
            arrive: dict[int, float] = {}
            for m in msgs:  # sends in message order, one at a time per directed link
                early = set(early_units(m, run.route.order)) if unit_ready is not None else set()
                rest = [u for u in m.units if u not in early]
                due = arrived.get((m.phase, m.src, m.dst), 0.0)
                if rest:
                    due = max(due, send(m.src, m.dst, rest, phase, at[m.src]))
                arrive[m.dst] = max(arrive.get(m.dst, 0.0), due)
            for d, t in arrive.items():
                at[d] = max(at[d], t)
            if stage_of is not None:
                for d in {x for m in msgs for x in (m.src, m.dst)}:
                    spans.append(Span(stage_of[d], EXCHANGE_PHASE[phase], -1, start[d], at[d]))
    return at, spans


def exchange_step(run: ExchangeRun, ready: dict[int, float], profile: Profile,
                  stage_of: dict[int, int], unit_ready: dict[int, dict[int, float]] | None = None
                  ) -> tuple[float, list[Span]]:
    """The end of the slowest device's exchange after ``ready`` (the period's mean over an
    outer step's H steps, module doc) and the spans of an ordinary step."""
    at, spans = run_exchange(run, run.every_step, ready, profile, stage_of, unit_ready)
    end = max(at.values())
    if not run.outer_step:
        return end, spans
    outer, _ = run_exchange(run, run.outer_step, ready, profile)
    return end + (max(outer.values()) - end) / max(run.outer_every, 1), spans
