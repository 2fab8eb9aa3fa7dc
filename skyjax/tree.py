"""Sizes and signatures of pytrees, one helper each (the profiler, transports, stages and the
trainer all measure trees the same way)."""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np


def tree_nbytes(tree: Any) -> int:
    """Bytes of the arrays (or ShapeDtypeStructs) in ``tree``; other leaves count 0."""
    return int(sum(np.dtype(x.dtype).itemsize * math.prod(x.shape)
                   for x in jax.tree.leaves(tree) if hasattr(x, "dtype")))


def tree_size(tree: Any) -> int:
    """Number of elements of the arrays in ``tree`` (parameters of a parameter tree)."""
    return int(sum(math.prod(x.shape) for x in jax.tree.leaves(tree) if hasattr(x, "shape")))


def tree_avals(tree: Any) -> tuple[tuple[tuple[int, ...], str], ...]:
    """``((shape, dtype), ...)`` of the leaves in order: what a program is compiled for, and what
    a message must match. Leaves without a shape give ``(None, type name)``."""
    return tuple((tuple(x.shape), str(x.dtype)) if hasattr(x, "shape") and hasattr(x, "dtype")
                 else (None, type(x).__name__) for x in jax.tree.leaves(tree))


def tree_shapes(tree: Any) -> Any:
    """The same tree with ``jax.ShapeDtypeStruct`` leaves: a stand-in that holds no memory."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
