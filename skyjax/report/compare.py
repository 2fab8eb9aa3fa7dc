"""Predicted vs measured, per stage: which term of the cost model was wrong.

``stage_comparison(plan, profile, spans)`` puts side by side, for each stage of a plan, per step:

* ``compute_s``: the forward and backward actions (zero bubble: F, B and W; predicted: m x (unit times + call costs +
  message calls), :func:`skyjax.plan.replay.simulate.stage_actions_s`, times ``slowdown``, the busy-time
  ratio that extra cost terms give the stage (:mod:`skyjax.plan.model.extension`; 1 without);
  measured: the sum of the step's F/B spans, the runtime's timed calls);
* ``comm_s``: the stage's messages out (activation to the next stage, gradient back from it),
  m x the one-way link delay twice (predicted); measured as, for every such message, the time
  from its producer's span end to its consumer's span start when the consumer was otherwise
  free (otherwise the wait is the consumer's backlog, not the link);
* ``idle_s``: the step's span (first action start to last action end) minus compute;
* ``update_s``: predicted only (the runtime does not time it separately).

It also replays the schedule with the *measured* action times and predicted links
(``replayed_step_s``): when the replay is close to the measured step but far from the predicted
one, the compute terms were wrong; when the measured step is far above the replay, the time went
into communication, synchronisation or the update. Extra cost terms may add their own figures
(``ExtraCost`` with a ``report`` method: the shared-host model's ``contention``). Pure Python (no
JAX): spans are
:class:`skyjax.spans.Span` records, as the runtime and the simulator both produce them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from skyjax.plan.model.extension import ExtraCost
from skyjax.plan.model.schedules import plan_lists
from skyjax.plan.replay.simulate import simulate, simulate_plan
from skyjax.plan.pricing.stage_times import stage_actions_s
from skyjax.plan.model.types import Plan
from skyjax.profile.format import Profile
from skyjax.plan.replay.measured import measured_comm
from skyjax.spans import Span, passes


def step_boundary_s(steps: Sequence[Sequence[Span]]) -> list[float]:
    """Between consecutive measured steps (each its F/B spans of every stage): the time from
    one step's last action end to the next step's first action start, which the cost model
    predicts as ``update_0 + sync_s`` (the gradient-norm all-reduce, the first stage's update,
    for a plan of one stage also the step's input put, and what else the runtime does between
    steps)."""
    steps = [passes(s) for s in steps]  # an exchange's spans are no action
    return [min(s.start for s in b) - max(s.end for s in a)
            for a, b in zip(steps, steps[1:]) if a and b]


def stage_comparison(plan: Plan, profile: Profile, spans: Sequence[Span],
                     boundaries: Sequence[float] = (),
                     steps: Sequence[Sequence[Span]] = (),
                     extra: ExtraCost | None = None) -> dict:
    """Per-stage predicted vs measured compute, comm, idle (per step), the replayed step and
    the step boundary (module doc). ``spans``: one step's F/B spans of every stage (empty:
    predicted only); ``boundaries``: measured ``step_boundary_s`` of the plan (their median);
    ``steps``: more steps' spans of the plan, for ``extra``'s own report where it has one
    (the shared-host model's ``contention``)."""
    p, m = len(plan.stages), plan.microbatches
    spans = passes(spans)  # the compute: an exchange's spans, if given, are not
    fwd, bwd, link = stage_actions_s(plan, profile)
    sim = simulate_plan(plan, profile, extra=extra)
    slowdown = sim.slowdown  # what extra cost terms add, per stage
    stages = []
    busy = {k: 0.0 for k in range(p)}
    mf: dict[int, list[float]] = {k: [] for k in range(p)}
    mb: dict[int, list[float]] = {k: [] for k in range(p)}
    mw: dict[int, list[float]] = {k: [] for k in range(p)}  # zero bubble's W passes
    for s in spans:
        busy[s.stage] = busy.get(s.stage, 0.0) + s.end - s.start
        ({"F": mf, "W": mw}.get(s.kind, mb)).setdefault(s.stage, []).append(s.end - s.start)
    window = (max(s.end for s in spans) - min(s.start for s in spans)) if spans else 0.0
    comm = measured_comm(spans, p) if spans else None
    for k, st in enumerate(plan.stages):
        rec = {"stage": k, "device": st.device, "units": list(st.units),
               "predicted": {"compute_s": m * (fwd[k] + bwd[k]) * slowdown[k],
                             "slowdown": slowdown[k], "comm_s": 2 * m * link[k] if k < p - 1 else 0.0,
                             "idle_s": sim.idle_s[k], "update_s": st.update_s}}
        if spans:
            rec["measured"] = {"compute_s": busy.get(k, 0.0),
                               "comm_s": comm[k] if k < p - 1 else 0.0,
                               "idle_s": window - busy.get(k, 0.0)}
            pc = rec["predicted"]["compute_s"]
            rec["compute_error"] = (busy.get(k, 0.0) - pc) / busy[k] if busy.get(k) else None
        stages.append(rec)
    out = {"stages": stages, "simulated_step_s": sim.step_time_s,
           "step_boundary": {"predicted_s": plan.stages[0].update_s + float(profile.sync_s)}}
    if len(boundaries):
        out["step_boundary"].update(measured_s=float(np.median(boundaries)),
                                    steps=len(boundaries))
    if spans and all(mf.get(k) and mb.get(k) for k in range(p)):
        mean = lambda x: sum(x) / len(x) if x else 0.0  # noqa: E731
        replay = simulate([mean(mf[k]) for k in range(p)], [mean(mb[k]) for k in range(p)],
                          link, plan.schedule, m, update_s=[s.update_s for s in plan.stages],
                          sync_s=profile.sync_s, weight_s=[mean(mw[k]) for k in range(p)],
                          lists=plan_lists(plan) if plan.num_pipelines == 1 else None)
        out["replayed_step_s"] = replay.step_time_s
        out["measured_span_s"] = window
    if steps and extra is not None and hasattr(extra, "report"):
        out.update(extra.report(plan, profile, steps))
    return out
