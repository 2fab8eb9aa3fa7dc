"""Every message tag skyjax uses, by range, in one table.

A transport pairs the n-th send of a tag on a link with the n-th receive of that tag on the same
link (``skyjax.transport``), so a tag only has to tell apart the messages that may be in
flight on one link at once. The ranges below are nevertheless kept apart, so that the users of
one transport (profiler, training, evaluation, re-planning) never pair each other's messages and
a timeout's "tag 123" says who was waiting. Tag values are part of the wire format (the transfer
transport derives pull ids from them): changing a formula changes what travels.

Point to point (``send`` / ``recv``):

==========================  ===========================================  =======================
tags                        messages                                     from
==========================  ===========================================  =======================
``0, 1, 2, ...``            training activations (F) and cotangents (B)  :func:`train_message`
                            of (step, micro-batch): 3 tags each; the
                            third of micro-batch 0: a step's replicated  :func:`replica_grads`
                            gradients (several pipelines); between a     :func:`tied_grads`
                            pipeline's first and last stage, its tied
                            weights' gradients
``PROFILE_BASE`` (900 000)  profiler link probes (and its collectives),  ``PROFILE_BASE``; the
and up                      before training                              profiler counts up
``-1`` down to              evaluation activations, one tag per eval     :func:`eval_message`
``MIGRATE_BASE + 1``        micro-batch
``MIGRATE_BASE - unit``     a unit's params and optimizer state moving   :func:`migrate`
(``MIGRATE_BASE = -1e9``)   to its new process after a re-plan
==========================  ===========================================  =======================

Training tags grow with the step and reach ``PROFILE_BASE`` after ~300 000 / m steps; that is
harmless because the profiler finishes (a final barrier) before the first training message, and
both ends of a link count earlier uses of a tag alike.

Collectives (``allreduce_sum``, ``gather_to_first``, ``barrier``) have a tag space per kind, apart
from point-to-point messages: the gradient-norm all-reduce of step ``s`` uses :func:`grad_norm`
(``s``); a distributed executor's per-step gathers (metrics, eval results) use
:func:`executor_gather` (its own counter 1, 2, ...); the profiler counts up from
``PROFILE_BASE``. Where each pipeline clips by its own norm (DiLoCo), step ``s`` has one
all-reduce per pipeline, :func:`pipeline_norm` (negative tags).

"""

from __future__ import annotations

FORWARD, BACKWARD = 0, 1  # message directions within a (step, micro-batch)
REPLICAS = 2  # the third tag of (step, micro-batch 0): replicated gradients between pipelines
_PER_MICROBATCH = 3  # tags reserved per (step, micro-batch); part of the wire format

PROFILE_BASE = 900_000  # first tag of the profiler (profile_distributed's ``tag_base``)
MIGRATE_BASE = -(10 ** 9)  # units moving after a re-plan: MIGRATE_BASE - unit


def train_message(step: int, microbatch: int, direction: int, microbatches: int) -> int:
    """The tag of one training message: (step, micro-batch, ``FORWARD`` / ``BACKWARD``)."""
    return (step * microbatches + microbatch) * _PER_MICROBATCH + direction


def replica_grads(step: int, microbatches: int) -> int:
    """The tag of step ``step``'s gradients sent to the stages of other pipelines that own the
    same units (one message per stage pair and step; ``microbatches``: the global count)."""
    return train_message(step, 0, REPLICAS, microbatches)


def tied_grads(step: int, microbatches: int) -> int:
    """The tag of step ``step``'s tied-weight gradient between the first and the last stage of
    a pipeline (``runtime.tied``): :func:`replica_grads`' tag, which that pair of stages never
    uses (they own no unit in common, so they exchange no replicated gradient)."""
    return replica_grads(step, microbatches)


def eval_message(index: int) -> int:
    """The tag of the ``index``-th eval micro-batch's activations (negative: apart from
    training)."""
    return -1 - index


def migrate(unit: int) -> int:
    """The tag of unit ``unit``'s (params, optimizer state) moving to its new process."""
    return MIGRATE_BASE - unit


def grad_norm(step: int) -> int:
    """The all-reduce tag of step ``step``'s squared gradient norm (for global clipping)."""
    return step


def pipeline_norm(step: int, pipeline: int, pipelines: int) -> int:
    """The all-reduce tag of step ``step``'s squared gradient norm of one pipeline, where each
    pipeline clips by its own norm (DiLoCo's inner steps; negative: apart from
    :func:`grad_norm`)."""
    return -1 - (step * pipelines + pipeline)


def executor_gather(count: int) -> int:
    """The gather tag of a distributed executor's ``count``-th gather (1, 2, ...)."""
    return count
