"""BERT-large (24 layers, hidden 1024, 16 heads) fine-tuned on GLUE MNLI: batch 32, length 128.

As configs/bert_base_mnli.py with BERT-large shapes; pass --config.model.pretrained and
--config.data.tokenizer for a real run. The GLUE loader is not implemented yet: building the data
raises NotImplementedError; the config itself loads and validates.
"""

from skyjax.config_defaults import base_config


def get_config():
    config = base_config()
    m = config.model
    m.vocab_size = 30522
    m.hidden_size = 1024
    m.num_hidden_layers = 24
    m.num_attention_heads = 16
    m.intermediate_size = 4096
    m.hidden_dropout_prob = 0.1
    m.attention_probs_dropout_prob = 0.1
    m.max_position_embeddings = 512
    m.num_labels = 3
    config.data.name = "glue/mnli"
    config.data.seq_len = 128
    config.data.batch_size = 32
    config.data.eval_examples = 9815  # validation_matched
    t = config.train
    t.steps = 36816  # 3 epochs of the 392,702 training pairs
    t.warmup_steps = 3682
    t.learning_rate = 1e-5
    t.log_every = 100
    t.eval_every = 2000
    config.pipeline.microbatches = 8
    config.lock()
    return config
