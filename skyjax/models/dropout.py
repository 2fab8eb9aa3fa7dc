"""Dropout whose keys come from the position in the model, never from how it is cut.

A key is derived from (seed, step, example) (:func:`example_keys`), then from the block and the
dropout site inside it (:func:`site_key`: embeddings are block 0, encoder layer ``i`` block
``i + 1``, the head ``num_hidden_layers + 1``), so neither the granularity, the plan, the
micro-batch count nor how a batch is shared among pipelines changes a mask.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name


# Dropout sites inside one block; combined with the block index (embeddings 0, encoder layer i
# is i + 1, head num_hidden_layers + 1) they name every dropout in the model.
SITE_EMBEDDINGS, SITE_ATTENTION_PROBS, SITE_ATTENTION_OUTPUT, SITE_FFN_OUTPUT, SITE_CLASSIFIER = range(5)


DROPOUT_STREAM = 1  # folded into jax.random.PRNGKey(seed) for every dropout key
DROPOUT_MASK = "dropout_mask"  # the masks' name for rematerialisation policies (jax.checkpoint)


@functools.partial(jax.jit, static_argnums=(0, 3))
def example_keys(seed: int, step: int, first: int, count: int) -> jax.Array:
    """The dropout keys of examples ``first .. first + count - 1`` of step ``step``'s global
    batch, one per example (``[count, 2]``). Keyed by the example, not by its micro-batch, so
    neither the micro-batch count nor how the batch is shared among pipelines changes a mask."""
    key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), DROPOUT_STREAM), step)
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(first + jnp.arange(count))


def _per_example(rng: jax.Array) -> bool:
    """Whether ``rng`` holds one key per example (raw ``[b, 2]`` or typed ``[b]``) rather than
    one key for the whole batch."""
    typed = jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key)
    return rng.ndim == (1 if typed else 2)


def site_key(rng: jax.Array, block: int, site: int) -> jax.Array:
    """The dropout key(s) of ``site`` in ``block`` for the key(s) ``rng`` (one per example, or
    one for the batch)."""
    fold = lambda k: jax.random.fold_in(jax.random.fold_in(k, block), site)  # noqa: E731
    return jax.vmap(fold)(rng) if _per_example(rng) else fold(rng)


def dropout(x: jax.Array, rate: float, rng: jax.Array | None, train: bool) -> jax.Array:
    """Inverted dropout, active only when ``train`` and ``rate > 0``; with one key per example
    (leading axis of ``x``) each example's mask comes from its own key."""
    if not train or rate == 0.0:
        return x
    if rng is None:
        raise ValueError("train=True with dropout needs an rng key")
    if _per_example(rng):
        keep = jax.vmap(lambda k, row: jax.random.bernoulli(k, 1.0 - rate, row.shape))(rng, x)
    else:
        keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return _keep_scaled(x, checkpoint_name(keep, DROPOUT_MASK), 1.0 - rate)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _keep_scaled(x: jax.Array, keep: jax.Array, kept: float) -> jax.Array:
    """``where(keep, x / kept, 0)`` whose backward keeps only ``keep``: JAX's own derivative
    of the ``where`` also saves a zero array the size of ``x`` per dropout site (the
    instantiated tangent of the zero branch), a buffer per site and micro-batch for nothing.
    The backward computes what JAX's does with the same operations (XLA may fuse them another
    way, which can move bf16's rounding)."""
    return jnp.where(keep, x / kept, jnp.zeros_like(x))


def _keep_scaled_fwd(x, keep, kept):
    return _keep_scaled(x, keep, kept), keep


def _keep_scaled_bwd(kept, keep, cotangent):
    return jnp.where(keep, cotangent / kept, jnp.zeros_like(cotangent)), None


_keep_scaled.defvjp(_keep_scaled_fwd, _keep_scaled_bwd)
