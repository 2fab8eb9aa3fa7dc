"""The exact exchange of replicated gradients between pipelines, as :mod:`skyjax.plan.exchange`
routes it: per unit, inside each link group to its representative, between the groups'
representatives, and back (a group of one device: the direct exchange).

A stage runs its messages phase by phase: it sends its phase's messages (never blocking), then
receives the phase's messages addressed to it, then sums what the phase completes. A phase's
sends depend only on earlier phases' receives, so the exchange cannot deadlock. Sums are in one
fixed order (a group's gradients in pipeline order, then the groups' partial sums in group
order), computed once per group by its representative and sent on as they are, so every owner
of a unit ends with the same bits; with every group of one device the additions are those of
the direct exchange (pipeline order), bit for bit. Relaxed averaging (``runtime.averaging``)
keeps its own, direct, exchange.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from skyjax.plan.exchange import Message, routing
from skyjax.transport import tags
from skyjax.tree import tree_shapes


@jax.jit
def ordered_sum(trees: list) -> Any:
    """The sum of gradient trees in list order (one order for every owner, so replicas stay
    bit-identical); the direct exchange (``PipelineStage.sum_replicas``) sums with it too."""
    total = trees[0]
    for g in trees[1:]:
        total = jax.tree.map(jnp.add, total, g)
    return total


def _sum(trees: list) -> Any:
    return trees[0] if len(trees) == 1 else ordered_sum(trees)


@dataclasses.dataclass(frozen=True)
class Routes:
    """One stage's part of the routing: its device, its messages (phase order), per unit of its
    block the owners' groups in summing order and their representatives, and where the
    transport reaches each device."""

    device: int
    messages: tuple[Message, ...]
    order: dict[int, list[list[int]]]
    rep: dict[int, list[int]]
    address: dict[int, int]

    def reduce(self, stage: Any, step: int) -> None:
        """Replaces ``stage``'s gradients by the sum over every pipeline (module doc)."""
        tag = tags.replica_grads(step, stage.program.loss_microbatches)
        a, d, link = stage.first_unit, self.device, stage.replica_link
        own = {a + j: g for j, g in enumerate(stage.state.grads)}
        held = {(u, d): g for u, g in own.items()}  # (unit, device) -> what d has of it
        partial: dict[int, Any] = {}
        total: dict[int, Any] = {}
        for phase in range(3):
            source = own if phase == 0 else partial if phase == 1 else total
            for m in self.messages:
                if m.phase == phase and m.src == d:
                    link.send(tag, [source[u] for u in m.units], self.address[m.dst])
            for m in self.messages:
                if m.phase == phase and m.dst == d:
                    got = link.recv(tag, [tree_shapes(own[u]) for u in m.units],
                                    self.address[m.src])
                    for u, g in zip(m.units, got):
                        if phase == 2:
                            total[u] = g
                        else:
                            held[u, m.src] = g
            for u in own:
                if phase == 0 and d in self.rep[u]:
                    group = next(g for g in self.order[u] if d in g)
                    partial[u] = _sum([held[u, e] for e in group])
                elif phase == 1 and d in self.rep[u]:
                    total[u] = _sum([partial[u] if r == d else held[u, r]
                                     for r in self.rep[u]])
        stage.state.grads = [total[u] for u in sorted(own)]


def stage_routes(plan: Any, k: int, address: Sequence[int]) -> Routes | None:
    """Stage ``k``'s :class:`Routes` in ``plan`` (None with one pipeline); ``address[j]``: where
    the transport reaches stage j."""
    if plan.num_pipelines < 2:
        return None
    chains = [[(s.device, *s.units) for s in plan.pipeline(i).stages]
              for i in range(plan.num_pipelines)]
    r = routing(chains, plan.exchange_groups, given=plan.exchange_reps)
    d = plan.stages[k].device
    a, b = plan.stages[k].units
    return Routes(d, tuple(r.of(d)), {u: r.order[u] for u in range(a, b)},
                  {u: r.rep[u] for u in range(a, b)},
                  {s.device: int(address[j]) for j, s in enumerate(plan.stages)})
