"""The devices a run plans over, and the emulation that makes one host look heterogeneous.
Importing this package does not import JAX, so :func:`ensure_host_device_count` can run before
JAX starts.

* ``devices``: :class:`Cluster` (devices, memory, links) built from ``config.cluster``;
* ``emulation``: slow calls (:func:`timed_call`) and slow links (:class:`LinkEmulation`);
* ``rehearsal``: calls and links that take the times a profile declares (``config.rehearse``);
* ``network``: the transfer server's address and port range (no JAX: the config checks parse
  them).
"""

from skyjax.cluster.devices import (Cluster, DeviceSpec, cluster_from_config, device_kind,
                                    device_memory_bytes, device_name,
                                    ensure_host_device_count, host_memory_bytes, select_devices)
from skyjax.cluster.emulation import (LinkEmulation, actions_block, block, precise_sleep,
                                      timed_call)

__all__ = ["Cluster", "DeviceSpec", "LinkEmulation", "actions_block", "block",
           "cluster_from_config", "device_kind", "device_memory_bytes", "device_name",
           "ensure_host_device_count", "host_memory_bytes", "precise_sleep", "select_devices",
           "timed_call"]
