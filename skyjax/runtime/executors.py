"""This process's transport and executor for a run's config: every stage in this process (one
thread each, :class:`~skyjax.runtime.local_executor.LocalExecutor`), or under
``jax.distributed`` this process's stage
(:class:`~skyjax.runtime.distributed_executor.DistributedExecutor`) over a per-process
transport. The orchestration (``skyjax.train``) and the benchmarks build them here.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections

from skyjax import cluster as cluster_lib, optim
from skyjax.models import bert
from skyjax.plan import Plan
from skyjax.runtime import placement
from skyjax.runtime.distributed_executor import DistributedExecutor
from skyjax.runtime.local_executor import LocalExecutor
from skyjax.runtime.rehearsal import Rehearsal


def make_transport(cluster: cluster_lib.Cluster, peer_timeout_s: float = 60.0,
                   server: Any = None) -> Any:
    """The per-process transport under ``jax.distributed`` (None in a single process), with the
    heartbeat watchdog that turns a lost peer into an error naming it; ``server``: its transfer
    server's :class:`~skyjax.transport.ServerOptions` (default: address found, any port)."""
    if jax.process_count() == 1:
        return None
    from skyjax.transport import group as distributed
    from skyjax.transport import TransferServerTransport

    distributed.start_watchdog(peer_timeout_s)

    me = jax.process_index()
    return TransferServerTransport(me, jax.process_count(), cluster.jax_devices[me],
                                   cluster.links if cluster.emulate_links else None,
                                   server=server)


def make_executor(config: ml_collections.ConfigDict, chain: list[bert.Unit], plan: Plan,
                  cluster: cluster_lib.Cluster, transport: Any = None, unit_states: Any = None,
                  rehearsal: Rehearsal | None = None):
    """The executor for this process: all stages here, or this process's stage (from restored
    ``unit_states`` when resuming); ``rehearsal``: the run's, whose declared times the stages'
    calls take."""
    kwargs = dict(batch_size=config.data.batch_size, seq_len=config.data.seq_len,
                  unit_states=unit_states, rehearsal=rehearsal,
                  optimizer=optim.make_optimizer(config.train, clip=False),
                  max_grad_norm=config.train.grad_clip_norm or None,
                  rng=lambda step, first, count: bert.example_keys(config.train.seed, step,
                                                                   first, count))
    sync = config.pipeline.sync_actions
    if jax.process_count() > 1:
        me = jax.process_index()
        return DistributedExecutor(chain, plan, transport, me, cluster.jax_devices[me],
                                   slowdown=cluster.slowdown(me),
                                   sync_actions=cluster.actions_block(me, sync), **kwargs)
    return LocalExecutor(chain, plan, cluster.jax_devices,
                         slowdowns=[d.slowdown for d in cluster.devices],
                         sync_actions=[cluster.actions_block(d, sync)
                                       for d in range(cluster.num_devices)],
                         links=cluster.links if cluster.emulate_links else None, **kwargs)


def own_units(plan: Plan, num_units: int) -> list[int]:
    """The units whose parameters this process makes: all of them in one process (its threads
    run every stage), else those of the stage on this process's device."""
    if jax.process_count() == 1:
        return list(range(num_units))
    return placement.device_units(plan, jax.process_index())
