"""BERT for sequence classification in Flax NNX, with Hugging Face semantics: the config and the
modules.

The model mirrors Hugging Face's ``BertForSequenceClassification`` (post-LN encoder, erf GELU for
``hidden_act="gelu"``, additive attention masking of padded keys, tanh pooler on [CLS]) so that
weights load one-to-one (:mod:`skyjax.models.hf_loading`) and logits match to ~1e-6. Dropout keys
are derived from the position in the model (layer index and dropout site, :func:`site_key`), never
from how the model is cut, so the granularity and the plan never change the math.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from skyjax.models.dropout import (DROPOUT_MASK, SITE_ATTENTION_OUTPUT, SITE_ATTENTION_PROBS,
                                   SITE_CLASSIFIER, SITE_EMBEDDINGS, SITE_FFN_OUTPUT, dropout,
                                   site_key)
from skyjax.names import ATTENTION_PATHS, COMPUTE_DTYPES

Params = dict[str, Any]
Carry = dict[str, jax.Array]

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "tanh": jnp.tanh,
}


NUMERICS_FIELDS = ("compute_dtype", "attention")


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Model hyper-parameters, named as in Hugging Face's ``BertConfig``."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    num_labels: int = 2
    classifier_dropout: float | None = None
    pad_token_id: int = 0
    # How the model computes, not what it is (not part of Hugging Face's config.json): the dtype
    # of matmuls, activations and hand-offs (parameters stay float32, see skyjax.models.units),
    # and the attention path (ATTENTION_PATHS).
    compute_dtype: str = "float32"
    attention: str = "exact"

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], **overrides: Any) -> "BertConfig":
        """Builds a config from a Hugging Face ``config.json`` dict (unknown keys are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)} - set(NUMERICS_FIELDS)
        values = {k: v for k, v in hf.items() if k in names}
        if "num_labels" not in values and "id2label" in hf:
            values["num_labels"] = len(hf["id2label"])
        values.update(overrides)
        return cls(**values).validate()

    def to_hf(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` form of this config."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k not in NUMERICS_FIELDS}
        out.update(model_type="bert", architectures=["BertForSequenceClassification"])
        return out

    def validate(self) -> "BertConfig":
        """Raises ``ValueError`` naming the first impossible field; returns self."""
        positive = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "max_position_embeddings", "type_vocab_size", "num_labels")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"BertConfig.{name}={value!r} must be a positive integer")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"BertConfig.num_attention_heads={self.num_attention_heads} does not divide "
                f"hidden_size={self.hidden_size}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"BertConfig.hidden_act={self.hidden_act!r} is not one of "
                             f"{sorted(ACTIVATIONS)}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ValueError(f"BertConfig.{name}={value!r} must be in [0, 1)")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"BertConfig.pad_token_id={self.pad_token_id} is outside the vocabulary")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"BertConfig.compute_dtype={self.compute_dtype!r} is not one of "
                             f"{COMPUTE_DTYPES}")
        if self.attention not in ATTENTION_PATHS:
            raise ValueError(f"BertConfig.attention={self.attention!r} is not one of "
                             f"{ATTENTION_PATHS}")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


# --------------------------------------------------------------------------------------------
# Modules (attribute names follow Hugging Face's parameter names where Python allows).

def _dense(cfg: BertConfig, n_in: int, n_out: int, rngs: nnx.Rngs) -> nnx.Linear:
    init = jax.nn.initializers.normal(cfg.initializer_range)
    return nnx.Linear(n_in, n_out, kernel_init=init, rngs=rngs)


def _layer_norm(cfg: BertConfig, rngs: nnx.Rngs) -> nnx.LayerNorm:
    # statistics in float32 whatever the input (flax promotes them); the result in the compute
    # dtype (flax would promote it to float32 as well)
    return nnx.LayerNorm(cfg.hidden_size, epsilon=cfg.layer_norm_eps, use_fast_variance=False,
                         dtype=jnp.dtype(cfg.compute_dtype), rngs=rngs)


def layer_norm(norm: nnx.LayerNorm, x: jax.Array) -> jax.Array:
    """``norm(x)``; below float32 it is rematerialised (``jax.checkpoint``): its float32
    statistics and normalised values are recomputed in the backward from ``x`` in the compute
    dtype instead of being kept per micro-batch (three float32 arrays the size of ``x``, which
    made a bf16 layer's saved activations a third larger). float32 is left as it was."""
    if x.dtype == jnp.float32:
        return norm(x)
    return rematerialised(norm, lambda n, v: n(v), x)


def rematerialised(modules: Any, apply: Callable[[Any, jax.Array], jax.Array], x: jax.Array,
                   policy: Callable | None = None) -> jax.Array:
    """``apply(modules, x)`` under ``jax.checkpoint`` with ``policy`` (None: keep only the
    inputs). The modules' state goes in as an argument (``nnx.split``), so their parameters are
    inputs of the checkpointed function rather than values it closes over."""
    graphdef, state = nnx.split(modules)
    return jax.checkpoint(lambda s, v: apply(nnx.merge(graphdef, s), v), policy=policy)(state, x)


class BertEmbeddings(nnx.Module):
    """Word + position + token-type embeddings, LayerNorm, dropout."""

    def __init__(self, cfg: BertConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        init = jax.nn.initializers.normal(cfg.initializer_range)
        self.word_embeddings = nnx.Embed(cfg.vocab_size, cfg.hidden_size, embedding_init=init, rngs=rngs)
        table = self.word_embeddings.embedding
        table[...] = table[...].at[cfg.pad_token_id].set(0.0)  # as HF's padding_idx
        self.position_embeddings = nnx.Embed(cfg.max_position_embeddings, cfg.hidden_size,
                                             embedding_init=init, rngs=rngs)
        self.token_type_embeddings = nnx.Embed(cfg.type_vocab_size, cfg.hidden_size,
                                               embedding_init=init, rngs=rngs)
        self.LayerNorm = _layer_norm(cfg, rngs)

    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array, rng, train: bool) -> jax.Array:
        positions = jnp.arange(input_ids.shape[-1])[None, :]
        x = (self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
             + self.position_embeddings(positions))
        x = layer_norm(self.LayerNorm, x)
        key = None if rng is None else site_key(rng, 0, SITE_EMBEDDINGS)
        return dropout(x, self.cfg.hidden_dropout_prob, key, train)


class BertSelfAttention(nnx.Module):
    """Multi-head scaled dot-product self-attention with HF's key mask, on the path
    :func:`attention_path` picks; the softmax is computed in float32 on every path."""

    def __init__(self, cfg: BertConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.query = _dense(cfg, cfg.hidden_size, cfg.hidden_size, rngs)
        self.key = _dense(cfg, cfg.hidden_size, cfg.hidden_size, rngs)
        self.value = _dense(cfg, cfg.hidden_size, cfg.hidden_size, rngs)

    def __call__(self, x: jax.Array, attention_mask: jax.Array, key, train: bool) -> jax.Array:
        cfg = self.cfg
        b, s, _ = x.shape

        def heads(t: jax.Array) -> jax.Array:
            return t.reshape(b, s, cfg.num_attention_heads, cfg.head_dim)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        path = attention_path(cfg, train, q.dtype)
        if path != "exact":
            keep = (attention_mask > 0)[:, None, None, :]  # [b, 1, 1, keys]
            if path == "cudnn":  # cuDNN takes a mask of whole [queries, keys] planes only
                keep = jnp.broadcast_to(keep, (b, 1, s, s))
            out = jax.nn.dot_product_attention(
                q, k, v, mask=keep, scale=1.0 / math.sqrt(cfg.head_dim), implementation=path)
            return out.reshape(b, s, cfg.hidden_size)
        # float32 scores straight from the matmul's float32 accumulator: the softmax's input
        # is never rounded to the compute dtype
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
        fn = functools.partial(attend, cfg.head_dim, cfg.attention_probs_dropout_prob, train)
        if v.dtype != jnp.float32:
            fn = jax.checkpoint(fn, policy=KEEP_DROPOUT_MASKS)
        return fn(scores, attention_mask, v, key).reshape(b, s, cfg.hidden_size)


# What a rematerialised block keeps besides its inputs: the dropout masks (recomputing them would
# draw the random bits again).
KEEP_DROPOUT_MASKS = jax.checkpoint_policies.save_only_these_names(DROPOUT_MASK)


def attend(head_dim: int, rate: float, train: bool, scores: jax.Array, attention_mask: jax.Array,
           v: jax.Array, key) -> jax.Array:
    """HF's attention after ``q kᵀ`` (float32 ``scores``): scale, additive key mask, softmax,
    dropout on the probabilities, times ``v``. Below float32 it runs rematerialised (the
    caller): it keeps the scores and the dropout mask, and the backward recomputes the softmax,
    instead of keeping its float32 exponentials and the dropped-out probabilities in the compute
    dtype as well."""
    scores = scores / math.sqrt(head_dim)
    # a key mask [b, keys], or a [b, queries, keys] one (a decoder's causal mask)
    keep = attention_mask[:, None, None, :] if attention_mask.ndim == 2 else attention_mask[:, None]
    bias = jnp.where(keep > 0, 0.0, jnp.finfo(scores.dtype).min)
    probs = jax.nn.softmax(scores + bias.astype(scores.dtype), axis=-1).astype(v.dtype)
    probs = dropout(probs, rate, key, train)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def cudnn_attention_applies(dtype: Any, head_dim: int) -> bool:
    """Whether cuDNN's fused attention takes these inputs here: a GPU backend, half-precision
    inputs and a head dimension it supports (a multiple of 8, at most 128)."""
    return (jax.default_backend() == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
            and head_dim % 8 == 0 and head_dim <= 128)


def attention_path(cfg: BertConfig, train: bool, dtype: Any) -> str:
    """``"exact"`` (the hand-written attention), ``"cudnn"`` or ``"xla"``
    (``jax.nn.dot_product_attention``'s implementations) for ``cfg.attention`` (module
    ``ATTENTION_PATHS``). ``"auto"`` keeps the exact math: the fused kernels have no dropout on
    the probabilities, so a training call with that dropout on stays exact."""
    cudnn = cudnn_attention_applies(dtype, cfg.head_dim)
    if cfg.attention == "fused":
        return "cudnn" if cudnn else "xla"
    probs_dropout = train and cfg.attention_probs_dropout_prob > 0
    if cfg.attention == "auto" and cudnn and not probs_dropout:
        return "cudnn"
    return "exact"


class BertResidualOutput(nnx.Module):
    """dense -> dropout -> LayerNorm(x + residual): HF's BertSelfOutput and BertOutput."""

    def __init__(self, cfg: BertConfig, n_in: int, rngs: nnx.Rngs):
        self.cfg = cfg
        self.dense = _dense(cfg, n_in, cfg.hidden_size, rngs)
        self.LayerNorm = _layer_norm(cfg, rngs)

    def __call__(self, x: jax.Array, residual: jax.Array, key, train: bool) -> jax.Array:
        return self.add_and_norm(self.dense(x), residual, key, train)

    def add_and_norm(self, projected: jax.Array, residual: jax.Array, key, train: bool):
        """The block after ``dense``: dropout, residual, LayerNorm."""
        x = dropout(projected, self.cfg.hidden_dropout_prob, key, train)
        return layer_norm(self.LayerNorm, x + residual)


class BertAttention(nnx.Module):
    """Self-attention followed by its output projection, residual and LayerNorm."""

    def __init__(self, cfg: BertConfig, rngs: nnx.Rngs):
        self.self_attention = BertSelfAttention(cfg, rngs)  # HF name: attention.self
        self.output = BertResidualOutput(cfg, cfg.hidden_size, rngs)

    def __call__(self, x: jax.Array, attention_mask: jax.Array, rng, block: int, train: bool):
        k_probs = None if rng is None else site_key(rng, block, SITE_ATTENTION_PROBS)
        k_out = None if rng is None else site_key(rng, block, SITE_ATTENTION_OUTPUT)
        context = self.self_attention(x, attention_mask, k_probs, train)
        return self.output(context, x, k_out, train)


class BertIntermediate(nnx.Module):
    """dense H -> FFN with the configured activation, rematerialised (its input is all it
    keeps for the backward; :func:`feed_forward` says why)."""

    def __init__(self, cfg: BertConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.dense = _dense(cfg, cfg.hidden_size, cfg.intermediate_size, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.checkpoint(ACTIVATIONS[self.cfg.hidden_act])(self.dense(x))


class BertLayer(nnx.Module):
    """One post-LN encoder layer: attention, intermediate, output."""

    def __init__(self, cfg: BertConfig, rngs: nnx.Rngs):
        self.attention = BertAttention(cfg, rngs)
        self.intermediate = BertIntermediate(cfg, rngs)
        self.output = BertResidualOutput(cfg, cfg.intermediate_size, rngs)

    def __call__(self, x: jax.Array, attention_mask: jax.Array, rng, block: int, train: bool):
        attended = self.attention(x, attention_mask, rng, block, train)
        k_out = None if rng is None else site_key(rng, block, SITE_FFN_OUTPUT)
        projected = feed_forward(self.intermediate, self.output.dense, attended)
        return self.output.add_and_norm(projected, attended, k_out, train)


def feed_forward(intermediate: BertIntermediate, dense: nnx.Linear, x: jax.Array) -> jax.Array:
    """``dense(intermediate(x))``, keeping one ``[tokens, intermediate_size]`` array per
    micro-batch for the backward instead of four: rematerialised (``jax.checkpoint``) with
    matmul outputs saved, so the backward recomputes only the activation (its input is the one
    saved array) and neither matmul. Autodiff of the erf GELU alone keeps its input, its output
    and two intermediates; the output projection's weight gradient needs the activation's
    output, which is recomputed here. Same ops on the same values: the same math."""
    return rematerialised((intermediate, dense), lambda m, v: m[1](m[0](v)), x,
                          policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)


class BertClassificationHead(nnx.Module):
    """tanh pooler on [CLS], dropout, linear classifier."""

    def __init__(self, cfg: BertConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.pooler = _dense(cfg, cfg.hidden_size, cfg.hidden_size, rngs)
        self.classifier = _dense(cfg, cfg.hidden_size, cfg.num_labels, rngs)

    def __call__(self, x: jax.Array, rng, train: bool) -> jax.Array:
        pooled = jnp.tanh(self.pooler(x[:, 0]))
        rate = (self.cfg.classifier_dropout if self.cfg.classifier_dropout is not None
                else self.cfg.hidden_dropout_prob)
        key = None if rng is None else site_key(rng, self.cfg.num_hidden_layers + 1, SITE_CLASSIFIER)
        return self.classifier(dropout(pooled, rate, key, train))


def initial_carry(input_ids: jax.Array, token_type_ids: jax.Array | None = None,
                  attention_mask: jax.Array | None = None) -> Carry:
    """The carry entering the first unit; HF defaults (all type 0, no padding) where omitted."""
    input_ids = jnp.asarray(input_ids, jnp.int32)
    if token_type_ids is None:
        token_type_ids = jnp.zeros_like(input_ids)
    if attention_mask is None:
        attention_mask = jnp.ones_like(input_ids)
    return {"input_ids": input_ids, "token_type_ids": jnp.asarray(token_type_ids, jnp.int32),
            "attention_mask": jnp.asarray(attention_mask, jnp.int32)}


def block_rngs(base_key: jax.Array, block: int) -> nnx.Rngs:
    """The init keys of ``block`` (embeddings 0, encoder layer i is i + 1, head L + 1): a pure
    function of the model's base key and the block's position, so a process that builds only
    some blocks gets exactly the parameters the whole model would have there."""
    return nnx.Rngs(jax.random.fold_in(base_key, block))


def init_block(config: BertConfig, base_key: jax.Array, block: int) -> nnx.Module:
    """Block ``block`` of the model alone, initialised as inside the whole model."""
    rngs = block_rngs(base_key, block)
    if block == 0:
        return BertEmbeddings(config, rngs)
    if block <= config.num_hidden_layers:
        return BertLayer(config, rngs)
    if block == config.num_hidden_layers + 1:
        return BertClassificationHead(config, rngs)
    raise ValueError(f"block {block} is outside a model of {config.num_hidden_layers} layers")


def base_key(seed: int) -> jax.Array:
    """The base init key of ``BertForSequenceClassification(config, nnx.Rngs(seed))``."""
    return nnx.Rngs(seed).params()


class BertForSequenceClassification(nnx.Module):
    """BERT encoder with a pooler and classifier; ``__call__`` returns logits ``[batch, labels]``.

    Every block is initialised from its own key (:func:`block_rngs`), never from a stream shared
    in construction order, so per-unit initialisation (:mod:`skyjax.models.build`) is exact.
    """

    def __init__(self, config: BertConfig, rngs: nnx.Rngs | None = None):
        self.config = config.validate()
        base = (rngs if rngs is not None else nnx.Rngs(0)).params()
        layers = config.num_hidden_layers
        self.embeddings = init_block(config, base, 0)
        self.layers = nnx.List([init_block(config, base, i + 1) for i in range(layers)])
        self.head = init_block(config, base, layers + 1)

    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array | None = None,
                 attention_mask: jax.Array | None = None, *, train: bool = False,
                 rng: jax.Array | None = None) -> jax.Array:
        carry = initial_carry(input_ids, token_type_ids, attention_mask)
        x = self.embeddings(carry["input_ids"], carry["token_type_ids"], rng, train)
        for i, layer in enumerate(self.layers):
            x = layer(x, carry["attention_mask"], rng, i + 1, train)
        return self.head(x, rng, train)
