"""A trained run's model, whole: its checkpoint's parameters gathered from every process file
into one tree, with the model's shape, its label names and the tokenizer it was trained with.

A checkpoint stores tensors by parameter path (``params/<path>``, :mod:`skyjax.checkpoint.names`),
one copy each whatever the plan, granularity, process count or number of pipelines (replicas
write pipeline 0's), so the whole model is read back by name from the files of any of them.
Parameters are float32 whatever ``config.train.compute_dtype`` was (bf16 runs keep float32
master weights, :mod:`skyjax.models.units`): the export is those master weights.

Where a relaxed averaging keeps replicas that differ (DiLoCo between outer steps), the
checkpoint also holds pipeline i's replica (``pipelines/<i>/params/<path>``) and the anchor,
the last outer step's model (``relax/anchor/<path>``; :mod:`skyjax.checkpoint.relaxed`). The
model is then their average (float32, summed in pipeline order, divided by their count: the
same bits every time), or one replica or the anchor when asked (``replica``); what was taken is
recorded (``TrainedModel.replica``, ``skyjax.json`` ``replica``) and said in one line
(:func:`replica_line`). Replicas that are equal bit for bit (exact and int8 averaging, whose
checkpoints hold one; DiLoCo just after an outer step) give pipeline 0's, unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

import ml_collections
import numpy as np

from skyjax import data as data_lib
from skyjax import failures
from skyjax.checkpoint import layout, restore, store
from skyjax.checkpoint.names import key_path
from skyjax.checkpoint.relaxed import PIPELINES, RELAX
from skyjax.config import defaults
from skyjax.data import glue, text
from skyjax.models.modeling import BertConfig

LABELS_FILE = "labels.json"
CONFIG_FILE = "config.json"
PARAMS = "params/"
AVERAGE, ANCHOR = "average", "anchor"  # the replica choices besides a pipeline's index


class ExportError(failures.BadInput):
    """A workdir, checkpoint, model directory or data file that cannot be exported or predicted
    from; the message names it (bad input: one line, exit 64)."""


class ReplicaChoiceError(ExportError):
    """A ``--replica`` the checkpoint does not offer; the message names the flag and the
    choices (the commands treat it as a usage error: one line, exit 2)."""


@dataclasses.dataclass
class TrainedModel:
    """A whole model: ``params`` is the tree of ``skyjax.models.units.model_params`` (numpy
    float32); ``config`` the run's config (None for a model directory not made by a run);
    ``task`` what the model reads (None: the synthetic task, token ids of its own)."""

    bert: BertConfig
    params: dict
    label_names: list[str] | None
    config: ml_collections.ConfigDict | None
    task: text.Task | None
    step: int | None = None
    checkpoint: str = ""
    hf_base: dict | None = None  # the pretrained config.json the run started from
    replica: dict | None = None  # which replica, where the checkpoint holds several (module doc)

    @property
    def regression(self) -> bool:
        return self.bert.num_labels == 1


# --------------------------------------------------------------------------------------------
# The run's config.

def _merge(into: ml_collections.ConfigDict, saved: dict, where: str) -> None:
    """``saved`` values over the schema's defaults; keys this skyjax does not know are skipped
    (a config of another version), lists become the tuples the schema has."""
    for key, value in saved.items():
        if key not in into:
            continue
        current = into[key]
        if isinstance(current, ml_collections.ConfigDict):
            if isinstance(value, dict):
                _merge(current, value, f"{where}.{key}")
            continue
        if isinstance(current, tuple) and isinstance(value, list):
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        try:
            into[key] = value
        except (TypeError, ValueError) as e:
            raise ExportError(f"{where}.{key}={value!r}: {e}") from None


def run_config(workdir: str) -> ml_collections.ConfigDict:
    """The config a run in ``workdir`` was trained with (its ``config.json``)."""
    if not os.path.isdir(workdir):
        raise ExportError(f"--workdir {workdir}: directory not found")
    path = os.path.join(workdir, CONFIG_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except FileNotFoundError:
        raise ExportError(f"{path}: not found (is {workdir} a skyjax run's workdir?)") from None
    except (OSError, ValueError) as e:
        raise ExportError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None
    config = defaults.base_config()
    _merge(config, saved, "config")
    return config


def run_task(config: ml_collections.ConfigDict) -> text.Task | None:
    """The text task of a run's config without reading its data (files may be gone): GLUE's
    table, or the configured columns; None for the synthetic task."""
    kind = data_lib.kind(config.data.name)
    if kind == "synthetic":
        return None
    if kind == "glue":
        return glue.task(config.data.name)
    return text.Task(tuple(config.data.text_columns), int(config.model.num_labels))


# --------------------------------------------------------------------------------------------
# The checkpoint.

def find_checkpoint(workdir: str, step: int | None = None) -> restore.Resume:
    """The latest checkpoint of ``workdir`` that verifies, or step ``step``'s (verified)."""
    directory = layout.checkpoints_dir(workdir)
    steps = layout.step_dirs(directory)
    if not steps:
        raise ExportError(f"{directory}: no checkpoint (train with --config.checkpoint.every=N: "
                          f"the run then saves every N steps and after its last)")
    if step is None:
        try:
            found = restore.find_resume(directory)
        except (ValueError, OSError) as e:
            raise ExportError(str(e)) from None
        assert found is not None  # steps exist: find_resume returns one or raises
        return found
    if step not in steps:
        raise ExportError(f"--step {step}: no checkpoint {step} in {directory} (it has steps "
                          f"{', '.join(map(str, steps))})")
    path = layout.step_dir(directory, step)
    try:
        meta = restore.verify(path, step)
    except ValueError as e:
        raise ExportError(f"checkpoint {step} does not verify: {e}") from None
    return restore.Resume(step, path, meta)


def _template(bert: BertConfig) -> dict:
    from flax import nnx

    from skyjax.models.modeling import BertForSequenceClassification
    from skyjax.models.units import model_params

    return model_params(nnx.eval_shape(lambda: BertForSequenceClassification(bert,
                                                                             nnx.Rngs(0))))


def _index(resume: restore.Resume) -> store.TensorIndex:
    try:
        return store.TensorIndex(resume.path)
    except Exception as e:  # noqa: BLE001 - an unverified (old) checkpoint's damaged file
        raise ExportError(f"checkpoint {resume.path} cannot be read: {type(e).__name__}: "
                          f"{e}") from None


def consolidate(resume: restore.Resume, bert: BertConfig, prefix: str = PARAMS,
                index: store.TensorIndex | None = None) -> dict:
    """Every parameter of the model ``bert`` read by name (``prefix`` + its path: pipeline 0's
    replica by default) from the checkpoint's process files; a tensor missing, of another
    shape, or belonging to no parameter is one line naming it."""
    import jax

    where = f"checkpoint {resume.path}"
    index = _index(resume) if index is None else index
    template = _template(bert)
    flat, treedef = jax.tree_util.tree_flatten_with_path(template)
    leaves, used = [], set()
    for path, like in flat:
        name = f"{prefix}{key_path(path)}"
        if name not in index:
            raise ExportError(f"{where}: tensor {name} is missing (another model shape than "
                              f"the workdir's config.json?)")
        x = index.read(name)
        if tuple(x.shape) != tuple(like.shape):
            raise ExportError(f"{where}: tensor {name} has shape {tuple(x.shape)}, the model "
                              f"{tuple(like.shape)}")
        leaves.append(np.asarray(x, np.float32))
        used.add(name)
    extra = sorted(n for n in index.names() if n.startswith(prefix) and n not in used)
    if extra:
        raise ExportError(f"{where}: tensor {extra[0]} belongs to no parameter of the model "
                          f"({len(extra)} such tensors; another model shape?)")
    return jax.tree.unflatten(treedef, leaves)


# --------------------------------------------------------------------------------------------
# Replicas (module doc).

def _replica_prefix(pipeline: int) -> str:
    return f"{PIPELINES}/{pipeline}/{PARAMS}" if pipeline else PARAMS


ANCHOR_PREFIX = f"{RELAX}/{ANCHOR}/"  # DiLoCo's anchor (runtime.averaging's state "anchor")


def held_replicas(resume: restore.Resume, index: store.TensorIndex) -> tuple[str, list[int], bool]:
    """``(averaging mode, pipelines whose replica the checkpoint holds, whether it holds an
    anchor)``: ``[0]`` for a checkpoint of equal replicas (exact, int8)."""
    mode = str((resume.meta.get("averaging") or {}).get("mode", "exact"))
    own = re.compile(rf"^{PIPELINES}/(\d+)/{PARAMS}")
    held = {0} | {int(m.group(1)) for m in map(own.match, index.names()) if m}
    anchor = any(n.startswith(ANCHOR_PREFIX) for n in index.names())
    return mode, sorted(held), anchor


def check_replica(replica: str | int, mode: str, held: list[int], anchor: bool,
                  step: int) -> str | int:
    """``replica`` (``average``, ``anchor``, or a pipeline's index, as an int or its digits)
    where the checkpoint offers it; else :class:`ReplicaChoiceError` naming the choices."""
    choices = ", ".join([AVERAGE, *map(str, held)] + [ANCHOR] * anchor)
    if isinstance(replica, str) and replica.strip().isdigit():
        replica = int(replica)
    if replica == ANCHOR and not anchor:
        raise ReplicaChoiceError(f"--replica {ANCHOR}: checkpoint {step} has no anchor (DiLoCo "
                                 f"averaging keeps one; this run's averaging is {mode}); choose "
                                 f"{choices}")
    if replica in (AVERAGE, ANCHOR) or (type(replica) is int and replica in held):
        return replica
    what = (f"{len(held)} replicas" if len(held) > 1
            else f"one replica ({mode} averaging keeps every pipeline's the same)")
    raise ReplicaChoiceError(f"--replica {replica}: checkpoint {step} holds {what}; choose "
                             f"{choices}")


def replicas_params(resume: restore.Resume, bert: BertConfig, replica: str | int = AVERAGE
                    ) -> tuple[dict, dict | None]:
    """``(parameters, record)``: the replica ``replica`` of the checkpoint's model (module
    doc); ``record`` (None where the checkpoint holds one replica and it was taken) says
    which: ``taken`` (``average``, ``anchor`` or the pipeline), ``averaging``, ``pipelines``
    and whether their parameters ``differ``."""
    import jax

    index = _index(resume)
    mode, held, anchor = held_replicas(resume, index)
    replica = check_replica(replica, mode, held, anchor, resume.step)
    first = consolidate(resume, bert, PARAMS, index)
    if len(held) == 1 and replica != ANCHOR:
        return first, None
    total, differ, chosen = jax.tree.map(np.copy, first), False, first
    for i in held[1:]:  # pipeline order: the same sum every time
        tree = consolidate(resume, bert, _replica_prefix(i), index)
        differ = differ or not all(jax.tree.leaves(jax.tree.map(np.array_equal, first, tree)))
        total = jax.tree.map(np.add, total, tree)
        chosen = tree if replica == i else chosen
    if replica == AVERAGE:
        n = np.float32(len(held))
        chosen = jax.tree.map(lambda x: (x / n).astype(np.float32), total) if differ else first
    elif replica == ANCHOR:
        chosen = consolidate(resume, bert, ANCHOR_PREFIX, index)
    record = {"taken": replica, "averaging": mode, "pipelines": len(held), "differ": differ}
    return chosen, record


def replica_line(record: dict | None, doing: str = "exporting") -> str | None:
    """The one line that says which replica a model is (None: the checkpoint held one)."""
    if record is None:
        return None
    taken, n = record["taken"], record["pipelines"]
    head = (f"replicas {'differ' if record['differ'] else 'identical'} ({n} pipelines, "
            f"{record['averaging']})")
    if taken == AVERAGE:
        return (f"{head}: {doing} their average; --replica N or anchor for one"
                if record["differ"] else f"{head}: {doing} them (pipeline 0's)")
    if taken == ANCHOR:
        return f"{head}: {doing} the anchor, the last outer step's model (--replica {ANCHOR})"
    return f"{head}: {doing} pipeline {taken}'s (--replica {taken}; the default is their average)"


def recorded_label_names(workdir: str, resume: restore.Resume, config: ml_collections.ConfigDict
                         ) -> list[str] | None:
    """The class names in id order a trained run recorded: the checkpoint's record, else
    ``labels.json``, else the GLUE task's (:data:`skyjax.data.glue.TASKS`); None for integer
    labels, a regression or the synthetic task."""
    if int(config.model.num_labels) == 1:
        return None
    if resume.meta.get("label_names"):
        return list(resume.meta["label_names"])
    path = os.path.join(workdir, LABELS_FILE)
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                return list(json.load(f)["label_names"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ExportError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None
    task = glue.TASKS.get(config.data.name)
    return list(task.label_names) if task is not None and task.label_names else None


def from_workdir(workdir: str, step: int | None = None, compute_dtype: str = "float32",
                 replica: str | int = AVERAGE) -> TrainedModel:
    """The model of the run in ``workdir`` at its latest verified checkpoint (or ``step``),
    computing in ``compute_dtype`` (the parameters stay float32); where the checkpoint holds
    replicas that differ, their average or ``replica`` (module doc)."""
    from skyjax.models import build, hf_config

    config = run_config(workdir)
    resume = find_checkpoint(workdir, step)
    try:
        bert = build.model_config(config.model, compute_dtype)
        base = hf_config.read(config.model.pretrained) if config.model.pretrained else None
    except ValueError as e:
        raise ExportError(f"{workdir}/{CONFIG_FILE}: {e}") from None
    params, record = replicas_params(resume, bert, replica)
    return TrainedModel(bert, params, recorded_label_names(workdir, resume, config),
                        config, run_task(config), resume.step, resume.path, base, record)
