"""A training step's records, shared by the pipeline stages and both executors: what a stage
takes from the host for a step (:class:`StepInputs`), what each stage reports
(:class:`StepResult`) and the step as the caller sees it (:class:`StepMetrics`)."""

from __future__ import annotations

import dataclasses

from skyjax.spans import Span


@dataclasses.dataclass
class StepResult:
    """Per-stage outcome of one step; ``losses``/``accuracies`` only on the last stage."""

    losses: list[float]
    accuracies: list[float]
    spans: list[Span]
    wall_s: float
    # the stage's own squared gradient norm (when clipping computes it; None otherwise)
    grad_sq_norm: float | None = None
    # whether the actions blocked, so that ``spans`` are compute times (False: dispatch times)
    measured: bool = True
    # several pipelines: the exchange's phases and outer steps after the actions (the kinds of
    # skyjax.spans.EXCHANGE_KINDS and OUTER), on the clock of ``spans``
    exchange: list[Span] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class StepMetrics:
    """One step as seen by the last stage: mean loss/accuracy over micro-batches, and timing."""

    loss: float
    accuracy: float
    wall_s: float
    results: list[StepResult]  # per stage (local); this process's stage only (distributed)
    # the global gradient norm before clipping (None: clipping off, so never computed)
    grad_norm: float | None = None
    has_loss: bool = True  # False on processes that do not gather the loss (distributed)
    # (start, end) of the step as the executor ran it, on the clock of the spans: its drawn
    # length (timeline.png, trace.json); None: unknown
    window: tuple[float, float] | None = None

    @property
    def spans(self) -> list[Span]:
        """The step's F/B spans of every stage in ``results``."""
        return [s for r in self.results for s in r.spans]

    @property
    def exchange_spans(self) -> list[Span]:
        """The step's exchange phases and outer steps of every stage in ``results``."""
        return [s for r in self.results for s in r.exchange]

    @property
    def timeline_spans(self) -> list[Span]:
        """Everything the step's pictures draw: its passes, then its exchange spans."""
        return self.spans + self.exchange_spans

    @property
    def measured(self) -> bool:
        """Whether every stage's spans are compute times (its actions blocked); what reads
        spans as times (re-planning, calibration, reports) skips a step that is not."""
        return all(r.measured for r in self.results)


@dataclasses.dataclass
class StepInputs:
    """What one step's forwards of a stage take from the host, already on its device, per
    micro-batch: the first stage's initial carries, the last stage's labels (None elsewhere), and
    every stage's dropout keys. Put in one transfer per step (:meth:`PipelineStage.step_inputs`)
    instead of one per forward (0.2-0.6 ms of host time each, on the first stage's critical path),
    and, when the caller hands over the next step's batch, during the stage's first wait of the
    step before (``DistributedExecutor.train_step``)."""

    step: int
    carries: list | None
    labels: list | None
    keys: list
