"""BERT for sequence classification (Flax NNX, Hugging Face semantics) as a chain of units.
``bert`` is the public face; the others are imported by name where needed.

* ``bert``: the stable names (``units``, ``BertForSequenceClassification``, ``from_pretrained``);
* ``modeling``: ``BertConfig`` and the Flax NNX modules;
* ``units``: the model cut into a chain of pure ``apply`` functions (layer or sublayer);
* ``dropout``: dropout whose keys come from the position in the model;
* ``hf_config``: a Hugging Face ``config.json``, read and checked without JAX;
* ``hf_loading``: Hugging Face safetensors checkpoints into the model;
* ``build``: the model a config asks for: abstract chain, then only this process's units.
"""
