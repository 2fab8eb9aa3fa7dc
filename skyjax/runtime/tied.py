"""Tied weights across stages: a tensor two units hold (a decoder's token embedding, which its
LM head also uses; ``Unit.tied``, ``models.decoder_units.tied_pairs``) kept bit for bit equal.

The first unit's stage and the last unit's stage each hold a copy and each computes its own
use's gradient. Every step, after the exchange with the other pipelines and before the update,
the two stages swap these gradients (one message each way on their link, tag
``transport.tags.tied_grads``) and each sets its copy's gradient to the sum, first unit's +
last unit's, so both copies take the same update from the same optimizer state and stay equal;
a stage that holds both sums them without a message. The global gradient norm counts the
tensor once (the last unit's copy is left out of it, :func:`without_copies`). A
checkpoint saves the first unit's copy alone (``checkpoint``: the second is filled from it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from skyjax.models.units import Unit
from skyjax.transport import tags


@dataclasses.dataclass(frozen=True)
class TiedSlot:
    """One tied tensor as a stage sees it: its copy at unit ``local`` (index in the stage's
    block), ``path`` inside that unit's params; the other copy at ``other_local`` of this stage
    (``peer`` None) or on stage ``peer`` of the pipeline; ``first``: this copy is the first
    unit's (the sum's first term)."""

    local: int
    path: tuple[str, ...]
    first: bool
    peer: int | None = None
    other_local: int | None = None
    other_path: tuple[str, ...] = ()


def second_copies(chain: Sequence[Unit]) -> dict[int, list[tuple[str, ...]]]:
    """``{unit index: [paths]}`` of the copies that are the second of a tied pair (what the
    checkpoint leaves out and the gradient norm does not count)."""
    index = {u.name: i for i, u in enumerate(chain)}
    out: dict[int, list[tuple[str, ...]]] = {}
    for i, unit in enumerate(chain):
        for path, other, _ in unit.tied:
            if index[other] < i:
                out.setdefault(i, []).append(tuple(path))
    return out


def stage_slots(chain: Sequence[Unit], start: int, end: int, index: int,
                num_stages: int) -> tuple[TiedSlot, ...]:
    """The tied tensors of the stage holding units ``[start, end)`` at ``index`` of
    ``num_stages``; the other copy's stage is found by its unit, which must be the chain's first
    or last (a decoder's embeddings and head) when it is not this stage's."""
    names = {u.name: i for i, u in enumerate(chain)}
    slots = []
    for u in range(start, end):
        for path, other, other_path in chain[u].tied:
            j = names[other]
            if start <= j < end:
                if u < j:  # the pair once, summed here
                    slots.append(TiedSlot(u - start, tuple(path), True, None, j - start,
                                          tuple(other_path)))
                continue
            if j == 0:
                peer = 0
            elif j == len(chain) - 1:
                peer = num_stages - 1
            else:
                raise ValueError(f"unit {chain[u].name} ties {path} to {other}, inside the "
                                 "chain: only the first and last units may share a tensor")
            slots.append(TiedSlot(u - start, tuple(path), u < j, peer))
    return tuple(slots)


def _get(tree: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: dict, path: tuple[str, ...], value: Any) -> dict:
    """A copy of nested dict ``tree`` with ``value`` at ``path``."""
    out = dict(tree)
    out[path[0]] = value if len(path) == 1 else _set(tree[path[0]], path[1:], value)
    return out


def exchange(stage: Any, step: int) -> None:
    """Sets each tied copy's gradient of ``stage`` (a ``PipelineStage``) to the sum of both
    uses' (module docstring); a no-op for a stage without tied tensors."""
    slots = stage.tied
    if not slots:
        return
    grads = list(stage.state.grads)
    tag = tags.tied_grads(step, stage.program.loss_microbatches)
    for s in slots:  # every send first: the two stages never wait for each other
        if s.peer is not None:
            stage.link.send(tag, _get(grads[s.local], s.path), s.peer)
    for s in slots:
        mine = _get(grads[s.local], s.path)
        if s.peer is None:
            other = _get(grads[s.other_local], s.other_path)
            total = mine + other
            # its own buffer: the update donates every gradient
            grads[s.other_local] = _set(grads[s.other_local], s.other_path, jnp.copy(total))
        else:
            like = jax.ShapeDtypeStruct(mine.shape, mine.dtype)
            other = jax.device_put(stage.link.recv(tag, like, s.peer), stage.device)
            total = mine + other if s.first else other + mine
        grads[s.local] = _set(grads[s.local], s.path, total)
    stage.state.grads = grads


def without_copies(stage: Any, grads: list) -> list:
    """``grads`` with the second copy of each tied tensor left out (zeros), so that the norm
    counts the tensor once."""
    out = list(grads)
    for s in stage.tied:
        if s.peer is not None and not s.first:
            out[s.local] = _set(out[s.local], s.path, jnp.zeros_like(_get(out[s.local], s.path)))
        elif s.peer is None:
            other = _get(out[s.other_local], s.other_path)
            out[s.other_local] = _set(out[s.other_local], s.other_path, jnp.zeros_like(other))
    return out
