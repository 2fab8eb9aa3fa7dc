"""Profiling with one process per device (``jax.distributed``, or threads sharing a transport).

Each process measures its own device for every unit kind (:mod:`skyjax.profile.units`), all at
once, or one process at a time where the extra probes ask for it (``Options.host``: processes
sharing a host's cores would time each other's load), in ``Options.passes`` rounds of turns.
The results are gathered to process 0 through the runtime's transport, links are probed
pairwise through the same transport (:func:`skyjax.profile.links.probe_links_across`), and
process 0 assembles the profile. :func:`load_or_measure_shared` is the cache under
``jax.distributed``: process 0 decides (cache hit or measure), every process takes part in
measuring, and all of them get process 0's profile through the key-value store.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from typing import Any, Callable

import jax
import numpy as np
import optax
from absl import logging

from skyjax import cluster as cluster_lib
from skyjax.models import bert
from skyjax.profile import links, units
from skyjax.profile.cache import cache_key, cache_path, try_load
from skyjax.profile.chain import Workload, chain_spec, sample_microbatch
from skyjax.profile.format import Profile, save_profile
from skyjax.profile.measure import assemble, device_records
from skyjax.profile.options import Log, Options
from skyjax.transport import tags
from skyjax.transport.group import broadcast_json

SHARE_TIMEOUT_S = 3600.0  # how long processes wait for process 0's decision and profile


@contextlib.contextmanager
def _patient(transport: Any):
    """Raises the transport's timeout to ``SHARE_TIMEOUT_S`` for a while (a peer that is lost is
    still reported by the watchdog)."""
    before = getattr(transport, "timeout_s", None)
    if before is not None:
        transport.timeout_s = max(before, SHARE_TIMEOUT_S)
    try:
        yield
    finally:
        if before is not None:
            transport.timeout_s = before


def profile_distributed(workload: Workload, cluster: cluster_lib.Cluster,
                        optimizer: optax.GradientTransformation, options: Options,
                        transport: Any, rank: int, *, chain: list[bert.Unit] | None = None,
                        log: Log | None = None, tag_base: int = tags.PROFILE_BASE) -> Profile | None:
    """One process per device: each measures its own device (``rank``), results are gathered to
    rank 0 (``transport.gather_to_first``), links are probed pairwise by ping-pong through
    ``transport.send`` / ``recv`` (which apply the link emulation). Returns the profile on rank 0
    and None elsewhere. Every rank must call it, with the same arguments but ``rank``."""
    log = log or logging.info
    start = time.perf_counter()
    spec = chain_spec(workload.model, workload.granularity, chain, options.dedup_units)
    sample = sample_microbatch(workload.model, *workload.microbatch)
    # Unless concurrent, the processes take turns (a barrier per turn): each device is timed
    # while the others wait, as the single-process profiler times devices one after another.
    # The first turn starts when every process is here: process 0 reaches this point first
    # (it decides to measure), while the others may still be building their model.
    if not options.concurrent:
        with _patient(transport):
            transport.barrier(tag_base)
    # Each pass times this device in its turn (one at a time: every device once, in the probes'
    # order), and the probes combine the passes.
    probes = options.probes
    timed: list[dict] = []
    for p in range(options.passes):
        for turn in probes.turns(rank, cluster.num_devices, p):
            if turn == rank:
                if options.passes > 1:
                    log(f"[profile] pass {p + 1}/{options.passes}")
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=".*[Dd]onat.*")
                    timed.append(units.measure_units(spec, sample, cluster, options, optimizer,
                                                     log, only_devices=[rank], wake=p == 0))
            if not options.concurrent:
                with _patient(transport):  # a turn may outlast the transport's usual timeout
                    transport.barrier(tag_base)  # the n-th barrier of a tag pairs with the n-th
    mine = probes.combine_passes(timed)
    host = probes.device_fields()
    unit_s = time.perf_counter() - start
    gathered = transport.gather_to_first(
        {"rank": rank, "forward_s": mine["forward_s"][:, rank].tolist(),
         "backward_s": mine["backward_s"][:, rank].tolist(), "units": mine["units"],
         "update_s": mine["update_s"][:, rank].tolist(),
         **{k: (None if mine.get(k) is None else mine[k][:, rank].tolist())
            for k in ("backward_weight_s", "backward_input_s")},
         "overheads": {k: v[rank] for k, v in mine["overheads"].items()},
         "compile_s": mine["compile_s"], "memory": list(cluster.memory_bytes(rank)),
         "host": host, "cpu_cores": mine["cpu_cores"][rank], "wake": mine["wake"][rank],
         "pass_work_s": (mine.get("pass_work_s") or [None] * (rank + 1))[rank]}, tag_base)
    mine_links, tag = links.probe_links_across(transport, rank, cluster, options, tag_base + 1)
    # extra probes: what a message costs a stage computing beside it (the largest activation)
    message_bytes = max(int(u["output_bytes"]) for u in mine["units"])
    message, tag = probes.message_costs(transport, rank, cluster, message_bytes,
                                        options.link_repeats, tag)
    gathered_links = transport.gather_to_first({"rank": rank, "one_way": mine_links,
                                                "message": message}, tag)
    transport.barrier(tag + 1)
    if rank != 0:
        return None
    n = cluster.num_devices
    fwd = np.zeros((len(spec.names), n))
    bwd = np.zeros((len(spec.names), n))
    compile_s = 0.0
    devices = device_records(cluster)
    upd = np.zeros((len(spec.names), n))
    wgt = np.zeros((len(spec.names), n)) if options.weight else None
    inp = np.zeros((len(spec.names), n)) if options.weight else None
    over = {k: [0.0] * n for k in gathered[0]["overheads"]}
    cpu_cores = [float("nan")] * n
    wake: list = [None] * n
    pass_work: list = [None] * n
    for g in gathered:
        fwd[:, g["rank"]] = g["forward_s"]
        bwd[:, g["rank"]] = g["backward_s"]
        upd[:, g["rank"]] = g["update_s"]  # fixed costs: per device (profile.json version 2)
        if wgt is not None:
            wgt[:, g["rank"]] = g["backward_weight_s"]
            inp[:, g["rank"]] = g["backward_input_s"]
        for k, v in g["overheads"].items():
            over[k][g["rank"]] = v
        compile_s = max(compile_s, g["compile_s"])
        # Each process knows its own device's memory.
        devices[g["rank"]]["memory_bytes"], devices[g["rank"]]["memory_source"] = g["memory"]
        devices[g["rank"]].update(g["host"])  # the extra probes' keys (which processes share)
        cpu_cores[g["rank"]] = g["cpu_cores"]
        wake[g["rank"]] = g["wake"]
        pass_work[g["rank"]] = g["pass_work_s"]
    one_way: dict[str, list[float]] = {}
    message_costs: list = [None] * n  # per device: send_s, recv_s, message_s (or None)
    for g in gathered_links:
        one_way.update(g["one_way"])
        message_costs[g["rank"]] = g["message"]
    lat, bw = links.link_matrices(n, options.link_sizes, one_way)
    idle_lat = lat.copy()
    message_costs, lat = probes.loaded_links(message_costs, devices, lat, bw, message_bytes)
    over["message_s"] = [c["message_s"] if c else 0.0 for c in message_costs]  # 0: not probed
    measured = {"units": gathered[0]["units"], "forward_s": fwd, "backward_s": bwd,
                "compile_s": compile_s, "devices": devices, "update_s": upd, "overheads": over,
                "cpu_cores": cpu_cores, "wake": wake, "backward_weight_s": wgt,
                "backward_input_s": inp}
    return assemble(workload, cluster, options, cache_key(workload, cluster, options), measured,
                    lat, bw, {"link_probe": "transport", "link_one_way_s": one_way,
                              "message_costs": message_costs,
                              "idle_latency_s": idle_lat.tolist(), "pass_work_s": pass_work,
                              "units_s": unit_s, "compile_s": compile_s,
                              "profile_time_s": time.perf_counter() - start})


def load_or_measure_shared(workdir: str, key: str, measure: Callable[[], Profile | None],
                           reprofile: bool, namespace: str, log: Log) -> Profile:
    """Under ``jax.distributed``: process 0 decides (its cache under ``key``, unless
    ``reprofile``), every process runs ``measure()`` if it must (it returns the profile on
    process 0 only), process 0 caches the result and shares it.

    ``namespace``: the key-value store namespace of this call; every process passes the same,
    and no other call in the same ``jax.distributed`` session may use it.
    """
    rank = jax.process_index()
    prefix = f"skyjax/profile/{namespace}/{key}"
    path = cache_path(workdir, key)
    prof = None if rank or reprofile else try_load(path, log)
    decision = broadcast_json("load" if prof is not None else "measure", f"{prefix}/decision",
                              SHARE_TIMEOUT_S)
    if decision == "measure":
        prof = measure()
        if rank == 0:
            save_profile(prof, path)
    shared = broadcast_json(prof.to_json() if rank == 0 else None, f"{prefix}/json",
                            SHARE_TIMEOUT_S)
    if rank == 0:
        return prof
    return Profile.from_json(shared)
