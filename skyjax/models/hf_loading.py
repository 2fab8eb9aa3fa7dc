"""Loading Hugging Face BERT checkpoints (``config.json`` + safetensors) into the Flax model."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from skyjax.models.modeling import BertConfig, BertForSequenceClassification

# Tensors in pre-training checkpoints that a classifier does not use.
_IGNORED = (re.compile(r"^cls\."), re.compile(r"(^|\.)embeddings\.position_ids$"))

_LAYER_PARTS = {
    "attention.self.query": ("attention", "self_attention", "query"),
    "attention.self.key": ("attention", "self_attention", "key"),
    "attention.self.value": ("attention", "self_attention", "value"),
    "attention.output.dense": ("attention", "output", "dense"),
    "attention.output.LayerNorm": ("attention", "output", "LayerNorm"),
    "intermediate.dense": ("intermediate", "dense"),
    "output.dense": ("output", "dense"),
    "output.LayerNorm": ("output", "LayerNorm"),
}
_LEAF = {"weight": "kernel", "bias": "bias", "gamma": "scale", "beta": "bias"}


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model; the message names the file or tensor."""


def hf_to_path(name: str) -> tuple[tuple[Any, ...], bool] | None:
    """Maps an HF tensor name to (path in ``model_params``, needs-transpose); None if unknown."""
    name = name.removeprefix("bert.")
    if name == "classifier.weight" or name == "classifier.bias":
        leaf = name.split(".")[1]
        return ("head", "classifier", _LEAF[leaf]), leaf == "weight"
    if m := re.fullmatch(r"pooler\.dense\.(weight|bias)", name):
        return ("head", "pooler", _LEAF[m[1]]), m[1] == "weight"
    if m := re.fullmatch(r"embeddings\.(word|position|token_type)_embeddings\.weight", name):
        return ("embeddings", f"{m[1]}_embeddings", "embedding"), False
    if m := re.fullmatch(r"embeddings\.LayerNorm\.(weight|bias|gamma|beta)", name):
        leaf = "scale" if m[1] in ("weight", "gamma") else "bias"
        return ("embeddings", "LayerNorm", leaf), False
    if m := re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias|gamma|beta)", name):
        part = _LAYER_PARTS.get(m[2])
        if part is None:
            return None
        is_norm = part[-1] == "LayerNorm"
        leaf = ("scale" if m[3] in ("weight", "gamma") else "bias") if is_norm else _LEAF[m[3]]
        return ("layers", int(m[1])) + part + (leaf,), (not is_norm and m[3] == "weight")
    return None


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """All tensors of ``model.safetensors`` (or a sharded index) under directory ``path``."""
    from safetensors.numpy import load_file

    single = os.path.join(path, "model.safetensors")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(single):
        return load_file(single)
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        tensors: dict[str, np.ndarray] = {}
        for shard in shards:
            tensors.update(load_file(os.path.join(path, shard)))
        return tensors
    raise CheckpointError(f"{single}: file not found (nor a sharded {os.path.basename(index)})")


def read_config(path: str, num_labels: int | None) -> BertConfig:
    """``config.json`` under ``path`` as a BertConfig (``num_labels`` overrides the file)."""
    file = os.path.join(path, "config.json")
    if not os.path.exists(file):
        raise CheckpointError(f"{file}: file not found")
    with open(file) as f:
        hf = json.load(f)
    if hf.get("model_type", "bert") != "bert":
        raise CheckpointError(f"{file}: model_type={hf['model_type']!r}, expected 'bert'")
    overrides = {} if num_labels is None else {"num_labels": num_labels}
    try:
        return BertConfig.from_hf(hf, **overrides)
    except ValueError as e:
        raise CheckpointError(f"{file}: {e}") from e


def _set(tree: dict, path: tuple, value: np.ndarray, name: str) -> None:
    node = tree
    for key in path[:-1]:
        node = node[key]
    expected = node[path[-1]].shape
    if tuple(value.shape) != tuple(expected):
        raise CheckpointError(f"tensor {name}: shape {tuple(value.shape)} does not fit the model's "
                              f"{tuple(expected)}")
    node[path[-1]] = jnp.asarray(value, dtype=node[path[-1]].dtype)


def _paths(tree: dict, prefix: tuple = ()) -> list[tuple]:
    out = []
    for key, value in tree.items():
        out += _paths(value, prefix + (key,)) if isinstance(value, dict) else [prefix + (key,)]
    return out


def from_pretrained(path: str, num_labels: int | None = None, seed: int = 0
                    ) -> BertForSequenceClassification:
    """Loads an HF ``BertForSequenceClassification`` or bare ``BertModel`` directory.

    A checkpoint without a classifier gets a freshly initialised one (logged). Unknown or missing
    tensors and shape mismatches raise ``CheckpointError`` naming the tensor.
    """
    config = read_config(path, num_labels)
    tensors = read_safetensors(path)
    model = BertForSequenceClassification(config, nnx.Rngs(seed))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    loaded: set[tuple] = set()
    for name, value in tensors.items():
        if any(p.search(name) for p in _IGNORED):
            continue
        mapped = hf_to_path(name)
        if mapped is None:
            raise CheckpointError(f"tensor {name}: unknown to BertForSequenceClassification "
                                  f"({os.path.join(path, 'model.safetensors')})")
        target, transpose = mapped
        if target in loaded:
            raise CheckpointError(f"tensor {name}: given twice")
        _set(params, target, value.T if transpose else value, name)
        loaded.add(target)
    missing = [p for p in _paths(params) if p not in loaded]
    classifier = [p for p in missing if p[:2] == ("head", "classifier")]
    if classifier:
        logging.info("%s has no classifier: initialised a new one with %d labels", path,
                     config.num_labels)
    missing = [p for p in missing if p not in classifier]
    if missing:
        raise CheckpointError(f"{path}: missing tensor for {'.'.join(map(str, missing[0]))} "
                              f"({len(missing)} missing in all)")
    nnx.update(model, params)
    return model
