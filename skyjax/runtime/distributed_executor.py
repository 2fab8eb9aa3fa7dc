"""``DistributedExecutor``: the one stage of a plan that this process owns, under
``jax.distributed`` (profile device ``d`` is process ``d``). Every process derives the same
batches from the seed, so only activations, gradients and host scalars travel, through a
per-process transport (``TransferServerTransport``) seen by the stage as a :class:`ProcessLink`."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterable, Sequence

import jax
import numpy as np
import optax

from skyjax import scores
from skyjax.models.bert import Unit
from skyjax.plan import Plan
from skyjax.plan.model.schedules import plan_lists
from skyjax.transport import group as distributed, tags
from skyjax.runtime.batches import (Batch, eval_microbatches, microbatch_like,
                                   split_microbatches)
from skyjax.runtime.averaging import norm_groups
from skyjax.runtime.pipeline import PipelineStage, sq_to_norm
from skyjax.runtime.placement import (UnitState, abstract_units, boundary_shapes, build_stage,
                                      placements, stage_role, unit_owners)
from skyjax.runtime.rehearsal import Rehearsal
from skyjax.runtime.replicas import norm_allreduce
from skyjax.runtime.steps import StepInputs, StepMetrics, StepResult
from skyjax.spans import Span


class ProcessLink:
    """A pipeline stage's view of a per-process transport: stage ``k`` lives on process
    ``stage_process[k]``; collectives span every process (idle ones contribute nothing)."""

    def __init__(self, transport: Any, stage_process: Sequence[int]):
        self.transport = transport
        self.stage_process = list(stage_process)

    def send(self, tag: int, tree: Any, dst: int) -> None:
        self.transport.send(tag, tree, self.stage_process[dst])

    def recv(self, tag: int, like: Any, src: int) -> Any:
        return self.transport.recv(tag, like, self.stage_process[src])

    def prefetch(self, tag: int, like: Any, src: int) -> None:
        """Posts the receive ahead where the transport can (``PipelineStage._pull_ahead``):
        without it every receive pulls when it is called, and waits, when the sender is
        computing on its cores, until that compute ends (up to a whole action)."""
        post = getattr(self.transport, "prefetch", None)
        if post is not None:
            post(tag, like, self.stage_process[src])

    def allreduce_sum(self, value: float, tag: int) -> float:
        return self.transport.allreduce_sum(value, tag)


class DistributedExecutor:
    """The stage this process owns (if the plan uses its device), under ``jax.distributed``.

    A process the plan leaves out still joins the per-step collectives (gradient norm, metrics),
    so every process runs the same number of steps.
    """

    def __init__(self, chain: Sequence[Unit], plan: Plan, transport: Any, process_index: int,
                 device: jax.Device, *, batch_size: int, seq_len: int,
                 optimizer: optax.GradientTransformation, max_grad_norm: float | None,
                 rng: Callable[[int, int, int], jax.Array], slowdown: float = 1.0,
                 sync_actions: bool = True,
                 unit_states: dict[int, UnitState] | None = None,
                 rehearsal: Rehearsal | None = None):
        self.plan = plan
        self.chain = abstract_units(chain)
        self.optimizer = optimizer
        self.device = device
        self._args = dict(batch_size=batch_size, seq_len=seq_len, optimizer=optimizer,
                          max_grad_norm=max_grad_norm, rng=rng, slowdown=slowdown,
                          sync_actions=sync_actions, rehearsal=rehearsal)
        self.places = placements(plan)
        self.schedule = plan.schedule
        self.microbatches = int(plan.microbatches)  # of the global batch
        self.microbatch_size = batch_size // self.microbatches
        self.max_grad_norm = max_grad_norm
        self.rng = rng
        self.transport = transport
        self.process_index = process_index
        several = plan.num_pipelines > 1
        watchdog = distributed.watchdog()
        if watchdog is not None:  # a lost process is reported with its stage
            watchdog.recoverable = several  # its pipeline can be dropped (runtime.recovery)
            watchdog.set_roles({place.device: (f"pipeline {place.pipeline} " if several else "")
                                + f"stage {place.index}, units [{place.start}, {place.end})"
                                for place in self.places})
        mine = [k for k, place in enumerate(self.places) if place.device == process_index]
        self.stage: PipelineStage | None = None
        self.actions: list = []
        if mine:
            k = mine[0]
            i = self.places[k].pipeline
            link = ProcessLink(transport, [self.places[j].device for j in plan.stage_ids(i)])
            shapes = boundary_shapes(chain, microbatch_like(batch_size, seq_len,
                                                            self.microbatches))
            role = stage_role(plan, k, [q.device for q in self.places], rehearsal)
            self.stage = build_stage(chain, role, device, link, shapes, optimizer,
                                     replica_link=transport, slowdown=slowdown,
                                     unit_states=unit_states,
                                     loss_microbatches=self.microbatches,
                                     sync_actions=sync_actions)
            self.actions = plan_lists(plan, i)
        self._gathers = 0
        # (batch, StepInputs) of the next step, put ahead during this one (train_step)
        self._prepared: tuple[Batch | None, StepInputs] | None = None

    def _gather_tag(self) -> int:
        self._gathers += 1
        return tags.executor_gather(self._gathers)

    @property
    def needs_batch(self) -> bool:
        """Whether :meth:`train_step` reads its batch: this process runs the first or the last
        stage. Elsewhere the caller may pass None and skip building it."""
        return self.stage is not None and self.stage.needs_batch

    def train_step(self, step: int, batch: Batch | None, next_batch: Batch | None = None,
                   measure: bool = False) -> StepMetrics:
        """Runs this process's stage for one step; metrics are the last stage's, on process 0.

        The metrics go to process 0 after the step's actions and before the update: every
        stage's last action precedes stage 0's (its last backward waits for theirs), so process 0
        finds them there, and no stage's update stands between stage 0's update and its next
        step (gathered after the update, the slowest stage's update delayed every step; the cost
        model charges only ``update_0``). ``wall_s`` is then the actions' time.

        ``next_batch``: the next step's batch, already built (None: there is no next step, or
        the stage reads no batch). Its inputs for the next step are put on the stage's device
        (:class:`~skyjax.runtime.steps.StepInputs`) in the stage's first wait of this step,
        off the step boundary, which is on the critical path; the next call must pass that same
        batch object. ``measure``: the stage blocks its calls, so that its spans are compute
        times (``PipelineStage.run_actions``)."""
        stage = self.stage
        start = time.time()  # the step's window, on the clock of its spans
        if stage is not None:
            prepared, self._prepared = self._prepared, None
            if prepared is None or prepared[1].step != step or prepared[0] is not batch:
                prepared = self._inputs(step, batch)
            idle = None if next_batch is None else lambda: self._prepare(step + 1, next_batch)
            result = stage.run_actions(step, self.actions[stage.index], prepared[1], idle,
                                       measure)
            result.losses = [(stage.first_microbatch + j, x) for j, x in enumerate(result.losses)]
            result.accuracies = [(stage.first_microbatch + j, x)
                                 for j, x in enumerate(result.accuracies)]
        else:
            result = StepResult([], [], [], 0.0)
        gathered = self.transport.gather_to_first(
            {"losses": result.losses, "accuracies": result.accuracies,
             "spans": [dataclasses.asdict(s) for s in result.spans], "wall_s": result.wall_s,
             "measured": result.measured},
            self._gather_tag())
        total = None  # the global squared gradient norm, on every process (clipping on)
        if self.stage is not None:
            result.grad_sq_norm = self.stage.finish_step(step, self.max_grad_norm)
            result.exchange = self.stage.exchange_spans  # its own; gather_exchange: everyone's
            total = self.stage.last_sq_norm
        elif self.max_grad_norm or self.plan.num_pipelines > 1:  # as PipelineStage.update
            total = norm_allreduce(self.transport, step, 0.0, self.max_grad_norm, -1,
                                   self.plan.num_pipelines, norm_groups(self.plan))
        window = (start, time.time())
        if gathered is None:
            return StepMetrics(float("nan"), float("nan"), result.wall_s, [result],
                               grad_norm=sq_to_norm(total), has_loss=False, window=window)
        # (global micro-batch, value) from every pipeline's last stage, in micro-batch order
        losses = [x for _, x in sorted(tuple(y) for g in gathered for y in g["losses"])]
        accuracies = [x for _, x in sorted(tuple(y) for g in gathered for y in g["accuracies"])]
        results = [StepResult([x for _, x in g["losses"]], [x for _, x in g["accuracies"]],
                              [Span(**s) for s in g["spans"]], g["wall_s"],
                              measured=g["measured"]) for g in gathered]
        return StepMetrics(float(np.mean(losses)), float(np.mean(accuracies)),
                           max(g["wall_s"] for g in gathered), results,
                           grad_norm=sq_to_norm(total), window=window)

    def gather_exchange(self, metrics: StepMetrics | None) -> StepMetrics | None:
        """``metrics`` of the last step (process 0's, with every process's results) with every
        process's exchange spans of that step; a collective, after the last step. Each step's
        metrics go to process 0 before its exchange (:meth:`train_step`), so the exchange's
        spans, which only the trace and the timeline read, follow once, here, off the steps."""
        spans = self.stage.exchange_spans if self.stage is not None else []
        gathered = self.transport.gather_to_first(
            {"exchange": [dataclasses.asdict(s) for s in spans]}, self._gather_tag())
        if gathered is None or metrics is None or len(metrics.results) != len(gathered):
            return metrics
        for r, g in zip(metrics.results, gathered):
            r.exchange = [Span(**s) for s in g["exchange"]]
        return metrics

    def _inputs(self, step: int, batch: Batch | None) -> tuple[Batch | None, StepInputs]:
        """``(batch, its StepInputs for step)`` on the stage's device."""
        microbatch = None if batch is None else split_microbatches(batch, self.microbatches)
        size = self.microbatch_size
        return batch, self.stage.step_inputs(step, microbatch,
                                             lambda g: self.rng(step, g * size, size))

    def _prepare(self, step: int, batch: Batch) -> None:
        """Puts ``step``'s inputs on the stage's device ahead (``train_step``'s ``next_batch``)."""
        self._prepared = self._inputs(step, batch)

    def evaluate(self, batches: Iterable[Batch], metric: str = "accuracy") -> dict[str, float]:
        """The held-out figures of ``metric`` (``skyjax.scores``) on the first process, ``{}``
        on the others."""
        batches = eval_microbatches(batches, self.microbatches)
        # pipeline 0 alone: the replicas hold the same params
        results = self.stage.run_eval(batches) if self._in_first_pipeline else []
        gathered = self.transport.gather_to_first({"results": results}, self._gather_tag())
        if gathered is None:
            return {}
        return scores.summarize([r for g in gathered for r in g["results"]], metric)

    @property
    def _in_first_pipeline(self) -> bool:
        return self.stage is not None and self.stage.pipeline == 0

    def unit_params(self) -> list[Any]:
        return list(self.stage.state.params) if self.stage else []

    def unit_states(self) -> dict[int, UnitState]:
        """This process's units' (params, optimizer state), by unit index; {} in pipelines
        other than 0, whose replicas equal pipeline 0's (a checkpoint holds one copy)."""
        return self.own_states() if self._in_first_pipeline else {}

    def own_states(self) -> dict[int, UnitState]:
        """This process's units' (params, optimizer state), by unit index, in any pipeline."""
        if self.stage is None:
            return {}
        return {self.stage.first_unit + i: (p, o) for i, (p, o) in enumerate(
            zip(self.stage.state.params, self.stage.state.opt_state))}

    def without(self, plan: Plan, lost: list[int], attempt: int) -> "DistributedExecutor":
        """An executor for ``plan`` (the pipelines left after losing the processes ``lost``;
        ``runtime.recovery``), continuing from this process's units as they were before the
        failed step (it never reached its update), over the renewed transport."""
        self.transport.renew(attempt, [p for p in range(jax.process_count()) if p not in lost])
        states = self.own_states() if any(
            s.device == self.process_index for s in plan.stages) else None
        return DistributedExecutor(self.chain, plan, self.transport, self.process_index,
                                   self.device, unit_states=states, **self._args)

    def rebuild(self, plan: Plan) -> "DistributedExecutor":
        """An executor for ``plan`` continuing from this one: every unit whose device changes
        is sent (params and optimizer state) from its old process to its new one."""
        old, new = unit_owners(self.plan), unit_owners(plan)
        me = self.process_index
        states = self.unit_states()
        for u, (o, n) in enumerate(zip(old, new)):
            if o == me and n != me:
                self.transport.send(tags.migrate(u), states.pop(u), n)
        for u, (o, n) in enumerate(zip(old, new)):
            if n == me and o != me:
                like = jax.eval_shape(lambda p: (p, self.optimizer.init(p)), self.chain[u].params)
                states[u] = self.transport.recv(tags.migrate(u), like, o)
        self.close()
        return DistributedExecutor(self.chain, plan, self.transport, me, self.device,
                                   unit_states=states, **self._args)

    def close(self) -> None:
        pass
