"""What the profiler's timed stage calls take as inputs, built one way for every measurement
(unit times, call costs, wake-ups), so that each times the same calls a stage makes."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from skyjax.models.bert import example_keys
from skyjax.programs.stage import float_entries


def call_inputs(carry: Any, labels: np.ndarray | None, is_last: bool,
                device: Any) -> tuple[Any, Any, Any]:
    """``(carry, dropout key, labels or None)`` on ``device``, as a stage's forward takes them
    (labels only for the chain's last stage)."""
    keys = example_keys(0, 0, 0, carry["attention_mask"].shape[0])  # one per example
    return (jax.device_put(carry, device), jax.device_put(keys, device),
            jax.device_put(labels, device) if is_last else None)


def cotangent(out: dict, is_last: bool) -> dict | None:
    """The gradient a stage's backward receives for its forward's ``out`` (ones for every
    floating output; None for the last stage, whose backward starts from its loss)."""
    if is_last:
        return None
    return {k: jnp.ones_like(v) for k, v in float_entries(out).items()}
