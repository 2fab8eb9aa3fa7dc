"""BERT for sequence classification, the way skyjax uses it: the public face of ``skyjax.models``.

Four modules, dependencies pointing one way (``dropout`` <- ``modeling`` <- ``units`` /
``hf_loading``):

* :mod:`skyjax.models.dropout`: dropout and its keys, derived from the position in the model;
* :mod:`skyjax.models.modeling`: ``BertConfig`` and the Flax NNX modules, Hugging Face semantics;
* :mod:`skyjax.models.units`: the model cut into a chain of units (``units(model, granularity)``);
* :mod:`skyjax.models.hf_loading`: Hugging Face checkpoints (``from_pretrained``).

This module only re-exports them under the stable names (``bert.units``,
``bert.BertForSequenceClassification``, ``bert.from_pretrained``, ...).
"""

from skyjax.models.dropout import example_keys, site_key
from skyjax.models.hf_loading import CheckpointError, from_pretrained
from skyjax.models.modeling import (ACTIVATIONS, BertConfig, BertForSequenceClassification,
                                    BertLayer, Carry, Params, initial_carry)
from skyjax.models.units import Unit, apply_units, model_params, units

__all__ = ["ACTIVATIONS", "BertConfig", "BertForSequenceClassification", "BertLayer", "Carry",
           "CheckpointError", "Params", "example_keys", "Unit", "apply_units", "from_pretrained", "initial_carry",
           "model_params", "site_key", "units"]
