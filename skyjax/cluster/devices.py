"""The cluster a run plans over: its devices, their emulated slow-downs and memory, the links.

A :class:`Cluster` comes from ``config.cluster`` (:func:`cluster_from_config`): one logical device
per pipeline-stage slot, backed by a JAX device (a local device in local mode, the first device of
each process under ``jax.distributed``). Each logical device may be *emulated* as slower
(``config.cluster.slowdowns``), smaller (``config.cluster.memory_caps_bytes``) or far away
(``config.cluster.regions`` with ``link_latency_s`` / ``link_bandwidth_Bps`` between regions).

The emulation itself (slow calls, slow links) lives in :mod:`skyjax.cluster.emulation`.

Memory caps are reported in the profile as the device's memory, which is what the planner obeys.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Sequence

import numpy as np

from skyjax.cluster.emulation import LinkEmulation, actions_block



@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """One logical device of the cluster.

    ``name``: e.g. ``"proc0:cpu1"``; ``kind``: the JAX platform and device kind, e.g. ``"cpu"`` or
    ``"gpu:NVIDIA H100 80GB HBM3"``; ``slowdown``: emulated factor (1 = full speed);
    ``memory_bytes``: emulated memory cap (``None`` = the device's real memory);
    ``region``: devices in different regions talk over emulated links.
    """

    name: str
    kind: str
    slowdown: float = 1.0
    memory_bytes: int | None = None
    region: str = "r0"
    process_index: int = 0


@dataclasses.dataclass
class Cluster:
    """Logical devices, the JAX devices behind them, and the emulated links ``[src, dst]``.

    ``link_latency_s[d, e]`` / ``link_bandwidth_Bps[d, e]`` are the *emulated* link parameters
    (0 s and inf B/s where nothing is emulated); the profiler measures the real ones.
    """

    devices: list[DeviceSpec]
    jax_devices: list[Any]
    link_latency_s: np.ndarray
    link_bandwidth_Bps: np.ndarray
    emulate_links: bool
    mode: str = "local"
    # a rehearsal's links (skyjax.cluster.rehearsal.RehearsalLinks), one object shared by the
    # transport and the executor; None: ``links`` builds the emulation from the matrices
    rehearsal_links: Any = None

    def __post_init__(self):
        n = len(self.devices)
        if len(self.jax_devices) != n:
            raise ValueError(f"Cluster: {n} device specs but {len(self.jax_devices)} JAX devices")
        self.link_latency_s = np.asarray(self.link_latency_s, dtype=np.float64).reshape(n, n)
        self.link_bandwidth_Bps = np.asarray(self.link_bandwidth_Bps,
                                             dtype=np.float64).reshape(n, n)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def links(self) -> "LinkEmulation":
        """The emulation of this cluster's links (a no-op when ``emulate_links`` is False)."""
        if self.rehearsal_links is not None:
            return self.rehearsal_links
        if not self.emulate_links:
            n = self.num_devices
            return LinkEmulation(np.zeros((n, n)), np.full((n, n), np.inf))
        return LinkEmulation(self.link_latency_s, self.link_bandwidth_Bps)

    def slowdown(self, d: int) -> float:
        return self.devices[d].slowdown

    def actions_block(self, d: int, setting: str) -> bool:
        """Whether the stage on device ``d`` waits for each call's result
        (``config.pipeline.sync_actions`` = ``setting``; ``emulation.actions_block``)."""
        return actions_block(setting, self.jax_devices[d].platform,
                             self.slowdown(d) > 1 or self.emulate_links)

    def memory_bytes(self, d: int) -> tuple[int, str]:
        """Memory of logical device ``d`` and where the figure comes from: ``"emulated"`` (the
        cap), ``"backend"`` (``memory_stats()['bytes_limit']``) or ``"host"`` (physical RAM
        shared evenly by this process's local devices, for CPU devices)."""
        cap = self.devices[d].memory_bytes
        if cap:
            return int(cap), "emulated"
        return device_memory_bytes(self.jax_devices[d])

    def describe(self) -> list[dict]:
        """JSON-able description of the devices (used in cache keys and profile.json)."""
        return [{"name": s.name, "kind": s.kind, "slowdown": float(s.slowdown),
                 "memory_cap_bytes": int(s.memory_bytes or 0), "region": s.region,
                 "process_index": s.process_index} for s in self.devices]


# ------------------------------------------------------------------------------------- memory

def host_memory_bytes() -> int:
    """Physical memory of this host."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


def device_memory_bytes(device: Any) -> tuple[int, str]:
    """``(bytes, source)``: the backend's limit (GPU/TPU) or, for CPU devices, the host's
    physical memory divided among this process's local devices of that platform."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - some backends raise instead of returning None
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), "backend"
    import jax

    peers = [d for d in jax.local_devices() if d.platform == device.platform] or [device]
    return host_memory_bytes() // len(peers), "host"


# ------------------------------------------------------------------------------------ config

_COUNT_FLAG = "--xla_force_host_platform_device_count"


def ensure_host_device_count(n: int) -> bool:
    """Asks XLA for ``n`` host (CPU) devices, if JAX's backends are not yet up and ``XLA_FLAGS``
    names no count already. Call before anything touches a JAX backend; returns whether it set
    the flag. (Harmless on GPU/TPU hosts: it only adds CPU devices.)"""
    if n <= 1:
        return False
    flags = os.environ.get("XLA_FLAGS", "")
    if _COUNT_FLAG in flags:
        return False
    if "jax" in sys.modules:
        try:
            from jax._src import xla_bridge

            if getattr(xla_bridge, "_backends", None):
                return False
        except ImportError:
            pass
    os.environ["XLA_FLAGS"] = f"{flags} {_COUNT_FLAG}={int(n)}".strip()
    return True


def device_kind(device: Any) -> str:
    """``"cpu"``, or ``"gpu:NVIDIA H100 ..."``: the platform plus the device kind if it differs."""
    kind = str(getattr(device, "device_kind", "") or "")
    platform = str(device.platform)
    return platform if kind.lower() in ("", platform) else f"{platform}:{kind}"


def device_name(device: Any) -> str:
    """``proc<process>:<platform><index among that process's devices>``, e.g. ``proc1:cpu0``."""
    import jax

    same = sorted(d.id for d in jax.devices() if d.process_index == device.process_index)
    index = same.index(device.id) if device.id in same else device.id
    return f"proc{device.process_index}:{device.platform}{index}"


def _per_device(values: Sequence, n: int, default: Any, name: str) -> list:
    values = list(values or ())
    if not values:
        return [default] * n
    if len(values) != n:
        raise ValueError(f"config.cluster.{name} has {len(values)} entries, "
                         f"config.cluster.num_devices={n}")
    return values


def select_devices(mode: str, num_devices: int) -> list[Any]:
    """The JAX devices behind ``num_devices`` logical devices.

    Under ``jax.distributed`` with several processes: the first device of each process (one
    process per stage). Otherwise the first ``num_devices`` local devices; in ``"distributed"``
    mode run as a single process (e.g. ``python -m skyjax.profile`` planning a distributed run)
    the local devices stand in for the processes, reused round-robin if there are too few.
    """
    import jax

    if jax.process_count() > 1:
        if jax.process_count() != num_devices:
            raise ValueError(f"config.cluster.num_devices={num_devices} but jax.distributed runs "
                             f"{jax.process_count()} processes (one per device expected)")
        firsts = {}
        for d in jax.devices():
            firsts.setdefault(d.process_index, d)
        return [firsts[p] for p in range(num_devices)]
    local = jax.local_devices()
    if len(local) >= num_devices:
        return local[:num_devices]
    if mode == "distributed":
        return [local[i % len(local)] for i in range(num_devices)]
    raise ValueError(
        f"config.cluster.num_devices={num_devices} but this process has {len(local)} "
        f"{local[0].platform} device(s); for CPU devices set "
        f"XLA_FLAGS=--xla_force_host_platform_device_count={num_devices} before JAX starts")


def cluster_from_config(config: Any, jax_devices: Sequence[Any] | None = None) -> Cluster:
    """The :class:`Cluster` described by ``config.cluster`` (optionally on given devices)."""
    c = config.cluster
    n = int(c.num_devices)
    devs = list(jax_devices) if jax_devices is not None else select_devices(c.mode, n)
    if len(devs) != n:
        raise ValueError(f"config.cluster.num_devices={n} but {len(devs)} devices were given")
    slowdowns = [float(s) for s in _per_device(c.slowdowns, n, 1.0, "slowdowns")]
    caps = [int(b) or None for b in _per_device(c.memory_caps_bytes, n, 0, "memory_caps_bytes")]
    regions = [str(r) for r in _per_device(c.regions, n, "r0", "regions")]
    specs = []
    for i, (d, s, cap, r) in enumerate(zip(devs, slowdowns, caps, regions)):
        name = device_name(d)
        if devs.index(d) != i:  # a device standing in for several logical ones
            name = f"{name}#{i}"
        specs.append(DeviceSpec(name=name, kind=device_kind(d), slowdown=s, memory_bytes=cap,
                                region=r, process_index=int(d.process_index)))
    lat = np.zeros((n, n))
    bw = np.full((n, n), np.inf)
    pairs = {frozenset((str(a), str(b))): (float(la), float(bb))
             for a, b, la, bb in getattr(c, "region_links", ())}
    default = (float(c.link_latency_s), float(c.link_bandwidth_Bps))
    for i in range(n):
        for j in range(n):
            if i != j and regions[i] != regions[j]:
                latency, bandwidth = pairs.get(frozenset((regions[i], regions[j])), default)
                lat[i, j] = latency
                bw[i, j] = bandwidth if bandwidth > 0 else np.inf
    emulate = bool(len(set(regions)) > 1 and (np.any(lat > 0) or np.any(np.isfinite(bw))))
    return Cluster(specs, devs, lat, bw, emulate, mode=str(c.mode))
