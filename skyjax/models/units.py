"""The model as a chain of units: what the profiler times, the planner allocates and the runtime's
stages run.

``units(model, granularity)`` returns pure functions ``apply(params, carry, rng, train) -> carry``
that each jit on their own; composing all of them is exactly the full model. ``"layer"``:
embeddings, one unit per encoder layer, head (pooler + classifier); ``"sublayer"``: each encoder
layer as attention / intermediate / output (3 units, as the original Sky Computing cut it).

Mixed precision (``BertConfig.compute_dtype``): parameters, gradients and optimizer states stay
float32; a unit computes with its floating parameters cast to the compute dtype, so its
activations, and the carry it hands to the next unit, are in that dtype (bf16: half the bytes of
every hand-off and saved activation). LayerNorm statistics and the softmax are float32 inside
the modules; the head's logits leave in float32, so the loss is computed in float32.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from skyjax.models.dropout import SITE_FFN_OUTPUT, site_key
from skyjax.models.modeling import BertForSequenceClassification, BertLayer, Carry, Params
from skyjax.names import GRANULARITIES


@dataclasses.dataclass
class Unit:
    """One link of the model chain: ``apply(params, carry, rng, train) -> carry``, pure and jittable.

    ``params`` is a nested dict of arrays; ``path`` locates them in the model's parameter tree
    (``model_params(model)``), so checkpoints are independent of granularity and plan.
    """

    name: str
    kind: str  # embeddings | layer | attention | intermediate | output | head
    path: tuple[str, ...]
    params: Params
    apply: Callable[[Params, Carry, jax.Array | None, bool], Carry]
    compute_dtype: str = "float32"  # the dtype it computes in (module doc)
    # tensors this unit shares with another unit (a decoder's tied embedding): each
    # (path inside ``params``, the other unit's name, path inside that unit's params)
    tied: tuple[tuple[tuple[str, ...], str, tuple[str, ...]], ...] = ()


def in_compute_dtype(params: Params, dtype: str) -> Params:
    """``params`` with floating leaves cast to ``dtype`` (the identity for float32 leaves in a
    float32 model: no copy, nothing changes)."""
    if dtype == "float32":
        return params
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)


def _computing_in(dtype: str, apply: Callable) -> Callable:
    """``apply`` with its parameters cast to ``dtype`` first (module doc)."""
    if dtype == "float32":
        return apply
    return lambda p, carry, rng, train=False: apply(in_compute_dtype(p, dtype), carry, rng, train)


def _bind(module: nnx.Module):
    """Splits ``module`` into (pure params, function that rebuilds it from pure params)."""
    graphdef, state = nnx.split(module)
    return nnx.to_pure_dict(state), lambda params: nnx.merge(graphdef, params)


def _embeddings_unit(model: BertForSequenceClassification) -> Unit:
    params, build = _bind(model.embeddings)

    def apply(p: Params, carry: Carry, rng, train: bool = False) -> Carry:
        x = build(p)(carry["input_ids"], carry["token_type_ids"], rng, train)
        return {"hidden": x, "attention_mask": carry["attention_mask"]}

    return Unit("embeddings", "embeddings", ("embeddings",), params, apply)


def _layer_unit(layer: BertLayer, i: int) -> Unit:
    params, build = _bind(layer)

    def apply(p: Params, carry: Carry, rng, train: bool = False) -> Carry:
        x = build(p)(carry["hidden"], carry["attention_mask"], rng, i + 1, train)
        return {"hidden": x, "attention_mask": carry["attention_mask"]}

    return Unit(f"layer_{i}", "layer", ("layers", str(i)), params, apply)


def _sublayer_units(layer: BertLayer, i: int) -> list[Unit]:
    block = i + 1
    attn_params, build_attn = _bind(layer.attention)
    inter_params, build_inter = _bind(layer.intermediate)
    out_params, build_out = _bind(layer.output)

    def attention(p: Params, carry: Carry, rng, train: bool = False) -> Carry:
        x = build_attn(p)(carry["hidden"], carry["attention_mask"], rng, block, train)
        return {"hidden": x, "attention_mask": carry["attention_mask"]}

    def intermediate(p: Params, carry: Carry, rng, train: bool = False) -> Carry:
        return {"hidden": build_inter(p)(carry["hidden"]), "residual": carry["hidden"],
                "attention_mask": carry["attention_mask"]}

    def output(p: Params, carry: Carry, rng, train: bool = False) -> Carry:
        key = None if rng is None else site_key(rng, block, SITE_FFN_OUTPUT)
        x = build_out(p)(carry["hidden"], carry["residual"], key, train)
        return {"hidden": x, "attention_mask": carry["attention_mask"]}

    base = ("layers", str(i))
    return [Unit(f"layer_{i}.attention", "attention", base + ("attention",), attn_params, attention),
            Unit(f"layer_{i}.intermediate", "intermediate", base + ("intermediate",), inter_params,
                 intermediate),
            Unit(f"layer_{i}.output", "output", base + ("output",), out_params, output)]


def _head_unit(model: BertForSequenceClassification) -> Unit:
    params, build = _bind(model.head)

    def apply(p: Params, carry: Carry, rng, train: bool = False) -> Carry:
        return {"logits": build(p)(carry["hidden"], rng, train).astype(jnp.float32)}

    return Unit("head", "head", ("head",), params, apply)


def units(model: BertForSequenceClassification, granularity: str = "layer") -> list[Unit]:
    """The model as a chain of units: embeddings, encoder (per layer or sub-layer), head."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity={granularity!r} is not one of {GRANULARITIES}")
    chain = [_embeddings_unit(model)]
    for i, layer in enumerate(model.layers):
        chain += [_layer_unit(layer, i)] if granularity == "layer" else _sublayer_units(layer, i)
    chain.append(_head_unit(model))
    dtype = model.config.compute_dtype
    return [dataclasses.replace(u, apply=_computing_in(dtype, u.apply), compute_dtype=dtype)
            for u in chain]


def apply_units(chain: list[Unit], params: list[Params], carry: Carry, rng, train: bool) -> Carry:
    """Applies ``chain`` in order with per-unit ``params``: the full model when all units are given."""
    for unit, p in zip(chain, params):
        carry = unit.apply(p, carry, rng, train)
    return carry


def model_params(model: BertForSequenceClassification) -> Params:
    """The model's parameters as one pure nested dict (the tree that unit paths index)."""
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))
