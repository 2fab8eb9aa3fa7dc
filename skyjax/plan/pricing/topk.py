"""The price of ``relax.outer_compression`` (:mod:`skyjax.compress`): bytes on the wire per
gradient byte and each device's coding seconds per gradient byte, what the exchange's cost
(``exchange.relaxed_exchange``), the simulator (``replay.exchange_run``) and the declared times
(``replay.rehearsal``) charge for the compressed averagings.

The ratio is the model's: the compressed bytes of every unit's gradients (per unit, n = its
``param_bytes`` / 4 float32 values, :func:`skyjax.topk_wire.payload_bytes`) over their float32
bytes, so a message carrying every unit prices the bytes the runtime sends, and one carrying a
few units their mean ratio (the last chunk's padding of each unit spread over the model). The
coding rate is the profile's, measured like a hand-off codec's (``profile.codecs[<name>]``:
one encode and one decode per gradient byte, :mod:`skyjax.profile.codec_times`).
"""

from __future__ import annotations

import numpy as np

from skyjax.profile.format import Profile
from skyjax.topk_wire import bits_of, payload_bytes


def wire_ratio(gprefix: np.ndarray, fraction: float, bits: int) -> float:
    """Compressed bytes over float32 bytes of the units whose gradient bytes ``gprefix`` [U+1]
    sums (module doc)."""
    sizes = [float(b) for b in np.diff(np.asarray(gprefix, float))]
    total = sum(sizes)
    if total <= 0:
        return 1.0
    return sum(payload_bytes(int(round(g / 4)), fraction, bits) for g in sizes if g > 0) / total


def rate(profile: Profile, compression: str) -> np.ndarray:
    """Each device's coding seconds per gradient byte for ``compression``; a clear error where
    the profile has not measured it."""
    if compression not in profile.codecs:
        raise ValueError(f"relax.outer_compression={compression}: pricing it needs its coding "
                         f"times (profile.codecs.{compression}), which this profile lacks: "
                         f"profile again with this bound")
    return np.asarray(profile.codecs[compression]["seconds_per_byte"], float)


def coder(profile: Profile, gprefix: np.ndarray, compression: str, fraction: float
          ) -> tuple[float, np.ndarray] | None:
    """(wire bytes per gradient byte, coding seconds per gradient byte [D]) of ``compression``
    at ``fraction``; None where it is ``none`` (each mode's own wire)."""
    if compression in ("", "none"):
        return None
    return (wire_ratio(gprefix, fraction, bits_of(compression)), rate(profile, compression))


def relax_coder(profile: Profile, gprefix: np.ndarray) -> tuple[float, np.ndarray] | None:
    """:func:`coder` of the bound ``profile.relax`` (None: not compressed)."""
    r = profile.relax
    return coder(profile, gprefix, r.outer_compression, r.outer_topk) if r.compressed else None


COMPRESSED = ("int8-across", "int8", "diloco-across", "diloco")  # the modes it codes


def plan_fields(relax, averaging: str) -> dict:
    """The Plan fields of the bound's compression for a plan averaging by ``averaging``."""
    if not relax.compressed or averaging not in COMPRESSED:
        return {}
    return {"outer_compression": relax.outer_compression, "outer_topk": relax.outer_topk}
