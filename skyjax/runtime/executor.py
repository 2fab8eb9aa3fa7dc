"""Executors: build the stages of a plan and run training steps across them.

``LocalExecutor`` runs every stage in one process, each on its own local device and in its own
thread (so emulated slow devices and link delays overlap as real devices would).
``DistributedExecutor`` runs the one stage this process owns under ``jax.distributed``; every
process derives the same batches from the seed, so only activations and gradients travel.
Both drive the same per-stage loop (``skyjax.runtime.pipeline``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any, Callable, Iterable, Sequence

import jax
import numpy as np
import optax

from skyjax.plan import schedules
from skyjax.models.bert import Unit, initial_carry
from skyjax.runtime.pipeline import Batch, PipelineStage, Span, StageLink, StepResult
from skyjax.runtime.stage import StageProgram
from skyjax.runtime.transport import LocalTransport


@dataclasses.dataclass(frozen=True)
class StagePlacement:
    """A block of units ``[start, end)`` and the index of the device that runs it."""

    device: int
    start: int
    end: int


def placements(plan: dict) -> list[StagePlacement]:
    """The stages of a plan.json-style dict."""
    return [StagePlacement(int(s["device"]), int(s["units"][0]), int(s["units"][1]))
            for s in plan["stages"]]


def boundary_shapes(chain: Sequence[Unit], batch_like: Batch) -> list[Any]:
    """ShapeDtypeStructs of the carry entering each unit (and, last, leaving the chain)."""
    carry = jax.eval_shape(lambda b: initial_carry(b["input_ids"], b["token_type_ids"],
                                                   b["attention_mask"]), batch_like)
    shapes = [carry]
    for unit in chain:
        carry = jax.eval_shape(lambda p, c, u=unit: u.apply(p, c, None, False), unit.params, carry)
        shapes.append(carry)
    return shapes


def microbatch_like(batch_size: int, seq_len: int, microbatches: int) -> Batch:
    mb = batch_size // microbatches
    tokens = jax.ShapeDtypeStruct((mb, seq_len), np.int32)
    return {"input_ids": tokens, "token_type_ids": tokens, "attention_mask": tokens,
            "labels": jax.ShapeDtypeStruct((mb,), np.int32)}


UnitState = tuple[Any, Any]  # (params, optimizer state) of one unit


def build_stage(chain: Sequence[Unit], place: StagePlacement, index: int, num_stages: int,
                device: jax.Device, link: StageLink, shapes: list[Any], microbatches: int,
                optimizer: optax.GradientTransformation, slowdown: float = 1.0,
                unit_states: dict[int, UnitState] | None = None) -> PipelineStage:
    """A stage owning units ``[place.start, place.end)`` on ``device``: params copied there from
    the units, or params and optimizer states from ``unit_states`` (by unit index)."""
    block = list(chain[place.start:place.end])
    program = StageProgram(block, is_last=index == num_stages - 1, microbatches=microbatches,
                           optimizer=optimizer)
    units = range(place.start, place.end)
    if unit_states:
        params = jax.device_put([unit_states[u][0] for u in units], device, may_alias=False)
        opt = jax.device_put([unit_states[u][1] for u in units], device, may_alias=False)
        state = program.init_state(params, opt)
    else:
        state = program.init_state(jax.device_put([u.params for u in block], device,
                                                  may_alias=False))
    return PipelineStage(index, num_stages, program, state, device, link, shapes[place.start],
                         shapes[place.end], slowdown)


def abstract_units(chain: Sequence[Unit]) -> list[Unit]:
    """The units with shapes in place of parameter arrays (enough to rebuild stages)."""
    return [dataclasses.replace(u, params=jax.eval_shape(lambda p=u.params: p)) for u in chain]


def split_microbatches(batch: Batch, microbatches: int) -> Callable[[int], Batch]:
    """Micro-batch ``i`` of ``batch`` (equal contiguous slices)."""
    size = len(batch["labels"]) // microbatches
    return lambda i: {k: v[i * size:(i + 1) * size] for k, v in batch.items()}


@dataclasses.dataclass
class StepMetrics:
    """One step as seen by the last stage: mean loss/accuracy over micro-batches, and timing."""

    loss: float
    accuracy: float
    wall_s: float
    results: list[StepResult]  # per stage (local); this process's stage only (distributed)


class LocalExecutor:
    """All stages in this process, one thread each, on ``devices[place.device]``."""

    def __init__(self, chain: Sequence[Unit], plan: dict, devices: Sequence[jax.Device], *,
                 batch_size: int, seq_len: int, optimizer, max_grad_norm: float | None,
                 rng: Callable[[int, int], jax.Array], slowdowns: Sequence[float] = (),
                 links: Any = None, unit_states: dict[int, UnitState] | None = None):
        self.plan = plan
        self.chain = abstract_units(chain)
        self._args = dict(devices=devices, batch_size=batch_size, seq_len=seq_len,
                          optimizer=optimizer, max_grad_norm=max_grad_norm, rng=rng,
                          slowdowns=slowdowns, links=links)
        self.places = placements(plan)
        transport = LocalTransport([devices[p.device] for p in self.places], links,
                                   link_ids=[p.device for p in self.places])
        self.schedule = plan["schedule"]
        self.microbatches = int(plan["microbatches"])
        self.max_grad_norm = max_grad_norm
        self.rng = rng
        p = len(self.places)
        shapes = boundary_shapes(chain, microbatch_like(batch_size, seq_len, self.microbatches))
        self.stages = [
            build_stage(chain, place, k, p, devices[place.device], transport.for_stage(k), shapes,
                        self.microbatches, optimizer,
                        slowdowns[place.device] if slowdowns else 1.0, unit_states)
            for k, place in enumerate(self.places)]
        self.transport = transport
        self.actions = schedules.actions(self.schedule, p, self.microbatches)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=p,
                                                           thread_name_prefix="stage")

    def _all(self, fn: Callable[[PipelineStage], Any]) -> list[Any]:
        """Runs ``fn`` on every stage in its thread; one failure aborts the others' waits."""

        def guarded(stage: PipelineStage) -> Any:
            try:
                return fn(stage)
            except BaseException as e:
                self.transport.abort(e)
                raise

        futures = [self._pool.submit(guarded, stage) for stage in self.stages]
        return [f.result() for f in futures]

    def train_step(self, step: int, batch: Batch) -> StepMetrics:
        microbatch = split_microbatches(batch, self.microbatches)
        rng = lambda mb: self.rng(step, mb)  # noqa: E731
        results = self._all(lambda s: s.run_step(step, self.actions[s.index], microbatch, rng,
                                                 self.max_grad_norm))
        last = results[-1]
        return StepMetrics(float(np.mean(last.losses)), float(np.mean(last.accuracies)),
                           max(r.wall_s for r in results), results)

    def evaluate(self, batches: Iterable[Batch]) -> dict[str, float]:
        batches = eval_microbatches(batches, self.microbatches)
        results = self._all(lambda s: s.run_eval(batches))[-1]
        return summarize_eval(results)

    def unit_params(self) -> list[Any]:
        """Every unit's current params, in chain order (for checks and checkpoints)."""
        return [p for s in self.stages for p in s.state.params]

    def unit_states(self) -> dict[int, UnitState]:
        """Every unit's (params, optimizer state), by unit index."""
        out = {}
        for place, stage in zip(self.places, self.stages):
            for u, p, o in zip(range(place.start, place.end), stage.state.params,
                               stage.state.opt_state):
                out[u] = (p, o)
        return out

    def rebuild(self, plan: dict) -> "LocalExecutor":
        """An executor for ``plan`` that continues from this one's params and optimizer states
        (each unit moves to its new device); this one is closed."""
        states = self.unit_states()
        self.close()
        return LocalExecutor(self.chain, plan, unit_states=states, **self._args)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def eval_microbatches(batches: Iterable[Batch], microbatches: int) -> list[Batch]:
    """Eval batches cut to micro-batch size, so that every stage sees its training shapes."""
    out = []
    for batch in batches:
        split = split_microbatches(batch, microbatches)
        out += [split(i) for i in range(microbatches)]
    return out


def summarize_eval(sums: list[tuple[float, float, float]]) -> dict[str, float]:
    """Mean loss and accuracy from per-batch weighted sums (loss, correct, weight)."""
    n = sum(r[2] for r in sums)
    if not n:
        return {}
    return {"eval_loss": sum(r[0] for r in sums) / n, "eval_accuracy": sum(r[1] for r in sums) / n,
            "eval_examples": int(round(n))}


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

    def allreduce_sum(self, value: float, tag: int) -> float:
        return self.transport.allreduce_sum(value, tag)


class DistributedExecutor:
    """The stage this process owns (if the plan uses its device), under ``jax.distributed``.

    Profile device ``d`` is process ``d``. A process the plan leaves out still joins the per-step
    collectives (gradient norm, metrics), so every process runs the same number of steps.
    """

    def __init__(self, chain: Sequence[Unit], plan: dict, transport: Any, process_index: int,
                 device: jax.Device, *, batch_size: int, seq_len: int, optimizer,
                 max_grad_norm: float | None, rng: Callable[[int, int], jax.Array],
                 slowdown: float = 1.0, unit_states: dict[int, UnitState] | None = None):
        self.plan = plan
        self.chain = abstract_units(chain)
        self.optimizer = optimizer
        self.device = device
        self._args = dict(batch_size=batch_size, seq_len=seq_len, optimizer=optimizer,
                          max_grad_norm=max_grad_norm, rng=rng, slowdown=slowdown)
        self.places = placements(plan)
        self.schedule = plan["schedule"]
        self.microbatches = int(plan["microbatches"])
        self.max_grad_norm = max_grad_norm
        self.rng = rng
        self.transport = transport
        self.process_index = process_index
        p = len(self.places)
        link = ProcessLink(transport, [place.device for place in self.places])
        mine = [k for k, place in enumerate(self.places) if place.device == process_index]
        self.stage: PipelineStage | None = None
        if mine:
            shapes = boundary_shapes(chain, microbatch_like(batch_size, seq_len,
                                                            self.microbatches))
            self.stage = build_stage(chain, self.places[mine[0]], mine[0], p, device, link,
                                     shapes, self.microbatches, optimizer, slowdown, unit_states)
        self.actions = schedules.actions(self.schedule, p, self.microbatches)
        self._tag = 0

    def _collective_tag(self) -> int:
        self._tag += 1
        return self._tag

    def train_step(self, step: int, batch: Batch) -> StepMetrics:
        """Runs this process's stage for one step; metrics are the last stage's, on process 0."""
        microbatch = split_microbatches(batch, self.microbatches)
        rng = lambda mb: self.rng(step, mb)  # noqa: E731
        if self.stage is not None:
            result = self.stage.run_step(step, self.actions[self.stage.index], microbatch, rng,
                                         self.max_grad_norm)
        else:
            if self.max_grad_norm:
                self.transport.allreduce_sum(0.0, step)
            result = StepResult([], [], [], 0.0)
        gathered = self.transport.gather_to_first(
            {"losses": result.losses, "accuracies": result.accuracies,
             "spans": [dataclasses.asdict(s) for s in result.spans], "wall_s": result.wall_s},
            self._collective_tag())
        if gathered is None:
            return StepMetrics(float("nan"), float("nan"), result.wall_s, [result])
        losses = [x for g in gathered for x in g["losses"]]
        accuracies = [x for g in gathered for x in g["accuracies"]]
        results = [StepResult(g["losses"], g["accuracies"], [Span(**s) for s in g["spans"]],
                              g["wall_s"]) for g in gathered]
        return StepMetrics(float(np.mean(losses)), float(np.mean(accuracies)),
                           max(g["wall_s"] for g in gathered), results)

    def evaluate(self, batches: Iterable[Batch]) -> dict[str, float]:
        batches = eval_microbatches(batches, self.microbatches)
        results = self.stage.run_eval(batches) if self.stage else []
        gathered = self.transport.gather_to_first({"results": results}, self._collective_tag())
        if gathered is None:
            return {}
        return summarize_eval([tuple(r) for g in gathered for r in g["results"]])

    def unit_params(self) -> list[Any]:
        return list(self.stage.state.params) if self.stage else []

    def unit_states(self) -> dict[int, UnitState]:
        """This process's units' (params, optimizer state), by unit index."""
        if self.stage is None:
            return {}
        start = self.places[self.stage.index].start
        return {start + i: (p, o) for i, (p, o) in enumerate(
            zip(self.stage.state.params, self.stage.state.opt_state))}

    def rebuild(self, plan: dict) -> "DistributedExecutor":
        """An executor for ``plan`` continuing from this one: every unit whose device changes
        is sent (params and optimizer state) from its old process to its new one."""
        old, new = _owners(self.plan), _owners(plan)
        me = self.process_index
        states = self.unit_states()
        for u, (o, n) in enumerate(zip(old, new)):
            if o == me and n != me:
                self.transport.send(MIGRATE_TAG - u, states.pop(u), n)
        for u, (o, n) in enumerate(zip(old, new)):
            if n == me and o != me:
                like = jax.eval_shape(lambda p: (p, self.optimizer.init(p)), self.chain[u].params)
                states[u] = self.transport.recv(MIGRATE_TAG - u, like, o)
        self.close()
        return DistributedExecutor(self.chain, plan, self.transport, me, self.device,
                                   unit_states=states, **self._args)

    def close(self) -> None:
        pass


MIGRATE_TAG = -(10 ** 9)  # units moving after a re-plan: tags MIGRATE_TAG - unit


def _owners(plan: dict) -> list[int]:
    owners = {}
    for place in placements(plan):
        for u in range(place.start, place.end):
            owners[u] = place.device
    return [owners[u] for u in sorted(owners)]
