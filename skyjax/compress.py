"""Sparse, low-bit outer steps: top-k plus 2- or 4-bit values with error feedback (SparseLoCo,
CocktailSGD), the compressor ``relax.outer_compression`` puts on the relaxed averagings' wire
(:mod:`skyjax.runtime.compressed`). Pure, jittable functions of arrays.

A tree (one unit's pseudo-gradient or gradients) is flattened to one float32 vector of n
values and cut into chunks of ``c = min(CHUNK, n)`` values (the last one zero-padded). In each
chunk the ``k`` values of largest magnitude are kept, ``k`` = ``fraction * c`` rounded up to a
whole number of bytes' worth of values (a multiple of 8 / bits); the rest are dropped. A kept
value is sent as its index in the chunk (uint16) and ``bits`` bits: the odd levels
``(2q - L) s``, ``q`` in [0, L], ``L = 2**bits - 1``, with the chunk's float32 scale
``s = max |kept| / L``. A kept value's error is at most ``s`` (half a step of 2s); what was
dropped or rounded, ``(x + r) - decode(encode(x + r))``, is the new residual ``r``, added to the
next tree sent (error feedback): over steps nothing is lost, only delayed, and the sum of what
was sent plus the last residual is the sum of the inputs.

Bytes on the wire (:func:`skyjax.topk_wire.payload_bytes`, no JAX: the planner's), exact:
``ceil(n / c) * (2k + ceil(k bits / 8) + 4)``; at ``fraction`` 1/8 (``relax.outer_topk``'s
default) and 2 bits, ``1156`` bytes per 4096 values, 14.2x fewer than float32.
A chunk holding a non-finite value gets a NaN scale, so the run's NaN guard still sees it.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from skyjax.topk_wire import BITS, CHUNK, bits_of, chunking, payload_bytes, wire_ratio

__all__ = ["BITS", "CHUNK", "bits_of", "chunking", "payload_bytes", "wire_ratio",
           "topk_lowbit_encode", "topk_lowbit_decode", "tree_payload_bytes"]

def _pack(q: jax.Array, bits: int) -> jax.Array:
    """[chunks, k] integers in [0, 2**bits) as [chunks, ceil(k bits / 8)] uint8, low bits
    first."""
    per = 8 // bits
    pad = -q.shape[1] % per
    q = jnp.pad(q.astype(jnp.uint8), ((0, 0), (0, pad))).reshape(q.shape[0], -1, per)
    out = jnp.zeros(q.shape[:2], jnp.uint8)
    for j in range(per):
        out = out | (q[..., j] << (bits * j))
    return out


def _unpack(p: jax.Array, bits: int, k: int) -> jax.Array:
    per = 8 // bits
    mask = (1 << bits) - 1
    q = jnp.stack([(p >> (bits * j)) & mask for j in range(per)], axis=-1)
    return q.reshape(p.shape[0], -1)[:, :k]


def encode_flat(v: jax.Array, fraction: float, bits: int) -> dict:
    """The payload of a float32 vector: ``idx`` [chunks, k] uint16, ``q`` packed uint8,
    ``scale`` [chunks] float32."""
    n = v.shape[0]
    chunks, c, k = chunking(n, fraction, bits)
    x = jnp.pad(v.astype(jnp.float32), (0, chunks * c - n)).reshape(chunks, c)
    _, idx = jax.lax.top_k(jnp.abs(x), k)
    vals = jnp.take_along_axis(x, idx, axis=1)
    levels = (1 << bits) - 1
    scale = jnp.max(jnp.abs(vals), axis=1) / levels
    scale = jnp.where(jnp.isfinite(x).all(axis=1), scale, jnp.nan)
    safe = jnp.where(scale > 0, scale, 1.0)
    q = jnp.clip(jnp.round((jnp.nan_to_num(vals / safe[:, None]) + levels) / 2), 0, levels)
    return {"idx": idx.astype(jnp.uint16), "q": _pack(q, bits), "scale": scale}


def decode_flat(payload: dict, n: int, fraction: float, bits: int) -> jax.Array:
    """The float32 vector of n values a payload of :func:`encode_flat` stands for."""
    chunks, c, k = chunking(n, fraction, bits)
    levels = (1 << bits) - 1
    q = _unpack(payload["q"], bits, k).astype(jnp.float32)
    vals = (2 * q - levels) * payload["scale"][:, None]
    rows = jnp.arange(chunks)[:, None]
    x = jnp.zeros((chunks, c), jnp.float32).at[rows, payload["idx"].astype(jnp.int32)].set(vals)
    return x.reshape(-1)[:n]


def topk_lowbit_encode(x: Any, fraction: float, bits: int, residual: Any
                       ) -> tuple[dict, Any, Any]:
    """(payload of x + residual, what it decodes to, the new residual), trees shaped as x
    (module doc); jittable with ``fraction`` and ``bits`` static."""
    total = jax.tree.map(lambda a, r: a.astype(jnp.float32) + r, x, residual)
    flat, unravel = ravel_pytree(total)
    payload = encode_flat(flat, fraction, bits)
    decoded = unravel(decode_flat(payload, flat.shape[0], fraction, bits))
    return payload, decoded, jax.tree.map(jnp.subtract, total, decoded)


def topk_lowbit_decode(payload: dict, like: Any, fraction: float, bits: int) -> Any:
    """The tree (shaped as ``like``: arrays or ShapeDtypeStructs) a payload stands for."""
    leaves = jax.tree.leaves(like)
    n = sum(math.prod(x.shape) for x in leaves)
    flat = decode_flat(payload, n, fraction, bits)
    out, at = [], 0
    for x in leaves:
        size = math.prod(x.shape)
        out.append(flat[at:at + size].reshape(x.shape).astype(x.dtype))
        at += size
    return jax.tree.unflatten(jax.tree.structure(like), out)


def tree_payload_bytes(like: Any, fraction: float, bits: int) -> int:
    """Bytes on the wire of one tree (one unit)."""
    return payload_bytes(sum(math.prod(x.shape) for x in jax.tree.leaves(like)), fraction, bits)
