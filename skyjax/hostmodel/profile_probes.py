"""The profiler's extra probes on a shared host: the :class:`~skyjax.profile.extension.ExtraProbes`
the orchestrators hand the profiler as ``Options.host`` (:mod:`skyjax.profile`).

* which cores each process may use (``host``, ``host_cores``, ``cpus`` per device) and how many
  one of its calls keeps busy (``cpu_cores``): what the contention model needs;
* calls after idle (:mod:`.wake`), measured in the first pass;
* devices timed one process at a time, in several passes whose median is kept per unit
  (:mod:`.passes`): processes sharing cores would time each other's load;
* what a message costs the stages computing beside it (:mod:`.messages`), pooled per host, and
  link latencies as a computing sender sees them.
"""

from __future__ import annotations

import math
import os
import socket
from typing import Any

import numpy as np

from skyjax.hostmodel import messages, passes, wake


def host_cpus() -> list[int] | None:
    """The cores this process may run on (its CPU affinity), None where unknown: processes of
    one host whose sets are disjoint (``skyjax.launch --bind_cores``, SLURM's core binding) do
    not share cores (:mod:`skyjax.hostmodel.sharing`)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def host_cores() -> int:
    """How many cores this process may run on (:func:`host_cpus`; all of them where unknown)."""
    cpus = host_cpus()
    return len(cpus) if cpus else os.cpu_count() or 1


class HostProbes:
    """:class:`~skyjax.profile.extension.ExtraProbes` for processes that share a host's cores."""

    one_at_a_time = True  # devices take turns: each one timed while the others wait
    rounds_per_repeat = messages.ROUNDS_PER_REPEAT

    @staticmethod
    def device_fields() -> dict:
        """This process's ``host``, ``host_cores`` and ``cpus`` (profile.json devices)."""
        return {"host": socket.gethostname(), "host_cores": host_cores(), "cpus": host_cpus()}

    @staticmethod
    def turns(rank: int, num_devices: int, p: int) -> list[int]:
        """Every device in turn, the order reversed each pass (:func:`.passes.pass_order`)."""
        return passes.pass_order(num_devices, p)

    @staticmethod
    def combine_passes(timed: list[dict[str, Any]]) -> dict[str, Any]:
        """Each unit's median pass (:func:`skyjax.hostmodel.passes.median_pass`)."""
        return passes.median_pass(timed)

    @staticmethod
    def wake_records(*args, **kwargs) -> list[dict]:
        return wake.wake_records(*args, **kwargs)

    @classmethod
    def record_devices(cls, devices: list[dict], measured: dict) -> None:
        """``cpu_cores`` (cores one of its calls keeps busy), the calls after idle (``wake_s``,
        ``wake_light_s``, ``wake_work_s``) and, where absent, this process's
        :meth:`device_fields`."""
        for dv, cores in zip(devices, measured.get("cpu_cores") or []):
            if cores is not None and math.isfinite(cores):
                dv["cpu_cores"] = float(cores)
        for dv, after_idle in zip(devices, measured.get("wake") or []):
            if after_idle is not None:
                dv.update(after_idle)
        fields = cls.device_fields()
        for dv in devices:
            dv.update({k: v for k, v in fields.items() if k not in dv})

    @staticmethod
    def message_costs(transport: Any, rank: int, cluster: Any, message_bytes: int,
                      link_repeats: int, tag: int) -> tuple[dict | None, int]:
        return messages.probe_message_costs(transport, rank, cluster, message_bytes,
                                            messages.ROUNDS_PER_REPEAT * link_repeats, tag)

    @staticmethod
    def loaded_links(costs: list[dict | None], devices: list[dict], latency: np.ndarray,
                     bandwidth: np.ndarray, message_bytes: int) -> tuple[list, np.ndarray]:
        """Message costs pooled per host (a send is its host's work) and link latencies as a
        computing sender's messages see them."""
        messages.pool_by_host(costs, devices)
        return costs, messages.loaded_latency(latency, bandwidth, costs, message_bytes)
