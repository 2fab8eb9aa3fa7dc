"""Offline language-model demo, Llama-shaped: a tiny Llama-family decoder (4 layers, hidden 64,
RMSNorm, rotary positions, SwiGLU, grouped-query attention with 2 key/value heads for 4 query
heads, an untied LM head) learns the shipped text corpus on 4 emulated devices of unequal speed,
as configs/gpt2_text.py does with GPT-2 (whose docstring says what runs).

    python -m skyjax.main --config configs/llama_text.py --workdir /tmp/skyjax_llama

Documents are masked from each other (``config.data.document_mask``): attention stays inside
the document each token belongs to.
"""

import os

from skyjax.config import base_config
from skyjax.config.defaults import decoder_model

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def get_config():
    config = decoder_model(base_config(), "llama")
    config.model.vocab_size = 512
    config.model.hidden_size = 64
    config.model.num_hidden_layers = 4
    config.model.num_attention_heads = 4
    config.model.num_key_value_heads = 2
    config.model.intermediate_size = 172
    config.model.max_position_embeddings = 64
    config.data.name = os.path.join(DATA, "tiny_corpus")
    config.data.tokenizer = os.path.join(DATA, "tiny_tokenizer")
    config.data.eval_fraction = 0.2
    config.data.eval_examples = -1
    config.data.document_mask = True
    config.data.seq_len = 32
    config.data.batch_size = 8
    config.train.steps = 150
    config.train.learning_rate = 3e-3
    config.train.warmup_steps = 10
    config.train.log_every = 25
    config.cluster.mode = "local"
    config.cluster.num_devices = 4
    config.cluster.slowdowns = (1, 4, 4, 1)
    config.pipeline.schedule = "1f1b"
    config.pipeline.microbatches = 4
    config.allocation.strategy = "optimal"
    config.allocation.calibrate_steps = 6
    config.lock()
    return config
