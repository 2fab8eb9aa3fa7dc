"""The model a config asks for: its shape, and the model itself (random or pretrained).

One mapping from ``config.model`` to :class:`BertConfig`, used by the trainer and the profiler
alike, so the shape that is profiled is the shape that is trained.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from flax import nnx

from skyjax.models.hf_loading import from_pretrained
from skyjax.models.modeling import BertConfig, BertForSequenceClassification


def model_config(model: Any) -> BertConfig:
    """The shape from ``config.model``: the pretrained directory's ``config.json`` (with
    ``model.num_labels``) when ``model.pretrained`` names one, else the ``BertConfig`` fields of
    ``config.model`` itself (the schema names them as Hugging Face does)."""
    if getattr(model, "pretrained", ""):
        with open(os.path.join(model.pretrained, "config.json")) as f:
            return BertConfig.from_hf(json.load(f), num_labels=int(model.num_labels))
    fields = {f.name for f in dataclasses.fields(BertConfig)}
    return BertConfig(**{k: model[k] for k in fields if k in model})


def build_model(model: Any, seed: int) -> BertForSequenceClassification:
    """Random init of ``config.model`` seeded by ``seed`` (``config.train.seed``), or the Hugging
    Face checkpoint ``model.pretrained``."""
    if model.pretrained:
        return from_pretrained(model.pretrained, num_labels=model.num_labels)
    return BertForSequenceClassification(model_config(model), rngs=nnx.Rngs(seed))
