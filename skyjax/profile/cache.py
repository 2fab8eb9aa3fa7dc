"""The profile cache: ``workdir/profiles/<key>.json`` (or ``$SKYJAX_PROFILE_CACHE/<key>.json``,
one cache for every workdir), where the key hashes everything that changes the numbers
(:func:`cache_key`), and load-or-measure in one process.

The repeats are deliberately not in the key: they change the precision, not the quantity.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from typing import Callable

import jax

from skyjax import cluster as cluster_lib
from skyjax import env_vars
from skyjax.profile.chain import Workload
from skyjax.profile.format import Profile, ProfileError, load_profile, save_profile
from skyjax.profile.options import Log, Options

PROFILER_VERSION = 17  # 2: fixed call costs, update per unit, sync (profile.json version 2); 3: sync
# includes the per-step metrics gather; 4: one process's device at a time (Options.concurrent);
# 5: each process's cores (devices[d]["cpus"]), jitted gradient norm in the update's time;
# 6: calls after idle (devices[d]["wake_s"], skyjax.hostmodel.wake); 7: their noise floor;
# 8: message_s measured across processes (skyjax.hostmodel.messages); 9: links' latency as a
# computing sender's messages see it (messages.loaded_latency); 10: a unit's forward and backward
# timed as an alternating pair, the update after the caches are evicted (profile.units); 11: putting
# a step's inputs (overheads.input_s, profile.inputs); 12: calls after idle also on the shortest
# unit (devices[d]["wake_light_s"], "wake_work_s"); 13: message costs from paired rounds, 20 of them
# (messages.paired_extra); 14: with passes > 1, each unit's median pass, not its fastest
# (profile.passes); 15: the shared-host probes only with Options.host (config.cluster.shared_host);
# 16: units' temp_bytes (the scratch of their largest stage call), charged by the memory model;
# 17: activation_bytes with the feed-forward block (and, below float32, the softmax)
# rematerialised and dropout keeping only its mask (models.modeling, models.dropout)


def cache_payload(workload: Workload, cluster: cluster_lib.Cluster, options: Options) -> dict:
    """Everything that changes a profile's numbers (hashed into the cache key): the workload,
    the cluster's devices (not their names), emulated links and mode, and what is deduplicated."""
    size, seq_len = workload.microbatch
    return {
        "profiler_version": PROFILER_VERSION,
        "jax": jax.__version__,
        "model": dataclasses.asdict(workload.model),
        "microbatch": {"size": size, "seq_len": seq_len},
        "dtype": workload.dtype,
        "granularity": workload.granularity,
        "mode": cluster.mode,
        "devices": [{k: v for k, v in d.items() if k != "name"} for d in cluster.describe()],
        "links": {"emulated": cluster.emulate_links,
                  "latency_s": cluster.link_latency_s.tolist(),
                  "bandwidth_Bps": [[b if math.isfinite(b) else None for b in row]
                                    for row in cluster.link_bandwidth_Bps.tolist()]},
        "optimizer": dict(workload.optimizer),
        "dedup": [options.dedup_units, options.dedup_devices],
        "concurrent": options.concurrent,
        "shared_host": options.host is not None,
        **({"codecs": list(options.codecs)} if options.codecs else {}),
        # a profile with W (zero-bubble runs) is another entry; without, the key is as before
        **({"weight": True} if options.weight else {}),
    }


def cache_key(workload: Workload, cluster: cluster_lib.Cluster, options: Options) -> str:
    """sha256 of the canonical JSON of :func:`cache_payload`."""
    payload = json.dumps(cache_payload(workload, cluster, options), sort_keys=True,
                         separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def cache_dir(workdir: str) -> str:
    """``$SKYJAX_PROFILE_CACHE`` when set (shared by every workdir), else ``workdir/profiles``."""
    return os.environ.get(env_vars.PROFILE_CACHE) or os.path.join(workdir, "profiles")


def cache_path(workdir: str, key: str) -> str:
    return os.path.join(cache_dir(workdir), f"{key}.json")


def in_use_path(workdir: str) -> str:
    """Where a run writes the profile it used (with its other outputs), cached or not."""
    return os.path.join(workdir, "profile.json")


def try_load(path: str, log: Log) -> Profile | None:
    """The cached profile at ``path``; None (logged) when there is none or it is unreadable."""
    if not os.path.exists(path):
        return None
    try:
        prof = load_profile(path)
    except ProfileError as e:
        log(f"[profile] ignoring unreadable cache {path}: {e}")
        return None
    log(f"[profile] reusing cached profile {path}")
    return prof


def load_or_measure(workdir: str, key: str, measure: Callable[[], Profile], reprofile: bool,
                    log: Log) -> Profile:
    """In one process: the profile cached under ``key``, else (or with ``reprofile``)
    ``measure()`` cached there."""
    path = cache_path(workdir, key)
    prof = None if reprofile else try_load(path, log)
    if prof is None:
        prof = measure()
        save_profile(prof, path)
        log(f"[profile] measured in {prof.extra['profiler']['profile_time_s']:.1f} s; "
            f"cached as {path}")
    return prof
