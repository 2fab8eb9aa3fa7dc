"""From a :class:`~skyjax.plan.Plan` to pipeline stages: which units run where, each stage's
role (:class:`~skyjax.runtime.role.StageRole`), the shapes that cross each cut, and the
construction of one :class:`~skyjax.runtime.pipeline.PipelineStage` with its role.

Both executors (local threads, distributed processes) build their stages here, so a plan means
the same thing to both; re-planning moves units between stages by unit index (``UnitState``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import optax

from skyjax.models.bert import Unit, initial_carry
from skyjax.plan import Plan
from skyjax.runtime import tied
from skyjax.runtime.averaging import averaging_spec
from skyjax.runtime.batches import Batch
from skyjax.runtime.exchange import stage_routes
from skyjax.runtime.pipeline import PipelineStage, StageLink
from skyjax.runtime.rehearsal import Rehearsal
from skyjax.runtime.role import ReplicaPeer, StagePlacement, StageRole
from skyjax.programs.stage import StageProgram
from skyjax.tree import tree_shapes

UnitState = tuple[Any, Any]  # (params, optimizer state) of one unit


def placements(plan: Plan) -> list[StagePlacement]:
    """The stages of ``plan`` in its order (pipeline 0's first, each in pipeline order)."""
    index: dict[int, int] = {}
    into: dict[int, str] = {}  # per pipeline: the codec of the link into its next stage
    out = []
    for s in plan.stages:
        k = index[s.pipeline] = index.get(s.pipeline, -1) + 1
        out.append(StagePlacement(int(s.device), int(s.units[0]), int(s.units[1]),
                                  int(s.pipeline), k, into.get(s.pipeline, "none"), s.codec))
        into[s.pipeline] = s.codec
    return out


def pipeline_sizes(places: Sequence[StagePlacement]) -> list[int]:
    """The number of stages of each pipeline."""
    sizes: dict[int, int] = {}
    for p in places:
        sizes[p.pipeline] = sizes.get(p.pipeline, 0) + 1
    return [sizes[i] for i in sorted(sizes)]


def replica_peers(places: Sequence[StagePlacement], k: int,
                  address: Sequence[int]) -> tuple[ReplicaPeer, ...]:
    """The stages of other pipelines that share units with stage ``k``, with the units shared
    and ``address[j]`` where stage j is reached."""
    me = places[k]
    return tuple(ReplicaPeer(q.pipeline, int(address[j]), max(me.start, q.start),
                             min(me.end, q.end))
                 for j, q in enumerate(places)
                 if q.pipeline != me.pipeline and max(me.start, q.start) < min(me.end, q.end))


def stage_role(plan: Plan, k: int, address: Sequence[int],
               rehearsal: Rehearsal | None = None) -> StageRole:
    """Stage ``k``'s role in ``plan`` (its flat order); ``address[j]``: where the transport
    reaches stage j; ``rehearsal``: the run's, whose declared times of ``plan`` it takes."""
    places = placements(plan)
    place = places[k]
    i = place.pipeline
    return StageRole(k, place, pipeline_sizes(places)[i], plan.num_pipelines,
                     plan.pipeline_shares()[i], plan.first_microbatch(i),
                     replica_peers(places, k, address), stage_routes(plan, k, address),
                     averaging_spec(plan),
                     None if rehearsal is None else rehearsal.stage(plan, k))


def unit_owners(plan: Plan) -> list[int]:
    """The device of every unit, by unit index (pipeline 0's, with several pipelines)."""
    owners = {u: place.device for place in placements(plan) if place.pipeline == 0
              for u in place.units}
    return [owners[u] for u in sorted(owners)]


class PipelineLink:
    """A stage's view of a transport addressed by stage id, for a pipeline whose stage ``k`` has
    id ``ids[k]`` (several pipelines share one transport)."""

    def __init__(self, base: Any, ids: Sequence[int]):
        self.base, self.ids = base, list(ids)

    def send(self, tag: int, tree: Any, dst: int) -> None:
        self.base.send(tag, tree, self.ids[dst])

    def recv(self, tag: int, like: Any, src: int) -> Any:
        return self.base.recv(tag, like, self.ids[src])

    def prefetch(self, tag: int, like: Any, src: int) -> None:
        post = getattr(self.base, "prefetch", None)
        if post is not None:
            post(tag, like, self.ids[src])

    def allreduce_sum(self, value: float, tag: int) -> float:
        return self.base.allreduce_sum(value, tag)


def device_units(plan: Plan, device: int) -> list[int]:
    """The units of every stage that ``device`` runs (what its process must materialise)."""
    return [u for place in placements(plan) if place.device == device for u in place.units]


def abstract_units(chain: Sequence[Unit]) -> list[Unit]:
    """The units with shapes in place of parameter arrays (enough to rebuild stages)."""
    return [dataclasses.replace(u, params=tree_shapes(u.params)) for u in chain]


def boundary_shapes(chain: Sequence[Unit], batch_like: Batch) -> list[Any]:
    """ShapeDtypeStructs of the carry entering each unit (and, last, leaving the chain)."""
    carry = jax.eval_shape(lambda b: initial_carry(b["input_ids"], b["token_type_ids"],
                                                   b["attention_mask"]), batch_like)
    shapes = [carry]
    for unit in chain:
        carry = jax.eval_shape(lambda p, c, u=unit: u.apply(p, c, None, False), unit.params, carry)
        shapes.append(carry)
    return shapes


def build_stage(chain: Sequence[Unit], role: StageRole, device: jax.Device, link: StageLink,
                shapes: list[Any], optimizer: optax.GradientTransformation, *,
                replica_link: Any = None, slowdown: float = 1.0,
                unit_states: dict[int, UnitState] | None = None,
                loss_microbatches: int | None = None,
                sync_actions: bool = True) -> PipelineStage:
    """The stage of ``role``, owning units ``[start, end)`` of its place on ``device``: params
    copied there from the units, or params and optimizer states from ``unit_states`` (by unit
    index). ``replica_link``: where its replicas are reached (several pipelines);
    ``loss_microbatches``: the global batch's micro-batches; ``sync_actions``: whether its
    calls block (``PipelineStage.sync_actions``)."""
    place = role.place
    block = list(chain[place.start:place.end])
    program = StageProgram(block, is_last=role.is_last, microbatches=role.microbatches,
                           optimizer=optimizer, loss_microbatches=loss_microbatches,
                           in_codec=place.in_codec, out_codec=place.out_codec,
                           in_like=shapes[place.start])
    if unit_states:
        params = jax.device_put([unit_states[u][0] for u in place.units], device, may_alias=False)
        opt = jax.device_put([unit_states[u][1] for u in place.units], device, may_alias=False)
        state = program.init_state(params, opt)
    else:
        state = program.init_state(jax.device_put([u.params for u in block], device,
                                                  may_alias=False))
    stage = PipelineStage(role, program, state, device, link, shapes[place.start],
                          shapes[place.end], replica_link, slowdown, sync_actions=sync_actions)
    stage.tied = tied.stage_slots(chain, place.start, place.end, role.index, role.num_stages)
    return stage
