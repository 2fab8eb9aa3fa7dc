"""The Sky Computing experiment: a 160-layer BERT-large (hidden 1024, 16 heads, FFN 4096), random
init, cut at sub-layer granularity (3 units per layer: 482 units), on 64 devices whose slow-downs
come from ``numpy.random.default_rng(35).integers(1, 7, 64)`` as in the original. Batch 32,
sequence length 128, GLUE MNLI, 30 steps, one batch in flight (the original did not pipeline; try
--config.pipeline.microbatches=8 to pipeline). The GLUE loader is not implemented yet; with
--config.data.name=synthetic the same shapes run on synthetic data.
"""

import numpy as np

from skyjax.config_defaults import base_config

NUM_DEVICES = 64


def get_config():
    config = base_config()
    m = config.model
    m.vocab_size = 30522
    m.hidden_size = 1024
    m.num_hidden_layers = 160
    m.num_attention_heads = 16
    m.intermediate_size = 4096
    m.hidden_dropout_prob = 0.1
    m.attention_probs_dropout_prob = 0.1
    m.max_position_embeddings = 512
    m.num_labels = 3
    config.data.name = "glue/mnli"
    config.data.seq_len = 128
    config.data.batch_size = 32
    config.data.eval_examples = 0
    t = config.train
    t.steps = 30
    t.warmup_steps = 0
    t.learning_rate = 1e-4
    t.lr_schedule = "constant"
    t.log_every = 1
    config.pipeline.schedule = "gpipe"
    config.pipeline.microbatches = 1
    config.allocation.strategy = "optimal"
    config.allocation.granularity = "sublayer"
    config.cluster.mode = "distributed"
    config.cluster.num_devices = NUM_DEVICES
    config.cluster.slowdowns = tuple(
        int(s) for s in np.random.default_rng(35).integers(1, 7, NUM_DEVICES))
    config.lock()
    return config
