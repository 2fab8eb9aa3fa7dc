"""Two pipelines in data parallel against the best single pipeline, predicted and measured side
by side in one run, then the paper-scale plan (``experiments/plan_pipelines.py``).

    python experiments/data_parallel_bench.py             # devices x1 x4 x4 x1, then x4 x4
    python experiments/data_parallel_bench.py --rounds 8 --steps 4 --slowdowns 1,4,4,1

One process, the demo model (``configs/local_demo.py``: 4 layers, hidden 128, batch 32 in 4
micro-batches, 6 units) on emulated devices in its threads: four (two fast, two 4x slower), then
two 4x slower ones (``--slowdowns``, one run per set). It profiles once, plans the best
single pipeline (``max_pipelines`` 1) and the best plan of up to two pipelines from the same
profile, builds both executors from the same initial weights and alternates blocks of steps
between them, so that the host's noise hits both alike; both train on steps 0, 1, 2, ... in
order. Printed per plan: its pipelines (devices, units, micro-batches), the predicted step T,
the measured median step, examples/s and the speed-up over the single pipeline, predicted and
measured; then the largest difference between the two runs' losses (the same math: <= 1e-5).

What this host can tell: it has 2 cores, and the stages are threads of one process. An emulated
slow device computes, then sleeps 3x what its compute took, so the host's contention is scaled
up with it; the profile times each device alone. With four devices the fast ones of both plans
compute at once beside the others' dispatch, and the measured steps sit far above the
predictions; with two devices at most two threads are busy, and the measured speed-up follows
the predicted one more closely. The ratio of the two plans is what each run compares.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def describe(plan, profile) -> str:
    """``P0 [m=2]: cpu1 [0,1) -> cpu0 [1,6) | P1 ...``"""
    parts = []
    for i, m in enumerate(plan.pipeline_shares()):
        stages = " -> ".join(f"{profile.devices[plan.stages[k].device]['name'].split(':')[-1]}"
                             f" [{plan.stages[k].units[0]},{plan.stages[k].units[1]})"
                             for k in plan.stage_ids(i))
        parts.append(f"P{i} [m={m}]: {stages}")
    return " | ".join(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slowdowns", nargs="+", default=["1,4,4,1", "4,4"],
                        help="emulated slow-downs per device, one run per set")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=4, help="steps per plan per round")
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--pipelines", type=int, default=2, help="the most pipelines to plan")
    parser.add_argument("--skip_paper", action="store_true", help="no paper-scale table")
    args = parser.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    for spec in args.slowdowns:
        compare(args, tuple(float(x) for x in spec.split(",")))
    if not args.skip_paper:
        from experiments import plan_pipelines

        print("\npaper scale (experiments/plan_pipelines.py):")
        plan_pipelines.main([])


def compare(args: argparse.Namespace, slowdowns: tuple[float, ...]) -> None:
    """One profile, the two plans, their executors alternating; prints the comparison."""
    import jax
    import numpy as np

    from configs import local_demo
    from skyjax import cluster as cluster_lib, data as data_lib, plan as plan_lib, train
    from skyjax.models import bert
    from skyjax.models.build import build_model
    from skyjax.runtime.executors import make_executor

    config = local_demo.get_config()
    config.unlock()
    config.cluster.num_devices, config.cluster.slowdowns = len(slowdowns), slowdowns
    config.allocation.calibrate_steps = 0
    config.pipeline.schedule = args.schedule
    config.train.steps = 10_000  # the learning-rate schedule's horizon; the run is far shorter
    cluster = cluster_lib.cluster_from_config(config)
    chain = bert.units(build_model(config.model, config.train.seed), "layer")
    workdir = tempfile.mkdtemp(prefix="skyjax-dp-bench-")
    profile = train.profile_phase(config, chain, workdir, cluster)
    m = config.pipeline.microbatches
    plans = {"one pipeline": plan_lib.plan(profile, "optimal", args.schedule, m),
             f"up to {args.pipelines}": plan_lib.plan(profile, "optimal", args.schedule, m,
                                                      max_pipelines=args.pipelines)}
    executors = {k: make_executor(config, chain, p, cluster) for k, p in plans.items()}
    total = 2 + args.rounds * args.steps
    source = data_lib.train_batches(config)
    batches = [next(source) for _ in range(total)]
    times = {k: [] for k in plans}
    losses = {k: [] for k in plans}
    done = {k: 0 for k in plans}

    def run(k: str, n: int, timed: bool) -> None:
        for _ in range(n):
            step = done[k]
            tic = time.perf_counter()
            metrics = executors[k].train_step(step, batches[step])
            if timed:
                times[k].append(time.perf_counter() - tic)
            losses[k].append(metrics.loss)
            done[k] += 1

    for k in plans:  # compiles
        run(k, 2, False)
    for r in range(args.rounds):
        for k in (list(plans) if r % 2 == 0 else list(reversed(plans))):
            run(k, args.steps, True)
    for ex in executors.values():
        ex.close()

    base_pred = plans["one pipeline"].step_time_s
    base_meas = statistics.median(times["one pipeline"])
    b = config.data.batch_size
    devices = ",".join(f"{x:g}" for x in slowdowns)
    print(f"\n{len(slowdowns)} emulated devices (slow-downs {devices}) on "
          f"{jax.devices()[0].platform} ({os.cpu_count()} host cores); the demo model, "
          f"{len(chain)} units, batch {b} in {m} micro-batches, {args.schedule}; "
          f"{args.rounds} rounds x {args.steps} timed steps per plan")
    print(f"{'plan':<14} {'predicted':>10} {'measured':>10} {'examples/s':>11} "
          f"{'speed-up pred.':>15} {'speed-up meas.':>15}  pipelines")
    for k, p in plans.items():
        meas = statistics.median(times[k])
        print(f"{k:<14} {p.step_time_s * 1e3:8.2f}ms {meas * 1e3:8.2f}ms {b / meas:11.1f} "
              f"{base_pred / p.step_time_s:14.2f}x {base_meas / meas:14.2f}x  "
              f"{describe(p, profile)}"
              + (f"; exchange {p.allreduce_s * 1e3:.2f} ms" if p.num_pipelines > 1 else ""))
    diff = float(np.max(np.abs(np.subtract(*losses.values()))))
    print(f"losses of the two runs over {total} steps: largest difference {diff:.2e} "
          f"(the same math)")


if __name__ == "__main__":
    main()
