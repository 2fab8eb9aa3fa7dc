"""Decoder language models (Llama and GPT-2 families): the config and the pieces both share.

:class:`DecoderConfig` holds either family's shape under Hugging Face's Llama names (GPT-2's
``n_embd``, ``n_layer``, ... are read into them by :meth:`DecoderConfig.from_hf`); ``family``
says which modules build it (:mod:`skyjax.models.llama`, :mod:`skyjax.models.gpt2`). Shared here:
RMSNorm, rotary positions (HF's default rope, half-split), and causal self-attention through
the attention path BERT's uses (:func:`skyjax.models.modeling.attention_path`: the exact
hand-written attention with its float32 scores and softmax, or ``jax.nn.dot_product_attention``),
with the causal mask and the padded keys of ``attention_mask`` masked.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from skyjax.models.modeling import (ACTIVATIONS, KEEP_DROPOUT_MASKS, NUMERICS_FIELDS, attend,
                                    attention_path, rematerialised)
from skyjax.names import ATTENTION_PATHS, COMPUTE_DTYPES

FAMILIES = ("llama", "gpt2")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel"}

# GPT-2's config.json names -> DecoderConfig's (Llama's)
_GPT2_NAMES = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers",
               "n_head": "num_attention_heads", "n_inner": "intermediate_size",
               "n_positions": "max_position_embeddings", "layer_norm_epsilon": "norm_eps",
               "activation_function": "hidden_act", "resid_pdrop": "hidden_dropout_prob",
               "embd_pdrop": "embedding_dropout_prob", "attn_pdrop": "attention_probs_dropout_prob"}
_LLAMA_NAMES = {"rms_norm_eps": "norm_eps", "attention_dropout": "attention_probs_dropout_prob"}
# GPT-2 options skyjax does not implement, with the value it computes as
_GPT2_FIXED = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
               "reorder_and_upcast_attn": False, "add_cross_attention": False}


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """A decoder's hyper-parameters, named as in Hugging Face's ``LlamaConfig``."""

    family: str = "llama"
    vocab_size: int = 32000
    hidden_size: int = 4096
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None  # None: as many as the query heads (no grouping)
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    intermediate_size: int | None = None  # None (GPT-2's n_inner): 4 * hidden_size
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    norm_eps: float = 1e-6  # RMSNorm's (Llama) or LayerNorm's (GPT-2) epsilon
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    initializer_range: float = 0.02
    hidden_dropout_prob: float = 0.0  # GPT-2's resid_pdrop (Llama has none)
    embedding_dropout_prob: float = 0.0  # GPT-2's embd_pdrop
    attention_probs_dropout_prob: float = 0.0  # attn_pdrop / attention_dropout
    compute_dtype: str = "float32"  # how it computes (modeling.NUMERICS_FIELDS)
    attention: str = "exact"

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], **overrides: Any) -> "DecoderConfig":
        """A config from a Hugging Face ``config.json`` dict of a Llama or GPT-2 (its
        ``model_type``); unknown keys are ignored, unsupported options are an error."""
        family = overrides.pop("family", hf.get("model_type", "llama"))
        if family not in FAMILIES:
            raise ValueError(f"model_type={family!r} is not one of {FAMILIES}")
        hf = dict(hf)
        values: dict[str, Any] = {"family": family}
        if family == "gpt2":
            values.update(hidden_act="gelu_new", norm_eps=1e-5, tie_word_embeddings=True,
                          attention_bias=True, mlp_bias=True, hidden_dropout_prob=0.1,
                          embedding_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
            for key, want in _GPT2_FIXED.items():
                if hf.get(key, want) != want:
                    raise ValueError(f"GPT-2 {key}={hf[key]!r} is not supported (only {want})")
            hf.pop("head_dim", None)
            names = _GPT2_NAMES
        else:
            rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
            kind = rope.get("rope_type", rope.get("type", "default"))
            if kind != "default":
                raise ValueError(f"Llama rope_type={kind!r} is not supported (only 'default')")
            if "rope_theta" in rope:
                values["rope_theta"] = rope["rope_theta"]
            names = _LLAMA_NAMES
        fields = {f.name for f in dataclasses.fields(cls)} - set(NUMERICS_FIELDS) - {"family"}
        for key, value in hf.items():
            name = names.get(key, key)
            if name in fields and (value is not None or name in ("num_key_value_heads",
                                                                 "head_dim",
                                                                 "intermediate_size")):
                values[name] = value
        values.update(overrides)
        return cls(**values).validate()

    def to_hf(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` form of this config."""
        if self.family == "gpt2":
            back = {v: k for k, v in _GPT2_NAMES.items()}
            out = {back[k]: getattr(self, k) for k in back}
            out.update(vocab_size=self.vocab_size, initializer_range=self.initializer_range,
                       tie_word_embeddings=self.tie_word_embeddings, **_GPT2_FIXED)
        else:
            out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                   if f.name not in NUMERICS_FIELDS + ("family", "norm_eps", "rope_theta",
                                                       "hidden_dropout_prob",
                                                       "embedding_dropout_prob",
                                                       "attention_probs_dropout_prob")}
            out.update(rms_norm_eps=self.norm_eps,
                       attention_dropout=self.attention_probs_dropout_prob,
                       num_key_value_heads=self.kv_heads, head_dim=self.head_size,
                       intermediate_size=self.ffn_size,
                       rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta})
        out.update(model_type=self.family, architectures=[ARCHITECTURES[self.family]])
        return out

    def validate(self) -> "DecoderConfig":
        """Raises ``ValueError`` naming the first impossible field; returns self."""
        if self.family not in FAMILIES:
            raise ValueError(f"DecoderConfig.family={self.family!r} is not one of {FAMILIES}")
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "max_position_embeddings", "kv_heads", "head_size", "ffn_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"DecoderConfig.{name}={value!r} must be a positive integer")
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(f"DecoderConfig.num_key_value_heads={self.kv_heads} does not divide "
                             f"num_attention_heads={self.num_attention_heads}")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"DecoderConfig.num_attention_heads={self.num_attention_heads} does "
                             f"not divide hidden_size={self.hidden_size}")
        if self.family == "llama" and self.head_size % 2:
            raise ValueError(f"DecoderConfig.head_dim={self.head_size} must be even (rotary)")
        if self.family == "gpt2" and self.head_size * self.num_attention_heads != self.hidden_size:
            raise ValueError("GPT-2's heads must split hidden_size exactly")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"DecoderConfig.hidden_act={self.hidden_act!r} is not one of "
                             f"{sorted(ACTIVATIONS)}")
        for name in ("hidden_dropout_prob", "embedding_dropout_prob",
                     "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"DecoderConfig.{name}={getattr(self, name)!r} must be in [0, 1)")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"DecoderConfig.compute_dtype={self.compute_dtype!r} is not one of "
                             f"{COMPUTE_DTYPES}")
        if self.attention not in ATTENTION_PATHS:
            raise ValueError(f"DecoderConfig.attention={self.attention!r} is not one of "
                             f"{ATTENTION_PATHS}")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size


def dense(cfg: DecoderConfig, n_in: int, n_out: int, bias: bool, rngs: nnx.Rngs) -> nnx.Linear:
    init = jax.nn.initializers.normal(cfg.initializer_range)
    return nnx.Linear(n_in, n_out, use_bias=bias, kernel_init=init, rngs=rngs)


def embed(cfg: DecoderConfig, n: int, rngs: nnx.Rngs) -> nnx.Embed:
    init = jax.nn.initializers.normal(cfg.initializer_range)
    # looked up in the compute dtype (flax's Embed would return its parameter dtype)
    return nnx.Embed(n, cfg.hidden_size, embedding_init=init, dtype=jnp.dtype(cfg.compute_dtype),
                     rngs=rngs)


class RMSNorm(nnx.Module):
    """HF's ``LlamaRMSNorm``: ``weight * x / sqrt(mean(x²) + eps)``, the statistics in float32,
    the result in the input's dtype; rematerialised below float32 (as ``modeling.layer_norm``)."""

    def __init__(self, size: int, eps: float):
        self.eps = eps
        self.weight = nnx.Param(jnp.ones((size,), jnp.float32))

    def __call__(self, x: jax.Array) -> jax.Array:
        if x.dtype == jnp.float32:
            return self._norm(x)
        return rematerialised(self, lambda n, v: n._norm(v), x)

    def _norm(self, x: jax.Array) -> jax.Array:
        h = x.astype(jnp.float32)
        h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(x.dtype) * h.astype(x.dtype)


def rotary(cfg: DecoderConfig, x: jax.Array) -> jax.Array:
    """HF's default rotary embedding of ``x`` ``[b, s, heads, head_dim]`` at positions
    ``0 .. s-1`` (``rotate_half``: the two halves of the head, not interleaved pairs); the angles
    in float32, cast to ``x``'s dtype as HF does."""
    d = x.shape[-1]
    inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    angles = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] * inv_freq[None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)[None, :, None, :]
    cos, sin = jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


def causal_mask(attention_mask: jax.Array) -> jax.Array:
    """``[b, queries, keys]``: 1 where a query may attend a key (not after it, not padding).
    A mask of documents' segment ids + 1 (0 on padding; packed text with
    ``config.data.document_mask``) also keeps a query within its document; with a 0/1 mask
    that is no condition (a padding query, 0, sees every earlier token, as before)."""
    s = attention_mask.shape[-1]
    lower = jnp.tril(jnp.ones((s, s), jnp.int32))
    keys, queries = attention_mask[:, None, :], attention_mask[:, :, None]
    allowed = (keys > 0) & ((keys == queries) | (queries == 0))
    return allowed.astype(jnp.int32) * lower[None]


def causal_attention(cfg: DecoderConfig, q: jax.Array, k: jax.Array, v: jax.Array,
                     attention_mask: jax.Array, key, train: bool) -> jax.Array:
    """Causal self-attention of ``q`` ``[b, s, heads, d]`` over ``k``, ``v`` ``[b, s, kv_heads,
    d]`` (grouped: each key/value head serves ``heads / kv_heads`` consecutive query heads, as
    HF's ``repeat_kv``) on BERT's attention path; returns ``[b, s, heads * d]``."""
    b, s, heads, d = q.shape
    groups = heads // k.shape[2]
    if groups > 1:
        k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    allowed = causal_mask(attention_mask)
    path = attention_path(_PathView(cfg), train, q.dtype)
    if path != "exact":
        out = jax.nn.dot_product_attention(q, k, v, mask=(allowed > 0)[:, None],
                                           scale=1.0 / math.sqrt(d), implementation=path)
        return out.reshape(b, s, heads * d)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    fn = functools.partial(attend, d, cfg.attention_probs_dropout_prob, train)
    if v.dtype != jnp.float32:
        fn = jax.checkpoint(fn, policy=KEEP_DROPOUT_MASKS)
    return fn(scores, allowed, v, key).reshape(b, s, heads * d)


@dataclasses.dataclass(frozen=True)
class _PathView:
    """The fields ``modeling.attention_path`` reads, under its names."""

    cfg: DecoderConfig

    @property
    def attention(self) -> str:
        return self.cfg.attention

    @property
    def head_dim(self) -> int:
        return self.cfg.head_size

    @property
    def attention_probs_dropout_prob(self) -> float:
        return self.cfg.attention_probs_dropout_prob


def feed_forward(modules: Any, fn, x: jax.Array) -> jax.Array:
    """``fn(modules, x)`` rematerialised with matmul outputs saved (``modeling.feed_forward``'s
    policy): the backward recomputes the activation, never a matmul."""
    return rematerialised(modules, fn, x,
                          policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
