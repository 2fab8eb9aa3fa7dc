"""What a profile says each pass and hand-off codec costs, as the cost model reads it: the
backward split into B (input gradient) and W (weight gradient) where zero bubble runs them
apart, and the codecs a relaxation allows with their bytes and coding rates. One home for these
readings: the tables (:mod:`skyjax.plan.pricing.cost`), the per-stage action times
(:mod:`skyjax.plan.pricing.stage_times`) and the replays all take them from here.
"""

from __future__ import annotations

import numpy as np

from skyjax.names import ZERO_BUBBLE
from skyjax.profile.format import Profile


def split_measured(profile: Profile) -> bool:
    """Whether the profile measured both halves of the split backward (``backward_input_s``
    and ``backward_weight_s``): zero bubble then prices B and W as measured."""
    return profile.backward_input_s is not None and profile.backward_weight_s is not None


def weight_s(profile: Profile) -> np.ndarray:
    """[U, D] the W pass of each unit: the profile's ``backward_weight_s`` as measured where it
    also has ``backward_input_s``; else ``backward_weight_s`` within ``backward_s``, or half of
    ``backward_s`` where W was not measured (the FLOP model's 1:1 split)."""
    got = profile.backward_weight_s
    if split_measured(profile):
        return np.asarray(got, float)
    bwd = np.asarray(profile.backward_s, float)
    return np.minimum(np.asarray(got, float), bwd) if got is not None else bwd / 2


def input_s(profile: Profile) -> np.ndarray:
    """[U, D] the B pass of each unit (the input gradient alone): the profile's
    ``backward_input_s`` where it measured both halves, else ``backward_s`` less W."""
    if split_measured(profile):
        return np.asarray(profile.backward_input_s, float)
    return np.asarray(profile.backward_s, float) - weight_s(profile)


def backward_s(profile: Profile, schedule: str) -> np.ndarray:
    """[U, D] the backward a stage runs per micro-batch: under zero bubble with both halves
    measured, B + W (split in two calls it costs more than whole: about 1.2x on CPU); else
    ``backward_s``."""
    if schedule in ZERO_BUBBLE and split_measured(profile):
        return input_s(profile) + weight_s(profile)
    return np.asarray(profile.backward_s, float)


def codec_tables(profile: Profile) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """The hand-off codecs ``profile.relax`` allows, with their bytes [C, U] and rates [C, D]
    (``none`` first: the uncoded bytes, no codec time). A codec the bound allows but the profile
    has not measured is an error naming it."""
    out_bytes = [float(u["output_bytes"]) for u in profile.units]
    names, rows, rates = ["none"], [out_bytes], [np.zeros(profile.num_devices)]
    for name in profile.relax.handoff_codecs[1:]:
        if name not in profile.codecs:
            raise ValueError(f"relax.handoff_bits={profile.relax.handoff_bits} allows the {name} "
                             f"codec but the profile has not measured it (profile.codecs has "
                             f"{sorted(profile.codecs) or 'none'}): profile again with this "
                             f"bound")
        names.append(name)
        rows.append(np.asarray(profile.codecs[name]["output_bytes"], float))
        rates.append(np.asarray(profile.codecs[name]["seconds_per_byte"], float))
    return tuple(names), np.array(rows), np.array(rates)
