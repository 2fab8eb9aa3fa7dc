"""The exact exchange of replicated gradients between pipelines, as :mod:`skyjax.plan.pricing.exchange`
routes it: per unit, inside each link group to its representative, between the groups'
representatives, and back (a group of one device: the direct exchange).

A stage runs its messages phase by phase: it sends its phase's messages (never blocking), then
receives the phase's messages addressed to it, then sums what the phase completes. A phase's
sends depend only on earlier phases' receives, so the exchange cannot deadlock. Sums are in one
fixed order (a group's gradients in pipeline order, then the groups' partial sums in group
order), computed once per group by its representative and sent on as they are, so every owner
of a unit ends with the same bits; with every group of one device the additions are those of
the direct exchange (pipeline order), bit for bit. Averaging per link class
(``runtime.averaging``) runs the same routes relaxed between groups: ``int8-across`` codes the
partial sums of phase 2, ``diloco-across`` runs phases 1 and 3 every step and phases 2 and 3 at
its outer step; ``int8`` and ``diloco`` keep their own, direct, exchange.

The exact exchange sends each message in pieces by bucket (:mod:`skyjax.plan.pricing.buckets`):
the pieces that carry the sender's own gradients can leave as soon as its last backward has
made their bucket final (:meth:`Routes.send_ready`, while the rest of the backward computes);
the rest leave in their phase. Receives and sums keep their order, so the bits are the same.

Each phase in which a stage sends or receives is recorded on it as a span (``record_span``;
kinds ``skyjax.spans.EXCHANGE_PHASE``) from the phase's start (its coding, then its first send)
to its last receive and sum, for the step's trace and timeline.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from skyjax.plan.pricing import buckets
from skyjax.plan.pricing.exchange import BACK, BETWEEN, IN_GROUP, PHASES, Message, routing
from skyjax.spans import EXCHANGE_PHASE
from skyjax.transport import tags
from skyjax.tree import tree_shapes


@jax.jit
def ordered_sum(trees: list) -> Any:
    """The sum of gradient trees in list order (one order for every owner, so replicas stay
    bit-identical); the direct exchange (``replicas.sum_replicas``) sums with it too."""
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
        stage.state.grads = self.run(stage, step, stage.state.grads,
                                     early=getattr(stage, "exchange_sent", set()))

    def early(self, m: Message) -> tuple[int, ...]:
        """The units of ``m`` that carry its sender's own gradient: phase 1's, and phase 2's
        where the sender's group of the unit is the sender alone."""
        return buckets.early_units(m, self.order)

    def pieces(self, m: Message) -> list[tuple[int, ...]]:
        """How the exact exchange sends ``m`` (``pricing.buckets.pieces``)."""
        return buckets.pieces(m.units, self.early(m))

    def send_ready(self, stage: Any, step: int, lo: int, hi: int, sent: set) -> None:
        """Sends the pieces of this device's messages that carry only its own gradients of
        units ``[lo, hi)`` (final in ``stage.state.grads``); adds them to ``sent``."""
        tag = tags.replica_grads(step, stage.program.loss_microbatches)
        a, d = stage.first_unit, self.device
        for m in self.messages:
            if m.src != d or m.phase == BACK:
                continue
            early = set(self.early(m))
            for p in self.pieces(m):
                if (m.phase, m.dst, p) not in sent and early >= set(p) and all(
                        lo <= u < hi for u in p):
                    stage.replica_link.send(tag, [stage.state.grads[u - a] for u in p],
                                            self.address[m.dst])
                    sent.add((m.phase, m.dst, p))

    def represents(self, u: int) -> bool:
        """Whether this device sends unit ``u``'s partial sum to other groups (phase 2,
        ``BETWEEN``)."""
        return self.device in self.rep[u] and len(self.rep[u]) > 1

    def run(self, stage: Any, step: int, trees: list, phases: Sequence[int] = PHASES,
            coder: Any = None, early: set | None = None) -> list:
        """Per unit of ``stage`` (``trees``: one entry each) what the exchange's ``phases``
        leave on every owner: all three, the sum over every pipeline; (1, 3), the sum over the
        device's group; (2, 3), the sum over the groups of their representatives' entries
        (each group's owners holding the same). ``coder`` (``runtime.averaging``): phase 2
        carries ``coder.encode(units, partial sums)`` = (codes, what each code decodes to) and
        each representative sums ``coder.decode(codes, like)`` of the others and its own
        decoded in group order. ``early`` (the exact exchange): messages go in pieces
        (:meth:`pieces`), those in ``early`` sent already by :meth:`send_ready`; None: whole."""
        tag = tags.replica_grads(step, stage.program.loss_microbatches)
        a, d, link = stage.first_unit, self.device, stage.replica_link
        own = {a + j: g for j, g in enumerate(trees)}
        held = {(u, d): g for u, g in own.items()}  # (unit, device) -> what d has of it
        partial: dict[int, Any] = {} if IN_GROUP in phases else {
            u: g for u, g in own.items() if d in self.rep[u]}
        total: dict[int, Any] = {}
        sent: dict[int, Any] = {}  # phase 2's entries on the wire (coded: the codes)
        for phase in phases:
            t0 = stage.clock()
            if phase == BETWEEN:
                sent = dict(partial)
                if coder is not None:
                    units = [u for u in sorted(partial) if self.represents(u)]
                    codes, decoded = coder.encode(units, [partial[u] for u in units])
                    sent.update(zip(units, codes))
                    for u, g in zip(units, decoded):
                        held[u, d] = g  # its own partial sum as the others decode it
            source = own if phase == IN_GROUP else sent if phase == BETWEEN else total
            for m in self.messages:
                if m.phase == phase and m.src == d:
                    for p in [m.units] if early is None else self.pieces(m):
                        if (m.phase, m.dst, p) not in (early or ()):
                            link.send(tag, [source[u] for u in p], self.address[m.dst])
            for m in self.messages:
                if m.phase == phase and m.dst == d:
                    like = {u: tree_shapes(own[u] if phase != BETWEEN else sent[u])
                            for u in m.units}
                    parts: dict[int, Any] = {}
                    for p in [m.units] if early is None else self.pieces(m):
                        parts.update(zip(p, link.recv(tag, [like[u] for u in p],
                                                      self.address[m.src])))
                    got = [parts[u] for u in m.units]
                    if phase == BETWEEN and coder is not None:
                        got = coder.decode(got, [own[u] for u in m.units])
                    for u, g in zip(m.units, got):
                        if phase == BACK:
                            total[u] = g
                        else:
                            held[u, m.src] = g
            for u in own:
                if phase == IN_GROUP and d in self.rep[u]:
                    group = next(g for g in self.order[u] if d in g)
                    partial[u] = _sum([held[u, e] for e in group])
                elif phase == BETWEEN and d in self.rep[u]:
                    mine = held[u, d] if coder is not None and self.represents(u) else partial[u]
                    total[u] = _sum([mine if r == d else held[u, r] for r in self.rep[u]])
            if phase == IN_GROUP and BETWEEN not in phases:
                total.update(partial)  # no phase 2: the group's sum is the total
            if any(m.phase == phase and d in (m.src, m.dst) for m in self.messages):
                stage.record_span(EXCHANGE_PHASE[phase], t0)
        return [total[u] for u in sorted(own)]


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
