"""What putting a step's inputs on a device costs the host: profile.json's ``overheads.input_s``
(docs/design.md, "Profiling" and "The cost model").

The runtime puts each step's forward inputs on a stage's device in one transfer (per
micro-batch: the first stage's carry, the last stage's labels and the dropout key;
``skyjax.runtime.steps.StepInputs``), during the stage's first wait of the step before. A plan
of one stage has no such wait, so its put lands on the critical path, and the cost model
charges ``m * input_s[d]`` to such a plan's step (``skyjax.plan.pricing.cost.Tables.alone``);
in a longer pipeline the put fits in the waits. The batches themselves are built ahead by the
data's prefetch thread (``skyjax.data.prefetch``), off the critical path, so the profile has no
term for building them.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from skyjax.profile.options import evict_caches, robust_time


def measure_input_put(targets: list[tuple[Any, float]], carry: Any, labels: np.ndarray,
                      repeats: int) -> list[float]:
    """Per target ``(jax device, slowdown)``: seconds to derive one micro-batch's dropout key and
    put its carry, labels and key on the device, as ``PipelineStage.step_inputs`` does; the
    robust time of ``repeats`` after a warm-up, each after the host's caches are evicted (the put
    follows the step's compute). A host transfer, so the emulated slow-down does not apply."""
    from skyjax.baseline import microbatch_rng

    host = jax.tree.map(np.asarray, carry)
    labels = np.asarray(labels)
    out = []
    for dev, _ in targets:
        times = []
        for r in range(repeats + 1):
            evict_caches()
            tic = time.perf_counter()
            key = microbatch_rng(0, r, 0, len(labels))
            jax.block_until_ready(jax.device_put(([host], [labels], [key]), dev))
            if r:
                times.append(time.perf_counter() - tic)
        out.append(robust_time(times))
    return out

