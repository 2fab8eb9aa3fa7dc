"""Host memory that stays mapped: glibc's malloc told to keep what XLA's CPU buffers free.

Every pipeline action allocates its outputs and residuals (megabytes) and a later one frees them.
glibc serves large blocks with ``mmap`` above a threshold it moves as the program runs, and gives
the top of its heap back to the kernel above another; either way the next action's buffers come
from fresh pages, and each 4 KiB page costs a fault and zeroing. Which way a process goes
depends on its allocation history, so the same code runs in two modes, the one that faults
pages in 10–20 % slower. Fixing both thresholds (``mallopt``, as the
``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` environment variables do) keeps freed
memory for reuse: the process's resident size stays at its peak instead of shrinking, which a
training process reaches in its first step anyway.

:func:`keep_freed_memory` runs through :func:`skyjax.hostmodel.activate`, where the entry points
start under the shared-host model (``train.train_and_evaluate``, the profiler CLI);
``SKYJAX_KEEP_FREED_MEMORY=0`` leaves malloc as it is. Elsewhere than glibc it does nothing. No JAX import.
"""

from __future__ import annotations

import ctypes
import os

from skyjax import env_vars

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
THRESHOLD_BYTES = 1 << 30  # blocks below this come from the heap, which is never trimmed below it

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds at :data:`THRESHOLD_BYTES` (module doc), once per
    process; True where they are fixed (now or by an earlier call), False where this is not
    glibc or ``SKYJAX_KEEP_FREED_MEMORY`` is ``0``."""
    global _applied
    if _applied is not None:
        return _applied
    if os.environ.get(env_vars.KEEP_FREED_MEMORY, "1").strip() == "0":
        _applied = False
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl without it)
        _applied = False
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = bool(mallopt(_M_MMAP_THRESHOLD, THRESHOLD_BYTES)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, THRESHOLD_BYTES))
    return _applied
