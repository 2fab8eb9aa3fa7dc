"""The plain single-device train step: one jit over the whole model, no pipeline.

The reference that pipelined training must equal (tests) and the baseline that a one-stage
pipeline is measured against (``experiments/hetero_benchmark.py``). Loss, eval sums and norms
are the ones the pipeline uses (``skyjax.metrics``, ``skyjax.optim``), so the two compare exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from skyjax import scores
from skyjax.metrics import classification_loss, eval_outputs
from skyjax.models import bert
from skyjax.optim import global_norm

Params = list[dict[str, Any]]  # one pure param dict per unit
Batch = dict[str, np.ndarray]

def microbatch_rng(seed: int, step: int, microbatch: int, size: int) -> jax.Array:
    """The dropout keys of micro-batch ``microbatch`` of ``size`` examples: one per example
    (``skyjax.models.bert.example_keys``), the same on every stage and for every plan."""
    return bert.example_keys(seed, step, microbatch * size, size)


def forward(chain: list[bert.Unit], params: Params, batch: Batch, rng: jax.Array | None,
            train: bool) -> jax.Array:
    """Logits of the composed units."""
    carry = bert.initial_carry(batch["input_ids"], batch["token_type_ids"],
                               batch["attention_mask"])
    return bert.apply_units(chain, params, carry, rng, train)["logits"]


def make_train_step(chain: list[bert.Unit], optimizer: optax.GradientTransformation,
                    seed: int, microbatches: int) -> Callable:
    """``step(params, opt_state, batch, step) -> (params, opt_state, metrics)``, jitted.

    The batch is split into ``microbatches`` equal micro-batches whose gradients are averaged
    (what a pipeline computes), example j of the batch with dropout key
    ``example_keys(seed, step, j, 1)``.
    """

    def loss_fn(params: Params, mb: Batch, rng: jax.Array):
        return classification_loss(forward(chain, params, mb, rng, True), mb["labels"])

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def step_fn(params: Params, opt_state: Any, batch: Batch, step: jax.Array):
        split = jax.tree.map(lambda x: x.reshape(microbatches, -1, *x.shape[1:]), batch)

        def accumulate(acc, i):
            mb = jax.tree.map(lambda x: x[i], split)
            size = mb["labels"].shape[0]
            keys = bert.example_keys(seed, step, 0, size * microbatches)
            (loss, accuracy), grads = grad_fn(params, mb, jax.lax.dynamic_slice_in_dim(
                keys, i * size, size))
            acc = jax.tree.map(jnp.add, acc, (grads, loss, accuracy))
            return acc, None

        zeros = (jax.tree.map(jnp.zeros_like, params), jnp.zeros(()), jnp.zeros(()))
        (grads, loss, accuracy), _ = jax.lax.scan(accumulate, zeros, jnp.arange(microbatches))
        grads, loss, accuracy = jax.tree.map(lambda x: x / microbatches, (grads, loss, accuracy))
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {"loss": loss, "accuracy": accuracy, "grad_norm": global_norm(grads)}
        return params, opt_state, metrics

    return jax.jit(step_fn, donate_argnums=(0, 1))


def make_eval_step(chain: list[bert.Unit]) -> Callable:
    """``eval_step(params, batch) -> per-example (loss, prediction, label, weight)``, jitted;
    padding rows carry ``weights`` 0."""

    def eval_fn(params: Params, batch: Batch):
        logits = forward(chain, params, batch, None, False)
        return eval_outputs(logits, batch["labels"], batch["weights"])

    return jax.jit(eval_fn)


def evaluate(eval_step: Callable, params: Params, batches: Iterable[Batch],
             metric: str = "accuracy") -> dict[str, float]:
    """The held-out figures of ``metric`` over the weighted eval examples (``{}`` when there are
    none, as the pipeline executors report)."""
    return scores.summarize((eval_step(params, batch) for batch in batches), metric)
