"""skyjax.hostmodel.malloc: freed host memory is kept for reuse, so buffers allocated again and again
(a pipeline's residuals, every action) stop faulting in fresh pages."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_CYCLES = r"""
import ctypes, json, sys
from skyjax.hostmodel.malloc import keep_freed_memory
applied = keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 64 << 20  # above glibc's largest dynamic mmap threshold (32 MiB): mmapped by default

def faults():
    return int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[7])

counts = []
for _ in range(4):
    before = faults()
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)  # touch every page, as a computation writing its output does
    libc.free(p)
    counts.append(faults() - before)
print(json.dumps({"applied": applied, "faults": counts}))
"""


def _run(env_value: str | None) -> dict:
    import json

    env = dict(os.environ)
    env.pop("SKYJAX_KEEP_FREED_MEMORY", None)
    if env_value is not None:
        env["SKYJAX_KEEP_FREED_MEMORY"] = env_value
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", _CYCLES], env=env, cwd=root, timeout=120,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and /proc")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    pages = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    kept = _run(None)
    assert kept["applied"]
    # the first cycle faults the block in; after that it is reused (a few stray pages at most)
    assert kept["faults"][0] > pages // 2 and max(kept["faults"][1:]) < pages // 20, kept
    left = _run("0")  # SKYJAX_KEEP_FREED_MEMORY=0: glibc's default, every cycle faults again
    assert not left["applied"]
    assert min(left["faults"][1:]) > pages // 2, left
