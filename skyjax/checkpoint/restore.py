"""Resuming: the latest committed checkpoint of a workdir, whether it fits this run, and the
states of the units this process owns under the current plan and granularity.

Any plan, schedule, granularity and number of devices or processes may restore any checkpoint of
the same model: tensors are found by their parameter path (``names.py``), each process reads only
its own units' tensors, from whichever process file holds them. A checkpoint of another run
(seed, dataset, model shape, optimizer) is refused before anything is written, naming the first
difference.

A checkpoint is verified before it is used (:func:`verify`): ``meta.json`` must exist, parse, match
its own checksum and record the step its directory is named after (a copied or renamed directory
would resume at the wrong step: wrong data position and schedule), and every file it lists must
match its size and CRC-32. One that fails, or cannot be read, is named in one warning line and
the latest earlier one that verifies is used instead; when checkpoint directories exist but none
verifies, the run is refused (starting afresh would overwrite them) unless
``config.checkpoint.replace``. A checkpoint written before checksums existed is accepted
unverified, with a line saying so.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Iterable, Sequence

import numpy as np
from absl import logging

from skyjax.checkpoint import layout, store
from skyjax.checkpoint.manager import UnitState, unit_like
from skyjax.checkpoint.names import key_path, rebuild, saved_name, state_entries, tied_names


class CheckpointMismatch(ValueError):
    """A checkpoint that does not belong to this run (the message names the first difference)."""


@dataclasses.dataclass
class Resume:
    """The checkpoint a run continues from: after ``step`` optimizer steps."""

    step: int
    path: str
    meta: dict

    @property
    def saved_units(self) -> list[tuple[str, ...]]:
        return [tuple(u["path"]) for u in self.meta["units"]]


def verify(path: str, step: int | None = None) -> dict:
    """``meta.json`` of the checkpoint directory ``path`` once its own checksum, its recorded
    ``step`` (when ``step``, the directory's, is given) and every file's size and CRC-32 check
    out; raises ``ValueError`` (``store.ChecksumError`` for a file that differs) naming what
    failed. A checkpoint without checksums (written by an older skyjax) is returned as it is,
    with ``meta["verified"] = False``."""
    if not os.path.isfile(os.path.join(path, layout.META)):
        raise ValueError(f"{path}/{layout.META} is missing")
    try:
        meta = layout.read_meta(path)
    except (OSError, ValueError, AttributeError) as e:  # truncated, not JSON, other format
        raise ValueError(f"{path}/{layout.META} cannot be read ({type(e).__name__}: {e})") from e
    if not isinstance(meta, dict) or not isinstance(meta.get("tensors"), dict) \
            or not isinstance(meta.get("units"), list):
        raise ValueError(f"{path}/{layout.META} lacks its tensors or units")
    if step is not None and meta.get("step") != step:
        raise ValueError(f"{path}/{layout.META} records step {meta.get('step')!r}, its directory "
                         f"is step {step} (copied or renamed?)")
    if "files" not in meta and "checksum" not in meta:
        meta["verified"] = False
        return meta
    if meta.get("checksum") != layout.meta_checksum(meta) \
            or not isinstance(meta.get("files"), dict):
        raise store.ChecksumError(f"{path}/{layout.META} does not match its checksum "
                                  "(corrupted)")
    store.verify_files(path, meta["files"])
    meta["verified"] = True
    return meta


def find_resume(directory: str, replace: bool = False) -> Resume | None:
    """The latest checkpoint under ``directory`` that verifies (None: there is none, start
    fresh). Each later one that fails is named in a warning line. When checkpoint directories
    exist but none verifies, :class:`CheckpointMismatch` names the directory and the latest
    (starting afresh would overwrite or prune them), unless ``replace`` (then a warning line,
    and None: the caller deletes them)."""
    layout.check_directory(directory)
    steps = layout.step_dirs(directory)
    failed = []
    for step in reversed(steps):
        path = layout.step_dir(directory, step)
        try:
            meta = verify(path, step)
        except ValueError as e:
            logging.warning("checkpoint %d skipped, it does not verify: %s", step, e)
            failed.append((step, e))
            continue
        if failed:
            logging.warning("resuming from checkpoint %d, the latest that verifies (skipped: "
                            "%s)", step, ", ".join(str(s) for s, _ in failed))
        if not meta["verified"]:
            logging.warning("checkpoint %d has no checksums (written by an older skyjax): "
                            "accepted unverified", step)
        return Resume(step, path, meta)
    if failed and replace:
        logging.warning("no checkpoint under %s verifies; config.checkpoint.replace: starting "
                        "afresh, replacing them", directory)
        return None
    if failed:
        step, e = failed[0]
        raise CheckpointMismatch(f"no checkpoint under {directory} verifies (latest, {step}: "
                                 f"{e}); move the directory aside, or set "
                                 f"--config.checkpoint.replace=True, to start afresh")
    return None


def unit_source(resume: Resume, unit_path: tuple[str, ...]):
    """Maps a unit-level tensor name of ``unit_path`` to the saved unit holding it: the same
    unit, or the saved unit that contains it / that it contains (another granularity)."""
    prefix = key_path(unit_path)
    related = [p for p in resume.saved_units
               if p[:len(unit_path)] == unit_path or unit_path[:len(p)] == p]

    def source(name: str) -> str:
        rest = name[len(f"unit/{prefix}/"):]
        for p in [unit_path] + related:
            candidate = f"unit/{key_path(p)}/{rest}"
            if candidate in resume.meta["tensors"]:
                return candidate
        return name  # reported as missing by the caller

    return source


def check_compatible(resume: Resume, run: dict, chain: Sequence[Any], optimizer: Any) -> None:
    """Raise :class:`CheckpointMismatch` naming the first difference between the checkpoint and
    this run: ``run`` keys (seed, dataset), then every unit's tensors (presence, shape, dtype),
    then tensors of the checkpoint that no unit of this model has."""
    where = f"checkpoint {resume.path}"
    for key, value in run.items():
        saved = resume.meta.get(key)
        if key in resume.meta and saved != value:
            raise CheckpointMismatch(f"{where} was written with {key}={saved!r}, this run has "
                                     f"{key}={value!r}; use another --workdir (or remove "
                                     f"{layout.CHECKPOINTS}/) to start afresh")
    saved = resume.meta["tensors"]
    used, tied = set(), tied_names(chain)
    for unit in chain:
        source = unit_source(resume, tuple(unit.path))
        for name, leaf in state_entries(unit.path, *unit_like(unit, optimizer)):
            name = source(name) if name.startswith("unit/") else saved_name(name, tied)
            used.add(name)
            want = [list(int(d) for d in leaf.shape), np.dtype(leaf.dtype).name]
            if name not in saved:
                raise CheckpointMismatch(f"{where}: unit {unit.name}: tensor {name} is not in "
                                         f"the checkpoint (another model or optimizer?)")
            if list(saved[name][0]) != want[0] or saved[name][1] != want[1]:
                raise CheckpointMismatch(
                    f"{where}: unit {unit.name}: tensor {name} has shape {tuple(saved[name][0])} "
                    f"{saved[name][1]} in the checkpoint, {tuple(want[0])} {want[1]} in this model")
    # a relaxed averaging's state (relaxed.PREFIXES) is checked where it is read
    unused = sorted((n for n in saved if n not in used
                     and not n.startswith(("unit/", "relax/", "pipelines/"))),
                    key=lambda n: (not n.startswith("params/"), n))
    if unused:
        raise CheckpointMismatch(f"{where}: tensor {unused[0]} belongs to no unit of this model "
                                 f"({len(unused)} such tensors; another model shape?)")


def checked_reader(index: Any, path: str) -> Callable[[str, Any], np.ndarray]:
    """``read(name, like)``: tensor ``name`` of the checkpoint at ``path``, refused by name when
    it is missing or its shape or dtype is not ``like``'s."""

    def read(name: str, like: Any) -> np.ndarray:
        if name not in index:
            raise CheckpointMismatch(f"checkpoint {path}: tensor {name} is missing")
        x = index.read(name)
        if tuple(x.shape) != tuple(like.shape) or x.dtype != np.dtype(like.dtype):
            raise CheckpointMismatch(f"checkpoint {path}: tensor {name} has "
                                     f"{x.shape} {x.dtype}, expected {like.shape} {like.dtype}")
        return x

    return read


def restore_units(resume: Resume, chain: Sequence[Any], units: Iterable[int],
                  optimizer: Any) -> dict[int, UnitState]:
    """The (params, optimizer state) of ``units`` (indices into ``chain``), as numpy arrays."""
    try:
        index = store.TensorIndex(resume.path)
    except Exception as e:  # noqa: BLE001 - an unverified (old) checkpoint's truncated file
        raise CheckpointMismatch(f"checkpoint {resume.path} cannot be read: "
                                 f"{type(e).__name__}: {e}") from e

    checked, tied = checked_reader(index, resume.path), tied_names(chain)

    def read(name: str, like: Any) -> np.ndarray:  # a tied tensor's second copy: the first
        return checked(saved_name(name, tied), like)

    return {u: rebuild(tuple(chain[u].path), unit_like(chain[u], optimizer), read,
                       unit_source(resume, tuple(chain[u].path))) for u in units}
