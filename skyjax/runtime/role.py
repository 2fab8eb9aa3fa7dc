"""A stage's role: what the plan makes it, decided once from the plan alone
(``placement.stage_role``) and given to the stage when it is made (``placement.build_stage``).

A :class:`StageRole` is frozen: which pipeline and position, which units and codecs, which
global micro-batches, which stages of other pipelines share its units and how their gradients
are summed (``routes``, or a relaxed ``averaging``), and, in a rehearsal, its declared times.
Both executors build roles the same way, so a plan means the same to threads and processes;
what a stage holds that changes (parameters, optimizer and averaging state) is the stage's own.
"""

from __future__ import annotations

import dataclasses

from skyjax.runtime.averaging import AveragingSpec
from skyjax.runtime.exchange import Routes
from skyjax.runtime.rehearsal import StageRehearsal


@dataclasses.dataclass(frozen=True)
class StagePlacement:
    """A block of units ``[start, end)`` and the index of the device that runs it; with several
    pipelines, its pipeline and its index in that pipeline."""

    device: int
    start: int
    end: int
    pipeline: int = 0
    index: int = 0  # position in its pipeline
    in_codec: str = "none"  # the codecs of its links from the previous and to the next stage
    out_codec: str = "none"

    @property
    def units(self) -> range:
        return range(self.start, self.end)


@dataclasses.dataclass(frozen=True)
class ReplicaPeer:
    """A stage of another pipeline owning units ``[start, end)`` that this stage owns too:
    ``address`` is where its transport reaches it (local: its stage id; distributed: its
    process)."""

    pipeline: int
    address: int
    start: int
    end: int


@dataclasses.dataclass(frozen=True)
class StageRole:
    """Stage ``stage_id`` of a plan (its position among all pipelines' stages: spans, traces):
    its ``place``; ``num_stages`` in its pipeline of ``num_pipelines``, whose share is
    ``microbatches`` per step from global micro-batch ``first_microbatch`` on; the ``peers``
    that own its units in other pipelines, the exact exchange's ``routes`` through the link
    groups (None: directly to the peers, or one pipeline), a relaxed ``averaging`` (None:
    exact), and a rehearsal's declared times (None: calls take what they take)."""

    stage_id: int
    place: StagePlacement
    num_stages: int
    num_pipelines: int = 1
    microbatches: int = 1
    first_microbatch: int = 0
    peers: tuple[ReplicaPeer, ...] = ()
    routes: Routes | None = None
    averaging: AveragingSpec | None = None
    rehearsal: StageRehearsal | None = None

    @property
    def pipeline(self) -> int:
        return self.place.pipeline

    @property
    def index(self) -> int:
        """Its position in its pipeline."""
        return self.place.index

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.num_stages - 1
