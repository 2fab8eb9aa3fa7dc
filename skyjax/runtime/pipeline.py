"""The per-stage pipeline loop, shared by the local (threads) and distributed (processes)
executors.

Each stage walks its own action list from ``skyjax.plan.model.schedules`` (GPipe, 1F1B, zero
bubble): a forward receives its input from the previous stage (or the batch, at stage 0), runs
the jitted forward and sends the output on; a backward receives the cotangent from the next
stage (none at the last, whose forward ends in the loss), runs the jitted backward and sends the
input cotangent back (zero bubble: B sends it, and a later W adds the parameter gradients).
After the step's actions the stages agree on the global gradient norm (for clipping) and apply
optax. Sends never block and receives block only on data the stage needs, so any schedule whose
action lists are consistent runs without deadlock, for any number of stages and micro-batches.
Training hand-offs travel in the codec the plan chose for their link (:mod:`skyjax.codecs`;
encoded and decoded inside the stage programs); eval hand-offs are always exact, so held-out
scores do not depend on the plan. Message tags come from ``skyjax.transport.tags``; measured
actions are ``skyjax.spans.Span`` records (the simulator's type, so a measured step and its
simulation share one trace builder).

Host waits: a stage whose actions block (:attr:`PipelineStage.sync_actions`: CPU and emulated
devices) waits for each call's result, so its spans are compute times. Otherwise (GPU/TPU) it
only dispatches, the device queue overlapping the next call with the running one, and the host
waits once per step: the last stage for its losses and accuracies (one transfer), every stage
for its gradient norm where clipping needs it; a measured step (``measure``) blocks like a
synchronous one, so that its spans are compute times (docs/design.md, "Host waits in a step").

A stage is made with its role (:class:`~skyjax.runtime.role.StageRole`: its place in the plan,
fixed). Several pipelines in data parallel: each stage is in one pipeline, whose share of the
global batch is whole micro-batches from the role's ``first_microbatch`` on; after its last
action a stage sums the gradients of the units it shares with its replicas
(:mod:`.replicas`), so every owner holds the same sum, bit for bit, before the update; under
the exact exchange its last backward runs by buckets, each bucket's part of the exchange
leaving as soon as it is final (``replicas.backward_by_buckets``).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Iterable, Protocol

import jax
import numpy as np

from skyjax import codecs
from skyjax.cluster import block, timed_call
from skyjax.cluster.rehearsal import rehearsed_call
from skyjax.optim import clip_scale, global_sq_norm
from skyjax.plan.model.schedules import Action
from skyjax.transport import tags
from skyjax.runtime import tied
from skyjax.runtime.compressed import make_averaging
from skyjax.runtime.batches import Batch, host_carry
from skyjax.runtime.replicas import backward_by_buckets, norm_allreduce, reduce_replicas
from skyjax.runtime.role import StageRole
from skyjax.programs.stage import StageProgram, StageState, float_entries
from skyjax.runtime.steps import StepInputs, StepResult
from skyjax.spans import Span


def sq_to_norm(sq: float | None) -> float | None:
    """The norm from a squared norm (NaN stays NaN; None stays None)."""
    return None if sq is None else float(np.sqrt(np.float64(sq)))


class StageLink(Protocol):
    """What a stage needs from the transport (``skyjax.transport``)."""

    def send(self, tag: int, tree: Any, dst: int) -> None: ...

    def recv(self, tag: int, like: Any, src: int) -> Any: ...

    def allreduce_sum(self, value: float, tag: int) -> float: ...


PULL_AHEAD = 2  # receives posted ahead of the action that needs them (transports with prefetch)


def message_tag(step: int, action: Action, microbatches: int) -> int:
    """The tag of the message ``action`` receives and of the one it sends (a forward's
    activation in and out, a backward's cotangent in and out)."""
    kind = tags.FORWARD if action.kind == "F" else tags.BACKWARD
    return tags.train_message(step, action.microbatch, kind, microbatches)


@dataclasses.dataclass
class PipelineStage:
    """One stage: its role in the plan, its program and state, its device and emulation."""

    role: StageRole
    program: StageProgram
    state: StageState
    device: jax.Device
    link: StageLink
    in_like: Any  # ShapeDtypeStructs of the input carry (micro-batch shapes)
    out_like: Any  # of the output carry (unused on the last stage)
    # where the stages of other pipelines that own its units are reached (several pipelines)
    replica_link: Any = None
    slowdown: float = 1.0
    # whether each action waits for its result (skyjax.cluster.actions_block); False: dispatched
    # only, except in measured steps
    sync_actions: bool = True
    # a relaxed averaging's state (runtime.averaging), made with the stage from its role; None:
    # the exact sum (runtime.replicas)
    averaging: Any = dataclasses.field(default=None, init=False, repr=False)
    _posted: int = dataclasses.field(default=0, init=False, repr=False)  # see _pull_ahead
    # the global squared gradient norm of the last update (None: clipping off, not computed)
    last_sq_norm: float | None = dataclasses.field(default=None, init=False, repr=False)
    # whether the current step's calls block (run_actions sets it; the update follows it)
    _blocking: bool = dataclasses.field(default=True, init=False, repr=False)
    # the exact exchange: whether a bucket's pieces leave as soon as the step's last backward
    # has made it final (False: after the backward; the same programs, sums and bits)
    exchange_overlap: bool = True
    # the current step's pieces sent during its last backward (runtime.exchange.send_ready)
    exchange_sent: set = dataclasses.field(default_factory=set, init=False, repr=False)
    # the current step's exchange phases and outer steps (skyjax.spans.EXCHANGE_KINDS, OUTER;
    # record_span), on the clock of its actions' spans; run_actions starts a new list
    exchange_spans: list[Span] = dataclasses.field(default_factory=list, init=False,
                                                   repr=False)
    # (time.time(), time.perf_counter()) at the current step's start: the spans' clock
    _epoch: tuple[float, float] = dataclasses.field(default=(0.0, 0.0), init=False, repr=False)
    # the tied tensors it holds a copy of (runtime.tied.TiedSlot; a decoder's embedding)
    tied: tuple = ()

    def __post_init__(self) -> None:
        self.averaging = make_averaging(self.role.averaging, self)

    def clock(self) -> float:
        """Now on the clock of the step's spans: the wall-clock time of the step's start,
        advanced by ``time.perf_counter``."""
        wall, perf = self._epoch
        return wall + (time.perf_counter() - perf)

    def record_span(self, kind: str, start: float) -> None:
        """A span of ``kind`` (an exchange phase or an outer step, ``skyjax.spans``) of this
        stage from ``start`` (:meth:`clock`) to now, for the step's trace and timeline."""
        self.exchange_spans.append(Span(self.role.stage_id, kind, -1, start, self.clock()))

    @property
    def index(self) -> int:
        """Its position in its pipeline."""
        return self.role.index

    @property
    def pipeline(self) -> int:
        return self.role.pipeline

    @property
    def first_unit(self) -> int:
        return self.role.place.start

    @property
    def first_microbatch(self) -> int:
        """Its pipeline's first global micro-batch."""
        return self.role.first_microbatch

    @property
    def is_first(self) -> bool:
        return self.role.is_first

    @property
    def is_last(self) -> bool:
        return self.role.is_last

    def _put(self, tree: Any) -> Any:
        return jax.device_put(tree, self.device)

    @property
    def needs_batch(self) -> bool:
        """Whether the step's batch feeds this stage (the first stage's tokens, the last's
        labels); the others never look at it."""
        return self.is_first or self.is_last

    def step_inputs(self, step: int, microbatch: Callable[[int], Batch] | None,
                    rng: Callable[[int], jax.Array]) -> StepInputs:
        """The step's :class:`StepInputs` on this stage's device, in one transfer; ``microbatch``
        (micro-batch ``g`` of the step's global batch) is only read where :attr:`needs_batch`;
        ``rng(g)``: its dropout keys. This pipeline's micro-batches are ``first_microbatch`` on."""
        ids = range(self.first_microbatch, self.first_microbatch + self.program.microbatches)
        if self.needs_batch and microbatch is None:
            raise ValueError(f"stage {self.index} of {self.role.num_stages}: step {step} needs "
                             "its batch (the first stage's tokens, the last stage's labels)")
        mbs = [microbatch(g) for g in ids] if self.needs_batch else None
        carries, labels, keys = self._put((
            [host_carry(b) for b in mbs] if self.is_first else None,
            [b["labels"] for b in mbs] if self.is_last else None,
            [rng(g) for g in ids]))
        return StepInputs(step, carries, labels, keys)

    def _input(self, tag: int, batch: Batch | None) -> Any:
        if self.is_first:
            return self._put(host_carry(batch))
        return self.link.recv(tag, self.in_like, self.index - 1)

    def _source(self, step: int, action: Action) -> tuple[int, Any, int] | None:
        """(tag, like, src) of the message ``action`` receives; None if it receives none."""
        tag = message_tag(step, action, self.program.microbatches)
        if action.kind == "W":
            return None
        if action.kind == "F":
            return None if self.is_first else (tag, self.wire_in, self.index - 1)
        return None if self.is_last else (tag, self.wire_cotangent, self.index + 1)

    @functools.cached_property
    def wire_in(self) -> Any:
        """What a training forward receives: the input carry in its link's codec."""
        return codecs.encoded_like(self.program.in_codec, self.in_like)

    @functools.cached_property
    def wire_cotangent(self) -> Any:
        """What a backward receives: the output's cotangent in its link's codec."""
        return codecs.encoded_like(self.program.out_codec, float_entries(self.out_like))

    def _pull_ahead(self, step: int, actions: list[Action], i: int) -> None:
        """Posts the receives of actions i .. i + PULL_AHEAD - 1 not posted yet (transports with
        ``prefetch``), so that a message's round trip overlaps this stage's compute."""
        prefetch = getattr(self.link, "prefetch", None)
        if prefetch is None:
            return
        for j in range(max(i, self._posted), min(i + PULL_AHEAD, len(actions))):
            source = self._source(step, actions[j])
            if source is not None:
                prefetch(*source)
        self._posted = max(self._posted, i + PULL_AHEAD)

    def run_step(self, step: int, actions: list[Action], inputs: StepInputs,
                 max_grad_norm: float | None, measure: bool = False) -> StepResult:
        """Runs one optimizer step's actions, then the (globally clipped) update."""
        start = time.perf_counter()
        result = self.run_actions(step, actions, inputs, measure=measure)
        result.grad_sq_norm = self.finish_step(step, max_grad_norm)
        result.exchange = self.exchange_spans
        result.wall_s = time.perf_counter() - start
        return result

    def run_actions(self, step: int, actions: list[Action], inputs: StepInputs,
                    idle: Callable[[], None] | None = None,
                    measure: bool = False) -> StepResult:
        """Runs one optimizer step's actions (gradients accumulate in the state); ``update``
        applies them. Split so that the distributed executor can hand the step's metrics to
        process 0 before its update (:meth:`DistributedExecutor.train_step`).

        ``idle``: host work for the stage's first wait of the step, called just before its first
        receive (after its last action when it receives nothing). That receive is a wait in
        every pipeline of two stages or more: the first stage's first backward waits for the
        micro-batch's round trip through the others, every other stage's first forward for the
        fill. (Where the message is there already, the work costs what it would have cost at
        the step boundary, where it ran before.)

        ``measure``: block every call (and the update after) even where :attr:`sync_actions`
        is off, so that the spans are compute times (:attr:`StepResult.measured`)."""
        if inputs.step != step:
            raise ValueError(f"stage {self.index}: inputs of step {inputs.step} given to step "
                             f"{step}")
        residuals: dict[int, Any] = {}
        pending: dict[int, Any] = {}  # zero bubble (Ws in the list): what each W needs
        split = any(a.kind == "W" for a in actions)
        losses, accuracies, spans = [], [], []  # the last stage's losses: device scalars
        blocking = self._blocking = self.sync_actions or measure
        start, wall_start = time.perf_counter(), time.time()
        self._epoch, self.exchange_spans = (wall_start, start), []
        self._posted = 0
        self.exchange_sent = set()
        last_b = max((i for i, a in enumerate(actions) if a.kind == "B"), default=-1)
        # a stage with replicas: its last backward by buckets (the same programs, so the same
        # bits, whatever the averaging; the exact exchange's pieces leave as they are final)
        by_buckets = self.role.routes is not None and not split
        for i, action in enumerate(actions):
            mb = action.microbatch
            source = self._source(step, action)
            self._pull_ahead(step, actions, i)
            if source is not None and idle is not None:
                idle, work = None, idle
                work()
            received = None if source is None else self.link.recv(*source)
            if blocking and received is not None:  # its transfer is no part of the compute span
                received = block(received)
            self._pull_ahead(step, actions, i + 1)
            t0 = time.perf_counter()
            if action.kind == "F":
                (out, residuals[mb]), seconds = self._call(
                    "forward_s", self.program.forward, self.state.params,
                    inputs.carries[mb] if self.is_first else received, inputs.keys[mb],
                    inputs.labels[mb] if self.is_last else None, sync=blocking)
                if self.is_last:
                    losses.append(out[0])
                    accuracies.append(out[1])
                else:
                    self.link.send(message_tag(step, action, self.program.microbatches), out,
                                   self.index + 1)
            elif action.kind == "W":
                self.state.grads, seconds = self._call(
                    "weight_s", self.program.backward_weight, self.state.params,
                    pending.pop(mb), self.state.grads, sync=blocking)
            elif by_buckets and i == last_b:  # its gradients final bucket by bucket
                d_carry, seconds = backward_by_buckets(self, step, residuals.pop(mb), received,
                                                       blocking)
                if not self.is_first:
                    self.link.send(message_tag(step, action, self.program.microbatches), d_carry,
                                   self.index - 1)
            else:  # zero bubble: B gives the input cotangent only and keeps what W needs
                args = (residuals.pop(mb), received) + (() if split else (self.state.grads,))
                out, seconds = self._call("backward_s", self.program.backward_input if split
                                          else self.program.backward, self.state.params, *args,
                                          sync=blocking)
                d_carry, pending[mb] = out if split else (out[1], None)
                self.state.grads = self.state.grads if split else out[0]
                if not self.is_first:
                    self.link.send(message_tag(step, action, self.program.microbatches), d_carry,
                                   self.index - 1)
            t0 = wall_start + (t0 - start)
            spans.append(Span(self.role.stage_id, action.kind, self.first_microbatch + mb, t0,
                              t0 + seconds))
        if idle is not None:
            idle()
        if losses:  # one transfer for the step's scalars, the same floats as one read each
            losses, accuracies = ([float(x) for x in xs]
                                  for xs in jax.device_get((losses, accuracies)))
        return StepResult(losses, accuracies, spans, time.perf_counter() - start,
                          measured=blocking)

    def _call(self, what: str, fn: Callable, *args: Any, sync: bool,
              share: float = 1.0) -> tuple[Any, float]:
        """One call of the stage: emulated (``timed_call``: this host's time, slowed down), or
        under a rehearsal the declared ``what`` seconds of its role (x ``share``: a bucket's
        part of the backward)."""
        rehearsal = self.role.rehearsal
        if rehearsal is not None and share != 1.0:
            return rehearsed_call(fn, *args, seconds=getattr(rehearsal.times, what) * share,
                                  ledger=rehearsal.ledger, stop=rehearsal.stop)
        if rehearsal is not None:
            return rehearsal.call(what, fn, *args)
        return timed_call(fn, *args, slowdown=self.slowdown, sync=sync)

    def finish_step(self, step: int, max_grad_norm: float | None) -> float | None:
        """What follows a step's actions: the exchange with the other pipelines, the update
        and, under DiLoCo, the outer step; returns :meth:`update`'s value."""
        reduce_replicas(self, step)
        tied.exchange(self, step)  # tied copies: both uses' gradient summed (runtime.tied)
        local = self.update(step, max_grad_norm)
        if self.averaging is not None:
            self.averaging.after_update(self, step)
        return local

    def update(self, step: int, max_grad_norm: float | None) -> float | None:
        """The step's optimizer update, after every stage agreed on the global gradient norm;
        returns this stage's squared gradient norm (None: clipping off, not computed). The
        global one is kept in :attr:`last_sq_norm`. With several pipelines only pipeline 0's
        stages count their (summed, identical) gradients, so each unit counts once; under
        DiLoCo every pipeline updates on its own and clips by its own norm (``diloco-across``:
        each region's pipelines by their group's, its first pipeline counting)."""
        groups, num_pipelines = None, self.role.num_pipelines
        if self.averaging is not None and self.averaging.own_norm:
            groups = getattr(self.averaging, "norm_groups", None) or range(num_pipelines)
        grad_scale = self.averaging.grad_scale(self) if self.averaging is not None else 1.0
        counts = max_grad_norm and self.pipeline == (
            0 if groups is None else list(groups).index(groups[self.pipeline]))
        # the step's one read of the gradients (clipping on): waits for its last backward
        grads = tied.without_copies(self, self.state.grads) if self.tied else self.state.grads
        local = float(jax.device_get(global_sq_norm(grads))) if counts else 0.0
        total = norm_allreduce(self.link, step, local, max_grad_norm, self.pipeline,
                               num_pipelines, groups)
        if self.role.rehearsal is not None:  # the step's synchronisation as the profile declares
            self.role.rehearsal.sync()
        self.last_sq_norm = float(total) if max_grad_norm else None
        scale = clip_scale(total * grad_scale ** 2, max_grad_norm) * grad_scale
        (self.state.params, self.state.opt_state, self.state.grads), _ = self._call(
            "update_s", self.program.update, self.state.params, self.state.opt_state,
            self.state.grads, np.float32(scale), sync=self._blocking)
        return local if max_grad_norm else None

    def run_eval(self, batches: Iterable[Batch]) -> list[tuple[np.ndarray, ...]]:
        """Forward-only pass over micro-batch-sized ``batches`` (optional ``weights``); the last
        stage returns per-example (loss, prediction, label, weight) arrays per batch. Eval
        messages have their own tag range (``tags.eval_message``); the transports pair repeated
        tags in order."""
        results = []
        for i, batch in enumerate(batches):
            tag = tags.eval_message(i)
            carry = self._input(tag, batch)
            if self.is_last:
                weights = batch.get("weights", np.ones(len(batch["labels"]), np.float32))
                out = self.program.evaluate(self.state.params, carry, self._put(batch["labels"]),
                                            self._put(weights))
                results.append(tuple(np.asarray(x) for x in out))
            else:
                self.link.send(tag, self.program.evaluate(self.state.params, carry), self.index + 1)
        return results

