"""A decoder's Hugging Face names, both ways: loading a ``LlamaForCausalLM`` /
``GPT2LMHeadModel`` directory (``config.json`` + safetensors) into
:class:`~skyjax.models.decoder_units.DecoderForCausalLM`, and the parameters back under HF's names (:func:`to_hf_state_dict`) for an export.

One table per config (:func:`hf_names`: HF name -> (path in ``model_params``, transpose)) serves
both directions. Linear weights are PyTorch's ``[out, in]`` (transposed); GPT-2's ``Conv1D``
weights are ``[in, out]`` already. A tied checkpoint stores the token embedding once (HF's
``save_pretrained`` leaves ``lm_head.weight`` out); the head's copy is read from it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from skyjax.models import hf_config
from skyjax.models.decoder import ARCHITECTURES, FAMILIES, DecoderConfig
from skyjax.models.decoder_units import LM_HEAD_COPY, TOKEN_EMBEDDING, DecoderForCausalLM
from skyjax.models.hf_loading import (CheckpointError, TensorMap, map_checkpoint,
                                      read_subtree)

# buffers that older transformers saved beside the weights
_IGNORED = (re.compile(r"rotary_emb\.inv_freq$"), re.compile(r"\.attn\.(masked_)?bias$"))


def _llama_names(cfg: DecoderConfig) -> dict[str, tuple[tuple, bool]]:
    out: dict[str, tuple[tuple, bool]] = {
        "model.embed_tokens.weight": (("embeddings", "embed_tokens", "embedding"), False),
        "model.norm.weight": (("head", "norm", "weight"), False)}
    parts = {"attention": ("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj"),
                           "input_layernorm", cfg.attention_bias),
             "mlp": ("mlp", ("gate_proj", "up_proj", "down_proj"), "post_attention_layernorm",
                     cfg.mlp_bias)}
    for i in range(cfg.num_hidden_layers):
        for block, (hf_block, linears, norm, bias) in parts.items():
            at = ("layers", i, block)
            out[f"model.layers.{i}.{norm}.weight"] = (at + (norm, "weight"), False)
            for lin in linears:
                out[f"model.layers.{i}.{hf_block}.{lin}.weight"] = (at + (lin, "kernel"), True)
                if bias:
                    out[f"model.layers.{i}.{hf_block}.{lin}.bias"] = (at + (lin, "bias"), False)
    return out


def _gpt2_names(cfg: DecoderConfig) -> dict[str, tuple[tuple, bool]]:
    out: dict[str, tuple[tuple, bool]] = {
        "transformer.wte.weight": (("embeddings", "wte", "embedding"), False),
        "transformer.wpe.weight": (("embeddings", "wpe", "embedding"), False),
        "transformer.ln_f.weight": (("head", "ln_f", "scale"), False),
        "transformer.ln_f.bias": (("head", "ln_f", "bias"), False)}
    parts = {"attention": ("ln_1", "attn", ("c_attn", "c_proj")),
             "mlp": ("ln_2", "mlp", ("c_fc", "c_proj"))}
    for i in range(cfg.num_hidden_layers):
        for block, (norm, hf_block, linears) in parts.items():
            at, name = ("layers", i, block), f"transformer.h.{i}"
            out[f"{name}.{norm}.weight"] = (at + (norm, "scale"), False)
            out[f"{name}.{norm}.bias"] = (at + (norm, "bias"), False)
            for lin in linears:  # Conv1D: [in, out], as Flax's kernel
                out[f"{name}.{hf_block}.{lin}.weight"] = (at + (lin, "kernel"), False)
                out[f"{name}.{hf_block}.{lin}.bias"] = (at + (lin, "bias"), False)
    return out


def hf_names(cfg: DecoderConfig) -> dict[str, tuple[tuple, bool]]:
    """Every HF tensor name of the model of ``cfg`` -> (its path in ``model_params``, whether
    it is stored transposed); ``lm_head.weight`` is the head's copy when tied."""
    out = (_llama_names if cfg.family == "llama" else _gpt2_names)(cfg)
    out["lm_head.weight"] = (((("head",) + LM_HEAD_COPY), False) if cfg.tie_word_embeddings
                             else (("head", "lm_head", "kernel"), True))
    return out


def _canonical(cfg: DecoderConfig, name: str) -> str:
    """GPT-2's original checkpoints name the body without the ``transformer.`` prefix."""
    if cfg.family == "gpt2" and not name.startswith(("transformer.", "lm_head.")):
        return "transformer." + name
    return name


def read_config(path: str, **numerics: str) -> DecoderConfig:
    """``config.json`` under ``path`` as a DecoderConfig (``numerics``: how it computes)."""
    try:
        hf = hf_config.read(path, model_types=FAMILIES)
        return DecoderConfig.from_hf(hf, **numerics)
    except (hf_config.PretrainedConfigError, ValueError) as e:
        raise CheckpointError(f"{os.path.join(path, 'config.json')}: {e}") from None


def map_decoder_checkpoint(path: str, cfg: DecoderConfig, template: dict) -> TensorMap:
    """Every parameter of ``template`` matched to a tensor of the checkpoint under ``path``
    (headers only; ``hf_loading.map_checkpoint``'s checks); a tied head's copy comes from the
    token embedding when the checkpoint stores it once."""
    names = hf_names(cfg)
    copy = ("head",) + LM_HEAD_COPY
    tensors = map_checkpoint(path, template, to_path=lambda n: names.get(_canonical(cfg, n)),
                             ignored=_IGNORED, optional=lambda p: p == copy,
                             model_name=ARCHITECTURES[cfg.family])
    sources = dict(tensors.sources)
    if tensors.missing:
        sources[copy] = sources[("embeddings",) + TOKEN_EMBEDDING[cfg.family]]
    return dataclasses.replace(tensors, sources=sources, missing=[])


def from_pretrained(path: str, seed: int = 0, **numerics: str) -> DecoderForCausalLM:
    """Loads a Hugging Face Llama- or GPT-2-family causal LM directory. Unknown or missing
    tensors and shape mismatches raise ``CheckpointError`` naming the tensor."""
    config = read_config(path, **numerics)
    model = nnx.eval_shape(lambda: DecoderForCausalLM(config, nnx.Rngs(seed)))
    graphdef, state = nnx.split(model)
    template = nnx.to_pure_dict(state)
    params = read_subtree(map_decoder_checkpoint(path, config, template), (), template)
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
    return nnx.merge(graphdef, state)


def _leaf(tree: Any, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def to_hf_state_dict(params: dict, cfg: DecoderConfig, tied_copy: bool = True
                     ) -> dict[str, np.ndarray]:
    """``params`` (``model_params`` of the model) under HF's names, float32 and in PyTorch's
    layout: what ``LlamaForCausalLM`` / ``GPT2LMHeadModel.load_state_dict(strict=True)`` takes.
    A tied model's ``lm_head.weight`` is the head's copy; ``tied_copy=False`` leaves it out (a
    safetensors file stores the tied tensor once, as HF's ``save_pretrained`` does)."""
    out = {}
    for name, (path, transpose) in hf_names(cfg).items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings and not tied_copy:
            continue
        value = np.asarray(_leaf(params, path), np.float32)
        out[name] = np.ascontiguousarray(value.T if transpose else value)
    return out
