"""Tensor names of a unit's state, by its path in the model's parameter tree.

A checkpoint stores tensors, not units: ``params/<param path>`` for every parameter,
``opt/<state path>/<param path>`` for every per-parameter optimizer leaf (AdamW's ``mu`` and
``nu``), and ``unit/<unit path>/<state path>`` for the optimizer leaves a unit holds once (AdamW's
step ``count``). ``<param path>`` is ``Unit.path`` joined with the leaf's path inside the unit's
params (e.g. ``layers/0/attention/self/query/kernel``), so a ``"layer"`` unit and the three
``"sublayer"`` units of the same encoder layer name the very same tensors: a checkpoint restores
under any granularity, plan and number of devices or processes.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import jax
import numpy as np

SEP = "/"


def _key(k: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def key_path(path: Iterable[Any]) -> str:
    return SEP.join(_key(k) for k in path)


def _same_shape(node: Any, like: Any, treedef: Any) -> bool:
    if jax.tree.structure(node) != treedef:
        return False
    return all(tuple(getattr(a, "shape", ())) == tuple(b.shape)
               for a, b in zip(jax.tree.leaves(node), jax.tree.leaves(like)))


def state_entries(unit_path: tuple[str, ...], params: Any, opt_state: Any
                  ) -> list[tuple[str, Any]]:
    """``[(tensor name, leaf)]`` of one unit's (params, optimizer state), in a fixed order.

    Works on arrays and on ``ShapeDtypeStruct`` trees alike (the names and shapes a restore
    expects). An optimizer subtree shaped like the params (same structure, same shapes) is
    per-parameter state; any other leaf belongs to the unit.
    """
    prefix = key_path(unit_path)
    flat_params = jax.tree_util.tree_flatten_with_path(params)[0]
    out = [(f"params/{prefix}/{key_path(p)}", x) for p, x in flat_params]
    if opt_state is None:
        return out
    treedef = jax.tree.structure(params)
    nodes = jax.tree_util.tree_flatten_with_path(
        opt_state, is_leaf=lambda n: _same_shape(n, params, treedef))[0]
    for spath, node in nodes:
        where = key_path(spath) or "_"
        if _same_shape(node, params, treedef):
            for (p, _), leaf in zip(flat_params, jax.tree.leaves(node)):
                out.append((f"opt/{where}/{prefix}/{key_path(p)}", leaf))
        else:
            out.append((f"unit/{prefix}/{where}", node))
    return out


def tied_names(chain: Iterable[Any]) -> dict[str, str]:
    """``{param path of a tied tensor's second copy: param path of its first}`` (a decoder's
    LM head copy of the token embedding, ``Unit.tied``): the second copy is not saved, and is
    read back from the first (:func:`saved_name`)."""
    units = list(chain)
    paths = {u.name: tuple(u.path) for u in units}
    out = {}
    for i, unit in enumerate(units):
        for path, other, other_path in getattr(unit, "tied", ()):
            if [u.name for u in units].index(other) < i:
                out[key_path(tuple(unit.path) + tuple(path))] = key_path(paths[other] +
                                                                         tuple(other_path))
    return out


def saved_name(name: str, tied: dict[str, str]) -> str:
    """The name under which tensor ``name`` is saved: its own, or, for a tied tensor's second
    copy (``params/<path>``, ``opt/<state>/<path>``), the first copy's."""
    for second, first in tied.items():
        if name == f"params/{second}":
            return f"params/{first}"
        if name.startswith("opt/") and name.endswith(SEP + second):
            return name[:-len(second)] + first
    return name


def rebuild(unit_path: tuple[str, ...], like: tuple[Any, Any],
            read: Callable[[str, Any], np.ndarray], unit_source: Callable[[str], str]
            ) -> tuple[Any, Any]:
    """(params, optimizer state) shaped like ``like`` (ShapeDtypeStructs) from tensors
    ``read(name, leaf_like)``. A unit-level leaf is read under the saved unit that
    ``unit_source(name)`` maps it to (the unit of another granularity that covers this one)."""
    params_like, opt_like = like
    entries = state_entries(unit_path, params_like, opt_like)
    leaves = []
    for name, leaf_like in entries:
        if name.startswith("unit/"):
            name = unit_source(name)
        leaves.append(read(name, leaf_like))
    n_params = len(jax.tree.leaves(params_like))
    params = jax.tree.unflatten(jax.tree.structure(params_like), leaves[:n_params])
    if opt_like is None:
        return params, None
    # Entries follow the optimizer's flattening with per-param subtrees expanded in place.
    treedef = jax.tree.structure(params_like)
    it = iter(leaves[n_params:])

    def fill(node):
        if _same_shape(node, params_like, treedef):
            return jax.tree.unflatten(treedef, [next(it) for _ in range(treedef.num_leaves)])
        return next(it)

    return params, jax.tree.map(fill, opt_like,
                                is_leaf=lambda n: _same_shape(n, params_like, treedef))
