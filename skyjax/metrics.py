"""The loss maths, once: the training loss of a batch and the per-example eval outputs. Training
steps, pipeline stages and the single-device baseline all call these; the held-out figures made
from the eval outputs are :mod:`skyjax.scores`'.

The head decides the loss, as Hugging Face's ``BertForSequenceClassification`` does: a head of one
output (``num_labels == 1``) is a regression trained with mean squared error against float labels;
a wider head a classifier trained with softmax cross-entropy against integer labels. A causal
language model's head gives logits ``[batch, seq, vocab]`` (rank 3, static when traced) against
next-token labels ``[batch, seq]`` (already shifted; :data:`IGNORE` where there is no target):
the loss is the mean next-token cross-entropy over the target tokens, its "accuracy" the share
of targets that are the arg-max token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


IGNORE = -100  # a label with no target (skyjax.data.lm_text.IGNORE)


def is_causal_lm(logits: jax.Array) -> bool:
    """Whether the head is a language model's, one prediction per position (static)."""
    return logits.ndim == 3


def _per_token(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per position: the next-token NLL (0 where no target), whether the arg-max is the target,
    and whether there is a target (``[batch, seq]`` each, float32)."""
    target = labels != IGNORE
    safe = jnp.where(target, labels, 0).astype(jnp.int32)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
    hit = (jnp.argmax(logits, axis=-1) == safe) & target
    weight = target.astype(jnp.float32)
    return nll * weight, hit.astype(jnp.float32), weight


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
    """Mean loss of the batch and its accuracy (0.0 for a regression, which has none); a
    language model's: the mean over its target tokens (0.0 where it has none)."""
    if is_causal_lm(logits):
        nll, hit, weight = _per_token(logits, labels)
        count = jnp.maximum(weight.sum(), 1.0)
        return nll.sum() / count, hit.sum() / count
    loss, prediction = _per_example(logits, labels)
    if is_regression(logits):
        return loss.mean(), jnp.zeros((), jnp.float32)
    return loss.mean(), (prediction == labels).astype(jnp.float32).mean()


def eval_outputs(logits: jax.Array, labels: jax.Array, weights: jax.Array
                 ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Per example ``(loss, prediction, label, weight)``: what :func:`skyjax.scores.summarize`
    turns into the held-out figures on the host (padding rows have weight 0). A language model's
    per sequence: ``(NLL summed over its targets, correct next tokens, targets, weight)``, which
    :func:`skyjax.scores.perplexity` weighs by tokens."""
    if is_causal_lm(logits):
        nll, hit, weight = _per_token(logits, labels)
        return nll.sum(-1), hit.sum(-1), weight.sum(-1), weights.astype(jnp.float32)
    loss, prediction = _per_example(logits, labels)
    return loss, prediction, labels, weights.astype(jnp.float32)
