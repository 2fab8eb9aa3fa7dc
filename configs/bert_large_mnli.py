"""BERT-large (24 layers, hidden 1024, 16 heads) fine-tuned on GLUE MNLI: batch 32, length 128.

As configs/bert_base_mnli.py with BERT-large shapes; pass --config.model.pretrained (e.g. a
``bert-large-uncased`` directory) and --config.data.data_dir for a real run.
"""

from configs import bert_base_mnli


def get_config():
    config = bert_base_mnli.get_config()
    config.unlock()
    m = config.model
    m.hidden_size = 1024
    m.num_hidden_layers = 24
    m.num_attention_heads = 16
    m.intermediate_size = 4096
    config.train.learning_rate = 1e-5
    config.pipeline.microbatches = 8
    config.lock()
    return config
