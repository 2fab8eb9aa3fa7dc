"""The model a config asks for: its shape, its unit chain without parameters, and the parameters
of just the units a process owns (random or pretrained).

One mapping from ``config.model`` to :class:`BertConfig`, used by the trainer and the profiler
alike, so the shape that is profiled is the shape that is trained. A pipeline process never holds
the whole model: :func:`abstract_chain` builds it with ``nnx.eval_shape`` (shapes, no arrays), and
:func:`materialize` fills in only the units asked for, each initialised from its block's position
(:func:`~skyjax.models.modeling.block_rngs`) or read from the safetensors tensor by tensor, so every
unit's parameters are the same whichever process makes them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

import jax
import jax.numpy as jnp
from absl import logging
from flax import nnx

from skyjax.models import decoder_hf, decoder_units, hf_config
from skyjax.models.decoder import FAMILIES, DecoderConfig
from skyjax.models.hf_loading import TensorMap, from_pretrained, map_checkpoint, read_subtree
from skyjax.models.modeling import BertConfig, BertForSequenceClassification, base_key, init_block
from skyjax.models.units import Unit, model_params, units


def resolve_compute_dtype(name: str, platforms: Iterable[str] | str | None = None) -> str:
    """``config.train.compute_dtype`` as a dtype name: ``"auto"`` is bfloat16 where every device
    is a GPU or TPU (tensor cores, half the bytes) and float32 where any is a CPU (bf16 matmuls
    are no faster there, and the tests pin float32 math). ``platforms``: the devices' (default:
    every device of the job, ``jax.devices()``, the same list in every process)."""
    if name != "auto":
        return name
    if platforms is None:
        platforms = {d.platform for d in jax.devices()}
    elif isinstance(platforms, str):
        platforms = {platforms}
    accelerators = {"gpu", "cuda", "rocm", "tpu"}
    return "bfloat16" if set(platforms) <= accelerators else "float32"


def _numerics(model: Any, compute_dtype: str) -> dict[str, str]:
    """How the model computes (``modeling.NUMERICS_FIELDS``): ``compute_dtype`` (resolved,
    see :func:`resolve_compute_dtype`) and ``config.model.attention``."""
    return {"compute_dtype": compute_dtype, "attention": str(getattr(model, "attention", "exact"))}


def decoder_family(model: Any) -> str | None:
    """``"llama"`` or ``"gpt2"`` when ``config.model`` is a decoder (its pretrained
    ``config.json``'s ``model_type``, else ``config.model.model_type``), None for BERT."""
    if getattr(model, "pretrained", ""):
        kind = hf_config.read(model.pretrained, model_types=("bert",) + FAMILIES).get("model_type")
    else:
        kind = getattr(model, "model_type", "bert")
    return kind if kind in FAMILIES else None


def model_config(model: Any, compute_dtype: str = "float32") -> BertConfig | DecoderConfig:
    """The shape from ``config.model``: the pretrained directory's ``config.json`` (with
    ``model.num_labels``) when ``model.pretrained`` names one, else the ``BertConfig`` fields of
    ``config.model`` itself (the schema names them as Hugging Face does); computing in
    ``compute_dtype`` with ``config.model.attention``. A decoder (:func:`decoder_family`) reads
    its fields as its family's ``config.json`` keys."""
    numerics = _numerics(model, compute_dtype)
    if family := decoder_family(model):
        if getattr(model, "pretrained", ""):
            return decoder_hf.read_config(model.pretrained, **numerics)
        fields = {k: model[k] for k in model.keys() if k not in numerics}
        return DecoderConfig.from_hf(fields, family=family, **numerics)
    if getattr(model, "pretrained", ""):
        return BertConfig.from_hf(hf_config.read(model.pretrained),
                                  num_labels=int(model.num_labels), **numerics)
    fields = {f.name for f in dataclasses.fields(BertConfig)} - set(numerics)
    return BertConfig(**{k: model[k] for k in fields if k in model}, **numerics)


def build_model(model: Any, seed: int, compute_dtype: str = "float32"
                ) -> BertForSequenceClassification:
    """The whole model, materialised: random init of ``config.model`` seeded by ``seed``
    (``config.train.seed``), or the Hugging Face checkpoint ``model.pretrained`` (a missing
    classifier initialised from ``seed``). For references and single-device baselines."""
    if decoder_family(model):
        if model.pretrained:
            return decoder_hf.from_pretrained(model.pretrained, seed=seed,
                                              **_numerics(model, compute_dtype))
        return decoder_units.DecoderForCausalLM(model_config(model, compute_dtype), nnx.Rngs(seed))
    if model.pretrained:
        return from_pretrained(model.pretrained, num_labels=model.num_labels, seed=seed,
                               **_numerics(model, compute_dtype))
    return BertForSequenceClassification(model_config(model, compute_dtype), rngs=nnx.Rngs(seed))


def abstract_chain(model: Any, seed: int, granularity: str, compute_dtype: str = "float32"
                   ) -> list[Unit]:
    """The unit chain with ``ShapeDtypeStruct`` parameters: no parameter memory is allocated."""
    cfg = model_config(model, compute_dtype)
    if isinstance(cfg, DecoderConfig):
        abstract = nnx.eval_shape(lambda: decoder_units.DecoderForCausalLM(cfg, nnx.Rngs(seed)))
        return decoder_units.units(abstract, granularity)
    abstract = nnx.eval_shape(lambda: BertForSequenceClassification(cfg, nnx.Rngs(seed)))
    return units(abstract, granularity)


def _block_and_rest(path: tuple[str, ...], num_layers: int) -> tuple[int, tuple[str, ...]]:
    """(block index, path inside the block) of a unit path: embeddings 0, layer i is i + 1, head
    num_layers + 1."""
    if path[0] == "embeddings":
        return 0, path[1:]
    if path[0] == "layers":
        return int(path[1]) + 1, path[2:]
    if path[0] == "head":
        return num_layers + 1, path[1:]
    raise ValueError(f"unit path {path} is not in the model")


def _tree_path(path: tuple[str, ...]) -> tuple:
    """A unit path in ``model_params`` keys (layer indices are ints there)."""
    return tuple(int(p) if p.isdigit() else p for p in path)


class UnitInitializer:
    """Makes the parameters of single units of ``config.model``: random (by block position) or
    from ``model.pretrained``; the checkpoint's headers are checked against the whole model
    once, when this is built (before anything compiles)."""

    def __init__(self, model: Any, seed: int):
        self.config = model_config(model)
        self.seed = seed
        self._blocks: dict[int, nnx.Module] = {}
        self.tensors: TensorMap | None = None
        if model.pretrained and isinstance(self.config, DecoderConfig):
            cfg = self.config
            abstract = nnx.eval_shape(lambda: decoder_units.DecoderForCausalLM(cfg, nnx.Rngs(seed)))
            self.tensors = decoder_hf.map_decoder_checkpoint(model.pretrained, cfg,
                                                             model_params(abstract))
        elif model.pretrained:
            cfg = self.config
            abstract = nnx.eval_shape(lambda: BertForSequenceClassification(cfg, nnx.Rngs(seed)))
            self.tensors = map_checkpoint(model.pretrained, model_params(abstract))
            if self.tensors.missing:
                logging.info("%s has no classifier: a new one with %d labels is initialised",
                             model.pretrained, cfg.num_labels)

    def _random(self, block: int, rest: tuple[str, ...]) -> dict:
        if block not in self._blocks:
            init = (decoder_units.init_block if isinstance(self.config, DecoderConfig)
                    else init_block)
            self._blocks[block] = init(self.config, base_key(self.seed), block)
        module = self._blocks[block]
        for name in rest:
            module = getattr(module, name)
        return nnx.to_pure_dict(nnx.state(module))

    def params(self, unit: Unit) -> dict:
        """``unit``'s parameters (host-side arrays)."""
        block, rest = _block_and_rest(unit.path, self.config.num_hidden_layers)
        if self.tensors is None:
            return self._random(block, rest)
        path = _tree_path(unit.path)
        tree = read_subtree(self.tensors, path, unit.params)
        if any(p[:len(path)] == path for p in self.tensors.missing):
            random = self._random(block, rest)  # the new classifier, as random init makes it
            tree = jax.tree.map(lambda got, new: new if isinstance(got, jax.ShapeDtypeStruct)
                                else got, tree, random)
        return jax.tree.map(jnp.asarray, tree)

    def release(self) -> None:
        """Drops the cached random blocks (sub-layer units of one layer share one)."""
        self._blocks.clear()


def materialize(init: UnitInitializer, chain: list[Unit], indices: Iterable[int]) -> list[Unit]:
    """``chain`` with real parameters in the units ``indices`` (the rest stay abstract)."""
    wanted = set(indices)
    return [dataclasses.replace(u, params=init.params(u)) if i in wanted else u
            for i, u in enumerate(chain)]


def is_materialized(unit: Unit) -> bool:
    return not any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(unit.params))
