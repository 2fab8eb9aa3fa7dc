"""How fast a stage hand-off moves between two processes: GB/s per message size.

:func:`measure_handoff_gbps` starts two local processes under ``jax.distributed`` (a loopback
coordinator), each with a :class:`TransferServerTransport` exactly as a distributed run builds it,
and ping-pongs one float32 array of each size: process 0 sends, process 1 receives it and sends
it back. One hand-off = round trip / 2 (the two directions cost the same); GB/s = bytes / the
median hand-off. Both processes share this host, so the path measured is the transfer server's
(device -> host staging -> socket -> host -> device) over loopback, not a network. The command is
``python -m skyjax.transport.handoff_speed`` (:mod:`skyjax.cli.handoff_speed`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Mapping, Sequence

from skyjax import env_vars
from skyjax.cluster import network

DEFAULT_SIZES = (1 << 20, 16 << 20, 64 << 20)
_RESULT = "HANDOFF "  # the line process 0 prints its results on
# each of the two processes: this module's worker, the spec as its one argument
_WORKER = ("import json, sys; from skyjax.transport.handoff_timing import worker; "
           "worker(json.loads(sys.argv[1]))")
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def measure_handoff_gbps(sizes_bytes: Sequence[int] = DEFAULT_SIZES, repeats: int = 5, *,
                         platform: str = "cpu", chunk_bytes: int | None = None,
                         parallel_copies: int | None = None, ports: str = "",
                         env: Mapping[str, str] | None = None,
                         timeout_s: float = 300.0) -> dict[int, float]:
    """{size in bytes: median hand-off GB/s} between two fresh local processes.

    ``sizes_bytes``: multiples of 4 (float32 arrays); ``repeats``: timed round trips per size
    (after one untimed); ``platform``: ``JAX_PLATFORMS`` of the children ("cpu", "cuda": both
    processes then share GPU 0 unless ``env`` says otherwise); ``chunk_bytes`` /
    ``parallel_copies``: the transfer server's buffers (default: :class:`ServerOptions`');
    ``ports``: a port range for the servers ("" = any). ``RuntimeError`` with the children's
    output when they fail or outlast ``timeout_s``.
    """
    sizes = [int(s) for s in sizes_bytes]
    if not sizes or any(s <= 0 or s % 4 for s in sizes) or repeats < 1:
        raise ValueError(f"sizes_bytes={sizes} must be positive multiples of 4 and "
                         f"repeats={repeats} >= 1")
    spec = {"sizes": sizes, "repeats": int(repeats), "chunk_bytes": chunk_bytes,
            "parallel_copies": parallel_copies, "ports": ports}
    coordinator = f"127.0.0.1:{network.free_port()}"
    base = dict(os.environ)
    base.update({"JAX_PLATFORMS": platform, "XLA_FLAGS": "",
                 "XLA_PYTHON_CLIENT_PREALLOCATE": "false",  # two processes may share a GPU
                 "PYTHONPATH": os.pathsep.join(filter(None, [_REPO, base.get("PYTHONPATH")])),
                 env_vars.COORDINATOR: coordinator, env_vars.NUM_PROCESSES: "2"})
    base.update(env or {})
    logs = [tempfile.TemporaryFile() for _ in range(2)]
    procs = [subprocess.Popen(
        [sys.executable, "-c", _WORKER, json.dumps(spec)],
        env={**base, env_vars.PROCESS_ID: str(k)}, stdout=logs[k], stderr=subprocess.STDOUT)
        for k in range(2)]
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    texts = []
    for f in logs:
        f.seek(0)
        texts.append(f.read().decode(errors="replace"))
        f.close()
    lines = [ln for ln in texts[0].splitlines() if ln.startswith(_RESULT)]
    if any(p.returncode != 0 for p in procs) or not lines:
        tails = "\n".join(f"--- process {k} (exit {p.returncode}):\n{texts[k][-3000:]}"
                          for k, p in enumerate(procs))
        raise RuntimeError(f"hand-off measurement failed (timeout {timeout_s:g} s):\n{tails}")
    return {int(k): float(v) for k, v in json.loads(lines[-1][len(_RESULT):]).items()}


def worker(spec: dict) -> None:
    """One of the two processes: ping-pong every size, process 0 reports."""
    import jax
    import numpy as np

    from skyjax.transport import group, server as server_lib
    from skyjax.transport.transfer import TransferServerTransport

    info = group.initialize(timeout_s=120)
    me = info.process_id
    defaults = server_lib.ServerOptions()
    options = server_lib.ServerOptions(
        ports=spec["ports"], chunk_bytes=spec["chunk_bytes"] or defaults.chunk_bytes,
        parallel_copies=spec["parallel_copies"] or defaults.parallel_copies)
    device = jax.local_devices()[0]
    t = TransferServerTransport(me, 2, device, server=options, namespace="handoff",
                                timeout_s=120)
    out = {}
    for size in spec["sizes"]:
        x = jax.device_put(np.ones((size // 4,), np.float32), device)
        like = {"x": jax.ShapeDtypeStruct(x.shape, x.dtype)}
        t.barrier(size)
        times = []
        for i in range(spec["repeats"] + 1):
            start = time.perf_counter()
            if me == 0:
                t.send(i, {"x": x}, 1)
                jax.block_until_ready(t.recv(i, like, 1))
            else:
                t.send(i, t.recv(i, like, 0), 0)
            times.append((time.perf_counter() - start) / 2)
        out[size] = size / float(np.median(times[1:])) / 1e9
    t.barrier(0)
    if me == 0:
        print(_RESULT + json.dumps(out), flush=True)
    t.close()
    group.shutdown()


def markdown_table(result: dict[int, float]) -> str:
    """``{size: GB/s}`` as a Markdown table, MiB per row."""
    lines = ["| MiB | hand-off GB/s |", "| ---: | ---: |"]
    lines += [f"| {size / (1 << 20):g} | {gbps:.3f} |" for size, gbps in sorted(result.items())]
    return "\n".join(lines)
