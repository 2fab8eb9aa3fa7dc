"""The loss maths, once: the training loss of a batch and the per-example eval outputs. Training
steps, pipeline stages and the single-device baseline all call these; the held-out figures made
from the eval outputs are :mod:`skyjax.scores`'.

The head decides the loss, as Hugging Face's ``BertForSequenceClassification`` does: a head of one
output (``num_labels == 1``) is a regression trained with mean squared error against float labels;
a wider head a classifier trained with softmax cross-entropy against integer labels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def is_regression(logits: jax.Array) -> bool:
    """Whether the head has one output (static: known when the program is traced)."""
    return logits.shape[-1] == 1


def _per_example(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Loss and prediction of each example: squared error and the value (regression), or
    softmax cross-entropy and the arg-max class (classification)."""
    if is_regression(logits):
        value = logits[:, 0].astype(jnp.float32)
        return jnp.square(value - labels.astype(jnp.float32)), value
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, labels[:, None].astype(jnp.int32), axis=-1)[:, 0]
    return nll, jnp.argmax(logits, axis=-1).astype(jnp.int32)


def classification_loss(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean loss of the batch and its accuracy (0.0 for a regression, which has none)."""
    loss, prediction = _per_example(logits, labels)
    if is_regression(logits):
        return loss.mean(), jnp.zeros((), jnp.float32)
    return loss.mean(), (prediction == labels).astype(jnp.float32).mean()


def eval_outputs(logits: jax.Array, labels: jax.Array, weights: jax.Array
                 ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Per example ``(loss, prediction, label, weight)``: what :func:`skyjax.scores.summarize`
    turns into the held-out figures on the host (padding rows have weight 0)."""
    loss, prediction = _per_example(logits, labels)
    return loss, prediction, labels, weights.astype(jnp.float32)
