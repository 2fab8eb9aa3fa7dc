"""A trained run's model, whole: its checkpoint's parameters gathered from every process file
into one tree, with the model's shape, its label names and the tokenizer it was trained with.

A checkpoint stores tensors by parameter path (``params/<path>``, :mod:`skyjax.checkpoint.names`),
one copy each whatever the plan, granularity, process count or number of pipelines (replicas
write pipeline 0's), so the whole model is read back by name from the files of any of them.
Parameters are float32 whatever ``config.train.compute_dtype`` was (bf16 runs keep float32
master weights, :mod:`skyjax.models.units`): the export is those master weights.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import ml_collections
import numpy as np

from skyjax import data as data_lib
from skyjax import failures
from skyjax.checkpoint import layout, restore, store
from skyjax.checkpoint.names import key_path
from skyjax.config import defaults
from skyjax.data import glue, text
from skyjax.models.modeling import BertConfig

LABELS_FILE = "labels.json"
CONFIG_FILE = "config.json"


class ExportError(failures.BadInput):
    """A workdir, checkpoint, model directory or data file that cannot be exported or predicted
    from; the message names it (bad input: one line, exit 64)."""


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


def consolidate(resume: restore.Resume, bert: BertConfig) -> dict:
    """Every parameter of the model ``bert`` read by name from the checkpoint's process files;
    a tensor missing, of another shape, or belonging to no parameter is one line naming it."""
    import jax

    where = f"checkpoint {resume.path}"
    try:
        index = store.TensorIndex(resume.path)
    except Exception as e:  # noqa: BLE001 - an unverified (old) checkpoint's damaged file
        raise ExportError(f"{where} cannot be read: {type(e).__name__}: {e}") from None
    template = _template(bert)
    flat, treedef = jax.tree_util.tree_flatten_with_path(template)
    leaves, used = [], set()
    for path, like in flat:
        name = f"params/{key_path(path)}"
        if name not in index:
            raise ExportError(f"{where}: tensor {name} is missing (another model shape than "
                              f"the workdir's config.json?)")
        x = index.read(name)
        if tuple(x.shape) != tuple(like.shape):
            raise ExportError(f"{where}: tensor {name} has shape {tuple(x.shape)}, the model "
                              f"{tuple(like.shape)}")
        leaves.append(np.asarray(x, np.float32))
        used.add(name)
    extra = sorted(n for n in index.names() if n.startswith("params/") and n not in used)
    if extra:
        raise ExportError(f"{where}: tensor {extra[0]} belongs to no parameter of the model "
                          f"({len(extra)} such tensors; another model shape?)")
    return jax.tree.unflatten(treedef, leaves)


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


def from_workdir(workdir: str, step: int | None = None, compute_dtype: str = "float32"
                 ) -> TrainedModel:
    """The model of the run in ``workdir`` at its latest verified checkpoint (or ``step``),
    computing in ``compute_dtype`` (the parameters stay float32)."""
    from skyjax.models import build, hf_config

    config = run_config(workdir)
    resume = find_checkpoint(workdir, step)
    try:
        bert = build.model_config(config.model, compute_dtype)
        base = hf_config.read(config.model.pretrained) if config.model.pretrained else None
    except ValueError as e:
        raise ExportError(f"{workdir}/{CONFIG_FILE}: {e}") from None
    return TrainedModel(bert, consolidate(resume, bert),
                        recorded_label_names(workdir, resume, config),
                        config, run_task(config), resume.step, resume.path, base)
