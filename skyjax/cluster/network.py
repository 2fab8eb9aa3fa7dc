"""Where a process's transfer server listens: an address peers on other nodes can reach, and ports
from a range a firewall can open. No JAX: the config checks use the parsers.

Address, first match wins: ``config.cluster.transfer_host`` > ``$SKYJAX_TRANSFER_HOST`` > the
local address of the route to the ``jax.distributed`` coordinator (:func:`route_address`: a UDP
socket ``connect()``, no packet sent; every process reaches the coordinator, so the interface that
route leaves by is one the others can reach too) > 127.0.0.1.

Ports: ``config.cluster.transfer_ports`` > ``$SKYJAX_TRANSFER_PORTS``, "FIRST-LAST" (both
included); empty = any free port. The range holds the server's control port (one per process).
Its bulk-data socket keeps an ephemeral port: jaxlib binds its outgoing bulk connections to the
same address as its bulk listener, so a fixed port there fails (a CHECK that aborts the process).
The transfer server sets ``SO_REUSEPORT``, so binding cannot tell a port another skyjax process on
the node already serves: :func:`port_leases` first locks a file per port
(``$TMPDIR/skyjax-transfer-port-<port>.lock``, held while the server lives; processes on a node
that start together then take different ports), then checks with a plain bind that no other
program listens there.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import socket
import tempfile
from typing import Iterator, Mapping

from skyjax import env_vars

DEFAULT_HOST = "127.0.0.1"
PORTS_PER_SERVER = 1  # the control socket (the bulk socket's port is ephemeral)
HOST_KEY = "config.cluster.transfer_host"
PORTS_KEY = "config.cluster.transfer_ports"


def split_host_port(address: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6 address]:port"."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is not 'host:port'")
    return host.strip("[]"), int(port)


def join_host_port(host: str, port: int) -> str:
    """"host:port", with an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def route_address(coordinator: str | None) -> str | None:
    """The local address of this node's route to ``coordinator`` ("host:port"); None when there
    is no coordinator or no route (the name does not resolve, the network is down).

    ``connect()`` on a UDP socket only picks the route and the source address; nothing is sent.
    A loopback coordinator gives 127.0.0.1; a coordinator given by host name (SLURM's first node)
    goes through name resolution, so the interface is the one that name resolves to a route by.
    """
    if not coordinator:
        return None
    try:
        host, port = split_host_port(coordinator)
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)
            return s.getsockname()[0]
    except (OSError, ValueError, IndexError):
        return None


def transfer_host(configured: str, coordinator: str | None,
                  environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """(address, where it came from): ``configured`` (the config key) > the environment variable
    > the route to ``coordinator`` > 127.0.0.1 (module docstring)."""
    if configured:
        return configured, HOST_KEY
    if environ.get(env_vars.TRANSFER_HOST):
        return environ[env_vars.TRANSFER_HOST], f"${env_vars.TRANSFER_HOST}"
    routed = route_address(coordinator)
    if routed:
        return routed, f"the route to the coordinator {coordinator}"
    return DEFAULT_HOST, "the default"


def parse_port_range(spec: str, name: str) -> range | None:
    """``range`` of "FIRST-LAST" (or one port "P"); None for "". ``ValueError`` naming ``name``
    (the config key or environment variable) when malformed or too small for one server."""
    spec = spec.strip()
    if not spec:
        return None
    first, _, last = spec.partition("-")
    last = last or first
    if not (first.strip().isdigit() and last.strip().isdigit()):
        raise ValueError(f"{name}={spec!r} must be 'FIRST-LAST' (e.g. '40000-40100') or ''")
    lo, hi = int(first), int(last)
    if not 1 <= lo <= hi <= 65535:
        raise ValueError(f"{name}={spec!r}: ports must satisfy 1 <= FIRST <= LAST <= 65535")
    return range(lo, hi + 1)


def port_range(configured: str,
               environ: Mapping[str, str] = os.environ) -> tuple[range | None, str, str]:
    """(ports, the spec, the name it came from): the config key > the environment variable."""
    if configured:
        return parse_port_range(configured, PORTS_KEY), configured, PORTS_KEY
    spec = environ.get(env_vars.TRANSFER_PORTS, "")
    name = f"${env_vars.TRANSFER_PORTS}"
    return parse_port_range(spec, name), spec, name


@dataclasses.dataclass
class PortLease:
    """Ports locked for one server; the locks last until :meth:`release` (or the process ends)."""

    ports: list[int]
    _fds: list[int]

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)  # closing drops the flock
        self._fds = []


def _lock(port: int) -> int | None:
    """An open, exclusively locked descriptor of this port's lock file; None if held elsewhere."""
    path = os.path.join(tempfile.gettempdir(), f"skyjax-transfer-port-{port}.lock")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        return None  # e.g. another user's file we may not open: theirs
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError:
        os.close(fd)
        return None


def bindable(host: str, port: int) -> bool:
    """True when nothing listens on (host, port): a plain bind (no SO_REUSEPORT) succeeds."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT leftovers
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def port_leases(host: str, ports: range, spec: str, name: str,
                count: int = PORTS_PER_SERVER) -> Iterator[PortLease]:
    """Leases of ``count`` free ports of ``ports`` on ``host``, lowest first; the caller takes
    the first its server starts on and releases the others. ``RuntimeError`` naming ``name``
    when the range is exhausted."""
    fds: list[int] = []
    taken: list[int] = []
    for port in ports:
        fd = _lock(port)
        if fd is None:
            continue
        if not bindable(host, port):
            os.close(fd)
            continue
        fds.append(fd)
        taken.append(port)
        if len(taken) == count:
            yield PortLease(taken, fds)
            fds, taken = [], []
    for fd in fds:
        os.close(fd)
    raise RuntimeError(f"{name}={spec!r}: no free port left in the range on {host} (each "
                       f"process on a node takes {count}; the others are in use or held by "
                       f"other skyjax processes); widen the range")


def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
