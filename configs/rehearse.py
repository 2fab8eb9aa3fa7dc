"""Rehearse a cluster you do not have: the plan of its profile.json runs on this host, every call
and message taking the time the profile declares (docs/design.md, "Rehearsal").

    python -m skyjax.profile.compose --cluster experiments/clusters/two_regions.json \\
        --out /tmp/sky/cluster.json
    python -m skyjax.main --config configs/rehearse.py --workdir /tmp/sky \\
        --config.rehearse.profile=/tmp/sky/cluster.json

The model that computes is a small BERT (hidden 32) with the profile's unit count, so the math
is real and checkable at any scale; the times are the declared cluster's, times
``rehearse.time_scale``. summary.json's ``rehearsal`` holds the measured step against the
simulator's, and this host's overhead per call (raise the time scale when it is not small
beside the declared calls).
"""

from skyjax.config import base_config


def get_config():
    config = base_config()
    config.model.hidden_size = 32
    config.model.num_attention_heads = 2
    config.model.intermediate_size = 64
    config.model.vocab_size = 128
    config.model.max_position_embeddings = 16
    config.data.name = "synthetic"
    config.data.seq_len = 16
    config.data.batch_size = 32
    config.data.eval_examples = 0
    config.data.prefetch = 2
    config.train.steps = 12
    config.train.log_every = 4
    config.train.compute_dtype = "float32"
    config.pipeline.schedule = "1f1b"
    config.pipeline.microbatches = 8
    config.allocation.strategy = "optimal"
    # up to 4 pipelines (the default 0 lets the planner go up to min(16, devices, micro-batches);
    # 4 keeps the rehearsal's processes and messages few enough for a laptop)
    config.allocation.max_pipelines = 4
    config.cluster.mode = "local"
    # declared times x 10: this host's ~0.2-2 ms per call (dispatch, wake-ups, a busy host's
    # compute of the small model) stays small beside the declared calls of a GPU cluster
    config.rehearse.time_scale = 10.0
    config.lock()
    return config
