"""Every unit of a chain timed and sized on the cluster's devices: the profile's unit records
and its ``[U, D]`` time tables.

Each distinct unit (same kind, parameter shapes and input shapes) is timed once on each
distinct device (same kind, process and emulated slow-down) by
:mod:`skyjax.profile.unit_timing`, and the result reused for the units and devices like it. The
records add what needs no timing: ``state_bytes`` (params + gradients + optimizer state, exactly
from the pytrees: ``jax.eval_shape`` of the optimizer's ``init``; AdamW keeps two more copies)
and ``output_bytes`` (the unit's output carry, the message to the next stage). The fixed part of
each call (:mod:`skyjax.profile.stage_calls`) is taken out of the unit times: the cost model
charges it once per stage action.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
import optax

from skyjax import cluster as cluster_lib
from skyjax.models import bert
from skyjax.profile.chain import ChainSpec
from skyjax.profile.codec_times import measure_codecs, output_likes
from skyjax.profile.eta import fmt_s
from skyjax.profile.inputs import measure_input_put
from skyjax.profile.options import Log, Options
from skyjax.profile.stage_calls import measure_call_costs
from skyjax.profile.unit_timing import UnitTimes, device_params, measure_unit, temp_bytes
from skyjax.tree import tree_avals, tree_nbytes


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
    measured: dict[tuple, tuple[int, UnitTimes]] = {}
    per_chain: list[tuple[int, UnitTimes]] = []  # (representative chain index, result)
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
            result = measure_unit(unit, is_last, carry, labels, targets, options, optimizer)
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
    # B and W [2, U, D] (profile.json's backward_input_s, backward_weight_s), less a backward
    # call's fixed part each
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
        if unit.tied:  # a tensor it shares with another unit (a decoder's tied embedding)
            rec["tied_bytes"] = tied_nbytes(unit)
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


def tied_nbytes(unit) -> int:
    """Bytes of the tensors ``unit`` shares with another unit (``Unit.tied``): what the tied
    weights' exchange sends each step (profile.json's ``tied_bytes``)."""
    total = 0
    for path, _, _ in unit.tied:
        leaf = unit.params
        for key in path:
            leaf = leaf[key]
        total += int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
    return total
