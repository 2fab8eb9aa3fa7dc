"""``LocalExecutor``: every stage of a plan in this process, each on its own local device and in
its own thread, so that emulated slow devices and link delays overlap as real devices would.
Stages talk through a :class:`~skyjax.transport.LocalTransport`; with several pipelines, all of
them share it, a stage addressed by its position in the plan."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Callable, Iterable, Sequence

import jax
import numpy as np
import optax

from skyjax import scores
from skyjax.models.bert import Unit
from skyjax.plan import Plan
from skyjax.plan.model.schedules import plan_lists
from skyjax.runtime.batches import (Batch, eval_microbatches, microbatch_like,
                                   split_microbatches)
from skyjax.runtime.pipeline import PipelineStage, sq_to_norm
from skyjax.runtime.placement import (PipelineLink, UnitState, abstract_units, boundary_shapes,
                                      build_stage, placements, stage_role)
from skyjax.runtime.rehearsal import Rehearsal
from skyjax.runtime.steps import StepMetrics
from skyjax.transport import LocalTransport


class LocalExecutor:
    """All stages of ``plan`` in this process, one thread each, on ``devices[stage.device]``.

    ``rng(step, first, count)``: the dropout keys of examples ``first .. first + count - 1`` of
    the step's global batch (``skyjax.models.bert.example_keys``). ``slowdowns`` (by device
    index) and ``links`` (a ``LinkEmulation`` by device index) emulate heterogeneous devices;
    ``sync_actions`` (by device index; () = all): whether a stage's calls block
    (``skyjax.cluster.actions_block``); ``unit_states`` continues from another executor's
    (``rebuild``); ``rehearsal``: the run's :class:`~skyjax.runtime.rehearsal.Rehearsal`,
    whose declared times of ``plan`` every stage's calls take.
    """

    needs_batch = True  # its first and last stages read every step's batch

    def __init__(self, chain: Sequence[Unit], plan: Plan, devices: Sequence[jax.Device], *,
                 batch_size: int, seq_len: int, optimizer: optax.GradientTransformation,
                 max_grad_norm: float | None, rng: Callable[[int, int, int], jax.Array],
                 slowdowns: Sequence[float] = (), links: Any = None,
                 sync_actions: Sequence[bool] = (),
                 unit_states: dict[int, UnitState] | None = None,
                 rehearsal: Rehearsal | None = None):
        self.plan = plan
        self.chain = abstract_units(chain)
        self._args = dict(devices=devices, batch_size=batch_size, seq_len=seq_len,
                          optimizer=optimizer, max_grad_norm=max_grad_norm, rng=rng,
                          slowdowns=slowdowns, links=links, sync_actions=sync_actions,
                          rehearsal=rehearsal)
        self.places = placements(plan)
        transport = LocalTransport([devices[p.device] for p in self.places], links,
                                   link_ids=[p.device for p in self.places])
        self.schedule = plan.schedule
        self.microbatches = int(plan.microbatches)  # of the global batch
        self.max_grad_norm = max_grad_norm
        self.rng = rng
        self.microbatch_size = batch_size // self.microbatches
        shapes = boundary_shapes(chain, microbatch_like(batch_size, seq_len, self.microbatches))
        ids = [plan.stage_ids(i) for i in range(plan.num_pipelines)]
        self.stages = []
        for k, place in enumerate(self.places):
            d = place.device
            self.stages.append(build_stage(
                chain, stage_role(plan, k, range(len(self.places)), rehearsal), devices[d],
                PipelineLink(transport.for_stage(k), ids[place.pipeline]), shapes, optimizer,
                replica_link=transport.for_stage(k), slowdown=slowdowns[d] if slowdowns else 1.0,
                unit_states=unit_states, loss_microbatches=self.microbatches,
                sync_actions=sync_actions[d] if sync_actions else True))
        self.transport = transport
        self.actions = [plan_lists(plan, i) for i in range(plan.num_pipelines)]
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(self.places),
                                                           thread_name_prefix="stage")

    def _all(self, fn: Callable[[PipelineStage], Any],
             stages: list[PipelineStage] | None = None) -> list[Any]:
        """Runs ``fn`` on every stage (or ``stages``) in its thread; one failure aborts the
        others' waits (their messages' and a rehearsal's declared times) and is raised, rather
        than a stage's report of the abort."""
        failed: list[BaseException] = []

        def guarded(stage: PipelineStage) -> Any:
            try:
                return fn(stage)
            except BaseException as e:
                failed.append(e)
                self._abort(e)
                raise

        futures = []
        try:
            for stage in stages or self.stages:
                futures.append(self._pool.submit(guarded, stage))
            return [f.result() for f in futures]
        except BaseException as e:
            # e.g. Ctrl-C / SIGTERM's KeyboardInterrupt here, perhaps before every stage was
            # submitted: the stages already running would wait for the others' messages until
            # the transport's timeout, or out their declared times, and close() (the run's
            # cleanup) with them
            self._abort(e)
            if isinstance(e, Exception) and failed and e is not failed[0]:
                raise failed[0] from None  # the cause, not a stage that saw the abort
            raise

    def _abort(self, reason: BaseException) -> None:
        self.transport.abort(reason)
        rehearsal = self._args["rehearsal"]
        if rehearsal is not None:
            rehearsal.stop(reason)

    def train_step(self, step: int, batch: Batch, next_batch: Batch | None = None,
                   measure: bool = False) -> StepMetrics:
        """One step of every stage (threads). ``next_batch`` (the next step's batch) is not
        used: the stages share this process's host, so there is no idle host to put the next
        step's inputs from. ``measure``: every stage blocks its calls, so that the spans are
        compute times (``PipelineStage.run_actions``)."""
        start = time.time()  # the step's window, on the clock of its spans
        microbatch = split_microbatches(batch, self.microbatches)
        size = self.microbatch_size
        rng = lambda g: self.rng(step, g * size, size)  # noqa: E731
        results = self._all(lambda s: s.run_step(
            step, self.actions[s.pipeline][s.index], s.step_inputs(step, microbatch, rng),
            self.max_grad_norm, measure))
        lasts = [r for r, s in zip(results, self.stages) if s.is_last]  # in pipeline order
        losses = [x for r in lasts for x in r.losses]
        accuracies = [x for r in lasts for x in r.accuracies]
        return StepMetrics(float(np.mean(losses)), float(np.mean(accuracies)),
                           max(r.wall_s for r in results), results,
                           grad_norm=sq_to_norm(self.stages[0].last_sq_norm),
                           window=(start, time.time()))

    def gather_exchange(self, metrics: StepMetrics | None) -> StepMetrics | None:
        """``metrics`` of the last step, with every stage's exchange spans: here they are
        already (``DistributedExecutor.gather_exchange`` gathers them)."""
        return metrics

    def evaluate(self, batches: Iterable[Batch], metric: str = "accuracy") -> dict[str, float]:
        """The held-out figures of ``metric`` (``skyjax.scores``) over ``batches``."""
        batches = eval_microbatches(batches, self.microbatches)
        first = [s for s in self.stages if s.pipeline == 0]  # the replicas hold the same params
        results = self._all(lambda s: s.run_eval(batches), first)[-1]
        return scores.summarize(results, metric)

    def unit_params(self) -> list[Any]:
        """Every unit's current params, in chain order (for checks and checkpoints; pipeline
        0's, which every replica equals)."""
        return [p for s in self.stages if s.pipeline == 0 for p in s.state.params]

    def replica_params(self, pipeline: int) -> list[Any]:
        """Pipeline ``pipeline``'s copy of every unit's params, in chain order."""
        return [p for s in self.stages if s.pipeline == pipeline for p in s.state.params]

    def unit_states(self) -> dict[int, UnitState]:
        """Every unit's (params, optimizer state), by unit index (pipeline 0's)."""
        out = {}
        for place, stage in zip(self.places, self.stages):
            if place.pipeline:
                continue
            for u, p, o in zip(place.units, stage.state.params, stage.state.opt_state):
                out[u] = (p, o)
        return out

    def rebuild(self, plan: Plan) -> "LocalExecutor":
        """An executor for ``plan`` that continues from this one's params and optimizer states
        (each unit moves to its new device); this one is closed."""
        states = self.unit_states()
        self.close()
        return LocalExecutor(self.chain, plan, unit_states=states, **self._args)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
