"""A relaxed averaging's state in checkpoints (docs/design.md, "Checkpoints and recovery"): the
int8 exchange's error-feedback residuals, DiLoCo's anchors and outer momenta, and, where the
replicas of a unit may differ (DiLoCo), every pipeline's own params and optimizer state, so that
a resumed relaxed run continues with the same math as the uninterrupted one.

Tensor names, beside a unit's ``params/``, ``opt/`` and ``unit/`` names (``names.py``):

* ``relax/<state>/<param path>``: pipeline 0's state, and a state equal on every replica
  (``SHARED``: DiLoCo's anchor and momentum), written once;
* ``pipelines/<i>/relax/<state>/<param path>``: pipeline i's own state (i >= 1; the int8
  residuals and the top-k residuals of ``relax.outer_compression``, one per pipeline);
* ``pipelines/<i>/params/...``, ``pipelines/<i>/opt/...``, ``pipelines/<i>/unit/...``: pipeline
  i's replica (i >= 1) where replicas may differ (``REPLICAS_DIFFER``).

Each state is one tree per unit shaped like the unit's params (``runtime.averaging``
``export_state``), so its names are by parameter path and follow the unit under any plan and
granularity. ``meta.json`` records ``averaging`` ``{"mode", "pipelines"}`` when such tensors are
present. A restoring plan with the same mode and pipeline count takes all of it back (pipeline
i's state to the new plan's pipeline i). With the same mode and another pipeline count the
shared state is taken back, the per-pipeline state is not (residuals start at zero, every
replica from pipeline 0's params and optimizer state), in one warning line; with another mode
none of it is (one warning line). A checkpoint without relaxed state (exact, or written before
it was saved) starts a relaxed plan's state afresh: zero residuals and momenta, anchors at the
restored params.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np
from absl import logging

from skyjax.checkpoint import store
from skyjax.checkpoint.manager import unit_like
from skyjax.checkpoint.names import key_path, rebuild, state_entries
from skyjax.runtime.averaging import local_stages
from skyjax.runtime.compressed import mode_name, state_class
from skyjax.runtime.placement import placements

RELAX, PIPELINES = "relax", "pipelines"
PREFIXES = (f"{RELAX}/", f"{PIPELINES}/")  # the names this module adds


def _prefix(pipeline: int) -> str:
    return f"{PIPELINES}/{int(pipeline)}/" if pipeline else ""


def _tree_entries(prefix: str, name: str, unit_path: Sequence[str], tree: Any) -> list:
    unit = key_path(unit_path)
    return [(f"{prefix}{RELAX}/{name}/{unit}/{key_path(p)}", x)
            for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _mode(plan: Any) -> str:
    """The plan's averaging state's name (``mode+compression`` where its exchange is in top-k:
    the residual is then part of it)."""
    if plan.num_pipelines < 2:
        return "exact"
    return mode_name(plan.averaging, getattr(plan, "outer_compression", "none"))


def meta(plan: Any) -> dict:
    """What ``meta.json`` records of a plan's relaxed state (``{}``: none)."""
    if state_class(_mode(plan)) is None:
        return {}
    return {"averaging": {"mode": _mode(plan), "pipelines": int(plan.num_pipelines)}}


def entries(executor: Any, chain: Sequence[Any]) -> list[tuple[str, Any]]:
    """``[(tensor name, array)]`` of the relaxed state this process's stages hold (module
    doc); ``chain``: the checkpoint's units (their paths)."""
    out: list = []
    for stage in local_stages(executor):
        avg, i = stage.averaging, stage.pipeline
        if avg is None:
            continue
        for name, trees in avg.export_state().items():
            shared = name in avg.SHARED
            if shared and i:
                continue
            for j, tree in enumerate(trees):
                out += _tree_entries("" if shared else _prefix(i), name,
                                     chain[stage.first_unit + j].path, tree)
        if i and avg.REPLICAS_DIFFER:
            for j, (p, o) in enumerate(zip(stage.state.params, stage.state.opt_state)):
                out += [(_prefix(i) + n, x)
                        for n, x in state_entries(chain[stage.first_unit + j].path, p, o)]
    return out


def expected(plan: Any, chain: Sequence[Any], optimizer: Any) -> dict[str, tuple]:
    """``{tensor name: ((shape, dtype name), unit name)}`` of the relaxed state every process
    together writes under ``plan`` (what a commit checks, beside every unit's state)."""
    cls = state_class(_mode(plan))
    if cls is None:
        return {}
    out = {}

    def add(pairs, unit):
        for n, x in pairs:
            out[n] = ((tuple(int(d) for d in x.shape), np.dtype(x.dtype).name), unit.name)

    for place in placements(plan):
        i = place.pipeline
        for u in place.units:
            unit = chain[u]
            params, opt = unit_like(unit, optimizer)
            for name in cls.STATE:
                if name in cls.SHARED and i:
                    continue
                add(_tree_entries("" if name in cls.SHARED else _prefix(i), name, unit.path,
                                  params), unit)
            if i and cls.REPLICAS_DIFFER:
                add([(_prefix(i) + n, x) for n, x in state_entries(unit.path, params, opt)], unit)
    return out


def restore(resume: Any, executor: Any, chain: Sequence[Any], optimizer: Any,
            unit_source: Callable[[tuple], Callable[[str], str]]) -> list[str]:
    """Puts the relaxed state of checkpoint ``resume`` into this process's stages of
    ``executor`` (built from the checkpoint's pipeline-0 unit states), as the module doc says;
    returns the names of the states restored. ``unit_source(unit path)``: the saved unit of a
    unit-level tensor (:func:`skyjax.checkpoint.restore.unit_source`)."""
    if resume is None:
        return []
    plan, step = executor.plan, resume.step
    mode, saved = _mode(plan), resume.meta.get("averaging")
    if saved is None:
        if state_class(mode) is not None:
            logging.info("checkpoint %d holds no averaging state: this plan's %s averaging "
                         "starts afresh", step, mode)
        return []
    if saved.get("mode") != mode:
        logging.warning("checkpoint %d: its %s averaging state is not used under this plan's "
                        "averaging %s (every replica starts from pipeline 0's params and "
                        "optimizer state)", step, saved.get("mode"), mode)
        return []
    same = int(saved.get("pipelines", 0)) == plan.num_pipelines
    if not same:
        cls = state_class(mode)
        own = [n for n in cls.STATE if n not in cls.SHARED]
        parts = ([f"restored: {', '.join(cls.SHARED)} (equal on every replica)"] * bool(cls.SHARED)
                 + [f"afresh: {', '.join(own)} (each pipeline's own)"] * bool(own)
                 + ["every replica from pipeline 0's params and optimizer state"]
                 * cls.REPLICAS_DIFFER)
        logging.warning("checkpoint %d was saved by %s pipelines, this plan has %d: %s", step,
                        saved.get("pipelines"), plan.num_pipelines, "; ".join(parts))
    index = store.TensorIndex(resume.path)

    from skyjax.checkpoint.restore import checked_reader

    read = checked_reader(index, resume.path)

    done = set()
    for stage in local_stages(executor):
        avg, i = stage.averaging, stage.pipeline
        if avg is None:
            continue
        units = [chain[stage.first_unit + j] for j in range(len(stage.state.params))]
        got = {}
        for name, trees in avg.export_state().items():
            shared = name in avg.SHARED
            if not (shared or same):
                continue
            pre = "" if shared else _prefix(i)
            got[name] = [jax.tree.unflatten(jax.tree.structure(tree), [
                read(n, x) for n, x in _tree_entries(pre, name, unit.path, tree)])
                for unit, tree in zip(units, trees)]
            done.add(name)
        avg.import_state(got)
        if i and avg.REPLICAS_DIFFER and same:
            pre = _prefix(i)
            states = [rebuild(tuple(u.path), unit_like(u, optimizer),
                              lambda n, like: read(pre + n, like), unit_source(tuple(u.path)))
                      for u in units]
            stage.state.params = jax.device_put([p for p, _ in states], stage.device)
            stage.state.opt_state = jax.device_put([o for _, o in states], stage.device)
            done.add("replicas")
    return sorted(done)
