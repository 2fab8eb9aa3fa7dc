"""The local demo's model on 4 processes of one host with emulated slow-downs (1, 2, 3, 6).

Used by the heterogeneous benchmark: one process per pipeline stage under jax.distributed, each
slowed down by its factor, so that even and optimal allocations differ. Run it through the
launcher, which starts the 4 processes:

    python -m skyjax.launch --num_processes 4 -- --config configs/local_hetero.py --workdir /tmp/h
"""

from skyjax.config import base_config


def get_config():
    config = base_config()  # model and data: those of configs/local_demo.py
    config.pipeline.schedule = "1f1b"
    config.pipeline.microbatches = 4
    config.allocation.strategy = "optimal"
    config.allocation.granularity = "layer"
    # Four emulated devices are processes sharing this host's cores: the shared-host model
    # (skyjax/hostmodel/) adds their contention to the cost model; what the profile's timings
    # still miss of the running pipeline is corrected from the first steps' measured times, then
    # the plan of the corrected profile runs.
    config.cluster.shared_host = True
    config.allocation.calibrate_steps = 6
    config.cluster.mode = "distributed"
    config.cluster.num_devices = 4
    config.cluster.slowdowns = (1, 2, 3, 6)
    # Two shared cores move in speed from one second to the next: each device is timed in three
    # passes, the median kept per unit (skyjax/hostmodel/passes.py).
    config.profile.passes = 3
    config.lock()
    return config
