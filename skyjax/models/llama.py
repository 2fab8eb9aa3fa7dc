"""The Llama family's blocks in Flax NNX, Hugging Face semantics (``LlamaForCausalLM``):
pre-norm layers with RMSNorm, rotary positions, grouped-query attention and a SwiGLU MLP.

A layer is two blocks, each one sub-layer unit and each adding its own residual: ``attention``
(``input_layernorm``, ``q/k/v/o_proj``) and ``mlp`` (``post_attention_layernorm``,
``gate/up/down_proj``). The head is the final ``norm`` and ``lm_head``; with tied embeddings
``lm_head`` is a copy of the embedding matrix (an ``nnx.Embed`` used by its ``attend``), made from
the embeddings block's keys so both copies start equal (:mod:`skyjax.models.decoder_units`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from skyjax.models.decoder import (DecoderConfig, RMSNorm, causal_attention, dense, embed,
                                   feed_forward, rotary)
from skyjax.models.dropout import SITE_ATTENTION_PROBS, site_key
from skyjax.models.modeling import ACTIVATIONS


class LlamaEmbeddings(nnx.Module):
    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs):
        self.embed_tokens = embed(cfg, cfg.vocab_size, rngs)  # first draw (the tied copy's)

    def __call__(self, input_ids: jax.Array, rng, train: bool) -> jax.Array:
        return self.embed_tokens(input_ids)


class LlamaAttention(nnx.Module):
    """``x + o_proj(attention(rope(q), rope(k), v))`` of ``input_layernorm(x)``."""

    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        h, d, bias = cfg.hidden_size, cfg.head_size, cfg.attention_bias
        self.input_layernorm = RMSNorm(h, cfg.norm_eps)
        self.q_proj = dense(cfg, h, cfg.num_attention_heads * d, bias, rngs)
        self.k_proj = dense(cfg, h, cfg.kv_heads * d, bias, rngs)
        self.v_proj = dense(cfg, h, cfg.kv_heads * d, bias, rngs)
        self.o_proj = dense(cfg, cfg.num_attention_heads * d, h, bias, rngs)

    def __call__(self, x: jax.Array, attention_mask: jax.Array, rng, block: int, train: bool):
        cfg = self.cfg
        b, s, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).reshape(b, s, cfg.num_attention_heads, cfg.head_size)
        k = self.k_proj(h).reshape(b, s, cfg.kv_heads, cfg.head_size)
        v = self.v_proj(h).reshape(b, s, cfg.kv_heads, cfg.head_size)
        key = None if rng is None else site_key(rng, block, SITE_ATTENTION_PROBS)
        out = causal_attention(cfg, rotary(cfg, q), rotary(cfg, k), v, attention_mask, key, train)
        return x + self.o_proj(out)


class LlamaMLP(nnx.Module):
    """``x + down_proj(act(gate_proj(h)) * up_proj(h))`` of ``h = post_attention_layernorm(x)``."""

    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        h, f, bias = cfg.hidden_size, cfg.ffn_size, cfg.mlp_bias
        self.post_attention_layernorm = RMSNorm(h, cfg.norm_eps)
        self.gate_proj = dense(cfg, h, f, bias, rngs)
        self.up_proj = dense(cfg, h, f, bias, rngs)
        self.down_proj = dense(cfg, f, h, bias, rngs)

    def __call__(self, x: jax.Array, attention_mask: jax.Array, rng, block: int, train: bool):
        act = ACTIVATIONS[self.cfg.hidden_act]
        mlp = (self.gate_proj, self.up_proj, self.down_proj)
        out = feed_forward(mlp, lambda m, v: m[2](act(m[0](v)) * m[1](v)),
                           self.post_attention_layernorm(x))
        return x + out


class LlamaLayer(nnx.Module):
    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs):
        self.attention = LlamaAttention(cfg, rngs)
        self.mlp = LlamaMLP(cfg, rngs)

    def __call__(self, x: jax.Array, attention_mask: jax.Array, rng, block: int, train: bool):
        x = self.attention(x, attention_mask, rng, block, train)
        return self.mlp(x, attention_mask, rng, block, train)


class LlamaHead(nnx.Module):
    """Final RMSNorm and the LM head: logits ``[b, s, vocab]`` in float32."""

    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs, embed_rngs: nnx.Rngs):
        self.cfg = cfg
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.lm_head = (embed(cfg, cfg.vocab_size, embed_rngs) if cfg.tie_word_embeddings
                        else dense(cfg, cfg.hidden_size, cfg.vocab_size, False, rngs))

    def __call__(self, x: jax.Array, rng, train: bool) -> jax.Array:
        h = self.norm(x)
        logits = self.lm_head.attend(h) if self.cfg.tie_word_embeddings else self.lm_head(h)
        return logits.astype(jnp.float32)
