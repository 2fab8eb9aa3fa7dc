"""The model a config asks for: its shape, and the model itself (random or pretrained).

One mapping from ``config.model`` to :class:`BertConfig`, used by the trainer and the profiler
alike, so the shape that is profiled is the shape that is trained.
"""

from __future__ import annotations

import json
import os
from typing import Any

from flax import nnx

from skyjax.models.hf_loading import from_pretrained
from skyjax.models.modeling import BertConfig, BertForSequenceClassification


def model_config(model: Any) -> BertConfig:
    """The shape from ``config.model``, or from the pretrained directory's ``config.json`` when
    ``model.pretrained`` names one (then only ``num_labels`` is taken from ``model``)."""
    if model.pretrained:
        with open(os.path.join(model.pretrained, "config.json")) as f:
            return BertConfig.from_hf(json.load(f), num_labels=int(model.num_labels))
    return BertConfig(
        vocab_size=model.vocab_size, hidden_size=model.hidden_size,
        num_hidden_layers=model.num_hidden_layers, num_attention_heads=model.num_attention_heads,
        intermediate_size=model.intermediate_size, hidden_act=model.hidden_act,
        hidden_dropout_prob=model.hidden_dropout_prob,
        attention_probs_dropout_prob=model.attention_probs_dropout_prob,
        max_position_embeddings=model.max_position_embeddings,
        type_vocab_size=model.type_vocab_size, layer_norm_eps=model.layer_norm_eps,
        initializer_range=model.initializer_range, num_labels=model.num_labels,
        pad_token_id=model.pad_token_id)


def build_model(model: Any, seed: int) -> BertForSequenceClassification:
    """Random init of ``config.model`` seeded by ``seed`` (``config.train.seed``), or the Hugging
    Face checkpoint ``model.pretrained``."""
    if model.pretrained:
        return from_pretrained(model.pretrained, num_labels=model.num_labels)
    return BertForSequenceClassification(model_config(model), rngs=nnx.Rngs(seed))
