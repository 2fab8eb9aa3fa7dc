"""A few minutes of the MNLI path, to check a checkpoint, a tokenizer and prepared data before a
real run: ``bert_base_mnli.py`` for 20 steps at seq 64, batch 8, on 2 local stages, with 256
examples of each validation split.

    python -m skyjax.main --config configs/mnli_smoke.py --workdir /tmp/mnli_smoke \\
      --config.model.pretrained=bert-base-uncased --config.data.data_dir=DIR
"""

from configs import bert_base_mnli


def get_config():
    config = bert_base_mnli.get_config()
    config.unlock()
    config.data.seq_len = 64
    config.data.batch_size = 8
    config.data.eval_examples = 256
    config.train.steps = 20
    config.train.warmup_steps = 2
    config.train.log_every = 5
    config.train.eval_every = 0
    config.pipeline.microbatches = 2
    config.cluster.num_devices = 2
    config.allocation.strategy = "even"
    config.profile.repeats = 2
    config.lock()
    return config
