"""One unit of a chain timed on each device, as a one-unit stage of the runtime's own programs,
and what it holds in memory.

* ``forward_s`` / ``backward_s``: one micro-batch through the unit, timed through
  :class:`~skyjax.programs.stage.StageProgram` (a jitted forward that keeps the ``jax.vjp``
  residuals, a jitted backward that applies them; the last unit includes the loss) and
  :func:`skyjax.cluster.timed_call` (the slow-down emulation the runtime uses). Compilation and
  warm-up calls are excluded; the mean of the fastest half of the repeats is kept
  (:func:`~skyjax.profile.options.robust_time`).
* Devices are measured one after another, interleaved repeat by repeat, so that load drift on a
  shared host hits them all. Fewer repeats for big units: a time budget per unit and device, at
  least ``min_repeats``.
* ``backward_input_s`` / ``backward_weight_s`` (``Options.weight``: zero-bubble runs): B and W
  of the backward split in two
  (``StageProgram.backward_input``, then ``backward_weight``), timed like the rest right after
  the whole backward on the same residuals (which it keeps).
* Memory: ``activation_bytes``, the residual arrays the forward returns (what the backward
  needs, per micro-batch in flight; measured, so in the dtype the forward keeps them in);
  ``temp_bytes``, the most scratch memory one of its stage calls needs; the
  ``memory_analysis()`` figures of the compiled forward, backward and update.

:mod:`skyjax.profile.units` calls this once per distinct unit and assembles the profile's
records; docs/design.md, "Profiling", says what each figure is for.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from skyjax import cluster as cluster_lib
from skyjax.models import bert
from skyjax.programs.calls import call_inputs, cotangent
from skyjax.profile.options import Options, robust_time
from skyjax.profile.stage_calls import stage_update
from skyjax.tree import tree_nbytes, tree_shapes


@dataclasses.dataclass
class UnitTimes:
    forward_s: dict  # device class -> seconds
    backward_s: dict
    activation_bytes: int
    repeats: int
    out_carry: Any
    memory: dict  # memory_analysis figures
    compile_s: float
    update_s: dict = dataclasses.field(default_factory=dict)  # device class -> seconds
    split_s: dict = dataclasses.field(default_factory=dict)  # (B, W) seconds (Options.weight)
    # device class -> [process CPU seconds, wall seconds] of the untimed (unslowed) calls: how
    # many of the host's cores one of its calls keeps busy (kept by extra probes that use it)
    cpu_wall: dict = dataclasses.field(default_factory=dict)


def _stage_program(unit: bert.Unit, is_last: bool):
    from skyjax.programs.stage import StageProgram

    return StageProgram([unit], is_last=is_last, microbatches=1, optimizer=None, train=True)


def _memory_analysis(compiled) -> dict:
    try:
        ma = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend has it
        return {}
    if ma is None:
        return {}
    return {k: int(getattr(ma, k)) for k in ("temp_size_in_bytes", "argument_size_in_bytes",
                                             "output_size_in_bytes") if hasattr(ma, k)}


def _compiled_update(unit: bert.Unit, is_last: bool, optimizer: optax.GradientTransformation,
                     params: list) -> Any:
    """The stage update of ``unit`` compiled for the shapes of ``params`` (for its
    ``memory_analysis()``: the update's scratch memory, which the stage needs once per step)."""
    prog = _stage_program(unit, is_last)
    prog.optimizer = optimizer
    shapes = tree_shapes(params)
    opt = jax.eval_shape(lambda p: [optimizer.init(q) for q in p], shapes)
    return prog.update.lower(shapes, opt, shapes, np.float32(1.0)).compile()


def temp_bytes(memory: dict) -> int:
    """The most scratch memory one stage call of a unit needs (forward, backward or update:
    the largest ``*_temp_size_in_bytes`` of its ``memory_analysis`` figures; 0 without them).
    A stage holds it on top of its state and residuals while the call runs."""
    return max((int(v) for k, v in memory.items() if k.endswith("temp_size_in_bytes")),
               default=0)


def device_params(params: Any, device: Any) -> list:
    """``[params]`` on ``device``; abstract parameters (``ShapeDtypeStruct`` leaves, as a process
    that does not own the unit has them) become small random arrays of their shape: the time of a
    unit does not depend on its parameter values."""
    def leaf(x: Any) -> Any:
        if isinstance(x, jax.ShapeDtypeStruct):
            with jax.default_device(device):
                return 0.02 * jax.random.normal(jax.random.PRNGKey(0), x.shape, x.dtype)
        return jax.device_put(x, device)

    return [jax.tree.map(leaf, params)]


def measure_unit(unit: bert.Unit, is_last: bool, carry: Any, labels: np.ndarray,
                  targets: list[tuple[Any, float]], options: Options,
                  optimizer: optax.GradientTransformation | None = None) -> UnitTimes:
    """Times one unit on each ``(jax device, slowdown)`` target (interleaved repeats); with
    ``optimizer`` also its update (:func:`stage_update`)."""
    prog = _stage_program(unit, is_last)
    states = []
    compile_s = 0.0
    estimate = 0.0
    activation_bytes = 0
    out_carry = None
    memory: dict = {}
    for k, (dev, slowdown) in enumerate(targets):
        params = device_params(unit.params, dev)
        c, rng, lab = call_inputs(carry, labels, is_last, dev)
        grads = jax.tree.map(jnp.zeros_like, params)
        # Compiled ahead of time for this device (the executable the jitted call would run),
        # which also gives its memory_analysis() without compiling twice.
        tic = time.perf_counter()
        fwd_c = prog.forward.lower(params, c, rng, lab).compile()
        out, res = cluster_lib.block(fwd_c(params, c, rng, lab))
        ct = cotangent(out, is_last)
        bwd_c = prog.backward.lower(params, res, ct, grads).compile()
        grads, _ = cluster_lib.block(bwd_c(params, res, ct, grads))
        split = None
        if options.weight:  # B and W, compiled the same way
            bi_c = prog.backward_input.lower(params, res, ct).compile()
            _, pending = cluster_lib.block(bi_c(params, res, ct))
            split = (bi_c, prog.backward_weight.lower(params, pending, grads).compile())
        compile_s += time.perf_counter() - tic
        if k == 0:
            activation_bytes = tree_nbytes(res)
            out_carry = out
            if options.memory_analysis:
                memory = {f"forward_{k2}": v for k2, v in _memory_analysis(fwd_c).items()}
                memory.update({f"backward_{k2}": v for k2, v in _memory_analysis(bwd_c).items()})
                if optimizer is not None:
                    memory.update({f"update_{k2}": v for k2, v in _memory_analysis(
                        _compiled_update(unit, is_last, optimizer, params)).items()})
        # One warm-up call each, not kept; it sizes the number of repeats.
        (_, res), tf = cluster_lib.timed_call(fwd_c, params, c, rng, lab, slowdown=slowdown)
        (grads, _), tb = cluster_lib.timed_call(bwd_c, params, res, ct, grads, slowdown=slowdown)
        if split:
            grads, t_split = _split_pair(split, params, res, ct, grads, slowdown)
            tb += sum(t_split)
        estimate = max(estimate, tf + tb)
        states.append([params, c, rng, lab, ct, grads, res, fwd_c, bwd_c, split])
    repeats = int(min(options.repeats,
                      max(options.min_repeats, options.budget_s // max(estimate, 1e-9))))
    fwd = {k: [] for k in range(len(targets))}
    bwd = {k: [] for k in range(len(targets))}
    wgt: dict = {k: [] for k in range(len(targets))}
    n = len(targets)
    cpu_wall = {k: [0.0, 0.0] for k in range(n)}
    for r in range(repeats):
        # Rotating the order spreads over all devices whatever the host does after the longest
        # emulated sleep (other processes grab the cores), instead of always hitting device 0.
        for k in [(r + i) % n for i in range(n)]:
            slowdown = targets[k][1]
            params, c, rng, lab, ct, grads, res, fwd_c, bwd_c, split = states[k]
            del res
            states[k][6] = None  # free the previous residuals before the next forward
            # The timed pair follows an untimed pair of the same unit: after an idle gap (another
            # device's emulated sleep) the first call runs up to 2x slower on a shared VM (cold
            # caches / reclaimed pages), which would bias the device measured right after a
            # slow one. Forward and backward alternate, as a stage's actions do: a call timed
            # right after an identical one (same inputs, outputs just freed) ran 2-5% faster than
            # the same unit inside a stage.
            cpu, wall = time.process_time(), time.perf_counter()
            _, warm_res = cluster_lib.block(fwd_c(params, c, rng, lab))
            grads, _ = cluster_lib.block(bwd_c(params, warm_res, ct, grads))
            del warm_res
            cpu_wall[k][0] += time.process_time() - cpu
            cpu_wall[k][1] += time.perf_counter() - wall
            (_, res), tf = cluster_lib.timed_call(fwd_c, params, c, rng, lab, slowdown=slowdown)
            (grads, _), tb = cluster_lib.timed_call(bwd_c, params, res, ct, grads,
                                                    slowdown=slowdown)
            if split:  # B then W on the same residuals (the backward keeps them)
                grads, t_split = _split_pair(split, params, res, ct, grads, slowdown)
                wgt[k].append(t_split)
            states[k][5], states[k][6] = grads, res
            fwd[k].append(tf)
            bwd[k].append(tb)
    update_s = {}
    if optimizer is not None:
        for k, (dev, slowdown) in enumerate(targets):
            update_s[k] = stage_update(_stage_program(unit, is_last), optimizer, states[k][0],
                                        dev, slowdown, repeats)
    del states
    return UnitTimes({k: robust_time(v) for k, v in fwd.items()},
                       {k: robust_time(v) for k, v in bwd.items()},
                       activation_bytes, repeats, out_carry, memory, compile_s, update_s,
                       {k: tuple(robust_time(x) for x in zip(*v)) for k, v in wgt.items() if v},
                       cpu_wall)


def _split_pair(split: tuple, params: list, res: Any, ct: Any, grads: list, slowdown: float
                ) -> tuple[list, tuple[float, float]]:
    """B then W (``split``: the compiled ``backward_input``, ``backward_weight``) of one
    micro-batch, each through ``timed_call``: the new gradients and the (B, W) seconds."""
    (_, pending), t_in = cluster_lib.timed_call(split[0], params, res, ct, slowdown=slowdown)
    grads, t_w = cluster_lib.timed_call(split[1], params, pending, grads, slowdown=slowdown)
    return grads, (t_in, t_w)
