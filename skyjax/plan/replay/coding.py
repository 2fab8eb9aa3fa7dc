"""What a plan's averaging codes on the wire, as the simulator (``exchange_run``) and the declared
times (``rehearsal``) replay it: the coded phases, the bytes per gradient byte there and each
device's coding seconds per gradient byte.

* ``int8`` / ``int8-across``: every phase / phase 2, in the int8 codec (``INT8_WIRE``, the
  profile's int8 rate);
* with ``outer_compression`` (:mod:`skyjax.plan.pricing.topk`): ``int8`` and ``diloco`` every
  phase (``diloco``'s only at its outer step), ``int8-across`` and ``diloco-across`` phase 2,
  in top-k at the plan's ``outer_topk``;
* otherwise nothing is coded.
"""

from __future__ import annotations

import numpy as np

from skyjax.plan.data_parallel.pipelines import grad_prefix
from skyjax.plan.model.types import Plan
from skyjax.plan.pricing import topk
from skyjax.plan.pricing.exchange import BETWEEN, INT8_WIRE, PHASES
from skyjax.profile.format import Profile


def wire_coder(profile: Profile, compression: str, fraction: float
               ) -> tuple[float, np.ndarray]:
    """(wire bytes per gradient byte, coding seconds per gradient byte [D]) of a coded message:
    top-k where ``compression`` names it, else int8."""
    top = topk.coder(profile, grad_prefix(profile), compression, fraction)
    if top is not None:
        return top
    return INT8_WIRE, np.asarray(profile.codecs["int8"]["seconds_per_byte"], float)


def coded_phases(plan: Plan) -> tuple[int, ...]:
    """The phases whose messages ``plan``'s averaging codes (module doc)."""
    mode = plan.averaging
    if plan.num_pipelines < 2 or mode == "exact":
        return ()
    if plan.outer_compression == "none" and not mode.startswith("int8"):
        return ()
    return PHASES if mode in ("int8", "diloco") else (BETWEEN,)


def plan_coding(plan: Plan, profile: Profile
                ) -> tuple[tuple[int, ...], float, np.ndarray | None]:
    """(coded phases, wire bytes per gradient byte in them, coding seconds per gradient byte
    [D] or None) of ``plan``'s averaging (module doc)."""
    phases = coded_phases(plan)
    if not phases:
        return (), 1.0, None
    return (phases, *wire_coder(profile, plan.outer_compression, plan.outer_topk))
