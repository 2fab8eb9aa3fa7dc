"""The cost model: what a plan costs, per stage and per training step. docs/design.md, "The cost
model", gives the formulas (compute_k, comm_k, t_k, update_k, memory_k, T and zero bubble's
credit) and the reasons for them; this module is their one implementation.

``tables`` turns a profile into the arrays every search, bound and replay reads (prefix sums, so
a block's compute or memory is two lookups). ``stage_costs`` prices an assignment's stages and
``step_time`` its step; ``evaluate`` prices a given assignment and checks that it fits.

A caller may hand in extra cost terms (:mod:`skyjax.plan.model.extension`: the optional
shared-host model). T is then their step where that is longer than the analytic T, and
``Plan.extra_s`` says by how much; the searches optimise the analytic T.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Sequence

import numpy as np

from skyjax.names import SCHEDULES, ZERO_BUBBLE
from skyjax.plan.model.extension import ExtraCost
from skyjax.plan.model.types import InfeasibleError, Plan, Stage
from skyjax.plan.pricing.passes import backward_s, codec_tables, weight_s
from skyjax.profile.format import Profile

_INF = math.inf

Assignment = Sequence[tuple[int, int, int]]  # [(device, first unit, end unit), ...] in order


@dataclasses.dataclass(frozen=True)
class Tables:
    """The profile as arrays for one schedule and micro-batch count."""

    work: np.ndarray  # [U, D] forward + backward seconds
    prefix: np.ndarray  # [D, U+1] prefix sums of work per device
    fixed: np.ndarray  # [D] forward + backward call seconds, once per stage and micro-batch
    in_msg: np.ndarray  # [D] 2 message_s: a stage that is not first (a > 0)
    update_prefix: np.ndarray  # [D, U+1] prefix sums of update_s per device
    update_call: np.ndarray  # [D]
    alone: np.ndarray  # [D] m input_s: what a plan of one stage on d adds to its update
    sync_s: float
    state_prefix: np.ndarray  # [U+1] bytes a unit holds whatever is in flight: state + temp
    act_prefix: np.ndarray  # [U+1]
    output_bytes: np.ndarray  # [U]
    latency: np.ndarray  # [D, D]
    bandwidth: np.ndarray  # [D, D]
    memory: np.ndarray  # [D]
    schedule: str
    microbatches: int
    # hand-off codecs the relaxation allows ("none" first, alone by default): bytes on the wire
    # of each unit's output [C, U] and encode + decode seconds per uncoded byte per device [C, D]
    codec_names: tuple[str, ...] = ("none",)
    codec_bytes: np.ndarray | None = None
    codec_rate: np.ndarray | None = None
    # zero bubble (docs/design.md, "Zero-bubble schedules"): prefix sums of backward_s and of
    # its W part per device [D, U+1], and the credit's factor (0: GPipe and 1F1B)
    bwd_prefix: np.ndarray | None = None
    weight_prefix: np.ndarray | None = None
    credit_factor: float = 0.0
    # zero bubble: the searches' depth, the most stages a plan they search may have, its stages
    # charged at that many stages' in-flight count (0: every device, the most any plan keeps;
    # :meth:`search_depths`)
    depth: int = 0

    @property
    def num_units(self) -> int:
        return self.work.shape[0]

    @property
    def num_devices(self) -> int:
        return self.work.shape[1]

    def inflight(self, stages_from_end: int | np.ndarray) -> int | np.ndarray:
        """Micro-batches whose activations a stage keeps (p - k = stages_from_end), as the
        searches charge it: under zero bubble the same on every stage, that of a plan of
        ``depth`` stages (every device where 0: an upper bound for any plan)."""
        if self.schedule == "gpipe":
            return self.microbatches
        if self.schedule in ZERO_BUBBLE:
            return self.zb_inflight(self.depth or self.num_devices)
        return np.minimum(self.microbatches, stages_from_end)

    def zb_inflight(self, stages: int) -> int:
        """A zero-bubble plan of ``stages`` stages: micro-batches in flight on each of them,
        min(m, p) (ZB-H1) or min(m, 2p) (ZB-H2)
        (:func:`skyjax.plan.model.schedules.inflight_limit`)."""
        return min(self.microbatches, stages * (2 if self.schedule == "zb-h2" else 1))

    @property
    def most_stages(self) -> int:
        """The most stages any plan has: min(D, U)."""
        return min(self.num_devices, self.num_units)

    def search_depths(self) -> list[int]:
        """The depths the searches run at (``depth``; one search, 0, except under zero bubble):
        a plan of p stages keeps ``zb_inflight(p)`` on every stage, so each depth P is searched
        over plans of at most P stages charged at P's count, and every plan fits at its own p.
        A depth is left out where the next one admits the same blocks on every device (its
        plans are the next one's too); the deepest, ``most_stages``, admits every plan."""
        if self.schedule not in ZERO_BUBBLE:
            return [0]
        top = self.most_stages
        out, seen = [top], self._admitted(top)
        for depth in range(top - 1, 0, -1):
            got = self._admitted(depth)
            if not all(np.array_equal(a, b) for a, b in zip(got, seen)):
                out.append(depth)
            seen = got
        return out[::-1]

    def _admitted(self, depth: int) -> list[np.ndarray]:
        """Per distinct device memory, the least start of a block ending at each unit boundary
        that fits it at ``depth``'s in-flight count."""
        q = self.state_prefix + self.zb_inflight(depth) * self.act_prefix
        return [np.searchsorted(q, q - cap, "left") for cap in np.unique(self.memory)]

    def restrict(self, keep: Sequence[int]) -> "Tables":
        """These tables on the devices ``keep`` only (device i of the result is keep[i])."""
        k = np.asarray(keep, int)
        cut = {name: getattr(self, name)[k] for name in (
            "prefix", "fixed", "in_msg", "update_prefix", "update_call", "alone", "memory")}
        cut.update(work=self.work[:, k], latency=self.latency[np.ix_(k, k)],
                   bandwidth=self.bandwidth[np.ix_(k, k)], codec_rate=self.codec_rate[:, k])
        if self.bwd_prefix is not None:
            cut.update(bwd_prefix=self.bwd_prefix[k], weight_prefix=self.weight_prefix[k])
        return dataclasses.replace(self, **cut)

    @property
    def least_inflight(self) -> int:
        """The fewest micro-batches any stage of any plan keeps in flight (what the bounds
        charge memory at): 1 (1F1B's last stage, ZB-H1 on one stage), min(m, 2) (ZB-H2), m
        (GPipe)."""
        if self.schedule == "gpipe":
            return self.microbatches
        return min(self.microbatches, 2 if self.schedule == "zb-h2" else 1)

    def max_credit(self) -> float:
        """At least the credit of any plan (0 under GPipe and 1F1B), for the lower bounds:
        the non-last stages hold units before the last, so sum_k min(B_k, f W_k) <=
        min(sum_{u < U-1} max_d backward_s[u][d], f sum_{u < U-1} max_d W[u][d])."""
        if not self.credit_factor:
            return 0.0
        last = self.num_units - 1
        bwd = np.diff(self.bwd_prefix, axis=1)[:, :last].max(axis=0, initial=0.0).sum()
        w = np.diff(self.weight_prefix, axis=1)[:, :last].max(axis=0, initial=0.0).sum()
        return float(min(bwd, self.credit_factor * w))

    def inflight_at(self, p: int, k: int) -> int:
        """Micro-batches stage k of a plan of p stages keeps in flight: what its memory is
        charged at (zero bubble: ``zb_inflight(p)``, of its own p stages;
        :func:`skyjax.plan.model.schedules.inflight_limit`)."""
        if self.schedule in ZERO_BUBBLE:
            return self.zb_inflight(p)
        return int(self.inflight(p - k))

    def credit(self, d: int, a: int | np.ndarray, b: int | np.ndarray) -> np.ndarray:
        """What a zero-bubble schedule takes off T for a stage on d over [a, b) that is not
        the last: min(its units' backward, credit_factor x their W), factor min(2, m) (ZB-H1)
        or min(3, m) (ZB-H2): with equal stages the bubble shrinks from (p - 1)(f + b + w) to
        (p - 1)(f + b - w) (- 2w); 0 under GPipe and 1F1B."""
        if not self.credit_factor:
            return np.zeros(np.broadcast(np.asarray(a), np.asarray(b)).shape)
        bwd = self.bwd_prefix[d, b] - self.bwd_prefix[d, a]
        w = self.weight_prefix[d, b] - self.weight_prefix[d, a]
        return np.minimum(bwd, self.credit_factor * w)

    def comm(self, d: int, e: int, cuts: np.ndarray | int) -> np.ndarray:
        """Two-way comm seconds of a stage on d ending at cut(s) (1..U-1), next stage on e: the
        two transfers and d's two message calls (activation out, gradient in)."""
        cuts = np.asarray(cuts)
        if self.bandwidth[d, e] <= 0:
            return np.full(cuts.shape, _INF)
        return self._by_codec(d, e, cuts.reshape(-1)).min(axis=0).reshape(cuts.shape)

    def _by_codec(self, d: int, e: int, cuts: np.ndarray) -> np.ndarray:
        """[C, len(cuts)]: ``comm`` with each allowed codec (the link's two transfers in its
        bytes, plus its encode and decode on both devices; none: no codec time)."""
        out = self.output_bytes[cuts - 1]
        return (2.0 * (self.latency[d, e] + self.codec_bytes[:, cuts - 1] / self.bandwidth[d, e]
                       + self.in_msg[d] / 2)
                + (self.codec_rate[:, d] + self.codec_rate[:, e])[:, None] * out)

    def link_codec(self, d: int, e: int, cut: int) -> str:
        """The codec ``comm`` charges for the link d -> e at ``cut``: the cheapest allowed."""
        if len(self.codec_names) == 1 or self.bandwidth[d, e] <= 0:
            return "none"
        return self.codec_names[int(np.argmin(self._by_codec(d, e, np.array([cut]))[:, 0]))]

    def crossing_s(self, latency: float, bandwidth: float, rate_src: np.ndarray,
                   rate_dst: np.ndarray) -> np.ndarray:
        """[U - 1]: the two transfers at every cut over a link of ``latency`` and
        ``bandwidth`` (no message calls), with the cheapest allowed codec whose rates on the
        two ends are ``rate_src``/``rate_dst`` [C] (the searches over link groups pass a group's
        largest rates, their bounds its least)."""
        return (2.0 * (latency + self.codec_bytes[:, :-1] / bandwidth)
                + (rate_src + rate_dst)[:, None] * self.output_bytes[:-1]).min(axis=0)

    @property
    def least_bytes(self) -> np.ndarray:
        """[U]: each unit's output in the fewest bytes any allowed codec sends."""
        return self.codec_bytes.min(axis=0)

    def block(self, d: int, a: int | np.ndarray, b: int | np.ndarray) -> np.ndarray:
        """compute + incoming message calls of a stage on d over [a, b) (no outgoing link)."""
        a = np.asarray(a)
        return (self.prefix[d, b] - self.prefix[d, a] + self.fixed[d]
                + np.where(a > 0, self.in_msg[d], 0.0))

    def first_update(self, d: int, ends: np.ndarray | int) -> np.ndarray:
        """update_0 of a first stage on d ending at ``ends``: what T adds for it once per step
        (a stage that also ends the chain puts the step's inputs at the boundary: ``alone``)."""
        ends = np.asarray(ends)
        return (self.update_call[d] + self.update_prefix[d, ends]
                + np.where(ends == self.num_units, self.alone[d], 0.0))

    def step_extra(self, first_update: float) -> float:
        """T - (sum t_k + (m - 1) max t_k): the first stage's update and the synchronisation."""
        return float(first_update) + self.sync_s


@dataclasses.dataclass
class Solution:
    """What a search returns: an assignment with its sum and maximum of stage times, so that
    T = total + (m - 1) bottleneck + sync_s (``total`` includes the first stage's update)."""

    total: float  # sum of t_k + update_0
    bottleneck: float  # max t_k
    assignment: list[tuple[int, int, int]]


def tables(profile: Profile, schedule: str = "1f1b", microbatches: int = 8) -> Tables:
    """Cost tables for a profile (validates schedule and micro-batch count)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {SCHEDULES}, got {schedule!r}")
    if int(microbatches) != microbatches or microbatches < 1:
        raise ValueError(f"microbatches: expected a positive integer, got {microbatches!r}")
    work = np.asarray(profile.forward_s, float) + backward_s(profile, schedule)
    prefix = np.concatenate([np.zeros((work.shape[1], 1)), np.cumsum(work.T, axis=1)], axis=1)
    upd = np.asarray(profile.update_s, float)
    units = profile.units
    names, cbytes, crate = codec_tables(profile)
    state = np.array([float(u["state_bytes"]) + float(u.get("temp_bytes", 0)) for u in units])
    act = np.array([float(u["activation_bytes"]) for u in units])
    return Tables(
        work=work, prefix=prefix,
        fixed=np.asarray(profile.forward_call_s, float) + np.asarray(profile.backward_call_s,
                                                                       float),
        in_msg=2.0 * np.asarray(profile.message_s, float),
        update_prefix=np.concatenate([np.zeros((upd.shape[1], 1)), np.cumsum(upd.T, axis=1)],
                                     axis=1),
        update_call=np.asarray(profile.update_call_s, float),
        alone=int(microbatches) * np.asarray(profile.input_s, float),
        sync_s=float(profile.sync_s),
        state_prefix=np.concatenate([[0.0], np.cumsum(state)]),
        act_prefix=np.concatenate([[0.0], np.cumsum(act)]),
        output_bytes=np.array([float(u["output_bytes"]) for u in units]),
        latency=np.asarray(profile.latency_s, float),
        bandwidth=np.asarray(profile.bandwidth_Bps, float),
        memory=np.array([float(d["memory_bytes"]) for d in profile.devices]),
        schedule=schedule, microbatches=int(microbatches), codec_names=names,
        codec_bytes=cbytes, codec_rate=crate, **_zero_bubble(profile, schedule, microbatches))


def _zero_bubble(profile: Profile, schedule: str, microbatches: int) -> dict:
    if schedule not in ZERO_BUBBLE:
        return {}
    def pre(x):
        return np.concatenate([np.zeros((x.shape[1], 1)), np.cumsum(x.T, axis=1)], axis=1)

    return dict(bwd_prefix=pre(backward_s(profile, schedule)),
                weight_prefix=pre(weight_s(profile)),
                credit_factor=float(min(2 if schedule == "zb-h1" else 3, microbatches)))


def stage_costs(t: Tables, assignment: Assignment) -> list[Stage]:
    """Stages (compute, comm, update, memory) of an assignment [(device, start, end), ...]."""
    p = len(assignment)
    stages = []
    for k, (d, a, b) in enumerate(assignment):
        compute = float(t.prefix[d, b] - t.prefix[d, a] + t.fixed[d])
        last = k == p - 1
        comm = (float(t.in_msg[d]) if a > 0 else 0.0) + (
            0.0 if last else float(t.comm(d, assignment[k + 1][0], b)))
        codec = "none" if last else t.link_codec(d, assignment[k + 1][0], b)
        mem = (t.state_prefix[b] - t.state_prefix[a]
               + t.inflight_at(p, k) * (t.act_prefix[b] - t.act_prefix[a]))
        update = float(t.first_update(d, b) if k == 0 else
                       t.update_call[d] + t.update_prefix[d, b] - t.update_prefix[d, a])
        passes = None
        if t.credit_factor:  # F, B and W seconds: what the schedule's fill is built from
            bwd = float(t.bwd_prefix[d, b] - t.bwd_prefix[d, a])
            w = float(t.weight_prefix[d, b] - t.weight_prefix[d, a])
            passes = (compute - bwd, bwd - w, w)
        stages.append(Stage(int(d), (int(a), int(b)), compute, comm, int(round(mem)), update,
                            codec=codec, passes_s=passes))

    return stages


def step_time(stage_times: Iterable[float], microbatches: int, extra_s: float = 0.0) -> float:
    """T = sum t_k + (m - 1) max t_k + extra (update_0 + sync_s: ``Tables.step_extra``)."""
    ts = list(stage_times)
    return float(sum(ts) + (microbatches - 1) * max(ts) + extra_s)


def check_assignment(t: Tables, assignment: Assignment) -> None:
    """Raises ValueError unless the assignment is distinct devices covering all units in order."""
    if not assignment:
        raise ValueError("assignment: empty")
    pos = 0
    seen = set()
    for k, (d, a, b) in enumerate(assignment):
        if not 0 <= d < t.num_devices:
            raise ValueError(f"assignment[{k}]: no device {d}")
        if d in seen:
            raise ValueError(f"assignment[{k}]: device {d} used twice")
        seen.add(d)
        if a != pos or b <= a:
            raise ValueError(f"assignment[{k}]: units [{a}, {b}) do not continue at {pos}")
        pos = b
    if pos != t.num_units:
        raise ValueError(f"assignment: covers units [0, {pos}) of {t.num_units}")


def check_fits(profile: Profile, t: Tables, stages: list[Stage]) -> None:
    """Raises InfeasibleError for the first stage over its device's memory or whose next
    device it cannot reach."""
    for k, s in enumerate(stages):
        cap = t.memory[s.device]
        if s.memory_bytes > cap:
            raise InfeasibleError(
                f"stage {k} on device {s.device} ({profile.devices[s.device]['name']}): units "
                f"[{s.units[0]}, {s.units[1]}) need {s.memory_bytes} bytes but it has {int(cap)}: "
                f"{int(s.memory_bytes - cap)} bytes do not fit")
        if math.isinf(s.comm_s):
            nxt = stages[k + 1].device
            raise InfeasibleError(f"stage {k}: device {s.device} cannot reach device {nxt} "
                                  f"(bandwidth_Bps[{s.device}][{nxt}] = 0)")


def evaluate(profile: Profile, assignment: Assignment, schedule: str = "1f1b",
             microbatches: int = 8, strategy: str = "custom", *, exact: bool = False,
             lower_bound_s: float | None = None, check: bool = True,
             extra: ExtraCost | None = None) -> Plan:
    """The Plan of a given assignment under the cost model (raises if it does not fit);
    ``extra``: optional cost terms (:mod:`skyjax.plan.model.extension`)."""
    t = tables(profile, schedule, microbatches)
    return evaluate_tables(profile, t, assignment, strategy, exact, lower_bound_s, check, extra)


def evaluate_tables(profile: Profile, t: Tables, assignment: Assignment, strategy: str,
                    exact: bool, lower_bound_s: float | None, check: bool = True,
                    extra: ExtraCost | None = None) -> Plan:
    """``evaluate`` on tables already built (the planner builds them once)."""
    check_assignment(t, assignment)
    stages = stage_costs(t, assignment)
    if check:
        check_fits(profile, t, stages)
    times = [s.time_s for s in stages]
    once = t.step_extra(stages[0].update_s) - sum(
        float(t.credit(d, a, b)) for d, a, b in list(assignment)[:-1])
    out = Plan(strategy=strategy, schedule=t.schedule, microbatches=t.microbatches,
               stages=stages, step_time_s=step_time(times, t.microbatches, once),
               bottleneck_s=float(max(times)), exact=exact,
               lower_bound_s=None if exact else lower_bound_s,
               device_names=[d["name"] for d in profile.devices])
    if extra is None:
        return out
    # T is never below the analytic T, so the searches' bounds stay valid with the extra terms
    stepped = extra.step_s(out, profile)
    penalty = max(stepped - out.step_time_s, 0.0) if stepped is not None else 0.0
    if penalty > 0:
        if out.exact:  # the searches optimise T without it: the optimum is a bound only
            out.exact, out.lower_bound_s = False, out.step_time_s
        out.step_time_s += penalty
        out.extra_s = penalty
    return out
