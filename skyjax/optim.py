"""The optimizer and its learning-rate schedule, from ``config.train``; nothing else builds one.

AdamW (no weight decay on biases and LayerNorm) after global-norm clipping. A pipeline clips with
the norm over *all* stages, which no stage sees alone: stages build the optimizer with
``clip=False`` and scale their gradients by :func:`clip_scale` of the summed squared norm, which
is exactly what ``optax.clip_by_global_norm`` does on the whole model.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax


def learning_rate_schedule(train: Any) -> optax.Schedule:
    """Linear warmup from 0 over ``train.warmup_steps``, then linear / cosine decay to 0 at the
    last step, or constant (``train.lr_schedule``). ``train`` is ``config.train``."""
    warmup = min(train.warmup_steps, train.steps)
    decay_steps = max(train.steps - warmup, 1)
    if train.lr_schedule == "linear":
        decay = optax.linear_schedule(train.learning_rate, 0.0, decay_steps)
    elif train.lr_schedule == "cosine":
        decay = optax.cosine_decay_schedule(train.learning_rate, decay_steps)
    else:
        decay = optax.constant_schedule(train.learning_rate)
    if warmup == 0:
        return decay
    return optax.join_schedules(
        [optax.linear_schedule(0.0, train.learning_rate, warmup), decay], [warmup])


def make_optimizer(train: Any, clip: bool = True) -> optax.GradientTransformation:
    """AdamW from ``config.train`` (no decay on 1-d parameters), after global-norm clipping when
    ``clip`` and ``train.grad_clip_norm > 0``. Pipeline stages pass ``clip=False``."""
    adamw = optax.adamw(learning_rate_schedule(train), b1=train.adam_b1, b2=train.adam_b2,
                        eps=train.adam_eps, weight_decay=train.weight_decay,
                        mask=lambda params: jax.tree.map(lambda p: p.ndim > 1, params))
    if clip and train.grad_clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(train.grad_clip_norm), adamw)
    return adamw


@jax.jit
def global_sq_norm(tree: Any) -> jax.Array:
    """Sum of squares of all leaves (a stage's share of the global norm). Jitted: a stage calls
    it on its gradients every step, and op by op it would cost one dispatch per leaf (~10 ms a
    step for the demo model on CPU, more than its whole optimizer update)."""
    return sum((jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)),
               jnp.zeros((), jnp.float32))


def global_norm(tree: Any) -> jax.Array:
    """The L2 norm of all leaves together."""
    return jnp.sqrt(global_sq_norm(tree))


def clip_scale(global_sq_norm_value: float, max_norm: float | None) -> float:
    """The factor global-norm clipping applies to every gradient (as optax's
    ``clip_by_global_norm``), from the squared norm summed over all stages."""
    if not max_norm:
        return 1.0
    norm = float(global_sq_norm_value) ** 0.5
    return 1.0 if norm < max_norm else max_norm / norm
