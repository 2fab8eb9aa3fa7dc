"""What a plan is: stages of (device, block of units) with their predicted costs, as plan.json.

A plan is one or more pipelines in data parallel. A pipeline is stages k = 0..p-1, each a
distinct device d_k and a non-empty block of units [a_k, b_k), covering all units in order
(docs/design.md). Several pipelines use disjoint devices, each with a share of every global batch
in whole micro-batches (``Plan.shares``); their stages sit in one flat list, pipeline 0's first,
each stage naming its pipeline, so a stage's position in ``Plan.stages`` is its id everywhere
(spans, traces, tables). ``Plan.to_json`` / ``Plan.from_json`` are
the plan.json object that ``python -m skyjax.plan --out`` writes and training reads back.
Plain data: the numbers come from :mod:`skyjax.plan.pricing.cost`.
"""

from __future__ import annotations

import dataclasses


class InfeasibleError(ValueError):
    """No plan fits; the message names the tightest device and the bytes that do not fit."""


@dataclasses.dataclass
class Stage:
    """One pipeline stage: a device, its units [start, end) and their predicted per-micro-batch
    compute (forward + backward, call costs included), comm (message calls, and the transfers
    to the next stage and back), memory, and what it does once per step at the boundary before
    its first action: the optimizer update (a plan of one stage also puts the step's inputs
    then: ``skyjax.plan.pricing.cost.Tables.alone``)."""

    device: int
    units: tuple[int, int]
    compute_s: float
    comm_s: float
    memory_bytes: int
    update_s: float = 0.0
    pipeline: int = 0  # which pipeline (several pipelines: ``Plan.shares``)
    # the codec of its hand-offs with the next stage of its pipeline (skyjax.codecs; both ways)
    codec: str = "none"
    # zero-bubble schedules: seconds of one F, B (input gradient) and W (weight gradient) pass, what
    # the schedule's fill is built from (skyjax.plan.model.schedules.plan_lists); None otherwise
    passes_s: tuple[float, float, float] | None = None
    # 1F1B: warm-up forwards deeper than 1F1B's p - k - 1, to keep a slow link's round trip
    # covered (skyjax.plan.search.warmup); None: 1F1B's own
    warmup: int | None = None

    @property
    def time_s(self) -> float:
        """t_k = compute + comm: the stage's share of every micro-batch."""
        return self.compute_s + self.comm_s

    def to_json(self) -> dict:
        out = {"device": self.device, "units": list(self.units), "compute_s": self.compute_s,
               "comm_s": self.comm_s, "memory_bytes": self.memory_bytes}
        if self.update_s:  # only profiles with fixed costs (version 2) measure it
            out["update_s"] = self.update_s
        if self.pipeline:
            out["pipeline"] = self.pipeline
        if self.codec != "none":
            out["codec"] = self.codec
        if self.passes_s is not None:
            out["passes_s"] = list(self.passes_s)
        if self.warmup is not None:
            out["warmup"] = self.warmup
        return out


@dataclasses.dataclass
class Plan:
    """Stages in pipeline order and the predicted step time T. ``exact``: T is optimal under the
    cost model; otherwise ``lower_bound_s`` (when searched) bounds the optimum from below.
    ``extra_s``: the part of T that extra cost terms add (:mod:`skyjax.plan.model.extension`, e.g.
    the optional shared-host model; 0 under the core model); the searches and their bounds work on
    ``analytic_s``, T without it."""

    strategy: str
    schedule: str
    microbatches: int
    stages: list[Stage]
    step_time_s: float
    bottleneck_s: float
    exact: bool
    lower_bound_s: float | None = None
    device_names: list[str] | None = None
    extra_s: float = 0.0
    # several pipelines: micro-batches of every global batch per pipeline (sum = microbatches),
    # pipeline i taking global micro-batches [sum(shares[:i]), sum(shares[:i + 1])); None: one
    shares: list[int] | None = None
    allreduce_s: float = 0.0  # the step's exchange of replicated gradients (cost model)
    pipeline_step_s: list[float] | None = None  # each pipeline's T_i (without sync_s)
    # how the pipelines average (skyjax.relax): "exact" | "int8-across" | "int8" |
    # "diloco-across" | "diloco" (an outer step every ``outer_every`` steps; allreduce_s is then
    # the exchange's time per step, amortised); "-across": exact inside exchange_groups
    averaging: str = "exact"
    outer_every: int = 0
    outer_lr: float = 0.0
    outer_momentum: float = 0.0
    # the exact exchange's link groups (skyjax.plan.pricing.exchange): each reduces inside first,
    # then one representative per group and unit exchanges; None (or a device in none): direct
    exchange_groups: list[list[int]] | None = None
    # per unit the representatives of its owners' groups, in summing order (with groups)
    exchange_reps: list[list[int]] | None = None
    # the cost model's T of this plan (skyjax.plan.pricing.cost), where step_time_s is the step
    # as it runs (skyjax.plan.as_run, the simulator's step); None: step_time_s is T itself
    model_s: float | None = None
    # the averaging's exchange in top-k plus 4 or 2 bits with error feedback (relax.
    # outer_compression, skyjax.compress; "none": as the mode sends it) and its fraction kept
    outer_compression: str = "none"
    outer_topk: float = 0.0
    # the peer modes (skyjax.plan.pricing.peers): decentral's peer schedule ("ring" |
    # "exponential") and the steps by which async's average lands late (its staleness)
    peer_schedule: str = ""
    staleness: int = 0

    @property
    def num_pipelines(self) -> int:
        return 1 if not self.shares else len(self.shares)

    def pipeline_shares(self) -> list[int]:
        """Micro-batches per pipeline (``[microbatches]`` for one pipeline)."""
        return list(self.shares) if self.shares else [self.microbatches]

    def first_microbatch(self, i: int) -> int:
        """The global index of pipeline i's first micro-batch."""
        return sum(self.pipeline_shares()[:i])

    def stage_ids(self, i: int) -> list[int]:
        """Positions in ``stages`` of pipeline i's stages, in pipeline order."""
        return [k for k, s in enumerate(self.stages) if s.pipeline == i]

    def pipeline(self, i: int) -> "Plan":
        """Pipeline i as a plan of its own (its stages, its micro-batches, its T_i)."""
        if self.num_pipelines == 1:
            return self
        stages = [dataclasses.replace(self.stages[k], pipeline=0) for k in self.stage_ids(i)]
        step = self.pipeline_step_s[i] if self.pipeline_step_s else self.step_time_s
        return Plan(self.strategy, self.schedule, self.shares[i], stages, step,
                    max(s.time_s for s in stages), self.exact, None, self.device_names)

    @property
    def analytic_s(self) -> float:
        """T without the extra terms: what the searches optimise and the bounds bound."""
        return self.step_time_s - self.extra_s

    def to_json(self) -> dict:
        out = {"strategy": self.strategy, "schedule": self.schedule,
               "microbatches": self.microbatches, "stages": [s.to_json() for s in self.stages],
               "step_time_s": self.step_time_s, "bottleneck_s": self.bottleneck_s,
               "exact": self.exact}
        if self.lower_bound_s is not None:
            out["lower_bound_s"] = self.lower_bound_s
        if self.device_names is not None:
            out["device_names"] = list(self.device_names)
        if self.extra_s:
            out["extra_s"] = self.extra_s
        if self.model_s is not None:
            out["model_s"] = self.model_s
        if self.shares:
            out["shares"] = list(self.shares)
            out["allreduce_s"] = self.allreduce_s
            if self.pipeline_step_s is not None:
                out["pipeline_step_s"] = list(self.pipeline_step_s)
            if self.exchange_groups:
                out["exchange_groups"] = [list(g) for g in self.exchange_groups]
                if self.exchange_reps:
                    out["exchange_reps"] = [list(r) for r in self.exchange_reps]
            if self.averaging != "exact":
                out["averaging"] = self.averaging
                if self.outer_every:
                    out.update(outer_every=self.outer_every, outer_lr=self.outer_lr,
                               outer_momentum=self.outer_momentum)
                if self.outer_compression != "none":
                    out.update(outer_compression=self.outer_compression,
                               outer_topk=self.outer_topk)
                if self.peer_schedule:
                    out["peer_schedule"] = self.peer_schedule
                if self.staleness:
                    out["staleness"] = self.staleness
        return out

    @property
    def is_exact(self) -> bool:
        """Whether nothing is relaxed (every hand-off uncoded, exact averaging)."""
        return self.averaging == "exact" and all(s.codec == "none" for s in self.stages)

    @classmethod
    def from_json(cls, d: dict) -> "Plan":
        stages = [Stage(int(s["device"]), (int(s["units"][0]), int(s["units"][1])),
                        float(s["compute_s"]), float(s["comm_s"]), int(s["memory_bytes"]),
                        float(s.get("update_s", 0.0)), int(s.get("pipeline", 0)),
                        str(s.get("codec", "none")),
                        tuple(float(x) for x in s["passes_s"]) if s.get("passes_s") else None,
                        int(s["warmup"]) if s.get("warmup") is not None else None)
                  for s in d["stages"]]
        shares = d.get("shares")
        return cls(d["strategy"], d["schedule"], int(d["microbatches"]), stages,
                   float(d["step_time_s"]), float(d["bottleneck_s"]), bool(d["exact"]),
                   d.get("lower_bound_s"), d.get("device_names"),
                   float(d.get("extra_s", d.get("replay_penalty_s", 0.0))),
                   [int(x) for x in shares] if shares else None,
                   float(d.get("allreduce_s", 0.0)),
                   [float(x) for x in d["pipeline_step_s"]] if d.get("pipeline_step_s")
                   else None, str(d.get("averaging", "exact")), int(d.get("outer_every", 0)),
                   float(d.get("outer_lr", 0.0)), float(d.get("outer_momentum", 0.0)),
                   [[int(x) for x in g] for g in d["exchange_groups"]]
                   if d.get("exchange_groups") else None,
                   [[int(x) for x in r] for r in d["exchange_reps"]]
                   if d.get("exchange_reps") else None,
                   float(d["model_s"]) if d.get("model_s") is not None else None,
                   str(d.get("outer_compression", "none")), float(d.get("outer_topk", 0.0)),
                   peer_schedule=str(d.get("peer_schedule", "")),
                   staleness=int(d.get("staleness", 0)))
