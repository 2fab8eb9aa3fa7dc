"""Per-stage action times of a plan on a profile: what the simulators replay.

One forward and one backward action per stage (unit times, the device's call cost and the
stage's message calls) and the one-way delay of each link; their sums give the cost model's t_k
(:mod:`skyjax.plan.pricing.cost`). Shared by :mod:`skyjax.plan.replay.simulate` and
:mod:`skyjax.hostmodel.sharing`.
"""

from __future__ import annotations

from skyjax.plan.model.types import Plan
from skyjax.profile.format import Profile


def stage_actions_s(plan: Plan, profile: Profile) -> tuple[list[float], list[float],
                                                           list[float]]:
    """Per stage: one forward action, one backward action (unit times + the call cost + the
    stage's message calls: in from the previous stage, out to the next) and one-way link delays
    (latency + bytes / bandwidth, len p - 1), in the bytes of the link's codec, whose time is
    split over both ends' actions. Their sums give the cost model's t_k."""
    fwd, bwd, link = [], [], []
    p = len(plan.stages)
    extra = [0.0] * p  # codec seconds per action of each stage
    for k, s in enumerate(plan.stages):
        (a, b), d = s.units, s.device
        msg = float(profile.message_s[d]) * ((k > 0) + (k < p - 1))
        fwd.append(float(profile.forward_s[a:b, d].sum() + profile.forward_call_s[d]) + msg)
        bwd.append(float(profile.backward_s[a:b, d].sum() + profile.backward_call_s[d]) + msg)
        if k < p - 1:
            e = plan.stages[k + 1].device
            bw = float(profile.bandwidth_Bps[d, e])
            out = float(profile.units[b - 1]["output_bytes"])
            wire = out
            if s.codec != "none":  # its bytes; encode + decode, half in each action of both
                coded = profile.codecs[s.codec]
                wire = float(coded["output_bytes"][b - 1])
                rate = coded["seconds_per_byte"]
                for j, dev in ((k, d), (k + 1, e)):
                    extra[j] += float(rate[dev]) * out / 2
            link.append(float(profile.latency_s[d, e]) + (wire / bw if bw > 0 else float("inf")))
    fwd = [x + c for x, c in zip(fwd, extra)]
    bwd = [x + c for x, c in zip(bwd, extra)]
    return fwd, bwd, link


def tied_message_s(plan: Plan, profile: Profile) -> float:
    """The tied weights' exchange of one pipeline (``plan``'s stages; docs/design.md, "Tied
    weights across stages"): its first and last stage each send the other the gradient of the
    tensor both hold, ``tied_bytes`` of the chain's first (or last) unit, after their last
    action: one message call each end and ``latency + tied_bytes / bandwidth`` on that pair's
    link. 0 for one stage or a model without tied weights."""
    st = plan.stages
    ends = (profile.units[st[0].units[0]], profile.units[st[-1].units[1] - 1])
    tied = max(float(u.get("tied_bytes", 0) or 0) for u in ends)
    if len(st) < 2 or not tied:
        return 0.0
    d, e = st[0].device, st[-1].device
    bw = float(profile.bandwidth_Bps[d, e])
    return (float(profile.latency_s[d, e]) + 2 * float(profile.message_s[d])
            + (tied / bw if bw > 0 else float("inf")))


def with_tied_message(step_s: float, first_end: float, last_end: float, tied_s: float) -> float:
    """A step's end before its synchronisation once the first and the last stage, whose actions
    end at ``first_end`` and ``last_end``, have swapped the tied gradient (``tied_s`` each way;
    each waits for the other's)."""
    if not tied_s:
        return step_s
    return max(step_s, max(first_end, last_end + tied_s), max(last_end, first_end + tied_s))


def stage_latency_s(plan: Plan, profile: Profile) -> list[float]:
    """Per link k -> k + 1 its latency: the part of its delay that does not hold the link (the
    rest, its bytes over the bandwidth, goes one message at a time per direction)."""
    st = plan.stages
    return [float(profile.latency_s[a.device, b.device]) for a, b in zip(st, st[1:])]


def stage_weight_s(plan: Plan, profile: Profile) -> list[float]:
    """Per stage the W pass of a zero-bubble schedule (its units' W,
    :func:`skyjax.plan.pricing.passes.weight_s`), beside its B action (:func:`stage_input_s`);
    zeros under other schedules."""
    from skyjax.names import ZERO_BUBBLE
    from skyjax.plan.pricing.passes import weight_s

    if plan.schedule not in ZERO_BUBBLE:
        return [0.0] * len(plan.stages)
    w = weight_s(profile)
    return [float(w[s.units[0]:s.units[1], s.device].sum()) for s in plan.stages]


def stage_input_s(plan: Plan, profile: Profile, bwd: list[float],
                  weight: list[float]) -> list[float]:
    """Per stage the B action of a zero-bubble schedule, from its backward action ``bwd``
    (:func:`stage_actions_s`) and W pass ``weight`` (:func:`stage_weight_s`): the backward
    action with its units' whole backward replaced by their measured B
    (:func:`skyjax.plan.pricing.passes.input_s`) where the profile has ``backward_input_s``;
    else the backward action less W (the backward action itself under other schedules)."""
    from skyjax.names import ZERO_BUBBLE
    from skyjax.plan.pricing.passes import input_s, split_measured

    if plan.schedule not in ZERO_BUBBLE or not split_measured(profile):
        return [b - w for b, w in zip(bwd, weight)]
    got = input_s(profile)
    return [b - float(profile.backward_s[s.units[0]:s.units[1], s.device].sum())
            + float(got[s.units[0]:s.units[1], s.device].sum()) for b, s in zip(bwd, plan.stages)]
