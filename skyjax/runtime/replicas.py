"""What a stage settles with the other stages after its step's actions: with the stages of other
pipelines that own its units (its replicas), the sum of their gradients; with every stage, the
squared gradient norm that clipping needs (docs/design.md, "Several pipelines").

The exact sum goes through the link groups (``StageRole.routes``, :mod:`.exchange`) or, with
no groups, directly to each peer (``StageRole.peers``); either way each owner sums in one order,
pipeline order, so every replica holds the same bits before the update. A relaxed averaging
(:mod:`.averaging`) replaces the sum and exchanges through :func:`swap_with_peers`.

The exact exchange starts behind the backward (:func:`backward_by_buckets`): the step's last
backward runs by buckets of units from the stage's last units down, and each bucket's pieces of
the exchange that carry the stage's own gradients leave as soon as it is final, while the rest
computes; :func:`reduce_replicas` then runs the exchange as before, less what left.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from skyjax.plan.pricing.buckets import stage_buckets
from skyjax.runtime.exchange import ordered_sum
from skyjax.spans import EXCHANGE_PHASE
from skyjax.transport import tags
from skyjax.tree import tree_shapes


def norm_allreduce(link: Any, step: int, local: float, max_grad_norm: float | None,
                   pipeline: int, num_pipelines: int,
                   groups: Sequence[int] | None) -> float:
    """The squared gradient norm every stage clips by: the sum of ``local`` over all stages
    (one all-reduce), or, with ``groups`` (each pipeline's replica group: DiLoCo's inner steps,
    a pipeline each, or a region's pipelines under ``diloco-across``; clipping on), over this
    pipeline's group's stages (an all-reduce per group, every stage joining each). With several
    pipelines the all-reduce also runs without clipping: it is the step's commit point, which
    every process passes or none (runtime.recovery). A process without a stage joins with
    ``local`` 0 and ``pipeline`` -1."""
    if groups is not None and max_grad_norm:
        mine = groups[pipeline] if pipeline >= 0 else -1
        sums = [link.allreduce_sum(local if g == mine else 0.0,
                                   tags.pipeline_norm(step, g, num_pipelines))
                for g in range(max(groups) + 1)]
        return sums[mine] if pipeline >= 0 else 0.0
    if max_grad_norm or num_pipelines > 1:
        return link.allreduce_sum(local, tags.grad_norm(step))
    return 0.0


def backward_by_buckets(stage: Any, step: int, residuals: Any, cotangent: Any,
                        sync: bool) -> tuple[Any, float]:
    """``stage``'s last backward of ``step``, bucket by bucket from its last units down
    (``StageProgram.backward_bucket``; the same programs, so the same bits, whether or not the
    exchange overlaps): after each bucket, with ``stage.exchange_overlap``, the exchange's
    pieces it made final leave (``Routes.send_ready``). Returns (the input cotangent, seconds).
    In a rehearsal each bucket takes its share of the declared backward (per unit the
    ``unit_backward_s`` its times declare, else equal)."""
    a, b = stage.role.place.start, stage.role.place.end
    bounds = tuple((lo - a, hi - a) for lo, hi in stage_buckets(a, b))
    times = stage.role.rehearsal.times if stage.role.rehearsal is not None else None
    weights = list(getattr(times, "unit_backward_s", None) or [1.0] * (b - a))
    grads, carried, d_carry, total = list(stage.state.grads), [], None, 0.0
    for j, (lo, hi) in enumerate(bounds):
        (grads[lo:hi], carried, out), seconds = stage._call(
            "backward_s", stage.program.backward_bucket, bounds, j, stage.state.params,
            residuals, cotangent, carried, grads[lo:hi], sync=sync,
            share=sum(weights[lo:hi]) / sum(weights))
        total += seconds
        d_carry = out if out is not None else d_carry
        stage.state.grads = grads
        if stage.exchange_overlap and stage.averaging is None:  # the exact exchange's pieces
            stage.role.routes.send_ready(stage, step, a + lo, a + hi, stage.exchange_sent)
    return d_carry, total


def reduce_replicas(stage: Any, step: int) -> None:
    """Several pipelines: replaces ``stage``'s gradients of the units it shares by the sum over
    all pipelines in pipeline order (no-op with one pipeline): through the link groups
    (``routes``) or directly with each peer (sends never block). A relaxed averaging does its
    own exchange instead."""
    role = stage.role
    if not role.peers:
        return
    if stage.averaging is not None:
        stage.averaging.reduce(stage, step)
        return
    if role.routes is not None:
        role.routes.reduce(stage, step)
        return
    t0 = stage.clock()
    stage.state.grads = sum_replicas(stage, stage.state.grads,
                                     swap_with_peers(stage, step, stage.state.grads))
    stage.record_span(EXCHANGE_PHASE[2], t0)  # the direct exchange: phase 2 (skyjax.spans)


def swap_with_peers(stage: Any, step: int, trees: list,
                    unwire: Callable[[Any, list], list] | None = None
                    ) -> dict[tuple[int, int], Any]:
    """Sends each peer of ``stage`` the entries of ``trees`` (one per unit of the stage) of the
    units it shares and receives its own: ``{(unit, pipeline): tree}``. Coded ``trees``:
    ``unwire(received, gradient slice)`` is what a received slice stands for."""
    tag = tags.replica_grads(step, stage.program.loss_microbatches)
    a, link = stage.first_unit, stage.replica_link
    for peer in stage.role.peers:
        link.send(tag, trees[peer.start - a:peer.end - a], peer.address)
    got: dict[tuple[int, int], Any] = {}
    for peer in stage.role.peers:
        mine = trees[peer.start - a:peer.end - a]
        theirs = link.recv(tag, tree_shapes(mine), peer.address)
        if unwire is not None:
            theirs = unwire(theirs, stage.state.grads[peer.start - a:peer.end - a])
        for u, g in zip(range(peer.start, peer.end), theirs):
            got[u, peer.pipeline] = g
    return got


def sum_replicas(stage: Any, own: list, got: dict[tuple[int, int], Any]) -> list:
    """Per unit of ``stage``: the sum over all pipelines, in pipeline order, of ``own``'s entry
    (this pipeline) and ``got``'s (the others)."""
    a, me = stage.first_unit, stage.pipeline
    return [ordered_sum([g if i == me else got[u, i]
                         for i in range(stage.role.num_pipelines)])
            for u, g in zip(range(a, a + len(own)), own)]
