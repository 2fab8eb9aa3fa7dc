"""What a waiting process's polling costs a computing process on the same cores.

    python experiments/poll_cost.py                 # 3 waiting neighbours, 2 rounds
    python experiments/poll_cost.py --neighbours 1 --calls 500

Where stages share a host's cores (4 emulated devices on this machine's 2 cores; several
stages on one host in the field), every stage that waits for a message looks whether it has
come (``skyjax.runtime.transport.transfer._wait_ready``), and each look wakes a process that
takes a core from the stages computing. This times, in one process, a layer-sized jitted
forward and backward (a hidden-256 MLP on 4 x 64 tokens, ~5 ms here) while ``--neighbours``
other processes wait: asleep (the baseline), looking every 200 us / 500 us / 1 ms / 2 ms, or
looking as a receive does (``transfer.poll_pause`` over waits of ``--wait_ms``, for a device
that is not the host's cores, and for a CPU device). Prints the
mean of the fastest half and the median of ``--calls`` calls per round, side by side.

Measured on the 2-core development machine, 3 neighbours, 3 rounds (noisy: a few % between
runs): every 200 us +12 %; 500 us +7.5 %; 1 ms +5 %; 2 ms +1 to +4 %. A receive looked every
200 us after a 2 ms spin until session 15, and still does for a GPU or TPU device: +15 % in
waits of 50 ms, +19 % in waits of 10 ms, on every computing stage of a 4-process pipeline here,
which the profile, taken one device at a time, never saw. On a CPU device it now spins 0.5 ms,
then backs off to 10 % of the time waited (at most 2 ms): +6 % and +13 %.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time


def neighbour(kind: str, wait_ms: float, stop) -> None:
    """Waits until ``stop`` the way ``kind`` says (see module doc)."""
    if kind == "asleep":
        stop.wait()
        return
    if kind.startswith("receive"):
        from skyjax.runtime.transport.transfer import poll_pause

        cpu_device = kind == "receive, cpu"
        while not stop.is_set():
            start, pause = time.monotonic(), 0.0
            while (waited := time.monotonic() - start) < wait_ms / 1e3:
                time.sleep(pause)
                pause = poll_pause(pause, waited, cpu_device)
        return
    pause = float(kind.removeprefix("every ").removesuffix(" us")) / 1e6
    while not stop.is_set():
        time.sleep(pause)


def time_calls(calls: int) -> tuple[float, float]:
    """(mean of the fastest half, median) of ``calls`` layer-sized forward + backward, in ms."""
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (4 * 64, 256))
    w1 = jax.random.normal(key, (256, 1024)) * 0.05
    w2 = jax.random.normal(key, (1024, 256)) * 0.05

    def loss(w1, w2, x):
        return jnp.sum(jnp.tanh(jnp.tanh(x @ w1) @ w2) ** 2)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    jax.block_until_ready(grad(w1, w2, x))
    times = []
    for _ in range(calls):
        tic = time.perf_counter()
        jax.block_until_ready(grad(w1, w2, x))
        times.append(time.perf_counter() - tic)
    times.sort()
    return 1e3 * statistics.mean(times[: len(times) // 2]), 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--neighbours", type=int, default=3)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--wait_ms", type=float, default=50.0,
                        help="each wait of a 'receive' neighbour")
    args = parser.parse_args()
    kinds = ["asleep", "every 200 us", "every 500 us", "every 1000 us", "every 2000 us",
             "receive, gpu", "receive, cpu"]
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    ctx = mp.get_context("spawn")
    for _ in range(args.rounds):
        for kind in kinds:
            stop = ctx.Event()
            procs = [ctx.Process(target=neighbour, args=(kind, args.wait_ms, stop))
                     for _ in range(args.neighbours)]
            for p in procs:
                p.start()
            time.sleep(0.5)  # the neighbours are up
            results[kind].append(time_calls(args.calls))
            stop.set()
            for p in procs:
                p.join()
    base = statistics.mean(f for f, _ in results["asleep"])
    print(f"{args.neighbours} neighbours; layer-sized forward + backward, ms per call "
          f"(fastest half / median, per round); vs asleep (fastest half)")
    for kind, rows in results.items():
        cells = "   ".join(f"{f:6.3f} / {m:6.3f}" for f, m in rows)
        ratio = statistics.mean(f for f, _ in rows) / base - 1
        name = f"{kind} device, {args.wait_ms:g} ms" if kind.startswith("receive") else kind
        print(f"  {name:26s} {cells}   {ratio:+6.1%}")


if __name__ == "__main__":
    main()
