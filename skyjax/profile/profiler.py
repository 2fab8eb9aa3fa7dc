"""The profiler's entry point for a run: :func:`profile_or_load`, the cached profile of a workload
on a cluster, measured here (:func:`skyjax.profile.measure.profile`) or, under
``jax.distributed``, by every process (:mod:`skyjax.profile.distributed`).

The orchestrator builds the inputs once, from its config::

    workload = Workload.from_config(config)
    cluster = cluster_from_config(config)
    optimizer = skyjax.optim.make_optimizer(config.train)
    options = Options.from_config(config)
    prof = profile_or_load(workdir, workload, cluster, optimizer, options, chain=chain)
"""

from __future__ import annotations

from typing import Any

import jax
import optax
from absl import logging

from skyjax import cluster as cluster_lib
from skyjax.models import bert
from skyjax.optim import make_optimizer
from skyjax.profile import distributed, measure
from skyjax.profile.cache import cache_key, load_or_measure
from skyjax.profile.chain import Workload
from skyjax.profile.format import Profile
from skyjax.profile.options import Log, Options
from skyjax.profile.eta import ProfileProgress


def profile_or_load(workdir: str, workload: Workload, cluster: cluster_lib.Cluster,
                    optimizer: optax.GradientTransformation, options: Options, *,
                    chain: list[bert.Unit] | None = None, reprofile: bool = False,
                    transport: Any = None, namespace: str | None = None,
                    log: Log | None = None) -> Profile:
    """The cached profile of ``workload`` on ``cluster``, measured first if there is none.

    The cache lives at ``workdir/profiles/<cache_key>.json``; ``reprofile`` forces a new
    measurement. ``chain``: the
    model's units if already built (else a skeleton of ``workload.model`` is measured).

    Under ``jax.distributed`` with several processes, pass the runtime's ``transport`` and a
    ``namespace`` for this call in the key-value store (the same on every process, unique per
    call in the session): every process takes part in measuring (its own device) and all of them
    return the same profile (process 0 decides, measures links, writes and shares it).
    """
    log = log or logging.info
    key = cache_key(workload, cluster, options)
    if jax.process_count() == 1:
        return _recorded(load_or_measure(
            workdir, key, lambda: measure.profile(workload, cluster, optimizer, options,
                                                  chain=chain, log=log), reprofile, log),
            workload)
    if not namespace:
        raise ValueError("profiling under jax.distributed needs a key-value namespace per call")

    def measure_all() -> Profile | None:
        if transport is None:
            raise ValueError("profiling under jax.distributed needs the runtime's transport")
        names = [d.name for d in cluster.devices]  # ProfileProgress: + "device d/D, ETA"
        return distributed.profile_distributed(workload, cluster, optimizer, options, transport,
                                               jax.process_index(), chain=chain,
                                               log=ProfileProgress(log, names))

    return _recorded(distributed.load_or_measure_shared(workdir, key, measure_all, reprofile,
                                                        namespace, log), workload)


def _recorded(prof: Profile, workload: Workload) -> Profile:
    """``prof`` with its ``model`` record: a cached profile written before the record existed
    was measured for this very workload (the cache key hashes it), so the run's copy
    (``WORKDIR/profile.json``) can be checked when it is given to another run."""
    if prof.model is None:
        prof.model = workload.record()
    return prof


def profile_config(config: Any, *, workdir: str | None = None, reprofile: bool = False,
                   host: Any = None, log: Log | None = None, **overrides: Any) -> Profile:
    """The profile of ``config``'s model on its cluster, in this one process (a
    ``"distributed"`` config's devices too): cached under ``workdir`` (:func:`profile_or_load`)
    when one is given, else measured. ``host``: the shared-host model's probes
    (``Options.host``); ``overrides``: :class:`Options` fields (repeats, budget, dedup)."""
    workload = Workload.from_config(config)
    cluster = cluster_lib.cluster_from_config(config)
    optimizer = make_optimizer(config.train)
    options = Options.from_config(config, host=host, **overrides)
    if workdir:
        return profile_or_load(workdir, workload, cluster, optimizer, options,
                               reprofile=reprofile, log=log)
    return measure.profile(workload, cluster, optimizer, options, log=log)
