"""Offline demo: a 4-layer BERT (hidden 128) learns the synthetic sentence-pair task on one device.

    python -m skyjax.main --config configs/local_demo.py --workdir /tmp/skyjax_demo

Reaches eval accuracy >= 0.8 in about a minute on a 2-core CPU. Every key is listed in
skyjax/config/defaults.py, where the defaults are these same values.
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
    config.cluster.num_devices = 1
    config.lock()
    return config
