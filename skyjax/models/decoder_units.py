"""A decoder language model (Llama or GPT-2) as a chain of units, by the protocol BERT's follows
(:mod:`skyjax.models.units`): pure ``apply(params, carry, rng, train) -> carry`` functions,
``"layer"``: embeddings, one unit per layer, head; ``"sublayer"``: each layer as ``attention`` and
``mlp`` (2L + 2 units). Blocks are numbered as BERT's (embeddings 0, layer ``i`` is ``i + 1``, head
``L + 1``), each initialised from its own key, so per-unit building
(:mod:`skyjax.models.build`) and dropout keys are independent of the cut.

The carry: ``{"input_ids", "attention_mask"}`` in (``token_type_ids``, as BERT's
``initial_carry`` makes it, is ignored), ``{"hidden", "attention_mask"}`` between units,
``{"logits"}`` (``[b, s, vocab]``, float32) out of the head.

Tied embeddings: the head holds its own copy of the token embedding (``lm_head.embedding``), so
any cut works; the two units name each other in :attr:`Unit.tied`, and :func:`tied_pairs` lists
the pairs for whoever keeps the copies equal (their gradients summed).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from flax import nnx

from skyjax.models import gpt2, llama
from skyjax.models.decoder import DecoderConfig
from skyjax.models.modeling import Carry, Params, block_rngs
from skyjax.models.units import Unit, _bind, _computing_in
from skyjax.names import GRANULARITIES

_BLOCKS = {"llama": (llama.LlamaEmbeddings, llama.LlamaLayer, llama.LlamaHead),
           "gpt2": (gpt2.GPT2Embeddings, gpt2.GPT2Layer, gpt2.GPT2Head)}
# the token embedding's path in the embeddings block, per family
TOKEN_EMBEDDING = {"llama": ("embed_tokens", "embedding"), "gpt2": ("wte", "embedding")}
LM_HEAD_COPY = ("lm_head", "embedding")  # its copy in the head, when tied


def init_block(config: DecoderConfig, base_key, block: int) -> nnx.Module:
    """Block ``block`` alone, initialised as inside the whole model (``modeling.block_rngs``);
    a tied head draws its embedding copy from the embeddings block's keys, so both are equal."""
    embeddings, layer, head = _BLOCKS[config.family]
    rngs = block_rngs(base_key, block)
    if block == 0:
        return embeddings(config, rngs)
    if block <= config.num_hidden_layers:
        return layer(config, rngs)
    if block == config.num_hidden_layers + 1:
        return head(config, rngs, block_rngs(base_key, 0))
    raise ValueError(f"block {block} is outside a model of {config.num_hidden_layers} layers")


def initial_carry(input_ids, attention_mask=None) -> Carry:
    """The carry entering the first unit (no padding where ``attention_mask`` is omitted)."""
    input_ids = jnp.asarray(input_ids, jnp.int32)
    if attention_mask is None:
        attention_mask = jnp.ones_like(input_ids)
    return {"input_ids": input_ids, "attention_mask": jnp.asarray(attention_mask, jnp.int32)}


class DecoderForCausalLM(nnx.Module):
    """A Llama- or GPT-2-family causal LM; ``__call__`` returns logits ``[batch, seq, vocab]``."""

    def __init__(self, config: DecoderConfig, rngs: nnx.Rngs | None = None):
        self.config = config.validate()
        base = (rngs if rngs is not None else nnx.Rngs(0)).params()
        layers = config.num_hidden_layers
        self.embeddings = init_block(config, base, 0)
        self.layers = nnx.List([init_block(config, base, i + 1) for i in range(layers)])
        self.head = init_block(config, base, layers + 1)

    def __call__(self, input_ids, attention_mask=None, *, train: bool = False, rng=None):
        carry = initial_carry(input_ids, attention_mask)
        x = self.embeddings(carry["input_ids"], rng, train)
        for i, layer in enumerate(self.layers):
            x = layer(x, carry["attention_mask"], rng, i + 1, train)
        return self.head(x, rng, train)


def _embeddings_unit(model: DecoderForCausalLM) -> Unit:
    params, build = _bind(model.embeddings)

    def apply(p: Params, carry: Carry, rng, train: bool = False) -> Carry:
        mask = carry.get("attention_mask")
        if mask is None:
            mask = jnp.ones_like(carry["input_ids"])
        return {"hidden": build(p)(carry["input_ids"], rng, train), "attention_mask": mask}

    return Unit("embeddings", "embeddings", ("embeddings",), params, apply)


def _block_unit(module: nnx.Module, name: str, kind: str, path: tuple[str, ...],
                block: int) -> Unit:
    params, build = _bind(module)

    def apply(p: Params, carry: Carry, rng, train: bool = False) -> Carry:
        x = build(p)(carry["hidden"], carry["attention_mask"], rng, block, train)
        return {"hidden": x, "attention_mask": carry["attention_mask"]}

    return Unit(name, kind, path, params, apply)


def _head_unit(model: DecoderForCausalLM) -> Unit:
    params, build = _bind(model.head)

    def apply(p: Params, carry: Carry, rng, train: bool = False) -> Carry:
        return {"logits": build(p)(carry["hidden"], rng, train)}

    return Unit("head", "head", ("head",), params, apply)


def units(model: DecoderForCausalLM, granularity: str = "layer") -> list[Unit]:
    """The model as a chain of units: embeddings, layers (whole, or attention / mlp), head; a
    tied embedding is named in the first and last unit's ``tied``."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity={granularity!r} is not one of {GRANULARITIES}")
    chain = [_embeddings_unit(model)]
    for i, layer in enumerate(model.layers):
        base = ("layers", str(i))
        if granularity == "layer":
            chain.append(_block_unit(layer, f"layer_{i}", "layer", base, i + 1))
        else:
            chain += [_block_unit(layer.attention, f"layer_{i}.attention", "attention",
                                  base + ("attention",), i + 1),
                      _block_unit(layer.mlp, f"layer_{i}.mlp", "mlp", base + ("mlp",), i + 1)]
    chain.append(_head_unit(model))
    cfg = model.config
    if cfg.tie_word_embeddings:
        token = TOKEN_EMBEDDING[cfg.family]
        chain[0] = dataclasses.replace(chain[0], tied=((token, "head", LM_HEAD_COPY),))
        chain[-1] = dataclasses.replace(chain[-1], tied=((LM_HEAD_COPY, "embeddings", token),))
    dtype = cfg.compute_dtype
    return [dataclasses.replace(u, apply=_computing_in(dtype, u.apply), compute_dtype=dtype)
            for u in chain]


def tied_pairs(chain: list[Unit]) -> list[tuple[tuple[int, tuple[str, ...]],
                                                tuple[int, tuple[str, ...]]]]:
    """Each tensor held by two units, once: ``((i, path in unit i), (j, path in unit j))``,
    ``i < j``."""
    index = {u.name: i for i, u in enumerate(chain)}
    pairs = []
    for i, unit in enumerate(chain):
        for path, other, other_path in unit.tied:
            j = index[other]
            if i < j:
                pairs.append(((i, path), (j, other_path)))
    return pairs
