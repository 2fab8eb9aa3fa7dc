"""BERT for sequence classification and decoder language models (Llama, GPT-2), Flax NNX with
Hugging Face semantics, as chains of units. ``bert`` is the public face; the others are imported
by name where needed.

* ``bert``: the stable names (``units``, ``BertForSequenceClassification``, ``from_pretrained``);
* ``modeling``: ``BertConfig`` and the Flax NNX modules;
* ``units``: the model cut into a chain of pure ``apply`` functions (layer or sublayer);
* ``dropout``: dropout whose keys come from the position in the model;
* ``hf_config``: a Hugging Face ``config.json``, read and checked without JAX;
* ``hf_loading``: Hugging Face safetensors checkpoints into the model;
* ``build``: the model a config asks for: abstract chain, then only this process's units;
* ``decoder``: ``DecoderConfig`` and what both decoder families share (RMSNorm, rotary, causal
  attention);
* ``llama``: the Llama family's blocks (RMSNorm, rotary, grouped-query attention, SwiGLU);
* ``gpt2``: GPT-2's blocks (learned positions, LayerNorm, GELU);
* ``decoder_units``: a decoder as a chain of units, with its tied embedding named;
* ``decoder_hf``: a decoder's Hugging Face names both ways (loading, the state dict for export).
"""
