"""Host memory per process: what a pipeline process holds, so a run shows each process keeping
about its share of the model (``summary.json`` ``memory``).

Peak resident set size comes from ``getrusage`` (the kernel's high-water mark over the process's
life, including JAX's own runtime), the training state (parameters + optimizer state) of a set of
units from their shapes, and a relaxed averaging's state (int8 residuals, DiLoCo's anchors and
outer momenta: ``runtime.averaging``) from what this process's stages hold.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from typing import Any, Iterable, Sequence

import jax
import optax

from skyjax.tree import tree_nbytes


def current_rss_bytes() -> int:
    """Resident set size now (``/proc/self/statm``; the peak where that file does not exist)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def state_bytes(chain: Sequence[Any], indices: Iterable[int],
                optimizer: optax.GradientTransformation) -> int:
    """Bytes of parameters plus optimizer state of the units ``indices`` (from shapes only)."""
    total = 0
    for i in indices:
        params = chain[i].params
        total += tree_nbytes(params) + tree_nbytes(jax.eval_shape(optimizer.init, [params]))
    return total


def averaging_bytes(executor: Any) -> int:
    """Bytes of the relaxed averaging state this process's stages hold (0: exact): what a
    checkpoint saves, and what the peer modes hold beside it (``held_bytes``)."""
    from skyjax.runtime.averaging import local_stages

    return sum(tree_nbytes(s.averaging.export_state())
               + (s.averaging.held_bytes() if hasattr(s.averaging, "held_bytes") else 0)
               for s in local_stages(executor) if s.averaging is not None)


def gather_to_chief(record: dict, key: str, timeout_s: float = 600.0) -> list[dict] | None:
    """Every process's JSON-able ``record`` on process 0 (in process order), through the
    coordination service's key-value store under ``key``; None on the other processes."""
    if jax.process_count() == 1:
        return [record]
    from skyjax.transport.group import key_value_client

    client = key_value_client()
    me = jax.process_index()
    client.key_value_set(f"{key}/{me}", json.dumps(record))
    if me != 0:
        return None
    from skyjax.transport.group import gone_processes

    gone = gone_processes()
    return [json.loads(client.blocking_key_value_get(f"{key}/{p}", int(timeout_s * 1000)))
            for p in range(jax.process_count()) if p not in gone]


def run_report(optimizer: optax.GradientTransformation, chain: Sequence[Any], mine: list[int],
               rss_start: int, averaging: int = 0) -> dict | None:
    """Peak host RSS and training-state bytes of every process (``mine``: this process's
    units; ``averaging``: its relaxed averaging's bytes, :func:`averaging_bytes`), against the
    whole model's training state (``summary.json`` ``memory``); None on processes other than
    0."""
    record = {"process": jax.process_index(), "units": [min(mine), max(mine) + 1] if mine else [],
              "state_bytes": state_bytes(chain, mine, optimizer),
              "averaging_state_bytes": int(averaging),
              "rss_start_bytes": rss_start, "peak_rss_bytes": peak_rss_bytes()}
    processes = gather_to_chief(record, "skyjax/memory")
    if processes is None:
        return None
    return {"model_state_bytes": state_bytes(chain, range(len(chain)), optimizer),
            "processes": processes}
