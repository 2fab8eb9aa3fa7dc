"""GPT-2's blocks in Flax NNX, Hugging Face semantics (``GPT2LMHeadModel``): learned positions,
pre-norm layers with LayerNorm, a fused ``c_attn`` projection, the tanh GELU (``gelu_new``) and
tied embeddings.

A layer is two blocks, each one sub-layer unit and each adding its own residual: ``attention``
(``ln_1``, ``c_attn``, ``c_proj``) and ``mlp`` (``ln_2``, ``c_fc``, ``c_proj``). HF's ``Conv1D``
weights are ``[in, out]``, as Flax's kernels, so they load untransposed. The head is ``ln_f``
and ``lm_head``, a copy of ``wte`` when tied (as :mod:`skyjax.models.llama`'s). Dropout:
``embd_pdrop`` after the embeddings, ``attn_pdrop`` on the attention probabilities,
``resid_pdrop`` on each block's output before its residual, keyed by position
(:func:`skyjax.models.dropout.site_key`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from skyjax.models.decoder import DecoderConfig, causal_attention, dense, embed, feed_forward
from skyjax.models.dropout import (SITE_ATTENTION_OUTPUT, SITE_ATTENTION_PROBS, SITE_EMBEDDINGS,
                                   SITE_FFN_OUTPUT, dropout, site_key)
from skyjax.models.modeling import ACTIVATIONS, layer_norm


def _layer_norm(cfg: DecoderConfig, rngs: nnx.Rngs) -> nnx.LayerNorm:
    # statistics in float32 (flax promotes them), the result in the compute dtype
    return nnx.LayerNorm(cfg.hidden_size, epsilon=cfg.norm_eps, use_fast_variance=False,
                         dtype=jnp.dtype(cfg.compute_dtype), rngs=rngs)


def _key(rng, block: int, site: int):
    return None if rng is None else site_key(rng, block, site)


class GPT2Embeddings(nnx.Module):
    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.wte = embed(cfg, cfg.vocab_size, rngs)  # first draw (the tied copy's)
        self.wpe = embed(cfg, cfg.max_position_embeddings, rngs)

    def __call__(self, input_ids: jax.Array, rng, train: bool) -> jax.Array:
        positions = jnp.arange(input_ids.shape[-1])[None, :]
        x = self.wte(input_ids) + self.wpe(positions)
        return dropout(x, self.cfg.embedding_dropout_prob, _key(rng, 0, SITE_EMBEDDINGS), train)


class GPT2Attention(nnx.Module):
    """``x + dropout(c_proj(attention(c_attn(ln_1(x)))))``."""

    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        h = cfg.hidden_size
        self.ln_1 = _layer_norm(cfg, rngs)
        self.c_attn = dense(cfg, h, 3 * h, True, rngs)
        self.c_proj = dense(cfg, h, h, True, rngs)

    def __call__(self, x: jax.Array, attention_mask: jax.Array, rng, block: int, train: bool):
        cfg = self.cfg
        b, s, h = x.shape
        qkv = self.c_attn(layer_norm(self.ln_1, x))
        q, k, v = (t.reshape(b, s, cfg.num_attention_heads, cfg.head_size)
                   for t in jnp.split(qkv, 3, axis=-1))
        out = causal_attention(cfg, q, k, v, attention_mask,
                               _key(rng, block, SITE_ATTENTION_PROBS), train)
        out = dropout(self.c_proj(out), cfg.hidden_dropout_prob,
                      _key(rng, block, SITE_ATTENTION_OUTPUT), train)
        return x + out


class GPT2MLP(nnx.Module):
    """``x + dropout(c_proj(gelu(c_fc(ln_2(x)))))``."""

    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.ln_2 = _layer_norm(cfg, rngs)
        self.c_fc = dense(cfg, cfg.hidden_size, cfg.ffn_size, True, rngs)
        self.c_proj = dense(cfg, cfg.ffn_size, cfg.hidden_size, True, rngs)

    def __call__(self, x: jax.Array, attention_mask: jax.Array, rng, block: int, train: bool):
        act = ACTIVATIONS[self.cfg.hidden_act]
        out = feed_forward((self.c_fc, self.c_proj), lambda m, v: m[1](act(m[0](v))),
                           layer_norm(self.ln_2, x))
        out = dropout(out, self.cfg.hidden_dropout_prob, _key(rng, block, SITE_FFN_OUTPUT), train)
        return x + out


class GPT2Layer(nnx.Module):
    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs):
        self.attention = GPT2Attention(cfg, rngs)
        self.mlp = GPT2MLP(cfg, rngs)

    def __call__(self, x: jax.Array, attention_mask: jax.Array, rng, block: int, train: bool):
        x = self.attention(x, attention_mask, rng, block, train)
        return self.mlp(x, attention_mask, rng, block, train)


class GPT2Head(nnx.Module):
    """``ln_f`` and the LM head: logits ``[b, s, vocab]`` in float32."""

    def __init__(self, cfg: DecoderConfig, rngs: nnx.Rngs, embed_rngs: nnx.Rngs):
        self.cfg = cfg
        self.ln_f = _layer_norm(cfg, rngs)
        self.lm_head = (embed(cfg, cfg.vocab_size, embed_rngs) if cfg.tie_word_embeddings
                        else dense(cfg, cfg.hidden_size, cfg.vocab_size, False, rngs))

    def __call__(self, x: jax.Array, rng, train: bool) -> jax.Array:
        h = layer_norm(self.ln_f, x)
        logits = self.lm_head.attend(h) if self.cfg.tie_word_embeddings else self.lm_head(h)
        return logits.astype(jnp.float32)
