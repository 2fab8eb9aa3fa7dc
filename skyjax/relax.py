"""How much a run may relax what crosses slow links: the user's bound, which the planner prices
per link and chooses within (docs/design.md, "Relaxation on slow links").

* Stage hand-offs: each link of a pipeline may carry activations and cotangents in any codec of
  :mod:`skyjax.codecs` with at least ``handoff_bits`` bits per value (32: exact, the default).
* Averaging across pipelines (several pipelines only), from exact to most relaxed:
  ``exact`` (the summed gradients, bit-identical on every owner); ``int8-across`` (exact inside
  each link group (region), the groups' partial sums in the int8 codec between groups, with
  error feedback at each group's representative); ``int8`` (each pipeline's gradients in the
  int8 codec, with error feedback: what rounding dropped is added to the next step's gradients,
  so over steps nothing is lost, only delayed, as in BAGUA's ByteGrad and 1-bit Adam);
  ``diloco-across`` (each region's pipelines are one exact data-parallel group every step, and
  the regions take DiLoCo's outer step every H steps, INTELLECT-1's pattern); ``diloco`` (each
  pipeline takes ``outer_every`` = H inner optimizer steps on its own share, then the pipelines
  average their pseudo-gradients, the parameters' change since the last outer step, and an
  outer Nesterov SGD (``outer_lr``, ``outer_momentum``) moves the common parameters: one
  exchange every H steps). ``averaging`` names the most relaxed one allowed, every mode before
  it in that order allowed too; the planner picks the cheapest allowed for the plan's split.
  DiLoCo's 0.7 and 0.9 are for thousands of outer steps; over the tens of a short fine-tuning
  run momentum 0.9 overshoots and the demo does not learn, where 0.5 does
  (``experiments/relax_bench.py``): hence 0.7 and 0.5 here.
* The relaxed averagings' wire (``outer_compression``, a bound of its own): ``none`` sends what
  each mode sends; ``topk4`` / ``topk2`` send int8's gradients, DiLoCo's outer deltas and the
  ``-across`` modes' partial sums between groups as the top ``outer_topk`` of each chunk in 4 or
  2 bits, with error feedback per replica (:mod:`skyjax.compress`,
  :mod:`skyjax.runtime.compressed`; SparseLoCo, CocktailSGD).

Beside that order, a bound per axis (docs/design.md, "Relaxation on slow links";
:mod:`skyjax.runtime.decentralized`): ``peers`` (``ring`` or ``exponential``, the one-peer
exponential graph; ``none``: not allowed) allows ``decentral``, each pipeline's replica
averaging with one peer per step, and with ``peer_bits`` 8 also ``decentral-int8``, the same
with each replica's difference to the pair's last common mean sent in int8, what rounding drops
kept in the replica (BAGUA's low-precision decentralized SGD); ``async_steps`` = k >= 1 allows
``async``, the exact average applied k steps late (its staleness), the exchange beside the next
k steps.

The planner takes a relaxed plan only where its predicted step is at least ``min_gain`` below
the exact plan's: a relaxation changes the math, and the cost model does not price what it may
cost in convergence, so it must buy a clear gain in time (on a fast link nothing is relaxed).

A relaxation changes the math, so all of it is opt-in: the default :class:`Relaxation` allows
nothing, and the planner then prices and chooses exactly what it did without this module.
"""

from __future__ import annotations

import dataclasses

from skyjax.names import (AVERAGING, CODEC_BITS, CODECS, OUTER_COMPRESSIONS, PEER_BITS,
                          PEER_SCHEDULES)
from skyjax.topk_wire import FRACTION


@dataclasses.dataclass(frozen=True)
class Relaxation:
    """The user's bound (``config.relax``); the default allows nothing."""

    handoff_bits: int = 32
    averaging: str = "exact"
    outer_every: int = 10
    outer_lr: float = 0.7
    outer_momentum: float = 0.5
    min_gain: float = 0.05  # the least fraction of the step a relaxed plan must save
    peers: str = "none"  # decentral's peer schedule (skyjax.plan.pricing.peers); none: off
    async_steps: int = 0  # async's staleness k (0: not allowed)
    peer_bits: int = 32  # 8: decentral-int8 allowed too (PEER_BITS)
    outer_compression: str = "none"  # OUTER_COMPRESSIONS: the relaxed averagings' wire
    outer_topk: float = FRACTION  # the fraction of each chunk it keeps

    def __post_init__(self):
        if self.handoff_bits not in CODEC_BITS.values():
            raise ValueError(f"relax.handoff_bits: expected one of "
                             f"{sorted(set(CODEC_BITS.values()))}, got {self.handoff_bits!r}")
        if self.averaging not in AVERAGING:
            raise ValueError(f"relax.averaging: expected one of {AVERAGING}, "
                             f"got {self.averaging!r}")
        if not 0 <= self.min_gain < 1:
            raise ValueError(f"relax.min_gain: expected a fraction in [0, 1), got "
                             f"{self.min_gain!r}")
        if self.outer_compression not in OUTER_COMPRESSIONS:
            raise ValueError(f"relax.outer_compression: expected one of {OUTER_COMPRESSIONS}, "
                             f"got {self.outer_compression!r}")
        if not 0 < self.outer_topk <= 1:
            raise ValueError(f"relax.outer_topk: expected a fraction in (0, 1], got "
                             f"{self.outer_topk!r}")
        if self.peers not in PEER_SCHEDULES or int(self.async_steps) != self.async_steps \
                or self.async_steps < 0:
            raise ValueError(f"relax: peers in {PEER_SCHEDULES} and async_steps >= 0 expected, "
                             f"got {self.peers!r}, {self.async_steps!r}")
        if self.peer_bits not in PEER_BITS:
            raise ValueError(f"relax.peer_bits: expected one of {PEER_BITS}, got "
                             f"{self.peer_bits!r}")
        if self.averaging.startswith("diloco") and self.outer_every < 1:
            raise ValueError(f"relax.outer_every: expected a positive integer for diloco, got "
                             f"{self.outer_every!r}")

    @property
    def handoff_codecs(self) -> tuple[str, ...]:
        """The codecs a hand-off may use (``none`` first)."""
        return tuple(c for c in CODECS if CODEC_BITS[c] >= self.handoff_bits)

    @property
    def averagings(self) -> tuple[str, ...]:
        """The averaging modes allowed (``exact`` first; the per-axis ones last)."""
        return AVERAGING[:AVERAGING.index(self.averaging) + 1] + (
            ("decentral",) * (self.peers != "none")
            + ("decentral-int8",) * (self.peers != "none" and self.peer_bits == 8)
            + ("async",) * (self.async_steps > 0))

    @property
    def measured_codecs(self) -> tuple[str, ...]:
        """The codecs the profiler must time for this bound: the hand-off codecs allowed, and
        int8 where the averaging may be int8 (across link groups, everywhere, or to a peer)."""
        coded = any(a.startswith("int8") or a.endswith("int8") for a in self.averagings)
        names = set(self.handoff_codecs[1:]) | ({"int8"} if coded else set())
        outer = (self.outer_compression,) if self.compressed else ()
        return tuple(c for c in CODECS if c in names) + outer

    @property
    def compressed(self) -> bool:
        """Whether the relaxed averagings' exchange is in top-k (``outer_compression``)."""
        return self.outer_compression != "none" and self.averaging != "exact"

    @property
    def ordered_only(self) -> "Relaxation | None":
        """This bound without its per-axis peer modes (None: it allows none)."""
        if self.peers == "none" and self.async_steps == 0:
            return None
        return dataclasses.replace(self, peers="none", async_steps=0, peer_bits=32)

    @property
    def is_exact(self) -> bool:
        return self.handoff_bits == 32 and self.averagings == ("exact",)

    @classmethod
    def from_config(cls, config) -> "Relaxation":
        r = config.relax
        return cls(int(r.handoff_bits), str(r.averaging), int(r.outer_every),
                   float(r.outer_lr), float(r.outer_momentum), float(r.min_gain),
                   outer_compression=str(r.get("outer_compression", "none")),
                   outer_topk=float(r.get("outer_topk", FRACTION)),
                   peers=str(r.get("peers", "none")),
                   async_steps=int(r.get("async_steps", 0)),
                   peer_bits=int(r.get("peer_bits", 32)))


EXACT = Relaxation()
