"""The Sky Computing experiment: a 160-layer BERT-large (hidden 1024, 16 heads, FFN 4096), random
init, cut at sub-layer granularity (3 units per layer: 482 units), on 64 devices whose slow-downs
come from ``numpy.random.default_rng(35).integers(1, 7, 64)`` as in the original. Batch 32,
sequence length 128, GLUE MNLI, 30 steps, one batch in flight (the original did not pipeline; try
--config.pipeline.microbatches=8 to pipeline). Needs --config.data.tokenizer (a BERT vocabulary)
and prepared MNLI data; with --config.data.name=synthetic the same shapes run on synthetic data.
"""

import numpy as np

from configs import bert_large_mnli

NUM_DEVICES = 64


def get_config():
    config = bert_large_mnli.get_config()
    config.unlock()
    config.model.num_hidden_layers = 160
    config.data.eval_examples = 0
    t = config.train
    t.steps = 30
    t.warmup_steps = 0
    t.learning_rate = 1e-4
    t.lr_schedule = "constant"
    t.log_every = 1
    t.eval_every = 0
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
