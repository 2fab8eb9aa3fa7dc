"""Averaging between pipeline replicas without a global exchange per step (``Plan.averaging``
``decentral``, ``decentral-int8`` or ``async``; :mod:`skyjax.relax`, docs/design.md,
"Relaxation on slow links"), hooked from :mod:`skyjax.runtime.averaging`.

In both, every pipeline takes its optimizer step on its own share (its gradients scaled to the
share's mean, m / m_i, and clipped by its own norm, as DiLoCo's inner steps); then:

* ``decentral`` (BAGUA's decentralized SGD): at step t each pipeline averages its parameters
  with ONE peer, the pair of :func:`skyjax.plan.pricing.peers.pairs` (``ring`` or the one-peer
  ``exponential`` graph). The owners of a unit in the two pipelines swap their parameters and
  both compute (lower pipeline's + higher pipeline's) * 0.5, in that order, in float32: the pair
  holds the same bits. There is no global exchange; replicas differ by design.
* ``decentral-int8`` (BAGUA's low-precision decentralized SGD): the same pairs, a quarter of
  the bytes. Each pair (i, j) keeps its last common mean c (both ends the same bits: the
  model at the start, at resume, or after average now, then each meeting's mean). At a meeting
  each end sends int8(x - c) (:mod:`skyjax.codecs`); both ends decode both, x~ = c + decoded,
  in one jitted function, so each holds the same x~_i, x~_j and computes the same mean
  m = (x~_lower + x~_higher) * 0.5; each then keeps m + (x - x~), its own rounding (error
  feedback: the pair's sum is preserved, what int8 drops stays in the replica that dropped it,
  and is sent at the next meeting), and c becomes m. The difference since the pair's last
  meeting is small, so int8's per-block scale fits it. Each replica holds a c per peer it meets
  (``pricing.peers.state_copies``); average now clears them, and they start again from the
  one model it leaves, so a checkpoint holds none of them.
* ``async`` (BAGUA's asynchronous model average): after its update at step t each pipeline
  sends w_i * params (w_i = m_i / m, a snapshot s_i) to every peer and keeps s_i; at step t + k
  (k = the plan's ``staleness``) it receives the others' and moves its parameters by the average
  it missed: params += sum_i w_i s_i (pipeline order, every pipeline the same bits) - s_own,
  then sends the next snapshot (after that correction). The exchange runs beside the k steps in
  between (sends never block, the receive is k steps on); one is in flight at a time, as in
  BAGUA (with several, each correction would be counted again by the next, and for k >= 2 the
  replicas' differences would not decay: the demo did not learn).

``average now`` (:func:`average_now`, at eval and at checkpoints): every replica takes the exact
all-pipelines average of the current parameters, weighted by share (the exact exchange's
routes, :mod:`skyjax.runtime.exchange`): every replica then holds the same bits. Under ``async``
it first receives what is in flight (the corrections it would apply sum to zero in the average)
and drops its snapshots, so a checkpoint holds no in-flight state: its relaxed state is each
pipeline's optimizer state (``REPLICAS_DIFFER``; the params are one model).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from skyjax import codecs
from skyjax.plan.pricing.exchange import BETWEEN
from skyjax.plan.pricing.peers import peer_of, peers_ever
from skyjax.runtime.replicas import sum_replicas
from skyjax.spans import EXCHANGE_PHASE
from skyjax.transport import tags
from skyjax.tree import tree_shapes

DIRECT = EXCHANGE_PHASE[BETWEEN]  # a span's kind: the direct exchange's phase


@jax.jit
def pair_mean(lower: list, higher: list) -> list:
    """(lower + higher) * 0.5 per leaf: one order for both ends of a pair."""
    return jax.tree.map(lambda a, b: (a + b) * jnp.float32(0.5), lower, higher)


@jax.jit
def weighted(trees: list, weight) -> list:
    return jax.tree.map(lambda x: weight * x, trees)


@jax.jit
def corrected(params: list, total: list, own: list) -> list:
    """params + (the average it missed - its own snapshot's share)."""
    return jax.tree.map(lambda p, t, s: p + (t - s), params, total, own)


def _tag(stage: Any, step: int) -> int:
    return tags.replica_grads(step, stage.program.loss_microbatches)


def _send(stage: Any, step: int, trees: list, pipelines: set[int] | None = None) -> None:
    """Sends each peer stage (of ``pipelines``; None: all) the entries of the units it shares."""
    a = stage.first_unit
    for peer in stage.role.peers:
        if pipelines is None or peer.pipeline in pipelines:
            stage.replica_link.send(_tag(stage, step), trees[peer.start - a:peer.end - a],
                                    peer.address)


def _recv(stage: Any, step: int, like: list, pipelines: set[int] | None = None
          ) -> dict[tuple[int, int], Any]:
    """Receives from each peer stage (of ``pipelines``) its entries: ``{(unit, pipeline): tree}``."""
    a, got = stage.first_unit, {}
    for peer in stage.role.peers:
        if pipelines is None or peer.pipeline in pipelines:
            theirs = stage.replica_link.recv(
                _tag(stage, step), tree_shapes(like[peer.start - a:peer.end - a]), peer.address)
            for u, g in zip(range(peer.start, peer.end), theirs):
                got[u, peer.pipeline] = g
    return got


def _weight(stage: Any) -> Any:
    return jnp.float32(stage.program.microbatches / stage.program.loss_microbatches)


class _PeerAveraging:
    """What both peer modes share: inner steps on the pipeline's share, and average now. No
    state of their own survives a checkpoint (``STATE`` empty, as ``runtime.averaging``'s
    classes name theirs): average now leaves none; each pipeline's optimizer state is saved as
    its replica (``REPLICAS_DIFFER``)."""

    STATE: tuple[str, ...] = ()
    SHARED: tuple[str, ...] = ()
    REPLICAS_DIFFER = True  # params between averages, optimizer states always
    own_norm = True  # every pipeline clips by its own norm

    def export_state(self) -> dict[str, list]:
        return {}

    def held_bytes(self) -> int:
        """Bytes held beside the params that no checkpoint saves (``runtime.memory``)."""
        return 0

    def import_state(self, state: dict[str, list]) -> None:
        pass

    def grad_scale(self, stage: Any) -> float:
        """m / m_i: the pipeline's gradient becomes its own share's mean."""
        return stage.program.loss_microbatches / stage.program.microbatches

    def reduce(self, stage: Any, step: int) -> None:
        pass

    def average_now(self, stage: Any, step: int) -> None:
        """Every replica of the stage's units to the exact share-weighted average (module doc)."""
        t0 = stage.clock()
        mine = weighted(stage.state.params, _weight(stage))
        if stage.role.routes is not None:
            stage.state.params = stage.role.routes.run(stage, step, mine)
        else:
            _send(stage, step, mine)
            stage.state.params = sum_replicas(stage, mine, _recv(stage, step, mine))
        stage.record_span(DIRECT, t0)


class DecentralAveraging(_PeerAveraging):
    """Per stage: one peer per step, the pair's mean in one order (module doc)."""

    name = "decentral"

    def __init__(self, stage: Any, schedule: str):
        self.schedule = schedule

    def after_update(self, stage: Any, step: int) -> None:
        q = peer_of(stage.pipeline, step, stage.role.num_pipelines, self.schedule)
        if q is None:
            return
        t0 = stage.clock()
        stage.state.params = self._meet(stage, step, q)
        stage.record_span(DIRECT, t0)

    def _meet(self, stage: Any, step: int, q: int) -> list:
        """The stage's params after meeting pipeline ``q``: the pair's mean."""
        own = stage.state.params
        _send(stage, step, own, {q})
        got = _recv(stage, step, own, {q})
        a = stage.first_unit
        theirs = [got[a + j, q] for j in range(len(own))]
        return pair_mean(own, theirs) if stage.pipeline < q else pair_mean(theirs, own)


@jax.jit
def code_difference(params: list, common: list) -> Any:
    """int8 of params - common (what a decentral-int8 end sends)."""
    return codecs.encode("int8", jax.tree.map(jnp.subtract, params, common))


@jax.jit
def as_sent(coded: Any, common: list) -> list:
    """common + decode(coded): one end's parameters as its peer sees them (one function for
    both ends: the same bits)."""
    return jax.tree.map(jnp.add, common, codecs.decode("int8", coded, common))


@jax.jit
def kept_after(params: list, seen: list, mean: list) -> list:
    """mean + (params - seen): the pair's mean plus the replica's own rounding."""
    return jax.tree.map(lambda p, s, m: m + (p - s), params, seen, mean)


class DecentralInt8Averaging(DecentralAveraging):
    """Per stage: one peer per step, int8 differences to the pair's last mean (module doc)."""

    name = "decentral-int8"

    def __init__(self, stage: Any, schedule: str):
        super().__init__(stage, schedule)
        self.common: dict[int, list] | None = None  # peer pipeline -> the pair's last mean

    def reduce(self, stage: Any, step: int) -> None:
        """Before the step's update, while every replica holds the one model (the start, a
        resume, the step after average now): each pair's common mean starts there."""
        if self.common is None:
            n = stage.role.num_pipelines
            self.common = {q: jax.tree.map(lambda x: x.copy(), stage.state.params)
                           for q in peers_ever(stage.pipeline, n, self.schedule)}

    def _meet(self, stage: Any, step: int, q: int) -> list:
        """The pair's mean of what each sent, plus this replica's own rounding."""
        own, common = stage.state.params, self.common[q]
        coded = code_difference(own, common)
        _send(stage, step, coded, {q})
        got = _recv(stage, step, coded, {q})
        a = stage.first_unit
        seen_own = as_sent(coded, common)
        seen_theirs = as_sent([got[a + j, q] for j in range(len(own))], common)
        mean = (pair_mean(seen_own, seen_theirs) if stage.pipeline < q
                else pair_mean(seen_theirs, seen_own))
        self.common[q] = mean
        return kept_after(own, seen_own, mean)

    def average_now(self, stage: Any, step: int) -> None:
        super().average_now(stage, step)
        self.common = None

    def held_bytes(self) -> int:
        """Bytes of the pairs' common means held (not saved: average now clears them)."""
        return sum(int(x.nbytes) for trees in (self.common or {}).values()
                   for x in jax.tree.leaves(trees))


class AsyncAveraging(_PeerAveraging):
    """Per stage: the exact average of step t's snapshots applied at step t + k (module doc)."""

    name = "async"

    def __init__(self, stage: Any, staleness: int):
        self.k = max(int(staleness), 1)
        self.pending: dict[int, tuple[list, list]] = {}  # step -> (snapshot, weighted)

    def after_update(self, stage: Any, step: int) -> None:
        t0 = stage.clock()
        due = self.pending.pop(step - self.k, None)
        if due is not None:
            own, sent = due
            total = sum_replicas(stage, sent, _recv(stage, step - self.k, sent))
            stage.state.params = corrected(stage.state.params, total, own)
        if not self.pending:  # one exchange in flight: the next leaves as the last lands
            snap = jax.tree.map(lambda x: x.copy(), stage.state.params)
            mine = weighted(snap, _weight(stage))
            _send(stage, step, mine)
            self.pending[step] = (snap, mine)
        stage.record_span(DIRECT, t0)

    def average_now(self, stage: Any, step: int) -> None:
        for s in sorted(self.pending):  # what is in flight arrives, and is not applied
            _recv(stage, s, self.pending[s][1])
        self.pending = {}
        super().average_now(stage, step)

    def held_bytes(self) -> int:
        """Bytes of the exchange in flight (its snapshot and what was sent; not saved)."""
        return sum(int(x.nbytes) for x in jax.tree.leaves(list(self.pending.values())))


CLASSES = {c.name: c for c in (DecentralAveraging, DecentralInt8Averaging, AsyncAveraging)}


def state_class(mode: str) -> type | None:
    return CLASSES.get(mode)


def make(spec: Any, stage: Any) -> Any:
    """A stage's peer averaging for ``spec`` (``runtime.averaging.AveragingSpec``)."""
    if spec.mode == "async":
        return AsyncAveraging(stage, spec.staleness)
    if spec.mode == "decentral":
        return DecentralAveraging(stage, spec.peer_schedule)
    if spec.mode == "decentral-int8":
        return DecentralInt8Averaging(stage, spec.peer_schedule)
    raise ValueError(f"plan.averaging={spec.mode!r}: not run by this version")


def average_now(executor: Any, step: int) -> bool:
    """Every replica of a peer mode's plan to the exact average, after step ``step`` (0-based);
    every stage of the executor in this process (a local executor's in their threads). Returns
    whether it averaged (False: not a peer mode)."""
    stages = getattr(executor, "stages", None)  # a local executor's; else its own stage
    if stages is None:
        stages = [] if getattr(executor, "stage", None) is None else [executor.stage]
    stages = [s for s in stages if getattr(s.averaging, "average_now", None) is not None]
    if not stages:
        return False
    run = getattr(executor, "_all", None)
    if run is not None:
        run(lambda s: s.averaging.average_now(s, step), stages)
    else:
        for s in stages:
            s.averaging.average_now(s, step)
    return True
