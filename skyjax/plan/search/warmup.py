"""Latency hidden by micro-batches in flight: 1F1B with a deeper warm-up before a slow link,
priced by the window model. docs/design.md, "Latency and the window", gives T_win and why it
holds.

The cost model charges each link's latency inside t_k, once per micro-batch on the bottleneck;
a stage that keeps more micro-batches in flight waits less for each round trip, and with enough
the latency is paid once, in the fill and drain. ``window`` prices a plan's per-stage warm-ups
(``Stage.warmup``, :func:`skyjax.plan.model.schedules.warmups`) as T_win. With 1F1B's own
warm-ups T_win <= T, so T stays the price that the searches minimise.

The planner (:mod:`skyjax.plan.as_run`) simulates ``choose``'s warm-ups beside 1F1B's own and
keeps them where the simulated step says they pay. ``choose`` gives each stage the fewest
warm-up forwards that hide its round trip, within its memory and never more than the stage
before it; ``deepen`` (the window model alone, for its experiments) keeps them only for a gain
of at least ``MIN_GAIN`` in T_win, since deeper warm-ups hold more activations; the plan's
``lower_bound_s`` is then the bound of the tables without links (``linkless``).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from skyjax.plan.pricing.cost import Tables
from skyjax.plan.model.schedules import warmups
from skyjax.plan.model.types import Plan

MIN_GAIN = 0.01  # least relative gain of T_win for which a plan takes deeper warm-ups


@dataclasses.dataclass(frozen=True)
class Window:
    """The window model's terms of one plan (module doc)."""

    times: list[float]  # t_k
    busy: list[float]  # c_k
    transfer: list[float]  # x_k, per link
    latency: list[float]  # per link

    def period(self, m: int, warm: Sequence[int]) -> float:
        """P for warm-up forwards ``warm`` per stage."""
        p = len(self.times)
        out = max(max(self.busy), max(self.transfer, default=0.0))
        for k in range(p - 1):
            w = min(m, warm[k] + 1)
            if w < m:
                out = max(out, sum(self.times[k:]) / w)
        return out

    def step(self, m: int, warm: Sequence[int], extra_s: float) -> float:
        """T_win = sum t_k + (m - 1) P + extra (update_0 + sync_s)."""
        return float(sum(self.times) + (m - 1) * self.period(m, warm) + extra_s)


def window(t: Tables, plan: Plan) -> Window:
    """The window terms of a one-pipeline plan priced by ``t``."""
    st = plan.stages
    times = [s.time_s for s in st]
    lat, xfer = [], []
    for s, nxt in zip(st, st[1:]):
        d, e, cut = s.device, nxt.device, s.units[1]
        c = t.codec_names.index(s.codec)
        lat.append(float(t.latency[d, e]))
        xfer.append(float(t.codec_bytes[c, cut - 1] / t.bandwidth[d, e]))
    busy = [tk - 2 * (lat[k] + xfer[k]) if k < len(st) - 1 else tk
            for k, tk in enumerate(times)]
    return Window(times, busy, xfer, lat)


def stage_memory(t: Tables, a: int, b: int, inflight: int) -> float:
    """Bytes a stage of units [a, b) holds with ``inflight`` micro-batches in flight."""
    return float(t.state_prefix[b] - t.state_prefix[a]
                 + inflight * (t.act_prefix[b] - t.act_prefix[a]))


def choose(t: Tables, plan: Plan, win: Window) -> list[int]:
    """Per stage the warm-up forwards ``deepen`` gives it (module doc)."""
    p, m = len(plan.stages), t.microbatches
    own = warmups(p, m)
    free = max(max(win.busy), max(win.transfer, default=0.0))
    out, prev = [], m
    for k, s in enumerate(plan.stages):
        need = own[k]
        if k < p - 1 and free > 0:
            need = max(need, min(m, int(np.ceil(sum(win.times[k:]) / free - 1e-9))) - 1)
        fits = own[k]
        while fits < min(need, prev) and stage_memory(t, *s.units, min(m, fits + 2)) \
                <= t.memory[s.device]:
            fits += 1
        out.append(max(own[k], min(need, prev, fits)))
        prev = out[-1]
    return out


def deepen(t: Tables, plan: Plan, bound_s: Callable[[], float]) -> Plan:
    """``plan`` with deeper warm-ups where the window model says they pay (module doc);
    ``bound_s()``: a lower bound on T_win of every plan (``lower_bound`` of ``linkless(t)``),
    called only for a deepened plan. Other schedules, several pipelines: ``plan`` itself."""
    if t.schedule != "1f1b" or plan.num_pipelines > 1 or len(plan.stages) < 2:
        return plan
    p, m = len(plan.stages), t.microbatches
    win = window(t, plan)
    own = warmups(p, m)
    warm = choose(t, plan, win)
    if warm == own:
        return plan
    extra = t.step_extra(plan.stages[0].update_s)
    deep = win.step(m, warm, extra)
    if deep >= win.step(m, own, extra) * (1 - MIN_GAIN):
        return plan
    stages = [dataclasses.replace(
        s, warmup=w if w > o else None,
        memory_bytes=int(round(stage_memory(t, *s.units, min(m, w + 1)))) if w > o else
        s.memory_bytes) for s, w, o in zip(plan.stages, warm, own)]
    return dataclasses.replace(plan, stages=stages, step_time_s=deep,
                               bottleneck_s=win.period(m, warm), exact=False,
                               lower_bound_s=min(float(bound_s()), deep))


def linkless(t: Tables) -> Tables:
    """``t`` with every link free (latency 0, bandwidth unbounded): its lower bound bounds
    T_win of every plan (module doc)."""
    n = t.num_devices
    return dataclasses.replace(t, latency=np.zeros((n, n)), bandwidth=np.full((n, n), np.inf))
