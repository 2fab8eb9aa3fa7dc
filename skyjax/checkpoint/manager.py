"""Saving the units of a run every ``config.checkpoint.every`` steps, from every process at once,
and committing a step only when every unit is on disk (docs/design.md, "Checkpoints").

Each process writes the units it owns (``executor.unit_states()``) into
``checkpoints/<step>.partial-<attempt>/process_<k>.safetensors`` and reports through the
key-value store; process 0 waits for every process (a bounded wait: a lost peer raises
``PeerLost``), opens every file, checks that the tensors present are exactly the tensors of
every unit of the model with the right shapes and dtypes, and only then writes ``meta.json`` and
renames the directory to ``<step>`` (``layout.commit``). Nothing is ever silently missing: a unit
that no process wrote fails the save, by name, and the step is not committed.

A state holding NaN or inf is never written (:class:`~skyjax.guard.NonFiniteError`); ``meta.json``
records every file's size and CRC-32 (the tensor files' from their processes' manifests) and its
own checksum, which a restore verifies. Pruning runs only after the new step is committed, and
never touches it or the ``keep - 1`` committed steps before it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np
from absl import logging

from skyjax.checkpoint import layout, store
from skyjax.checkpoint.names import saved_name, state_entries, tied_names
from skyjax.guard import NonFiniteError
from skyjax.models.hf_loading import CheckpointError  # also a save that cannot be committed

UnitState = tuple[Any, Any]


def unit_like(unit: Any, optimizer: Any) -> tuple[Any, Any]:
    """ShapeDtypeStructs of a unit's (params, optimizer state); nothing is allocated."""
    params = jax.eval_shape(lambda p=unit.params: p)
    return params, (jax.eval_shape(optimizer.init, params) if optimizer is not None else None)


def expected_tensors(chain: Sequence[Any], optimizer: Any) -> dict[str, tuple]:
    """``{tensor name: ((shape, dtype name), unit name)}`` of every unit's state: what a
    checkpoint of this model and optimizer holds."""
    out, tied = {}, tied_names(chain)
    for unit in chain:
        for name, leaf in state_entries(unit.path, *unit_like(unit, optimizer)):
            if saved_name(name, tied) == name:  # a tied tensor's second copy is not saved
                out[name] = ((tuple(int(d) for d in leaf.shape), np.dtype(leaf.dtype).name),
                             unit.name)
    return out


class CheckpointManager:
    """Saves every ``every`` steps (0 = never) into ``directory``, keeping the last ``keep``.

    ``chain``: the model's units (arrays or shapes); ``run``: what identifies the run in
    ``meta.json`` (seed, dataset, granularity, ...). Distributed: ``client`` is the key-value
    client and ``kv_get(key, timeout_s, what)`` a bounded wait; every process constructs the
    manager at the same point (process 0 removes earlier attempts' half-written directories and
    publishes this attempt's name).
    """

    def __init__(self, directory: str, every: int, keep: int, chain: Sequence[Any],
                 optimizer: Any, run: dict, *, process_index: int = 0, num_processes: int = 1,
                 client: Any = None, kv_get: Callable[..., Any] | None = None,
                 timeout_s: float = 600.0, namespace: str = "skyjax/ckpt",
                 total_steps: int | None = None):
        self.directory, self.every, self.keep = directory, int(every), int(keep)
        self.chain = list(chain)
        self.optimizer = optimizer
        self.run = dict(run)
        self.me, self.n = process_index, num_processes
        self.client, self.kv_get, self.timeout_s = client, kv_get, timeout_s
        self.ns = namespace
        self.total_steps = total_steps
        self.saves: list[dict] = []
        self._expected: dict[str, tuple] | None = None
        if self.every <= 0:
            self.attempt = ""
            return
        if self.me == 0:
            os.makedirs(directory, exist_ok=True)
            self.attempt = np.base_repr(int(time.time() * 1e6) ^ os.getpid(), 36).lower()
            removed = layout.remove_stale(directory, self.attempt)
            if removed:
                logging.info("checkpoint: removed half-written %s", removed)
            if self.n > 1:
                self.client.key_value_set(f"{self.ns}/attempt", self.attempt)
        else:
            self.attempt = self.kv_get(f"{self.ns}/attempt", self.timeout_s,
                                       f"process {self.me}: checkpoint attempt from process 0")

    def due(self, steps_done: int) -> bool:
        """Whether to save after ``steps_done`` steps: every ``every`` steps and after the last
        of ``total_steps`` (the fine-tuned model, and the start of a longer rerun)."""
        if self.every <= 0 or steps_done <= 0:
            return False
        return steps_done % self.every == 0 or steps_done == self.total_steps

    def save(self, step: int, unit_states: dict[int, UnitState],
             extra_meta: dict | None = None, extra: Sequence[tuple[str, Any]] = (),
             extra_expected: dict[str, tuple] | None = None) -> dict | None:
        """Writes this process's ``unit_states`` (by unit index) and ``extra`` tensors
        (``[(name, array)]``: a relaxed averaging's state, ``relaxed.entries``) as checkpoint
        ``step``; returns the commit record (process 0) after every process has written. The
        commit also requires every tensor of ``extra_expected`` (``relaxed.expected``: what all
        processes' ``extra`` together hold). Raises :class:`CheckpointError` if the step cannot
        be committed."""
        tic = time.perf_counter()
        partial = layout.partial_dir(self.directory, step, self.attempt)
        os.makedirs(partial, exist_ok=True)
        error = ""
        try:
            host, more = jax.device_get(({u: unit_states[u] for u in sorted(unit_states)},
                                         list(extra)))
            tied = tied_names(self.chain)  # a tied tensor once: its first copy
            entries = [e for u, (p, o) in host.items()
                       for e in state_entries(self.chain[u].path, p, o)
                       if saved_name(e[0], tied) == e[0]] + more
            bad = store.non_finite(entries)
            if bad is not None:
                raise NonFiniteError(f"tensor {bad[0]} holds {bad[1]} NaN or infinite values "
                                     f"(training diverged); the step is not checkpointed")
            if entries:
                store.write_tensors(partial, self.me, entries,
                                    [self.chain[u].name for u in host])
        except Exception as e:  # noqa: BLE001 - reported to process 0, then raised
            error = f"process {self.me}: {type(e).__name__}: {e}"
            if self.n == 1:
                if isinstance(e, NonFiniteError):
                    raise NonFiniteError(f"checkpoint {step}: {e}") from e
                raise CheckpointError(f"checkpoint {step}: {error}") from e
        wrote_s = time.perf_counter() - tic
        key = f"{self.ns}/{self.attempt}/{step}"
        if self.n > 1:
            self.client.key_value_set(f"{key}/done/{self.me}", error or "ok")
        if self.me != 0:
            result = self.kv_get(f"{key}/result", self.timeout_s,
                                 f"process {self.me}: commit of checkpoint {step} by process 0")
            if error or result != "ok":
                raise CheckpointError(f"checkpoint {step} not committed: {error or result}")
            return None
        try:
            record = self._commit(step, partial, key, extra_meta or {}, extra_expected or {})
        except Exception as e:
            if self.n > 1:
                self.client.key_value_set(f"{key}/result", f"{type(e).__name__}: {e}")
            raise
        if self.n > 1:
            self.client.key_value_set(f"{key}/result", "ok")
        record.update(write_s=wrote_s, save_s=time.perf_counter() - tic)
        self.saves.append(record)
        logging.info("checkpoint %d committed: %d tensors, %.1f MB in %.2f s (%s)", step,
                     record["tensors"], record["bytes"] / 1e6, record["save_s"], record["path"])
        return record

    def _commit(self, step: int, partial: str, key: str, extra_meta: dict,
                extra_expected: dict[str, tuple]) -> dict:
        errors = []
        from skyjax.transport.group import gone_processes

        gone = gone_processes()  # lost processes the run went on without (runtime.recovery)
        for k in range(1, self.n):
            if k in gone:
                continue
            status = self.kv_get(f"{key}/done/{k}", self.timeout_s,
                                 f"process 0: waiting for process {k} to write checkpoint {step}")
            if status != "ok":
                errors.append(status)
        if errors:
            raise CheckpointError(f"checkpoint {step} not committed: {'; '.join(errors)}")
        index = store.TensorIndex(partial)
        self._check_complete(step, index, extra_expected)
        files = self._file_checksums(step, partial)
        meta = {"format": layout.FORMAT_VERSION, "step": int(step), "data_position": int(step),
                **self.run, "processes": self.n,
                "units": [{"name": u.name, "path": list(u.path)} for u in self.chain],
                "tensors": {k: [list(s), d] for k, s, d in
                            ((k, *index.shapes[k]) for k in sorted(index.shapes))},
                "time": time.time(), **extra_meta, "files": files}
        meta["checksum"] = layout.meta_checksum(meta)
        path = layout.commit(self.directory, step, partial, meta)
        deleted = layout.prune(self.directory, self.keep, newest=step)
        nbytes = sum(int(np.prod(s)) * store.numpy_dtype(d).itemsize
                     for s, d in index.shapes.values())
        return {"step": int(step), "path": path, "tensors": len(index.shapes), "bytes": nbytes,
                "pruned": deleted}

    def _file_checksums(self, step: int, partial: str) -> dict[str, dict]:
        """``{file name: {"size", "crc32"}}`` of every file of ``partial``: each tensor file's
        from its process's manifest (checked against the file's size on disk), each
        manifest's computed here."""
        files = {}
        for name in sorted(os.listdir(partial)):
            path = os.path.join(partial, name)
            if not (name.startswith("process_") and name.endswith(".json")):
                continue
            with open(path, "rb") as f:
                data = f.read()
            files[name] = {"size": len(data), store.CHECKSUM: store.checksum(data)}
            tensors = name[:-len(".json")] + ".safetensors"
            record = json.loads(data).get("file")
            if record is None or not os.path.isfile(os.path.join(partial, tensors)):
                raise CheckpointError(f"checkpoint {step} not committed: {path} names no "
                                      f"checksummed tensor file")
            size = os.path.getsize(os.path.join(partial, tensors))
            if size != record["size"]:
                raise CheckpointError(f"checkpoint {step} not committed: {tensors} has {size} "
                                      f"bytes, its process wrote {record['size']}")
            files[tensors] = dict(record)
        stray = sorted(n for n in os.listdir(partial)
                       if n.endswith(".safetensors") and n not in files)
        if stray:
            raise CheckpointError(f"checkpoint {step} not committed: {stray[0]} has no manifest")
        return files

    def _check_complete(self, step: int, index: store.TensorIndex,
                        extra_expected: dict[str, tuple]) -> None:
        """Every tensor of every unit (and of ``extra_expected``), with its shape and dtype, and
        nothing else."""
        if self._expected is None:
            self._expected = expected_tensors(self.chain, self.optimizer)
        expected = {**self._expected, **extra_expected}
        for name, (want, unit) in expected.items():
            if name not in index:
                raise CheckpointError(f"checkpoint {step} not committed: unit {unit}: tensor "
                                      f"{name} was written by no process")
            if index.shapes[name] != want:
                raise CheckpointError(f"checkpoint {step} not committed: unit {unit}: tensor "
                                      f"{name} has (shape, dtype) {index.shapes[name]}, "
                                      f"expected {want}")
        extra = sorted(set(index.names()) - set(expected))
        if extra:
            raise CheckpointError(f"checkpoint {step} not committed: unexpected tensor "
                                  f"{extra[0]} ({len(extra)} in all)")

