"""Loading Hugging Face BERT checkpoints (``config.json`` + safetensors) into the Flax model."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from skyjax.models import hf_config
from skyjax.models.modeling import (BertConfig, BertForSequenceClassification, base_key,
                                    init_block)

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
    """A checkpoint that cannot be used or written: a pretrained one that does not fit the model
    (here), or a save of skyjax's own that cannot be committed (``skyjax.checkpoint``); the
    message names the file, tensor, unit or process. Defined once, in the lowest package that
    raises it, so that one ``except CheckpointError`` catches both. A ``ValueError``: a restart
    would fail the same way, so a command ends with exit 64 and the launcher does not retry."""


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


class SafetensorsCheckpoint:
    """The tensors of ``model.safetensors`` (or a sharded index) under a directory, read one at a
    time: names and shapes come from the file headers, data only for the tensors asked for (a
    process that owns a few layers never reads the rest)."""

    def __init__(self, path: str):
        single = os.path.join(path, "model.safetensors")
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(single):
            files = [single]
        elif os.path.exists(index):
            with open(index) as f:
                files = [os.path.join(path, s) for s in sorted(set(json.load(f)["weight_map"].values()))]
        else:
            raise CheckpointError(f"{single}: file not found (nor a sharded "
                                  f"{os.path.basename(index)})")
        from safetensors import safe_open

        self.file_of: dict[str, str] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        for file in files:
            if not os.path.exists(file):
                raise CheckpointError(f"{file}: file not found (named by {index})")
            try:
                with safe_open(file, framework="numpy") as f:
                    for name in f.keys():
                        self.file_of[name] = file
                        self.shapes[name] = tuple(f.get_slice(name).get_shape())
            except Exception as e:  # noqa: BLE001 - safetensors' own error type varies
                raise CheckpointError(f"{file}: cannot be read ({type(e).__name__}: {e}; "
                                      f"truncated or not safetensors?)") from None

    def read(self, name: str) -> np.ndarray:
        from safetensors import safe_open

        with safe_open(self.file_of[name], framework="numpy") as f:
            x = f.get_tensor(name)
        bad = int(x.size - np.count_nonzero(np.isfinite(x))) if x.dtype.kind == "f" else 0
        if bad:  # a NaN or inf weight would train to NaN, silently
            raise CheckpointError(f"{self.file_of[name]}: tensor {name} holds {bad} NaN or "
                                  f"infinite value(s)")
        return x

    def read_all(self) -> dict[str, np.ndarray]:
        return {name: self.read(name) for name in self.file_of}


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """All tensors of the checkpoint under directory ``path``."""
    return SafetensorsCheckpoint(path).read_all()


def read_config(path: str, num_labels: int | None, **numerics: str) -> BertConfig:
    """``config.json`` under ``path`` as a BertConfig (``num_labels`` overrides the file;
    ``numerics``: how it computes, ``modeling.NUMERICS_FIELDS``)."""
    file = os.path.join(path, "config.json")
    try:
        hf = hf_config.read(path)
    except hf_config.PretrainedConfigError as e:
        raise CheckpointError(str(e)) from None
    overrides = dict(numerics) if num_labels is None else {"num_labels": num_labels, **numerics}
    try:
        return BertConfig.from_hf(hf, **overrides)
    except ValueError as e:
        raise CheckpointError(f"{file}: {e}") from e


def _leaf(tree: dict, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _paths(tree: dict, prefix: tuple = ()) -> list[tuple]:
    out = []
    for key, value in tree.items():
        out += _paths(value, prefix + (key,)) if isinstance(value, dict) else [prefix + (key,)]
    return out


@dataclasses.dataclass(frozen=True)
class TensorMap:
    """Where each model parameter comes from: ``sources[path] = (tensor name, transpose)``;
    ``missing`` are the parameters the checkpoint lacks (only the classifier may be)."""

    checkpoint: SafetensorsCheckpoint
    sources: dict[tuple, tuple[str, bool]]
    missing: list[tuple]


def map_checkpoint(path: str, template: dict, to_path=hf_to_path, ignored=_IGNORED,
                   optional=lambda p: p[:2] == ("head", "classifier"),
                   model_name: str = "BertForSequenceClassification") -> TensorMap:
    """Matches every tensor of the checkpoint under ``path`` to the model's parameter tree
    ``template`` (arrays or ``ShapeDtypeStruct``s) by name and shape, reading headers only, so a
    bad checkpoint fails before anything is read or compiled. Unknown, duplicate or missing
    tensors and shape mismatches raise ``CheckpointError`` naming the tensor. BERT's names by
    default; a decoder passes its own ``to_path``, ``ignored`` tensors and ``optional`` paths
    (those the checkpoint may lack)."""
    ckpt = SafetensorsCheckpoint(path)
    sources: dict[tuple, tuple[str, bool]] = {}
    for name, shape in ckpt.shapes.items():
        if any(p.search(name) for p in ignored):
            continue
        mapped = to_path(name)
        if mapped is None:
            raise CheckpointError(f"tensor {name}: unknown to {model_name} "
                                  f"({ckpt.file_of[name]})")
        target, transpose = mapped
        if target in sources:
            raise CheckpointError(f"tensor {name}: given twice")
        try:
            expected = tuple(_leaf(template, target).shape)
        except (KeyError, IndexError):
            raise CheckpointError(f"tensor {name}: the model has no {'.'.join(map(str, target))} "
                                  f"({ckpt.file_of[name]})") from None
        got = shape[::-1] if transpose else shape
        if tuple(got) != expected:
            raise CheckpointError(f"tensor {name}: shape {tuple(got)} does not fit the model's "
                                  f"{expected}")
        sources[target] = (name, transpose)
    missing = [p for p in _paths(template) if p not in sources]
    classifier = [p for p in missing if optional(p)]
    others = [p for p in missing if p not in classifier]
    if others:
        raise CheckpointError(f"{path}: missing tensor for {'.'.join(map(str, others[0]))} "
                              f"({len(others)} missing in all)")
    return TensorMap(ckpt, sources, classifier)


def read_subtree(tensors: TensorMap, prefix: tuple, template: dict) -> dict:
    """The parameters under ``prefix`` (e.g. ``("layers", 3, "attention")``) read tensor by
    tensor; ``template`` is the subtree's shapes. Missing leaves (a new classifier) stay as in
    ``template``."""
    out = jax.tree.map(lambda x: x, template)
    for rel in _paths(template):
        source = tensors.sources.get(prefix + rel)
        if source is None:
            continue
        name, transpose = source
        value = tensors.checkpoint.read(name)
        node = _leaf(out, rel[:-1])
        dtype = template_dtype(_leaf(template, rel))
        node[rel[-1]] = np.ascontiguousarray(value.T if transpose else value).astype(dtype)
    return out


def template_dtype(leaf: Any) -> Any:
    return getattr(leaf, "dtype", np.float32)


def from_pretrained(path: str, num_labels: int | None = None, seed: int = 0, **numerics: str
                    ) -> BertForSequenceClassification:
    """Loads an HF ``BertForSequenceClassification`` or bare ``BertModel`` directory.

    A checkpoint without a classifier gets a freshly initialised one (logged), the one random
    init with ``seed`` would give. Unknown or missing tensors and shape mismatches raise
    ``CheckpointError`` naming the tensor.
    """
    config = read_config(path, num_labels, **numerics)
    model = nnx.eval_shape(lambda: BertForSequenceClassification(config, nnx.Rngs(seed)))
    graphdef, state = nnx.split(model)
    template = nnx.to_pure_dict(state)
    tensors = map_checkpoint(path, template)
    params = read_subtree(tensors, (), template)
    if tensors.missing:
        logging.info("%s has no classifier: initialised a new one with %d labels", path,
                     config.num_labels)
        head = init_block(config, base_key(seed), config.num_hidden_layers + 1)
        params["head"]["classifier"] = nnx.to_pure_dict(nnx.state(head.classifier))
    params = jax.tree.map(jnp.asarray, params)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state)
