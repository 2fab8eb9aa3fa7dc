"""How much slower a jitted stage call is after the device idled: what the profile does not see.

    python experiments/idle_gap.py                       # configs/local_hetero.py's model, layers
    python experiments/idle_gap.py --granularity sublayer --gap_ms 10
    taskset -c 1 python experiments/idle_gap.py          # one core, as launch --bind_cores gives

The profiler times each unit's forward and backward back to back (``skyjax.profile.units``); a
pipeline stage that is not the bottleneck waits for its neighbours between actions. This times,
in one process, every unit as a one-unit stage and the whole chain as one stage, both back to
back and with ``--gap_ms`` of sleep before every call, and prints the four sums side by side
(mean of the fastest half of ``--repeats`` calls, as the profiler keeps). Measured on the 2-core
development machine: the units' sum grows from ~33 to ~55 ms after 10 ms gaps while the whole
stage barely changes (a cost per call, ~1.7 ms); bound to one core, both grow (+34 %, +26 %).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np


def fastest_half(times: list[float]) -> float:
    times = sorted(times)
    return float(np.mean(times[: max(len(times) // 2, 1)]))


def time_stage(units, carry, labels, microbatches: int, gap_s: float, repeats: int
               ) -> tuple[float, float, dict]:
    """(forward s, backward s, output carry) of ``units`` as one stage, ``gap_s`` idle before
    each call."""
    import jax
    import jax.numpy as jnp

    from skyjax.profile.calls import cotangent
    from skyjax.runtime.stage import StageProgram

    prog = StageProgram(units, is_last=labels is not None, microbatches=microbatches)
    params = [u.params for u in units]
    grads = jax.tree.map(jnp.zeros_like, params)
    rng = jax.random.PRNGKey(0)
    out, res = jax.block_until_ready(prog.forward(params, carry, rng, labels))
    ct = cotangent(out, labels is not None)
    grads, _ = jax.block_until_ready(prog.backward(params, res, ct, grads))
    fwd, bwd = [], []
    for _ in range(repeats):
        time.sleep(gap_s)
        tic = time.perf_counter()
        _, res = jax.block_until_ready(prog.forward(params, carry, rng, labels))
        fwd.append(time.perf_counter() - tic)
        time.sleep(gap_s)
        tic = time.perf_counter()
        grads, _ = jax.block_until_ready(prog.backward(params, res, ct, grads))
        bwd.append(time.perf_counter() - tic)
    return fastest_half(fwd), fastest_half(bwd), out


def demo_chain(granularity: str) -> tuple:
    """``configs/local_hetero.py``'s config, its model's units at ``granularity`` and one
    micro-batch of input carry and labels (what the benchmarks time as stages)."""
    from configs import local_hetero
    from skyjax.models import bert
    from skyjax.models.build import build_model
    from skyjax.profile.chain import sample_microbatch

    config = local_hetero.get_config()
    chain = bert.units(build_model(config.model, 0), granularity)
    m = config.pipeline.microbatches
    names = {f.name for f in dataclasses.fields(bert.BertConfig)}
    model = bert.BertConfig(**{k: v for k, v in config.model.items() if k in names})
    carry, labels = sample_microbatch(model, config.data.batch_size // m, config.data.seq_len)
    return config, chain, carry, labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--granularity", default="layer", choices=("layer", "sublayer"))
    parser.add_argument("--gap_ms", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()

    config, chain, carry, labels = demo_chain(args.granularity)
    m = config.pipeline.microbatches
    print(f"{len(chain)} units ({args.granularity}), micro-batch {config.data.batch_size // m} x "
          f"{config.data.seq_len}; forward + backward, ms (fastest half of {args.repeats})")
    print(f"{'':18s} {'sum of units':>13s} {'whole stage':>12s}")
    for gap in (0.0, args.gap_ms / 1e3):
        c, total = carry, 0.0
        for i, unit in enumerate(chain):
            last = i == len(chain) - 1
            f, b, out = time_stage([unit], c, labels if last else None, m, gap, args.repeats)
            total += f + b
            c = out
        f, b, _ = time_stage(chain, carry, labels, m, gap, args.repeats)
        print(f"{f'gap {gap * 1e3:g} ms':18s} {total * 1e3:13.2f} {(f + b) * 1e3:12.2f}")


if __name__ == "__main__":
    main()
