"""Every environment variable skyjax reads or sets, named once.

The launcher (``skyjax.launch``) sets the first four for each child; ``jax.distributed`` start-up
(``skyjax.transport.group``) reads them; the transfer server's start-up reads ``TRANSFER_HOST``
and ``TRANSFER_PORTS`` (``skyjax.cluster.network``); ``skyjax.hostmodel.malloc`` reads
``KEEP_FREED_MEMORY``; the profile cache ``PROFILE_CACHE``. ``XLA_FLAGS`` is XLA's own
(``skyjax.cluster.ensure_host_device_count`` adds the host device count to it before JAX starts).
"""

COORDINATOR = "SKYJAX_COORDINATOR"  # "host:port" of the jax.distributed coordinator
NUM_PROCESSES = "SKYJAX_NUM_PROCESSES"  # processes in the job
PROCESS_ID = "SKYJAX_PROCESS_ID"  # this process's index
LAUNCHER_PID = "SKYJAX_LAUNCHER_PID"  # the launcher's pid: a child exits if it is orphaned
CPUS = "SKYJAX_CPUS"  # cores ("0,1") a launched child binds itself to (launch --bind_cores)
TRANSFER_HOST = "SKYJAX_TRANSFER_HOST"  # address the point-to-point transfer server binds
TRANSFER_PORTS = "SKYJAX_TRANSFER_PORTS"  # "FIRST-LAST": ports it may bind (cluster/network.py)
# A directory holding the profile cache for every workdir (default: each WORKDIR/profiles): runs
# of one cluster and model in different workdirs then profile once (skyjax.profile.cache).
PROFILE_CACHE = "SKYJAX_PROFILE_CACHE"
KEEP_FREED_MEMORY = "SKYJAX_KEEP_FREED_MEMORY"  # "0": leave glibc's malloc thresholds alone
XLA_FLAGS = "XLA_FLAGS"
