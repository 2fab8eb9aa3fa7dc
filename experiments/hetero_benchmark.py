"""Heterogeneous pipeline benchmark: even vs optimal plans, measured side by side in one run.

    python experiments/hetero_benchmark.py                      # 4 processes, slow-downs 1,2,3,6
    python experiments/hetero_benchmark.py --processes 3 --slowdowns 1,2,4 --steps 6
    python experiments/hetero_benchmark.py --shipped --granularity sublayer  # local_hetero as is
    python experiments/hetero_benchmark.py --processes 2 --slowdowns 1,3 --bind_cores  # own cores

N processes on this host under jax.distributed (configs/local_hetero.py, one stage per process,
emulated slow-downs). The processes profile once, plan ``even`` and ``optimal`` from the same
profile, build both pipelines and then alternate blocks of steps between them, so that machine
noise hits both alike. Printed: measured vs predicted step time per plan, the measured speed-up
of optimal over even against the planner's predicted one, and pipeline efficiency against the
ideal step (all work spread perfectly over the devices' speeds, no bubble, no communication).
Then, in this process: a one-stage pipeline against a plain jitted full-model step at m = 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

from experiments.hetero_report import calibrated_s, ideal_step_s, report


MODEL = dict(hidden_size=256, num_hidden_layers=8, num_attention_heads=4, intermediate_size=1024,
             max_position_embeddings=64)


def build_config(args: argparse.Namespace):
    from configs import local_hetero

    config = local_hetero.get_config()
    config.unlock()
    config.data.eval_examples = 0
    if getattr(args, "shipped", False):  # configs/local_hetero.py's model, data and m as shipped
        args.microbatches = config.pipeline.microbatches
        args.batch_size, args.seq_len = config.data.batch_size, config.data.seq_len
    else:
        config.model.update(MODEL)
    config.data.seq_len = args.seq_len
    config.data.batch_size = args.batch_size
    config.pipeline.microbatches = args.microbatches
    config.pipeline.schedule = args.schedule
    config.allocation.granularity = args.granularity
    config.cluster.num_devices = args.processes
    config.cluster.slowdowns = tuple(args.slowdowns)
    config.cluster.shared_host = getattr(args, "shared_host", "on") == "on"
    if not config.cluster.shared_host:
        config.profile.passes = 1  # several passes serve a shared host only
    config.profile.repeats = 5
    config.train.steps = 10_000  # the lr schedule's horizon; the benchmark runs far fewer
    config.train.warmup_steps = 0
    return config


# ----------------------------------------------------------------------------------- worker

def worker(spec_path: str) -> None:
    import jax
    import numpy as np

    from skyjax import cluster as cluster_lib, data as data_lib, train
    from skyjax import plan as plan_lib
    from skyjax.plan.replay import simulate
    from skyjax.plan.replay.measured import measured_comm
    from skyjax.report.compare import stage_comparison
    from skyjax.plan import replan
    from skyjax.models import bert
    from skyjax.models.build import build_model
    from skyjax.transport import group as distributed
    from skyjax.runtime.executors import make_executor, make_transport
    from skyjax.runtime.replanner import stage_busy
    from skyjax.profile.format import Profile

    with open(spec_path) as f:
        spec = json.load(f)
    args = argparse.Namespace(**spec["args"])
    config = build_config(args)
    distributed.initialize()
    cluster = cluster_lib.cluster_from_config(config)
    transport = make_transport(cluster)
    chain = bert.units(build_model(config.model, config.train.seed), config.allocation.granularity)
    extra, probes = train.shared_host(config)  # on in configs/local_hetero.py
    profile = train.profile_phase(config, chain, spec["workdir"], cluster, transport, probes)
    plans = {s: plan_lib.plan(profile, s, args.schedule, args.microbatches, extra=extra)
             for s in ("even", "optimal")}
    executors = {s: make_executor(config, chain, p, cluster, transport)
                 for s, p in plans.items()}
    batches = data_lib.StepBatches(data_lib.train_batches(config))  # train.train_step_inputs
    times: dict[str, list[float]] = {s: [] for s in plans}
    busy: dict[str, list[list[float]]] = {s: [] for s in plans}  # per step, per stage
    spans: dict[str, list] = {s: [] for s in plans}  # the last measured step's F/B spans
    all_spans: dict[str, list] = {s: [] for s in plans}  # every measured step's (result.json)
    comm: dict[str, list[list[float]]] = {s: [] for s in plans}  # measured link waits
    step = 0
    for s in plans:  # warm-up (compilation)
        for _ in range(2):
            executors[s].train_step(*train.train_step_inputs(executors[s], batches, step,
                                                             1 << 30))
            step += 1
    # What allocation.calibrate_steps does: steps on the even plan correct the profile (process
    # 0), then the plan of the corrected profile runs alongside the others.
    cal: dict[str, list] = {"busy": [], "comm": [], "times": []}
    for _ in range(args.calibrate_steps):
        tic = time.perf_counter()
        metrics = executors["even"].train_step(
            *train.train_step_inputs(executors["even"], batches, step, 1 << 30))
        cal["times"].append(time.perf_counter() - tic)
        cal["busy"].append(stage_busy(metrics))
        sp = metrics.spans
        cal["comm"].append(measured_comm(sp, len(plans["even"].stages)))
        step += 1
    calibrated = None
    if jax.process_index() == 0 and args.calibrate_steps:
        decision = replan.decide(profile, plans["even"], replan.stage_busy_s(cal["busy"]),
                                 replan.stage_busy_s(cal["comm"]), extra)
        decision.candidate.strategy = "optimal"
        calibrated = decision.candidate.to_json()
        calibrated["calibration_profile"] = decision.profile.to_json()
        calibrated["calibration_even_s"] = decision.current.step_time_s
    calibrated = distributed.broadcast_json(calibrated, "bench/calibrated")
    if calibrated:
        cal_profile = calibrated.pop("calibration_profile")
        cal_even_s = calibrated.pop("calibration_even_s")
        plans["calibrated"] = plan_lib.Plan.from_json(calibrated)
        executors["calibrated"] = make_executor(config, chain, plans["calibrated"],
                                                      cluster, transport)
        for _ in range(2):
            executors["calibrated"].train_step(
                *train.train_step_inputs(executors["calibrated"], batches, step, 1 << 30))
            step += 1
        for d in (times, busy, spans, all_spans, comm):
            d["calibrated"] = []
    for r in range(1, args.rounds + 1):
        order = list(plans) if r % 2 else list(reversed(plans))
        for s in order:
            for _ in range(args.steps):
                inputs = train.train_step_inputs(executors[s], batches, step, 1 << 30)
                tic = time.perf_counter()
                metrics = executors[s].train_step(*inputs)
                times[s].append(time.perf_counter() - tic)
                busy[s].append(stage_busy(metrics))
                spans[s] = metrics.spans
                all_spans[s].append([dataclasses.astuple(sp) for sp in spans[s]])
                comm[s].append(measured_comm(spans[s], len(plans[s].stages)))
                step += 1
    if jax.process_index() == 0:
        out = {"plans": {s: p.to_json() for s, p in plans.items()}, "times": times,
               "busy": {s: np.median(np.array(b), axis=0).tolist() for s, b in busy.items()},
               "simulated": {s: simulate.simulate_plan(p, profile, extra=extra).step_time_s
                             for s, p in plans.items()},
               "ideal_s": ideal_step_s(profile, args.microbatches),
               "calibrated": {src: calibrated_s(
                   profile, {s: p.to_json() for s, p in plans.items()},
                   {s: np.median(np.array(b), axis=0).tolist() for s, b in busy.items()},
                   {s: np.median(np.array(c), axis=0).tolist() for s, c in comm.items()}, src,
                   extra)
                   for src in plans},
               "overheads": profile.to_json()["overheads"],
               "compare": {s: stage_comparison(p, profile if s != "calibrated" else
                                               Profile.from_json(cal_profile), spans[s],
                                               extra=extra)
                           for s, p in plans.items()},
               "device_names": [d["name"] for d in profile.devices],
               "spans": all_spans, "profile": profile.to_json(),
               "profile_s": profile.extra.get("profiler", {}).get("profile_time_s"),
               "calibration_profile": cal_profile if calibrated else None,
               "calibration_steps": cal,
               "calibration_even_s": cal_even_s if calibrated else None}
        with open(os.path.join(spec["workdir"], "result.json"), "w") as f:
            json.dump(out, f)
    distributed.shutdown()


# ------------------------------------------------------------------------------ one stage

def one_stage_overhead(args) -> dict:
    """Median step of a one-stage pipeline vs the plain jitted full-model step, m = 1."""
    import jax
    import numpy as np

    from skyjax import baseline, data as data_lib, optim
    from skyjax.models import bert
    from skyjax.models.build import build_model
    from skyjax.plan import Plan, Stage
    from skyjax.runtime.local_executor import LocalExecutor

    config = build_config(args)
    config.cluster.mode, config.cluster.num_devices, config.cluster.slowdowns = "local", 1, ()
    config.pipeline.microbatches = 1
    chain = bert.units(build_model(config.model, config.train.seed), "layer")
    plan = Plan("manual", "1f1b", 1, [Stage(0, (0, len(chain)), 0.0, 0.0, 0)], step_time_s=0.0,
                bottleneck_s=0.0, exact=False)
    pipe = LocalExecutor(chain, plan, jax.local_devices(), batch_size=config.data.batch_size,
                         seq_len=config.data.seq_len,
                         optimizer=optim.make_optimizer(config.train, clip=False),
                         max_grad_norm=config.train.grad_clip_norm,
                         rng=lambda s, first, n: bert.example_keys(0, s, first, n))
    optimizer = optim.make_optimizer(config.train)
    params = jax.tree.map(np.array, [u.params for u in chain])
    opt_state = optimizer.init(params)
    plain = baseline.make_train_step(chain, optimizer, 0, 1)
    batches = data_lib.train_batches(config)
    times = {"pipeline": [], "plain": []}
    for r in range(args.rounds * 2 + 1):
        for _ in range(args.steps):
            batch = next(batches)
            tic = time.perf_counter()
            pipe.train_step(r, batch)
            t_pipe = time.perf_counter() - tic
            tic = time.perf_counter()
            params, opt_state, metrics = plain(params, opt_state, batch, np.int32(r))
            jax.block_until_ready(metrics)
            t_plain = time.perf_counter() - tic
            if r:
                times["pipeline"].append(t_pipe)
                times["plain"].append(t_plain)
    pipe.close()
    return {k: statistics.median(v) for k, v in times.items()}


# ---------------------------------------------------------------------------------- report

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--slowdowns", type=lambda s: [float(x) for x in s.split(",")],
                        default=[1, 2, 3, 6])
    parser.add_argument("--schedule", default="1f1b", choices=("gpipe", "1f1b"))
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--granularity", default="layer", choices=("layer", "sublayer"))
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seq_len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5, help="steps per block")
    parser.add_argument("--rounds", type=int, default=4, help="alternating blocks per plan")
    parser.add_argument("--timeout", type=float, default=1500)
    parser.add_argument("--calibrate_steps", type=int, default=5,
                        help="measured even steps that calibrate the 'calibrated' plan (0: none)")
    parser.add_argument("--skip_overhead", action="store_true")
    parser.add_argument("--shipped", action="store_true",
                        help="configs/local_hetero.py's model, batch and m as shipped")
    parser.add_argument("--bind_cores", action="store_true",
                        help="each process on its own cores (skyjax.launch --bind_cores): no "
                             "shared cores, so no contention between the emulated devices")
    parser.add_argument("--shared_host", choices=("on", "off"), default="on",
                        help="the shared-host model (config.cluster.shared_host): on for "
                             "processes sharing this host's cores, off for one accelerator each")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    if len(args.slowdowns) != args.processes:
        parser.error(f"--slowdowns has {len(args.slowdowns)} entries for {args.processes} "
                     "processes")
    from skyjax.launcher import launch

    if args.shipped:
        build_config(args)  # takes the shipped m, batch and sequence length into args

    workdir = args.workdir or tempfile.mkdtemp(prefix="skyjax_bench_")
    os.makedirs(workdir, exist_ok=True)
    spec = os.path.join(workdir, "spec.json")
    with open(spec, "w") as f:
        json.dump({"args": vars(args), "workdir": workdir}, f)
    env = {"SKYJAX_BENCH_SPEC": spec, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}
    rc = launch([], args.processes, timeout_s=args.timeout, env=env,
                module="experiments.hetero_benchmark", stdout=open(
                    os.path.join(workdir, "workers.log"), "wb"), bind_cores=args.bind_cores)
    if rc:
        sys.exit(f"workers failed (exit {rc}); see {workdir}/workers.log")
    with open(os.path.join(workdir, "result.json")) as f:
        result = json.load(f)
    overhead = None if args.skip_overhead else one_stage_overhead(args)
    report(result, overhead, args, MODEL)
    print(f"\n(profile, logs and raw times in {workdir})")


if __name__ == "__main__":
    if "SKYJAX_BENCH_SPEC" in os.environ:
        worker(os.environ["SKYJAX_BENCH_SPEC"])
    else:
        from experiments import results_doc

        results_doc.run(main, [(
            "--bind_cores", "hetero_benchmark-bind_cores", "Pipeline efficiency on own cores",
            "Processes on their own cores (`--bind_cores`): even and optimal plans measured "
            "side by side against their predictions, and pipeline efficiency against the "
            "bubble-bounded ideal."), (
            None, "hetero_benchmark", "Predicted against measured step time",
            "Four processes with slow-downs 1, 2, 3, 6 sharing two cores (the shared-host model "
            "on): the even, optimal and calibrated plans side by side, measured against "
            "predicted step time, pipeline efficiency, the step boundary and message delays, "
            "each stage's actions with no other stage of the host computing.")])
