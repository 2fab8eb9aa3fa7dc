"""BERT-base (12 layers, hidden 768) fine-tuned on GLUE MNLI: batch 32, sequence length 128.

Pass a Hugging Face checkpoint directory (its tokenizer is used too) and the prepared TFDS data,
e.g. ``--config.model.pretrained=/path/bert-base-uncased --config.data.data_dir=/path/tfds``
(no download happens; docs/guide/configs.md says how to get both). Both validation splits
(matched, mismatched) are evaluated whole.
"""

from skyjax.config import base_config


def get_config():
    config = base_config()
    m = config.model
    m.vocab_size = 30522
    m.hidden_size = 768
    m.num_hidden_layers = 12
    m.num_attention_heads = 12
    m.intermediate_size = 3072
    m.hidden_dropout_prob = 0.1
    m.attention_probs_dropout_prob = 0.1
    m.max_position_embeddings = 512
    m.num_labels = 3
    config.data.name = "glue/mnli"
    config.data.seq_len = 128
    config.data.batch_size = 32
    config.data.eval_examples = -1  # every example of validation_matched and _mismatched
    t = config.train
    t.steps = 36816  # 3 epochs of the 392,702 training pairs
    t.warmup_steps = 3682
    t.learning_rate = 2e-5
    t.log_every = 100
    t.eval_every = 2000
    config.pipeline.microbatches = 4
    config.lock()
    return config
