"""``config.cluster`` checked: the devices and what is emulated on them (slow-downs, memory
caps, regions and the links between them), the coordinator, and the transfer server.

Reason: the cluster is built from these keys in every process before the first message; a bad
entry found here is one line naming its key, not a hang or a traceback from a worker.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from skyjax import names
from skyjax.cluster import network
from skyjax.config.rules import NUMBER, at_least, fail, one_of, per_device, positive


def check_cluster(c: Any) -> None:
    """``config.cluster``: mode, devices and their per-device tuples, links, the coordinator's
    address and the transfer server."""
    one_of("config.cluster.mode", c.mode, names.MODES)
    at_least("config.cluster.num_devices", c.num_devices, 1)
    n = c.num_devices
    per_device("config.cluster.slowdowns", c.slowdowns, n, NUMBER)
    for i, s in enumerate(c.slowdowns):
        if not s >= 1:
            fail(f"config.cluster.slowdowns[{i}]={s!r} must be >= 1 (1 = full speed)")
    per_device("config.cluster.memory_caps_bytes", c.memory_caps_bytes, n, int)
    for i, b in enumerate(c.memory_caps_bytes):
        at_least(f"config.cluster.memory_caps_bytes[{i}]", b, 0)
    per_device("config.cluster.regions", c.regions, n, str)
    at_least("config.cluster.link_latency_s", c.link_latency_s, 0.0)
    at_least("config.cluster.link_bandwidth_Bps", c.link_bandwidth_Bps, 0.0)
    _check_region_links(c)
    positive("config.cluster.peer_timeout_s", c.peer_timeout_s)
    addr = c.coordinator_address
    if addr and (":" not in addr or not addr.rsplit(":", 1)[1].isdigit()):
        fail(f"config.cluster.coordinator_address={addr!r} must be 'host:port' or ''")
    _check_transfer_server(c)


def _check_region_links(c: Any) -> None:
    """``cluster.region_links``: (region, region, latency_s, bandwidth_Bps) of named regions."""
    regions = set(c.regions)
    for i, entry in enumerate(c.region_links):
        key = f"config.cluster.region_links[{i}]={entry!r}"
        if not (isinstance(entry, Sequence) and not isinstance(entry, str) and len(entry) == 4):
            fail(f"{key}: expected (region, region, latency_s, bandwidth_Bps)")
        a, b, lat, bw = entry
        if a not in regions or b not in regions or a == b:
            fail(f"{key}: expected two distinct regions of config.cluster.regions "
                 f"({', '.join(sorted(regions)) or 'none set'})")
        if not (isinstance(lat, NUMBER) and math.isfinite(lat) and lat >= 0):
            fail(f"{key}: latency {lat!r} must be seconds >= 0")
        if not (isinstance(bw, NUMBER) and bw >= 0):
            fail(f"{key}: bandwidth {bw!r} must be bytes per second >= 0 (0 = not emulated)")


def _check_transfer_server(c: Any) -> None:
    """The transfer server's address, port range (this process's environment variable too, when
    the key is empty) and buffers."""
    host = c.transfer_host
    if host and (host != host.strip() or not host.strip("[]") or
                 (":" in host and host.count(":") == 1)):
        fail(f"config.cluster.transfer_host={host!r} must be an address or host name without "
             "a port, or ''")
    network.port_range(c.transfer_ports)  # ValueError naming the key or the variable
    at_least("config.cluster.transfer_chunk_bytes", c.transfer_chunk_bytes, 1 << 16)
    at_least("config.cluster.transfer_parallel_copies", c.transfer_parallel_copies, 1)
