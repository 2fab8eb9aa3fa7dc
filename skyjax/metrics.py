"""The metric maths, once: cross-entropy and accuracy of a batch, weighted eval sums, and their
means. Training steps, pipeline stages and the single-device baseline all call these."""

from __future__ import annotations

from typing import Iterable

import jax
import jax.numpy as jnp


def _per_example(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Softmax cross-entropy and correctness (float32) of each example."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, labels[:, None].astype(jnp.int32), axis=-1)[:, 0]
    return nll, (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)


def classification_loss(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean softmax cross-entropy and accuracy of ``logits`` against integer ``labels``."""
    nll, correct = _per_example(logits, labels)
    return nll.mean(), correct.mean()


def weighted_sums(logits: jax.Array, labels: jax.Array, weights: jax.Array
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(sum of loss, sum of correct, sum of weight)`` over a batch whose padding rows have
    weight 0: eval sets need not divide into batches."""
    nll, correct = _per_example(logits, labels)
    weights = weights.astype(jnp.float32)
    return jnp.sum(nll * weights), jnp.sum(correct * weights), jnp.sum(weights)


def summarize_eval(sums: Iterable[tuple[float, float, float]]) -> dict[str, float]:
    """``eval_loss``, ``eval_accuracy``, ``eval_examples`` from per-batch weighted sums
    ``(loss, correct, weight)``; ``{}`` when there were no examples."""
    sums = [tuple(float(x) for x in r) for r in sums]
    n = sum(r[2] for r in sums)
    if not n:
        return {}
    return {"eval_loss": sum(r[0] for r in sums) / n,
            "eval_accuracy": sum(r[1] for r in sums) / n, "eval_examples": int(round(n))}
