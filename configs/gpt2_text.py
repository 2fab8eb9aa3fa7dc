"""Offline language-model demo: a tiny GPT-2-shaped decoder (4 layers, hidden 64, tied
embeddings) learns the shipped text corpus as a pipeline over 4 emulated devices of unequal
speed, in one process, as configs/local_demo.py trains BERT.

    python -m skyjax.main --config configs/gpt2_text.py --workdir /tmp/skyjax_gpt2

The corpus is configs/data/tiny_corpus (five .txt files, one document each), tokenised by the
byte-level BPE in configs/data/tiny_tokenizer (512 tokens, ``<|endoftext|>`` between documents);
one document is held out and scored by perplexity. The model is random-initialised from the
shape below (set ``config.model.pretrained`` to a Hugging Face GPT-2 directory to start from a
checkpoint, whose tokenizer is then used). Devices 1 and 2 are emulated 4x slower; the first 6
steps run the even split and are timed, then the units move to the plan of those times. The
embedding, which the head also uses, is held by the first and the last stage, its gradient
summed between them every step (docs/design.md, "Tied weights across stages").
"""

import os

from skyjax.config import base_config
from skyjax.config.defaults import decoder_model

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def get_config():
    config = decoder_model(base_config(), "gpt2")
    config.model.vocab_size = 512
    config.model.hidden_size = 64
    config.model.num_hidden_layers = 4
    config.model.num_attention_heads = 4
    config.model.intermediate_size = 256
    config.model.max_position_embeddings = 64
    config.data.name = os.path.join(DATA, "tiny_corpus")
    config.data.tokenizer = os.path.join(DATA, "tiny_tokenizer")
    config.data.eval_fraction = 0.2
    config.data.eval_examples = -1
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
