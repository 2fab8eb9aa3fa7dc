"""Starting this process's ``jax.experimental.transfer`` server: its address, ports and buffers.

``start_transfer_server(client, address, transport_addresses, max_num_parallel_copies,
transfer_size)`` (jaxlib 0.10) listens on ``address`` for control messages and on each transport
address for bulk data; arrays move in chunks of ``transfer_size`` bytes, at most
``max_num_parallel_copies`` at once. With transport addresses given it allocates, once, host
memory of ``3 * max_num_parallel_copies * transfer_size`` bytes (a slab for the bulk sockets and
a premapped staging area twice that size), registered with the device's client: on a GPU that is
pinned (page-locked) memory, on a CPU plain lazily touched memory. jax's defaults (8 x 256 MiB)
pin 6 GiB per process; :class:`ServerOptions` bounds it (``config.cluster.transfer_chunk_bytes``,
``transfer_parallel_copies``; docs/design.md, "Runtime").
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

import jax

from skyjax.cluster import network

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    """How a transfer server starts. ``host``/``ports``: "" = found or chosen at start
    (:mod:`skyjax.cluster.network`: config > environment > route to the coordinator > loopback);
    ``chunk_bytes`` x ``parallel_copies``: the transfer size and copies in flight (pinned host
    memory: 3 x their product)."""

    host: str = ""
    ports: str = ""
    chunk_bytes: int = 32 << 20
    parallel_copies: int = 8

    @classmethod
    def from_config(cls, cluster: Any) -> "ServerOptions":
        """From ``config.cluster`` (its ``transfer_*`` keys)."""
        return cls(host=cluster.transfer_host, ports=cluster.transfer_ports,
                   chunk_bytes=int(cluster.transfer_chunk_bytes),
                   parallel_copies=int(cluster.transfer_parallel_copies))

    @property
    def host_buffer_bytes(self) -> int:
        """Host memory the server allocates (pinned on a GPU)."""
        return 3 * self.chunk_bytes * self.parallel_copies


_servers: dict[tuple[int, ServerOptions], Any] = {}
_leases: list[network.PortLease] = []  # port locks held while the servers live
_retired: list[Any] = []  # servers replace_server took out of use: alive until the process ends
_lock = threading.Lock()


def coordinator_address() -> str | None:
    """The ``jax.distributed`` coordinator's address (None before it starts)."""
    from jax._src import distributed as _dist  # no public accessor in jax 0.10/0.11

    return _dist.global_state.coordinator_address


def _start(client: Any, host: str, ports: list[int] | None, options: ServerOptions):
    from jax.experimental import transfer

    control = ports[0] if ports else 0
    # The bulk socket's port stays ephemeral (skyjax.cluster.network's docstring says why).
    return transfer.start_transfer_server(
        client, network.join_host_port(host, control), [network.join_host_port(host, 0)],
        max_num_parallel_copies=options.parallel_copies, transfer_size=options.chunk_bytes)


def start_server(device: jax.Device, options: ServerOptions):
    """A new transfer server for ``device``'s client, on the address and ports ``options`` name
    or imply (module docstring of :mod:`skyjax.cluster.network`)."""
    host, source = network.transfer_host(options.host, coordinator_address())
    ports, spec, name = network.port_range(options.ports)
    if ports is None:
        server = _start(device.client, host, None, options)
    else:
        for lease in network.port_leases(host, ports, spec, name):
            try:
                server = _start(device.client, host, lease.ports, options)
            except Exception as e:  # noqa: BLE001 - another program bound it since the check
                lease.release()
                if "in use" not in str(e):
                    raise
                continue
            _leases.append(lease)
            break
    log.info("transfer server on %s (address from %s; %d MiB of host buffers)",
             server.address(), source, options.host_buffer_bytes >> 20)
    return server


def transfer_server(device: jax.Device, options: ServerOptions | None = None):
    """This process's transfer server for (``device``, ``options``), started on first use."""
    options = options or ServerOptions()
    with _lock:
        key = (device.id, options)
        if key not in _servers:
            _servers[key] = start_server(device, options)
        return _servers[key]


def replace_server(device: jax.Device, options: ServerOptions | None = None):
    """A new transfer server for (``device``, ``options``), which :func:`transfer_server`
    returns from now on (``TransferServerTransport.renew``, after a lost process).

    Why: a peer killed while it pulls from this process's server can leave that server unable
    to send anything again (jaxlib 0.10: the chunks of the dead peer's pull keep the server's
    staging slots, at most 8, which a chunk returns only once its send completes; chunks queued
    for a connection whose sender is gone never complete, and every later offer waits behind
    them). Nothing fails: the receiver of the next message waits forever. The old server is
    kept, never destroyed (its destructor may wait for those transfers), with its port and its
    host buffers: each replacement costs another ``ServerOptions.host_buffer_bytes`` and, with
    a port range, another port of it."""
    options = options or ServerOptions()
    with _lock:
        key = (device.id, options)
        old = _servers.get(key)
        _servers[key] = start_server(device, options)
        if old is not None:
            _retired.append(old)
        return _servers[key]
