"""Offline demo: a 4-layer BERT (hidden 128) learns the synthetic sentence-pair task as a pipeline
over 4 emulated devices of unequal speed, in one process.

    python -m skyjax.main --config configs/local_demo.py --workdir /tmp/skyjax_demo

Devices 1 and 2 are emulated 4x slower: each of their calls then sleeps 3x its compute, which
the host's load does not shrink. The first 6 steps run the even split, which gives the slow
devices 3 of the 4 layers, and are timed; then the units move to the plan of the times measured
there. The last log line prints both measured step times (each plan's mean, without its
compiling step) and the speed-up; ``summary.json`` has them under ``calibration``. Reaches eval
accuracy >= 0.8 in about a minute on a 2-core CPU.

Every key is listed in skyjax/config/defaults.py, whose defaults are these values but for the
cluster, the micro-batches and the calibration: one device, one micro-batch, none.
"""

from skyjax.config import base_config


def get_config():
    config = base_config()
    config.model.num_hidden_layers = 4
    config.model.hidden_size = 128
    config.model.num_attention_heads = 4
    config.model.intermediate_size = 512
    config.data.name = "synthetic"
    config.data.seq_len = 32
    config.data.batch_size = 32
    config.train.steps = 200
    config.train.learning_rate = 1e-3
    config.cluster.mode = "local"
    config.cluster.num_devices = 4
    config.cluster.slowdowns = (1, 4, 4, 1)
    config.pipeline.schedule = "1f1b"
    config.pipeline.microbatches = 4
    config.allocation.strategy = "optimal"
    # steps 2-6 of the even split are timed (the first compiles), then the chosen plan runs
    config.allocation.calibrate_steps = 6
    config.lock()
    return config
