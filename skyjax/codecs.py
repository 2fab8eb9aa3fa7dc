"""Codecs for what crosses a slow link: stage hand-offs (activations forward, cotangents backward)
and the gradients exchanged between pipelines. Pure, jittable functions of arrays.

* ``none``: the array itself (the exact path; encode and decode trace to nothing).
* ``bf16``: bfloat16, half the bytes; fp32's exponent range, 8 bits of mantissa.
* ``int8``: blocks of ``BLOCK`` values along the last axis (:func:`block_size`), each scaled by
  its largest magnitude to [-127, 127] and rounded to nearest: 1 byte per value plus a float32
  scale per block (4 / 1.0625 = 3.76x fewer bytes than float32). A block's error is at most
  half a step, max|block| / 254, so one outlier costs only its own block.
* ``int4``: the same blocks rotated by the orthonormal Hadamard matrix first, then 15 levels
  ([-7, 7]) per block, two values per byte (4 / 0.5625 = 7.1x). The rotation spreads a block's
  outliers over all its values (activations of transformers have a few large channels), so the
  per-block scale fits the bulk instead of the outlier; it is its own inverse, so decoding
  rotates back (TAH-Quant's tiles, without its cache-free dropout of the scale's outliers).
* ``sparse``: in each block the ``b / 2`` values of largest magnitude (32 of 64), marked in a
  bitmask of the block (b bits) and sent in block order in 4 bits (15 levels, [-7, 7]) with the
  block's float32 scale (max |kept| / 7); the rest are zero (FusionLLM's top-k, at a fixed k):
  (8 + 16 + 4) bytes per 64 values, 9.1x fewer than float32, 3.5 bits per value. A kept value's
  error is at most half a step; a dropped one is lost (no error feedback on a hand-off), so its
  quality is measured (``tests/test_relax_quality.py``) before a bound allows it
  (``relax.handoff_bits`` 2). Fewer kept values lose the demo's accuracy (an eighth: 0.65, a
  quarter: 0.33, against the exact run's 1.00 after 200 steps; a half: 0.99).

Rounding is deterministic (to nearest), so a relaxed run is reproducible. Non-finite values
stay non-finite after a round trip (the block's scale becomes NaN or inf), so the run's NaN
guard still sees them. Only floating leaves are coded; integer leaves (the attention mask)
travel as they are.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from skyjax.names import CODEC_BLOCK as BLOCK  # values per scale (a power of two: Hadamard's size)
from skyjax.names import CODECS
from skyjax.tree import tree_nbytes


def _hadamard(n: int) -> np.ndarray:
    """The orthonormal Hadamard matrix of size n (a power of two): symmetric, its own inverse."""
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.float32(math.sqrt(n))


def block_size(n: int) -> int:
    """Values per scale for a last axis of n: ``BLOCK``, or the least power of two >= n when
    n is shorter (no block is mostly padding)."""
    return BLOCK if n >= BLOCK else max(2, 1 << max(n - 1, 0).bit_length())


def _blocks(x: jax.Array) -> jax.Array:
    """x as [..., n_blocks, block] in float32 (the last axis zero-padded to whole blocks; a
    scalar as one value)."""
    x = x.astype(jnp.float32).reshape(x.shape or (1,))
    n = x.shape[-1]
    b = block_size(n)
    pad = -n % b
    if pad:
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])
    return x.reshape(*x.shape[:-1], (n + pad) // b, b)


def _unblock(y: jax.Array, like: Any) -> jax.Array:
    n = like.shape[-1] if like.shape else 1
    return y.reshape(*y.shape[:-2], -1)[..., :n].reshape(like.shape).astype(like.dtype)


def _quantize(y: jax.Array, levels: int) -> tuple[jax.Array, jax.Array]:
    """Per-block scale and integers in [-levels, levels] (a zero block: scale 0, zeros)."""
    scale = jnp.max(jnp.abs(y), axis=-1) / levels
    scale = jnp.where(jnp.isnan(y).any(axis=-1), jnp.nan, scale)  # XLA's max may skip NaN
    safe = jnp.where(scale > 0, scale, 1.0)
    q = jnp.clip(jnp.round(y / safe[..., None]), -levels, levels)
    q = jnp.where(jnp.isfinite(scale)[..., None], q, 0.0)
    return q, scale


def sparse_keep(block: int) -> int:
    """Values the ``sparse`` codec keeps per block of ``block`` values."""
    return max(1, block // 2)


def _pack_bits(x: jax.Array, bits: int) -> jax.Array:
    """[..., m] integers in [0, 2**bits) as [..., ceil(m bits / 8)] uint8, low bits first."""
    per = 8 // bits
    pad = -x.shape[-1] % per
    x = jnp.pad(x.astype(jnp.uint8), [(0, 0)] * (x.ndim - 1) + [(0, pad)])
    x = x.reshape(*x.shape[:-1], -1, per)
    return functools.reduce(jnp.bitwise_or, [x[..., j] << (bits * j) for j in range(per)])


def _unpack_bits(p: jax.Array, bits: int, m: int) -> jax.Array:
    per, mask = 8 // bits, (1 << bits) - 1
    x = jnp.stack([(p >> (bits * j)) & mask for j in range(per)], axis=-1)
    return x.reshape(*p.shape[:-1], -1)[..., :m]


def _sparse_encode(y: jax.Array) -> dict:
    b = y.shape[-1]
    _, idx = jax.lax.top_k(jnp.abs(y), sparse_keep(b))
    idx = jnp.sort(idx, axis=-1)  # the kept values in block order, as the bitmask reads
    vals = jnp.take_along_axis(y, idx, axis=-1)
    q, scale = _quantize(vals, 7)
    scale = jnp.where(jnp.isfinite(y).all(axis=-1), scale, jnp.nan)
    flat = idx.reshape(-1, idx.shape[-1])
    rows = jnp.arange(flat.shape[0])[:, None]
    kept = jnp.zeros((flat.shape[0], b), jnp.uint8).at[rows, flat].set(1)
    return {"mask": _pack_bits(kept.reshape(y.shape), 1),
            "q": _pack_bits((q + 8).astype(jnp.uint8), 4), "scale": scale}


def _sparse_decode(z: dict, like: Any) -> jax.Array:
    n = like.shape[-1] if like.shape else 1
    b = block_size(n)
    kept = _unpack_bits(z["mask"], 1, b).astype(bool)
    q = _unpack_bits(z["q"], 4, sparse_keep(b)).astype(jnp.float32) - 8
    at = jnp.clip(jnp.cumsum(kept, axis=-1) - 1, 0, q.shape[-1] - 1)  # each kept value's place
    y = jnp.where(kept, jnp.take_along_axis(q, at, axis=-1) * z["scale"][..., None], 0.0)
    return _unblock(y, like)


def encode_array(codec: str, x: jax.Array) -> Any:
    """One floating array in ``codec``'s wire format."""
    if codec == "none":
        return x
    if codec == "bf16":
        return x.astype(jnp.bfloat16)
    y = _blocks(x)
    if codec == "int8":
        q, scale = _quantize(y, 127)
        return {"q": q.astype(jnp.int8), "scale": scale}
    if codec == "int4":
        q, scale = _quantize(y @ _hadamard(y.shape[-1]), 7)
        nib = (q + 8).astype(jnp.uint8)  # 1..15
        return {"q": nib[..., 0::2] | (nib[..., 1::2] << 4), "scale": scale}
    if codec == "sparse":
        return _sparse_encode(y)
    raise ValueError(f"codec: expected one of {CODECS}, got {codec!r}")


def decode_array(codec: str, z: Any, like: Any) -> jax.Array:
    """The array ``encode_array(codec, x)`` stands for; ``like``: x's shape and dtype."""
    if codec == "none":
        return z
    if codec == "bf16":
        return z.astype(like.dtype)
    if codec == "sparse":
        return _sparse_decode(z, like)
    scale = z["scale"][..., None]
    if codec == "int8":
        return _unblock(z["q"].astype(jnp.float32) * scale, like)
    if codec == "int4":
        lo = (z["q"] & 15).astype(jnp.float32) - 8
        hi = (z["q"] >> 4).astype(jnp.float32) - 8
        q = jnp.stack([lo, hi], axis=-1).reshape(*lo.shape[:-1], 2 * lo.shape[-1])
        return _unblock((q * scale) @ _hadamard(q.shape[-1]), like)
    raise ValueError(f"codec: expected one of {CODECS}, got {codec!r}")


def _is_float(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jnp.floating)


def encode(codec: str, tree: Any) -> Any:
    """A pytree with every floating leaf encoded (integer leaves as they are)."""
    if codec == "none":
        return tree
    return jax.tree.map(lambda x: encode_array(codec, x) if _is_float(x) else x, tree)


def decode(codec: str, tree: Any, like: Any) -> Any:
    """The inverse of :func:`encode` up to the codec's rounding; ``like``: the original tree's
    shapes and dtypes (ShapeDtypeStructs or arrays)."""
    if codec == "none":
        return tree
    leaves, treedef = jax.tree.flatten(like)
    coded = treedef.flatten_up_to(tree)
    return jax.tree.unflatten(treedef, [decode_array(codec, z, x) if _is_float(x) else z
                                        for z, x in zip(coded, leaves)])


def encoded_like(codec: str, like: Any) -> Any:
    """ShapeDtypeStructs of ``encode(codec, like)`` (what the receiver expects on the wire)."""
    if codec == "none":
        return like
    return jax.eval_shape(lambda t: encode(codec, t), like)


def encoded_bytes(codec: str, like: Any) -> int:
    """Bytes on the wire of ``like`` in ``codec``."""
    return tree_nbytes(encoded_like(codec, like))
