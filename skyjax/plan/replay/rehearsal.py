"""A rehearsal's times: what every action of a plan takes on the cluster a profile describes, so
that the real runtime can rehearse that cluster on any host (``config.rehearse``).

A rehearsal runs the plan's stages with a small model of the profile's unit count; each call
then waits out the time the profile declares for its block on its device, and each message the
time its link declares for the bytes the *profiled* model sends. This module turns (plan,
profile) into those figures, with the cost model's own terms (:func:`stage_actions_s`, the
gradient exchange of :mod:`skyjax.plan.data_parallel.pipelines`), so a rehearsed step measures
the runtime against the very numbers the simulator replays. Pure numpy, like the rest of
``plan``; the run's side (its config, devices, calls) is :mod:`skyjax.runtime.rehearsal`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from skyjax.plan.pricing.buckets import piece_bytes
from skyjax.plan.pricing.exchange import BETWEEN, message_bytes, routing
from skyjax.plan.data_parallel.pipelines import grad_prefix
from skyjax.plan.pricing.stage_times import stage_actions_s, stage_input_s, stage_weight_s
from skyjax.plan.model.types import Plan
from skyjax.plan.replay.coding import plan_coding
from skyjax.plan.replay.peer_run import peer_coding
from skyjax.names import PEER_MODES
from skyjax.profile.format import Profile


@dataclasses.dataclass(frozen=True)
class StageTimes:
    """One stage's declared seconds: a forward and a backward action (unit times, call cost,
    message calls and its share of the codec's coding), its update at the step boundary
    (``update_k``) and the step's synchronisation after its last action."""

    forward_s: float
    backward_s: float
    update_s: float
    sync_s: float
    weight_s: float = 0.0  # zero bubble: the W pass (backward_s is then the B pass alone)
    # per unit of the stage its backward seconds: how a bucketed last backward shares backward_s
    # among its buckets (runtime.replicas.backward_by_buckets; the simulator's unit_ready_s)
    unit_backward_s: tuple[float, ...] | None = None


@dataclasses.dataclass
class RehearsalTimes:
    """Per stage of a plan (its flat order) its :class:`StageTimes`; per directed device pair
    the bytes a message declares on the wire (hand-offs in the link's codec, replicated
    gradients in the averaging's) and the seconds of coding it adds (the int8 exchange's, which
    the cost model charges per message), with the profile's latency and bandwidth."""

    stages: list[StageTimes]
    wire_bytes: np.ndarray  # [D, D]
    coding_s: np.ndarray  # [D, D]
    latency_s: np.ndarray  # [D, D]
    bandwidth_Bps: np.ndarray  # [D, D]


def scale_profile(profile: Profile, k: float) -> Profile:
    """``profile`` with every time multiplied by ``k`` (unit and call times, updates, inputs,
    messages, synchronisation, codec rates, latencies) and every bandwidth divided by it, so
    that every cost-model term, and the simulator's step, scales by exactly ``k``."""
    if k == 1.0:
        return profile
    codecs = {name: {**c, "seconds_per_byte": [float(x) * k for x in c["seconds_per_byte"]]}
              for name, c in profile.codecs.items()}
    return dataclasses.replace(
        profile, forward_s=profile.forward_s * k, backward_s=profile.backward_s * k,
        latency_s=profile.latency_s * k, bandwidth_Bps=profile.bandwidth_Bps / k,
        update_s=profile.update_s * k, forward_call_s=profile.forward_call_s * k,
        backward_call_s=profile.backward_call_s * k, update_call_s=profile.update_call_s * k,
        message_s=profile.message_s * k, sync_s=float(profile.sync_s) * k,
        input_s=None if profile.input_s is None else profile.input_s * k, codecs=codecs,
        backward_weight_s=(None if profile.backward_weight_s is None
                           else profile.backward_weight_s * k),
        backward_input_s=(None if profile.backward_input_s is None
                          else profile.backward_input_s * k))


def scale_plan(plan: Plan, k: float) -> Plan:
    """``plan``'s predicted times multiplied by ``k`` (its stages and cuts unchanged): the plan
    of :func:`scale_profile`'s profile, priced there."""
    if k == 1.0:
        return plan
    stages = [dataclasses.replace(s, compute_s=s.compute_s * k, comm_s=s.comm_s * k,
                                  update_s=s.update_s * k,
                                  passes_s=None if s.passes_s is None
                                  else tuple(x * k for x in s.passes_s))
              for s in plan.stages]
    return dataclasses.replace(
        plan, stages=stages, step_time_s=plan.step_time_s * k, bottleneck_s=plan.bottleneck_s * k,
        lower_bound_s=None if plan.lower_bound_s is None else plan.lower_bound_s * k,
        extra_s=plan.extra_s * k, allreduce_s=plan.allreduce_s * k,
        model_s=None if plan.model_s is None else plan.model_s * k,
        pipeline_step_s=None if plan.pipeline_step_s is None
        else [t * k for t in plan.pipeline_step_s])


def rehearsal_times(plan: Plan, profile: Profile) -> RehearsalTimes:
    """The declared times of ``plan``'s actions and messages on ``profile`` (already scaled)."""
    n = profile.num_devices
    wire = np.zeros((n, n))
    times: dict[int, StageTimes] = {}
    sync = float(profile.sync_s)
    for i in range(plan.num_pipelines):
        sub = plan.pipeline(i)
        fwd, bwd, _ = stage_actions_s(sub, profile)
        w = stage_weight_s(sub, profile)
        b = stage_input_s(sub, profile, bwd, w)
        for k, (g, s) in enumerate(zip(plan.stage_ids(i), sub.stages)):
            times[g] = StageTimes(fwd[k], b[k], float(s.update_s), sync, w[k], tuple(
                float(x) for x in profile.backward_s[s.units[0]:s.units[1], s.device]))
            if k + 1 < len(sub.stages):
                d, e = s.device, sub.stages[k + 1].device
                end = s.units[1] - 1
                nbytes = (float(profile.codecs[s.codec]["output_bytes"][end])
                          if s.codec != "none" else float(profile.units[end]["output_bytes"]))
                wire[d, e] = wire[e, d] = nbytes  # activations one way, cotangents back
    gprefix = grad_prefix(profile)
    phases, ratio, rate = plan_coding(plan, profile)  # int8's, or top-k's (replay.coding)
    if plan.averaging in PEER_MODES:  # the peer modes' own (replay.peer_run)
        phases, ratio, rate = peer_coding(plan, profile)
    coding = np.zeros((n, n))
    chains = [[(s.device, *s.units) for s in plan.pipeline(i).stages]
              for i in range(plan.num_pipelines)]
    # the others route through the link groups
    direct = plan.averaging in ("int8", "diloco") + PEER_MODES
    route = routing(chains, None if direct else plan.exchange_groups, np.diff(gprefix),
                    None if direct else plan.exchange_reps)
    # int8: every message coded; int8-across: the partial sums between groups (phase 2)
    across = {(m.src, m.dst) for m in route.messages if m.phase == BETWEEN}
    # the exact exchange sends its messages in pieces by bucket (pricing.buckets)
    split = piece_bytes if plan.averaging == "exact" else message_bytes
    for (d, e), sizes in split(route, gprefix).items():
        # pipelines.exchange_s's messages; a pair with two (in a group: partial sums one way,
        # totals back in a later phase) declares their mean, so the pair's total is the model's;
        # diloco-across's outer step repeats the pairs' messages of phases 2 and 3
        g = sum(sizes) / len(sizes)
        on = bool(phases) and (len(phases) > 1 or (d, e) in across)
        wire[d, e] = g * (ratio if on else 1.0)
        coding[d, e] = float(rate[d]) * g if on else 0.0
    return RehearsalTimes([times[g] for g in range(len(plan.stages))], wire, coding,
                          np.asarray(profile.latency_s, float),
                          np.asarray(profile.bandwidth_Bps, float))

