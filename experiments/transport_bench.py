"""How fast do activations move between stages? Ping-pong latency and bandwidth, per transport.

    python experiments/transport_bench.py [--sizes 4096,262144,4194304,33554432] [--json out.json]

Transports compared (float32 messages, two stages / processes on this host):

- ``local``: :class:`skyjax.transport.LocalTransport`, two threads, two CPU devices;
- ``transfer``: :class:`skyjax.transport.TransferServerTransport` (what distributed runs
  use): a ``jax.experimental.transfer`` pull plus a key-value-store notice per message;
- ``transfer_raw``: the same pulls without the notice (ids agreed in advance): the notice's cost;
- ``device_put``: cross-process ``jax.device_put`` between single-device shardings
  (``jax_cross_host_transfer_socket_address``); both processes issue every call;
- ``ppermute``: ``lax.ppermute`` in ``jax.shard_map`` over a 2-device mesh (one device per
  process; a swap: both directions at once, every process takes part).

One-way time = median round trip / 2 (``ppermute``: median time of one swap). Bandwidth = bytes /
one-way time. On a shared 2-core machine expect noise; compare medians.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import threading
import time


DEFAULT_SIZES = (4096, 262144, 4194304, 33554432)


def _iters(nbytes: int) -> int:
    return 50 if nbytes <= 1 << 20 else 12 if nbytes <= 8 << 20 else 6


def _summary(name: str, nbytes: int, one_way: list[float]) -> dict:
    import numpy as np

    t = float(np.median(one_way))
    return {"transport": name, "bytes": nbytes, "one_way_s": t, "GBps": nbytes / t / 1e9,
            "iters": len(one_way)}


# ------------------------------------------------------------------------------- in-process

def bench_local(sizes) -> list[dict]:
    import jax
    import jax.numpy as jnp

    from skyjax.transport import LocalTransport

    devs = jax.local_devices()
    devs = [devs[0], devs[1 % len(devs)]]
    t = LocalTransport(devs, timeout_s=60)
    rows = []
    for nbytes in sizes:
        like = {"a": jax.ShapeDtypeStruct((nbytes // 4,), jnp.float32)}
        x = jax.device_put(jnp.ones((nbytes // 4,), jnp.float32), devs[0])
        n = _iters(nbytes) + 2
        rtts = []

        def echo():
            s = t.for_stage(1)
            for i in range(n):
                s.send(i, s.recv(i, like, 0), 0)

        th = threading.Thread(target=echo, daemon=True)
        th.start()
        s0 = t.for_stage(0)
        for i in range(n):
            start = time.perf_counter()
            s0.send(i, {"a": x}, 1)
            s0.recv(i, like, 1)
            rtts.append(time.perf_counter() - start)
        th.join()
        rows.append(_summary("local", nbytes, [r / 2 for r in rtts[2:]]))
    return rows


# ------------------------------------------------------------------------- two processes

def _worker(sizes) -> None:
    from skyjax.cluster.network import free_port
    from skyjax.transport import group as distributed

    info = distributed.initialize(timeout_s=60)
    import jax

    jax.config.update("jax_cross_host_transfer_socket_address", f"127.0.0.1:{free_port()}")
    import jax.numpy as jnp
    import numpy as np

    from skyjax.transport import TransferServerTransport

    me = info.process_id
    dev = jax.local_devices()[0]
    t = TransferServerTransport(me, 2, dev, timeout_s=60)
    rows = []

    def report(name, nbytes, one_way):
        if me == 0:
            rows.append(_summary(name, nbytes, one_way))

    for nbytes in sizes:
        n = _iters(nbytes) + 2
        like = {"a": jax.ShapeDtypeStruct((nbytes // 4,), jnp.float32)}
        x = jax.device_put(jnp.ones((nbytes // 4,), jnp.float32), dev)

        # transfer: the transport as the pipeline uses it.
        t.barrier(0)
        rtts = []
        for i in range(n):
            start = time.perf_counter()
            if me == 0:
                t.send(i, {"a": x}, 1)
                t.recv(i, like, 1)
            else:
                t.send(i, t.recv(i, like, 0), 0)
            rtts.append(time.perf_counter() - start)
        report("transfer", nbytes, [r / 2 for r in rtts[2:]])

        # transfer_raw: pulls with ids known in advance (no key-value notice).
        srv = t.server  # the server the peer pulls from
        conn = t.connection(1 - me)
        avals = [jax.ShapeDtypeStruct((nbytes // 4,), jnp.float32,
                                      sharding=jax.sharding.SingleDeviceSharding(dev))]
        base = 1 << 40 | nbytes << 8
        t.barrier(1)
        rtts = []
        for i in range(n):
            start = time.perf_counter()
            if me == 0:
                srv.await_pull(base + 2 * i, [x])
                jax.block_until_ready(conn.pull(base + 2 * i + 1, avals))
            else:
                y = jax.block_until_ready(conn.pull(base + 2 * i, avals))
                srv.await_pull(base + 2 * i + 1, y)
            rtts.append(time.perf_counter() - start)
        report("transfer_raw", nbytes, [r / 2 for r in rtts[2:]])

        # device_put: every process issues every call.
        S = jax.sharding.SingleDeviceSharding
        d0, d1 = jax.devices()[0], jax.devices()[1]
        g = jax.make_array_from_single_device_arrays(
            x.shape, S(d0), [jax.device_put(x, d0)] if me == 0 else [], dtype=jnp.float32)
        t.barrier(2)
        rtts = []
        for i in range(n):
            start = time.perf_counter()
            y = jax.device_put(g, S(d1))
            z = jax.device_put(y, S(d0))
            jax.block_until_ready(z if me == 0 else y)
            rtts.append(time.perf_counter() - start)
        report("device_put", nbytes, [r / 2 for r in rtts[2:]])

        # ppermute: a swap inside shard_map over both processes' devices.
        mesh = jax.sharding.Mesh(np.array([d0, d1]), ("s",))
        spec = jax.sharding.PartitionSpec("s")
        sh = jax.sharding.NamedSharding(mesh, spec)
        local = jnp.ones((1, nbytes // 4), jnp.float32)
        garr = jax.make_array_from_single_device_arrays(
            (2, nbytes // 4), sh, [jax.device_put(local, dev)])
        swap = jax.jit(jax.shard_map(lambda a: jax.lax.ppermute(a, "s", [(0, 1), (1, 0)]),
                                     mesh=mesh, in_specs=spec, out_specs=spec))
        jax.block_until_ready(swap(garr))
        t.barrier(3)
        times = []
        for i in range(n):
            start = time.perf_counter()
            garr = jax.block_until_ready(swap(garr))
            times.append(time.perf_counter() - start)
        report("ppermute", nbytes, times[2:])

    if me == 0:
        for r in rows:
            print("ROW " + json.dumps(r), flush=True)
    t.barrier(4)
    t.close()
    distributed.shutdown()


def bench_distributed(sizes, timeout_s: float = 540) -> list[dict]:
    from skyjax.launcher import launch

    out = io.BytesIO()
    env = {"XLA_FLAGS": "", "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.path.dirname(__file__)}
    rc = launch(["--worker", "--sizes", ",".join(map(str, sizes))], 2, timeout_s, env=env,
                module="transport_bench", stdout=out, grace_s=2)
    text = out.getvalue().decode(errors="replace")
    rows = [json.loads(line.split("ROW ", 1)[1]) for line in text.splitlines() if "ROW " in line]
    if rc != 0:
        print(text[-4000:], file=sys.stderr)
        print(f"distributed benchmark failed (exit {rc})", file=sys.stderr)
    return rows


def _table(rows: list[dict]) -> str:
    lines = ["| transport | bytes | one-way ms | GB/s |", "| --- | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['transport']} | {r['bytes']:,} | {r['one_way_s'] * 1e3:.3f} | "
                     f"{r['GBps']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.worker:
        _worker(sizes)
        return
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    rows = bench_local(sizes) + bench_distributed(sizes)
    order = ["local", "transfer", "transfer_raw", "device_put", "ppermute"]
    rows.sort(key=lambda r: (order.index(r["transport"]), r["bytes"]))
    print(_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
