"""Timing and sizing the units of a chain on the cluster's devices.

* ``forward_s`` / ``backward_s``: one micro-batch through the unit, timed through the runtime's own
  :class:`~skyjax.programs.stage.StageProgram` (a single-unit stage: jitted forward that keeps the
  ``jax.vjp`` residuals, jitted backward that applies them; the last unit includes the loss) and
  :func:`skyjax.cluster.timed_call` (the same slow-down emulation the runtime uses). Compilation
  and warm-up calls are excluded; the mean of the fastest half of the repeats is kept
  (:func:`~skyjax.profile.options.robust_time`). Devices are measured one after another,
  interleaved repeat by repeat so that load drift on a shared host hits them all. The number of
  repeats shrinks for big units (a time budget per unit and device, at least ``min_repeats``).
* ``backward_weight_s`` (``Options.weight``: zero-bubble runs): W of the backward split in two
  (``StageProgram.backward_input``, then ``backward_weight``), timed like the rest right after
  the whole backward on the same residuals (which it keeps), less the fixed part of a backward
  call (an empty block's B or W call costs the same, microseconds: not charged apart).
* ``state_bytes``: params + gradients + optimizer state, exactly from the pytrees
  (``jax.eval_shape`` of the optimizer's ``init``: AdamW keeps two more copies);
  ``activation_bytes``: the residual arrays the stage's forward returns (what backward needs, per
  micro-batch in flight; measured, so in the dtype the forward keeps them in);
  ``output_bytes``: the unit's output carry (the message to the next stage);
  ``temp_bytes``: the most scratch memory one of its stage calls needs (:func:`temp_bytes`).
  ``memory_analysis()`` of the compiled forward/backward/update is recorded as extra keys.

Identical units (same kind, parameter shapes and input shapes) are measured once and reused;
identical devices (same kind, process and emulated slow-down) likewise.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from skyjax import cluster as cluster_lib
from skyjax.models import bert
from skyjax.programs.calls import call_inputs, cotangent
from skyjax.profile.chain import ChainSpec
from skyjax.profile.codec_times import measure_codecs, output_likes
from skyjax.profile.inputs import measure_input_put
from skyjax.profile.options import Log, Options, evict_caches, robust_time
from skyjax.profile.eta import fmt_s
from skyjax.tree import tree_avals, tree_nbytes, tree_shapes


@dataclasses.dataclass
class _UnitResult:
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


def _stage_update(prog, optimizer: optax.GradientTransformation, params: list, dev: Any,
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
            _stage_update(prog, optimizer, [], dev, slowdown, repeats) if optimizer else 0.0)
    return out


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


def _measure_unit(unit: bert.Unit, is_last: bool, carry: Any, labels: np.ndarray,
                  targets: list[tuple[Any, float]], options: Options,
                  optimizer: optax.GradientTransformation | None = None) -> _UnitResult:
    """Times one unit on each ``(jax device, slowdown)`` target (interleaved repeats); with
    ``optimizer`` also its update (:func:`_stage_update`)."""
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
            update_s[k] = _stage_update(_stage_program(unit, is_last), optimizer, states[k][0],
                                        dev, slowdown, repeats)
    del states
    return _UnitResult({k: robust_time(v) for k, v in fwd.items()},
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


def _signature(unit: bert.Unit, is_last: bool, carry: Any) -> tuple:
    """What makes two units time alike: kind, loss or not, parameter and input avals."""
    return (unit.kind, is_last, jax.tree.structure(unit.params), tree_avals(unit.params),
            jax.tree.structure(carry), tree_avals(carry))


def measured_classes(cluster: cluster_lib.Cluster, dedup: bool,
                     only: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
    """Devices timed once for all like them: ``(representative device of each class, class of
    each device)``; a class = same kind, process and slow-down (only those devices in ``only``
    are measured; others get class -1). Not the planner's ``device_classes``, which groups
    devices by their measured costs."""
    reps: list[int] = []
    keys: dict = {}
    cls = []
    for d, spec in enumerate(cluster.devices):
        if only is not None and d not in only:
            cls.append(-1)
            continue
        key = (spec.kind, spec.process_index, spec.slowdown) if dedup else d
        if key not in keys:
            keys[key] = len(reps)
            reps.append(d)
        cls.append(keys[key])
    return reps, cls


def _output_bytes(chain: list[bert.Unit], carry: Any) -> list[int]:
    """Each unit's output carry in bytes, from shapes alone."""
    return [tree_nbytes(c) for c in output_likes(chain, carry)]


def measure_units(spec: ChainSpec, sample: tuple[Any, np.ndarray], cluster: cluster_lib.Cluster,
                  options: Options, optimizer: optax.GradientTransformation, log: Log,
                  only_devices: Sequence[int] | None = None, wake: bool = True) -> dict:
    """Times and sizes every unit of ``spec`` on the cluster's devices (or ``only_devices``).

    ``sample``: ``(first unit's carry, labels)`` of one micro-batch; ``optimizer``: the training
    optimizer (only its state's size is used). Returns ``units`` (profile records),
    ``forward_s`` / ``backward_s`` ``[U, D]`` (NaN for devices not measured), with
    ``options.weight`` also the split's ``backward_input_s`` / ``backward_weight_s`` (else None),
    and ``compile_s``;
    ``wake=False`` leaves out the calls after idle (measured only by extra probes that time them,
    ``options.host``, in their first pass).
    """
    reps, cls = measured_classes(cluster, options.dedup_devices, only_devices)
    targets = [(cluster.jax_devices[d], cluster.devices[d].slowdown) for d in reps]
    carry, labels = sample
    n_chain = len(spec.chain)
    measured: dict[tuple, tuple[int, _UnitResult]] = {}
    per_chain: list[tuple[int, _UnitResult]] = []  # (representative chain index, result)
    inputs: dict[int, Any] = {}  # carry into each measured unit
    compile_s = 0.0
    total = len(spec.names)
    for i, unit in enumerate(spec.chain):
        is_last = i == n_chain - 1
        sig = _signature(unit, is_last, carry)
        if options.dedup_units and sig in measured:
            rep_i, result = measured[sig]
            log(f"[profile] unit {unit.name}: same shapes as {spec.chain[rep_i].name}, reused")
        else:
            result = _measure_unit(unit, is_last, carry, labels, targets, options, optimizer)
            rep_i = i
            measured[sig] = (i, result)
            inputs[i] = carry
            compile_s += result.compile_s
            stands = spec.rep.count(i)
            note = f", stands for {stands} units" if stands > 1 else ""
            for k, d in enumerate(reps):
                dspec = cluster.devices[d]
                w = (" (B {}, W {})".format(*map(fmt_s, result.split_s[k]))
                     if k in result.split_s else "")
                log(f"[profile] unit {i + 1}/{n_chain} {unit.name:<22} on {dspec.name:<14} "
                    f"(x{dspec.slowdown:g}): forward {fmt_s(result.forward_s[k])} "
                    f"backward {fmt_s(result.backward_s[k])}{w} ({result.repeats} "
                    f"repeats{note})")
        per_chain.append((rep_i, result))
        if not is_last:
            carry = result.out_carry
    out_bytes = _output_bytes(spec.chain, sample[0])
    calls = measure_call_costs(targets, sample[0], optimizer, options)
    calls["input_s"] = measure_input_put(targets, sample[0], labels, max(options.repeats, 5))
    coded = measure_codecs(options.codecs, output_likes(spec.chain, sample[0]), targets,
                           options.repeats) if options.codecs else {}
    for name, c in coded.items():  # per device, like the fixed costs (merged across processes)
        calls[f"codec_{name}_s"] = c["seconds_per_byte"]
    units, fwd, bwd = [], np.full((total, cluster.num_devices), np.nan), np.full(
        (total, cluster.num_devices), np.nan)
    upd = np.full((total, cluster.num_devices), np.nan)
    # B and W [2, U, D] (only W goes into profile.json), less a backward call's fixed part each
    split = np.full((2, total, cluster.num_devices), np.nan) if options.weight else None
    opt_cache: dict[int, int] = {}
    for u, (name, r) in enumerate(zip(spec.names, spec.rep)):
        unit = spec.chain[r]
        rep_i, result = per_chain[r]
        if r not in opt_cache:
            opt_cache[r] = tree_nbytes(jax.eval_shape(optimizer.init, [unit.params]))
        pb = spec.param_bytes[u]
        rec = {"name": name, "state_bytes": 2 * pb + opt_cache[r],
               "activation_bytes": result.activation_bytes, "output_bytes": out_bytes[r],
               "temp_bytes": temp_bytes(result.memory),
               "kind": spec.kinds[u], "param_bytes": pb, "optimizer_bytes": opt_cache[r],
               "measured_as": spec.chain[rep_i].name, "repeats": result.repeats}
        if coded:  # moved to profile.codecs by measure.assemble
            rec["codec_bytes"] = {name: c["output_bytes"][r] for name, c in coded.items()}
        rec.update(result.memory)
        units.append(rec)
        for d, k in enumerate(cls):
            if k >= 0:  # the fixed part of a call is the stage's, once per action: taken out
                fwd[u, d] = max(result.forward_s[k] - calls["forward_call_s"][k], 0.0)
                bwd[u, d] = max(result.backward_s[k] - calls["backward_call_s"][k], 0.0)
                upd[u, d] = max(result.update_s.get(k, 0.0) - calls["update_call_s"][k], 0.0)
                if split is not None:
                    split[:, u, d] = np.maximum(np.subtract(result.split_s[k],
                                                            calls["backward_call_s"][k]), 0.0)
    overheads = {key: [vals[k] if k >= 0 else float("nan") for k in cls]
                 for key, vals in calls.items()}
    log("[profile] fixed costs per call: " + ", ".join(
        f"{cluster.devices[d].name}: forward {fmt_s(calls['forward_call_s'][k])} backward "
        f"{fmt_s(calls['backward_call_s'][k])} update {fmt_s(calls['update_call_s'][k])}"
        for k, d in enumerate(reps)))
    cpu_wall = np.zeros((len(reps), 2))
    for _, result in measured.values():
        cpu_wall += np.array([result.cpu_wall[k] for k in range(len(reps))])
    cores = [float(c / w) if w > 0 else float("nan") for c, w in cpu_wall]
    # extra probes: calls after idle (the shared-host model's: the longest and the shortest unit)
    after_idle = options.probes.wake_records(
        spec.chain, list(measured.values()), inputs, labels, targets,
        lambda unit, dev: device_params(unit.params, dev)) if wake else [None] * len(targets)
    return {"units": units, "forward_s": fwd, "backward_s": bwd, "compile_s": compile_s,
            "update_s": upd, "overheads": overheads,
            "backward_input_s": None if split is None else split[0],
            "backward_weight_s": None if split is None else split[1],
            "cpu_cores": [cores[k] if k >= 0 else float("nan") for k in cls],
            "wake": [after_idle[k] if k >= 0 else None for k in cls]}
