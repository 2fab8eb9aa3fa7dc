"""The stage calls a profile times apart from the units: the fixed seconds of a forward, a
backward and an update call whatever the stage holds, and the time of a stage's update.

Reason: the cost model charges a call's fixed part once per stage action and each unit's time
on top, so the unit times (measured as one-unit stages) have the fixed part taken out
(:mod:`skyjax.profile.units`) and the fixed part is measured here, over an empty block. The
update is timed as a step pays it, caches evicted first (``stage_update``).
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from skyjax import cluster as cluster_lib
from skyjax.programs.calls import call_inputs, cotangent
from skyjax.profile.options import Options, evict_caches, robust_time


def stage_update(prog, optimizer: optax.GradientTransformation, params: list, dev: Any,
                  slowdown: float, repeats: int) -> float:
    """Seconds of one step's update of ``params`` as a stage pays it: its share of the
    gradient norm (``skyjax.optim.global_sq_norm``, read back to the host) and the jitted optax
    update (emulated slow-down included); the robust time of ``repeats`` after a warm-up.

    Each timed update starts with the host's caches evicted (``options.evict_caches``): in a step
    the update reads its parameters, gradients and optimizer moments once, after the step's
    forwards and backwards streamed everything else through the caches. Timed back to back
    instead, it ran 15-25% faster than inside the step (shipped model, CPU)."""
    from skyjax.optim import global_sq_norm

    prog.optimizer = optimizer
    # the update donates its inputs: give it copies, never the caller's (or the model's) arrays
    state = prog.init_state(jax.device_put(jax.tree.map(jnp.copy, params), dev))
    scale = np.float32(1.0)
    times = []
    # Two warm-up calls: should a second compile happen (inputs placed differently from the
    # update's own outputs; ``StageProgram.init_state`` commits them to avoid it), it is not timed.
    warmup = 2
    for r in range(repeats + warmup):
        evict_caches()
        tic = time.perf_counter()
        float(global_sq_norm(state.grads))
        (state.params, state.opt_state, state.grads), t_upd = cluster_lib.timed_call(
            prog.update, state.params, state.opt_state, state.grads, scale, slowdown=slowdown)
        if r >= warmup:
            times.append(time.perf_counter() - tic)
    return robust_time(times)


def measure_call_costs(targets: list[tuple[Any, float]], carry: Any,
                       optimizer: optax.GradientTransformation | None, options: Options
                       ) -> dict[str, list[float]]:
    """Per target ``(jax device, slowdown)``: the fixed seconds of a forward, a backward and an
    update call of a stage, whatever its size: the same programs over an empty block (the carry
    passes through; no parameters). The cost model adds them once per stage action and takes
    them out of the unit times, which were measured as one-unit stages."""
    from skyjax.programs.stage import StageProgram

    out: dict[str, list[float]] = {"forward_call_s": [], "backward_call_s": [],
                                   "update_call_s": []}
    repeats = max(options.repeats, 5)
    for dev, slowdown in targets:
        prog = StageProgram([], is_last=False, microbatches=1, optimizer=None, train=True)
        c, rng, _ = call_inputs(carry, None, False, dev)
        out_c, res = cluster_lib.block(prog.forward([], c, rng, None))
        ct = cotangent(out_c, False)
        cluster_lib.block(prog.backward([], res, ct, []))
        tf, tb = [], []
        for _ in range(repeats + 1):
            (_, res), t1 = cluster_lib.timed_call(prog.forward, [], c, rng, None,
                                                  slowdown=slowdown)
            _, t2 = cluster_lib.timed_call(prog.backward, [], res, ct, [], slowdown=slowdown)
            tf.append(t1)
            tb.append(t2)
        out["forward_call_s"].append(robust_time(tf[1:]))
        out["backward_call_s"].append(robust_time(tb[1:]))
        out["update_call_s"].append(
            stage_update(prog, optimizer, [], dev, slowdown, repeats) if optimizer else 0.0)
    return out
