"""A Hugging Face BERT directory's ``config.json``, read and checked once for every reader (config
validation, data, model building) without JAX: a missing, truncated or foreign file is one line
naming it, before anything starts."""

from __future__ import annotations

import json
import os
from typing import Any

SHAPE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "intermediate_size", "max_position_embeddings", "type_vocab_size")


DECODER_TYPES = ("llama", "gpt2")  # decoder.FAMILIES, named here without JAX
MODEL_TYPES = ("bert",) + DECODER_TYPES


class PretrainedConfigError(ValueError):
    """A pretrained directory whose ``config.json`` is missing, unreadable or not BERT's."""


def model_type(model: Any) -> str:
    """``"bert"``, ``"llama"`` or ``"gpt2"``: the pretrained ``config.json``'s ``model_type``
    when ``config.model.pretrained`` names one, else ``config.model.model_type``."""
    if getattr(model, "pretrained", ""):
        return str(read(model.pretrained, model_types=MODEL_TYPES).get("model_type", "bert"))
    return str(getattr(model, "model_type", "bert") or "bert")


def max_positions(hf: dict[str, Any]) -> int:
    """A ``config.json``'s longest sequence (GPT-2 names it ``n_positions``)."""
    return int(hf.get("max_position_embeddings", hf.get("n_positions", 512)))


def read(pretrained: str, key: str = "config.model.pretrained",
         model_types: tuple[str, ...] = ("bert",)) -> dict[str, Any]:
    """The checked ``config.json`` of ``pretrained`` (``key``: the config key naming it), of one
    of ``model_types`` (a decoder's reader passes ``decoder.FAMILIES``)."""
    file = os.path.join(pretrained, "config.json")
    if not os.path.isdir(pretrained):
        raise PretrainedConfigError(f"{key}={pretrained!r}: directory not found")
    if not os.path.isfile(file):
        raise PretrainedConfigError(f"{key}={pretrained!r} is not a directory with a "
                                    f"config.json")
    try:
        with open(file) as f:
            hf = json.load(f)
    except (OSError, UnicodeDecodeError) as e:
        raise PretrainedConfigError(f"{file}: cannot be read ({e})") from None
    except json.JSONDecodeError as e:
        raise PretrainedConfigError(f"{file}: not valid JSON ({e.msg} at line {e.lineno}; "
                                    f"truncated?)") from None
    if not isinstance(hf, dict):
        raise PretrainedConfigError(f"{file}: expected a JSON object, got "
                                    f"{type(hf).__name__}")
    if hf.get("model_type", "bert") not in model_types:
        expected = " or ".join(map(repr, model_types))
        why = " (skyjax trains BERT)" if model_types == ("bert",) else ""
        raise PretrainedConfigError(f"{file}: model_type={hf['model_type']!r}, expected "
                                    f"{expected}{why}")
    if hf.get("model_type", "bert") != "bert":
        return hf  # a decoder's config.json: DecoderConfig.from_hf checks its fields
    for name in SHAPE_KEYS:
        v = hf.get(name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise PretrainedConfigError(f"{file}: {name}={v!r} must be a positive integer")
    hidden, heads = hf.get("hidden_size", 768), hf.get("num_attention_heads", 12)
    if hidden % heads:
        raise PretrainedConfigError(f"{file}: num_attention_heads={heads} does not divide "
                                    f"hidden_size={hidden}")
    return hf
