"""A whole model as a Hugging Face directory: ``config.json``, ``model.safetensors``, the
tokenizer files, and ``skyjax.json`` (what predictions need besides the model: text columns,
sequence length, where it came from).

Tensor names are Hugging Face's ``BertForSequenceClassification`` names (``bert.`` + the encoder,
``classifier.``): the inverse of :func:`skyjax.models.hf_loading.hf_to_path`, which loading uses,
checked name by name, so a model started from a hub checkpoint goes back under the names it came
with and ``AutoModelForSequenceClassification.from_pretrained`` finds every weight it expects and
none it does not. The directory is written under a temporary name and renamed into place: a
failed export leaves nothing that looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import numpy as np

from skyjax.export.trained import AVERAGE, ExportError, TrainedModel, from_workdir, replica_line
from skyjax.models.hf_loading import hf_to_path

SKYJAX_FILE = "skyjax.json"
SKYJAX_FORMAT = 1

_LEAF = {"kernel": "weight", "scale": "weight", "bias": "bias", "embedding": "weight"}
_PARTS = {("attention", "self_attention", "query"): "attention.self.query",
          ("attention", "self_attention", "key"): "attention.self.key",
          ("attention", "self_attention", "value"): "attention.self.value",
          ("attention", "output", "dense"): "attention.output.dense",
          ("attention", "output", "LayerNorm"): "attention.output.LayerNorm",
          ("intermediate", "dense"): "intermediate.dense",
          ("output", "dense"): "output.dense",
          ("output", "LayerNorm"): "output.LayerNorm"}


def hf_name(path: tuple) -> tuple[str, bool]:
    """``(Hugging Face tensor name, transpose)`` of a parameter path of ``model_params``; the
    exact inverse of ``hf_to_path`` (asserted)."""
    *module, leaf = path
    if module[0] == "embeddings":
        name = f"bert.embeddings.{'.'.join(module[1:])}.{_LEAF[leaf]}"
    elif module[0] == "layers":
        name = f"bert.encoder.layer.{int(module[1])}.{_PARTS[tuple(module[2:])]}.{_LEAF[leaf]}"
    elif module[:2] == ["head", "pooler"]:
        name = f"bert.pooler.dense.{_LEAF[leaf]}"
    elif module[:2] == ["head", "classifier"]:
        name = f"classifier.{_LEAF[leaf]}"
    else:
        raise ValueError(f"parameter {'/'.join(map(str, path))} has no Hugging Face name")
    transpose = leaf == "kernel"
    back = hf_to_path(name)
    if back != (tuple(path), transpose):
        raise AssertionError(f"{name}: maps back to {back}, not {(tuple(path), transpose)}")
    return name, transpose


def hf_tensors(params: dict) -> dict[str, np.ndarray]:
    """Every parameter under its Hugging Face name, as PyTorch lays it out (``nn.Linear``
    weights are [out, in]: the transpose of a Flax kernel)."""
    import jax

    out = {}
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = tuple(getattr(k, "key", k) for k in path)
        name, transpose = hf_name(keys)
        x = np.asarray(x, np.float32)
        out[name] = np.ascontiguousarray(x.T if transpose else x)
    return out


def id2label(model: TrainedModel) -> dict[str, str]:
    names = model.label_names or [f"LABEL_{i}" for i in range(model.bert.num_labels)]
    return {str(i): n for i, n in enumerate(names)}


def hf_config_json(model: TrainedModel) -> dict[str, Any]:
    """``config.json``: the pretrained ``config.json`` the run started from (its keys kept),
    the model's shape over it, and the head: ``num_labels``, ``id2label`` / ``label2id``,
    ``problem_type``."""
    out = dict(model.hf_base or {})
    out.update(model.bert.to_hf())
    labels = id2label(model)
    out.update(architectures=["BertForSequenceClassification"], model_type="bert",
               num_labels=model.bert.num_labels, id2label=labels,
               label2id={n: int(i) for i, n in labels.items()},
               problem_type=("regression" if model.regression
                             else "single_label_classification"),
               dtype="float32")
    out.pop("torch_dtype", None)  # the older name of "dtype"
    return out


def skyjax_json(model: TrainedModel) -> dict[str, Any]:
    """What :mod:`skyjax.export.inference` reads besides the model: the text columns and sequence
    length the model was trained on, its label names, the run and step it came from, and,
    where the checkpoint held several replicas, which one it is (``replica``:
    :func:`skyjax.export.trained.replicas_params`)."""
    c = model.config
    out: dict[str, Any] = {"format": SKYJAX_FORMAT, "label_names": model.label_names,
                           "regression": model.regression}
    if model.task is not None:
        out["text_columns"] = list(model.task.text)
    if c is not None:
        out.update(dataset=str(c.data.name), seq_len=int(c.data.seq_len),
                   compute_dtype=str(c.train.compute_dtype), step=model.step,
                   checkpoint=os.path.abspath(model.checkpoint))
    if model.replica is not None:  # the checkpoint held several replicas: which one this is
        out["replica"] = model.replica
    return out


def check_out(out: str) -> None:
    """``--out`` must be new (or an empty directory) in a directory that exists."""
    if os.path.isdir(out) and os.listdir(out):
        raise ExportError(f"--out {out}: the directory exists and is not empty; remove it or "
                          f"name a new one")
    if os.path.lexists(out) and not os.path.isdir(out):
        raise ExportError(f"--out {out}: exists and is not a directory")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise ExportError(f"--out {out}: directory {parent} does not exist")


def save_tokenizer(model: TrainedModel, directory: str) -> str | None:
    """The run's tokenizer, loaded as training loads it (``data.text.load_tokenizer``) and saved
    with ``save_pretrained``; returns where it came from (None: the synthetic task has none)."""
    if model.task is None or model.config is None:
        return None
    from skyjax.data import text

    try:
        tokenizer = text.load_tokenizer(model.config, model.task)
    except ValueError as e:
        raise ExportError(f"the run's tokenizer: {e}") from None
    tokenizer.save_pretrained(directory)
    return text.tokenizer_dir(model.config)[1]


def write(model: TrainedModel, out: str) -> dict[str, Any]:
    """Writes the Hugging Face directory ``out``; returns what was written (for the log)."""
    from safetensors.numpy import save

    check_out(out)
    tmp = f"{os.path.abspath(out).rstrip(os.sep)}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        tensors = hf_tensors(model.params)
        with open(os.path.join(tmp, "model.safetensors"), "wb") as f:  # (the umask's mode)
            f.write(save(tensors, metadata={"format": "pt"}))
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(hf_config_json(model), f, indent=2, sort_keys=True)
            f.write("\n")
        tokenizer = save_tokenizer(model, tmp)
        with open(os.path.join(tmp, SKYJAX_FILE), "w", encoding="utf-8") as f:
            json.dump(skyjax_json(model), f, indent=2)
            f.write("\n")
        if os.path.isdir(out):
            os.rmdir(out)  # empty (check_out): the rename takes its place
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out": out, "tensors": len(tensors),
            "parameters": int(sum(x.size for x in tensors.values())), "tokenizer": tokenizer}


def export_run(workdir: str, out: str, step: int | None = None,
               replica: str | int = AVERAGE) -> list[str]:
    """A run's checkpoint (its latest that verifies, or ``step``) written as the Hugging Face
    directory ``out``; where the checkpoint holds replicas, their average or ``replica``;
    returns what was written, one line each (for the log)."""
    check_out(out)  # before the checkpoint is read
    model = from_workdir(workdir, step, replica=replica)
    done = write(model, out)
    which = replica_line(model.replica)
    return [f"step {model.step} of {workdir} -> {out}: {done['tensors']} tensors, "
            f"{done['parameters']:,} parameters, {model.bert.num_labels} label(s)"
            + ("" if model.regression else f" ({', '.join(id2label(model).values())})"),
            *([which] if which else []),
            (f"tokenizer from {done['tokenizer']}" if done["tokenizer"]
             else "no tokenizer: the synthetic task's token ids are its own")]
