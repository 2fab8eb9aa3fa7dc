"""Averaging between replicas without a global exchange per step, as plain data: decentralized
averaging's peer schedule and both peer modes' prices (docs/design.md, "Relaxation on slow
links"; the runtime is :mod:`skyjax.runtime.decentralized`).

Peer schedules over n pipelines, step t (a matching: each pipeline has at most one peer, and
its peer has it, so both ends of a pair compute the same average):

* ``ring``: pipelines (i, i + 1) for i = t mod 2, t mod 2 + 2, ... while i + 1 < n, and, with n
  even and above 2, (0, n - 1) at odd steps: even steps pair 0-1, 2-3, ..., odd steps 1-2,
  3-4, ..., n-1-0 (a ring over two steps; with n odd, a path: one pipeline sits out each step).
  Two pipelines pair every step. Period 2 (1 with two pipelines).
* ``exponential`` (the one-peer exponential graph): pipeline i pairs with i XOR 2^j, j = t mod
  ceil(log2 n); for n not a power of two a pipeline whose partner is n or above sits out that
  step. Period ceil(log2 n). After ``period`` steps of a power of two every replica has mixed
  with every other.

Prices (the cost model's AR per step, :func:`decentral_s`, :func:`async_s`):

* ``decentral``: at step t each owner sends its units' parameters (float32, ``grad_bytes``) to
  its peer's owners of them, one phase; AR_t = max_d sum over d's messages of (latency +
  bytes / bandwidth); AR = the mean of AR_t over the period.
* ``decentral-int8``: the same messages in the int8 codec (``INT8_WIRE`` of the bytes, plus
  the sender's int8 coding seconds per byte, as the ``int8`` exchange prices them).
* ``async``: the direct exact exchange of every replica's parameters (X = its AR), one every k
  steps (k = ``async_steps``, its staleness), runs beside those k steps: it lengthens the step
  only where it outlasts them, T = max(compute, X / k); AR = T - compute (compute = max_i T_i +
  sync_s).
"""

from __future__ import annotations

import math
import numpy as np

from skyjax.plan.pricing.exchange import (BETWEEN, INT8_WIRE, Chains, Message, Routing,
                                          routing, routing_s)


def period(n: int, schedule: str) -> int:
    """Steps after which ``schedule``'s pairings repeat (1 for fewer than three pipelines)."""
    if n <= 2:
        return 1
    if schedule == "ring":
        return 2
    return max(1, math.ceil(math.log2(n)))


def pairs(step: int, n: int, schedule: str) -> list[tuple[int, int]]:
    """The (lower, higher) pipeline pairs that average at ``step`` (module doc)."""
    if n < 2:
        return []
    if n == 2:
        return [(0, 1)]
    if schedule == "ring":
        out = [(i, i + 1) for i in range(step % 2, n - 1, 2)]
        if n % 2 == 0 and step % 2:
            out.append((0, n - 1))
        return sorted(out)
    if schedule != "exponential":
        raise ValueError(f"peer schedule: expected ring or exponential, got {schedule!r}")
    bit = 1 << (step % period(n, schedule))
    return [(i, i ^ bit) for i in range(n) if i < (i ^ bit) < n]


def peer_of(pipeline: int, step: int, n: int, schedule: str) -> int | None:
    """``pipeline``'s peer at ``step`` (None: it sits out)."""
    for a, b in pairs(step, n, schedule):
        if pipeline in (a, b):
            return b if pipeline == a else a
    return None


def peers_ever(pipeline: int, n: int, schedule: str) -> list[int]:
    """Every peer ``pipeline`` meets over a period, in order of first meeting."""
    out: list[int] = []
    for t in range(period(n, schedule)):
        q = peer_of(pipeline, t, n, schedule)
        if q is not None and q not in out:
            out.append(q)
    return out


def pair_messages(chains: Chains, step: int, schedule: str) -> list[Message]:
    """The messages of ``step``'s pairs: each owner of a unit sends it to its peer's owner,
    bundled per (sender, receiver); phase ``BETWEEN`` (one phase)."""
    bundles: dict[tuple[int, int], list[int]] = {}
    for i, j in pairs(step, len(chains), schedule):
        for d, a, b in chains[i]:
            for e, c, f in chains[j]:
                units = list(range(max(a, c), min(b, f)))
                if units:
                    bundles.setdefault((d, e), []).extend(units)
                    bundles.setdefault((e, d), []).extend(units)
    return [Message(BETWEEN, s, d, tuple(sorted(us))) for (s, d), us in sorted(bundles.items())]


def peer_wire(mode: str, profile) -> tuple[float, np.ndarray | None]:
    """(wire bytes per parameter byte, coding seconds per byte [D] or None) of a peer mode's
    messages: ``decentral-int8``'s int8, the others' float32."""
    if mode != "decentral-int8":
        return 1.0, None
    if "int8" not in profile.codecs:
        raise ValueError("relax.peer_bits=8: pricing decentral-int8 needs the int8 codec's "
                         "timings (profile.codecs.int8), which this profile lacks: profile "
                         "again with this bound")
    return INT8_WIRE, np.asarray(profile.codecs["int8"]["seconds_per_byte"], float)


def decentral_s(chains: Chains, gprefix: np.ndarray, latency: np.ndarray,
                bandwidth: np.ndarray, schedule: str, wire: float = 1.0,
                coder_s: np.ndarray | None = None) -> float:
    """``decentral``'s AR per step: the mean over the period of each step's pair exchange
    (module doc)."""
    n = len(chains)
    steps = [routing_s(Routing({}, {}, pair_messages(chains, t, schedule)), gprefix, latency,
                       bandwidth, wire, coder_s)[0] for t in range(period(n, schedule))]
    return float(sum(steps) / len(steps))


def async_s(chains: Chains, gprefix: np.ndarray, latency: np.ndarray, bandwidth: np.ndarray,
            staleness: int, compute_s: float = 0.0) -> float:
    """``async``'s AR per step beyond ``compute_s`` (module doc)."""
    x = routing_s(routing(chains, None), gprefix, latency, bandwidth)[0]
    return max(0.0, x / max(int(staleness), 1) - float(compute_s))


def state_copies(mode: str, pipelines: int, staleness: int, schedule: str) -> int:
    """Copies of a stage's parameters (float32) a peer mode keeps: ``decentral`` none (its pair
    average is the replica's own params); ``decentral-int8`` the last common mean of each peer
    it meets (the most over the pipelines); ``async`` its snapshot in flight and the n - 1 of
    its peers it receives (one exchange in flight at a time, whatever k)."""
    if mode == "async":
        return max(int(pipelines), 2)
    if mode == "decentral-int8":
        n = int(pipelines)
        return max(len(peers_ever(i, n, schedule)) for i in range(n)) if n > 1 else 0
    return 0


def staleness_of(mode: str, relax) -> int:
    """The steps by which a mode's average lands late: async's k, 0 otherwise."""
    return int(relax.async_steps) if mode == "async" else 0


def plan_fields(mode: str, relax) -> dict:
    """The Plan fields of a peer mode: ``peer_schedule`` (decentral) and ``staleness``, the
    steps by which its average lands late (async's k; stated in the plan)."""
    if mode.startswith("decentral"):
        return {"peer_schedule": relax.peers}
    if mode == "async":
        return {"staleness": int(relax.async_steps)}
    return {}
