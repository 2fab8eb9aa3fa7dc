"""A :class:`~skyjax.profile.format.Profile` measured in this process, and the assembly of one
from its parts (also used by :mod:`skyjax.profile.distributed`).

:func:`profile` times and sizes the units on every device of the cluster, one after another
(:mod:`skyjax.profile.units`), probes the links (:mod:`skyjax.profile.links`) and records the
devices' memory: the emulated cap, else the backend's ``bytes_limit``, else host RAM shared by
this process's devices. Its inputs are built once by the orchestrator (``skyjax.train``'s
``profile_phase`` or ``python -m skyjax.profile``); nothing here reads the config.
"""

from __future__ import annotations

import time
import warnings

import jax
import numpy as np
import optax
from absl import logging

from skyjax import cluster as cluster_lib
from skyjax.models import bert
from skyjax.profile import links, units
from skyjax.profile.cache import PROFILER_VERSION, cache_key
from skyjax.profile.chain import Workload, chain_spec, sample_microbatch
from skyjax.profile.format import Profile
from skyjax.profile.options import Log, Options
from skyjax.profile.eta import ProfileProgress


def device_records(cluster: cluster_lib.Cluster) -> list[dict]:
    """profile.json's ``devices``: name, memory (and where the figure comes from), kind,
    emulated slow-down, region and process of each logical device, as this process sees
    them (under jax.distributed each process fills in its own memory)."""
    out = []
    for d, spec in enumerate(cluster.devices):
        mem, source = cluster.memory_bytes(d)
        out.append({"name": spec.name, "memory_bytes": int(mem), "kind": spec.kind,
                    "slowdown": spec.slowdown, "region": spec.region,
                    "process_index": spec.process_index, "memory_source": source})
    return out


def fixed_costs(measured: dict, meta: dict, n_units: int, n_devices: int) -> dict:
    """profile.json's version-2 ``update_s`` and ``overheads`` from the measured parts (zeros
    for what was not measured, e.g. an older caller)."""
    from skyjax.profile.links import sync_seconds

    upd = measured.get("update_s")
    over = measured.get("overheads") or {}
    zeros = [0.0] * n_devices
    return {"update_s": (np.nan_to_num(np.asarray(upd, float)).tolist() if upd is not None
                         else [zeros] * n_units),
            "overheads": {"forward_call_s": list(over.get("forward_call_s", zeros)),
                          "backward_call_s": list(over.get("backward_call_s", zeros)),
                          "update_call_s": list(over.get("update_call_s", zeros)),
                          "message_s": list(over.get("message_s", zeros)),
                          "input_s": list(over.get("input_s", zeros)),
                          "sync_s": sync_seconds(meta.get("link_one_way_s") or {})}}


def assemble(workload: Workload, cluster: cluster_lib.Cluster, options: Options, key: str,
             measured: dict, lat: np.ndarray, bw: np.ndarray, meta: dict) -> Profile:
    """The profile of ``measured`` units (:func:`skyjax.profile.units.measure_units`, optionally
    with ``devices`` records; its ``backward_input_s`` and ``backward_weight_s`` where measured) and links, stamped
    with the cache ``key`` and profiler ``meta``."""
    size, seq_len = workload.microbatch
    units_rec = [dict(u) for u in measured["units"]]
    coded = [u.pop("codec_bytes", {}) for u in units_rec]
    over = measured.get("overheads") or {}
    codecs = {name: {"output_bytes": [c[name] for c in coded],
                     "seconds_per_byte": list(over[f"codec_{name}_s"])}
              for name in (coded[0] if coded else {})}
    d = {
        "version": 2,
        "microbatch": {"size": size, "seq_len": seq_len},
        "model": workload.record(),
        "units": units_rec,
        "devices": measured.get("devices") or device_records(cluster),
        "forward_s": measured["forward_s"].tolist(),
        "backward_s": measured["backward_s"].tolist(),
        "links": {"latency_s": lat.tolist(), "bandwidth_Bps": bw.tolist()},
        **fixed_costs(measured, meta, len(measured["units"]), cluster.num_devices),
        **({"codecs": codecs} if codecs else {}),
        **{k: np.asarray(measured[k]).tolist() for k in ("backward_weight_s", "backward_input_s")
           if measured.get(k) is not None},
        "cache_key": key,
        "profiler": {"version": PROFILER_VERSION, "jax": jax.__version__,
                     "granularity": workload.granularity, "mode": cluster.mode,
                     "dtype": workload.dtype, "repeats": options.repeats,
                     "passes": options.passes,
                     "dedup_units": options.dedup_units, "dedup_devices": options.dedup_devices,
                     "created": time.strftime("%Y-%m-%dT%H:%M:%S"), **meta},
    }
    options.probes.record_devices(d["devices"], measured)  # extra probes' device keys
    return Profile.from_json(d)


def profile(workload: Workload, cluster: cluster_lib.Cluster,
            optimizer: optax.GradientTransformation, options: Options, *,
            chain: list[bert.Unit] | None = None, log: Log | None = None) -> Profile:
    """Measures a profile in this process (all of ``cluster``'s devices, one after another).

    ``chain``: the model's units if already built (identical ones are measured once); without it
    a one-layer skeleton of ``workload.model`` stands for every layer. ``optimizer``: the training
    optimizer, whose state is sized per unit.
    """
    log = ProfileProgress(log or logging.info, [d.name for d in cluster.devices])  # + ETA
    start = time.perf_counter()
    spec = chain_spec(workload.model, workload.granularity, chain, options.dedup_units)
    size, seq_len = workload.microbatch
    log(f"[profile] {len(spec.names)} units ({workload.granularity}), micro-batch {size} x "
        f"{seq_len}, {cluster.num_devices} device(s), up to {options.repeats} repeats")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Dd]onat.*")
        sample = sample_microbatch(workload.model, size, seq_len)
        timed = []
        for p in range(options.passes):  # several only with extra probes that combine them
            if options.passes > 1:
                log(f"[profile] pass {p + 1}/{options.passes}")
            timed.append(units.measure_units(spec, sample, cluster, options, optimizer, log,
                                             wake=p == 0))
        measured = options.probes.combine_passes(timed)
        unit_s = time.perf_counter() - start
        lat, bw, raw = links.probe_links(cluster, options, log)
    return assemble(workload, cluster, options, cache_key(workload, cluster, options), measured,
                    lat, bw, {"link_probe": raw["path"], "link_one_way_s": raw["one_way_s"],
                              "pass_work_s": measured.get("pass_work_s"),
                              "units_s": unit_s, "compile_s": measured["compile_s"],
                              "profile_time_s": time.perf_counter() - start})
