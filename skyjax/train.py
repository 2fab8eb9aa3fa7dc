"""Training and evaluation: ``train_and_evaluate(config, workdir) -> summary dict``.

Reads top-down as the flow of docs/design.md; each phase receives what it works on, built once
here:

1. model: the unit chain at ``allocation.granularity`` (``skyjax.models``);
2. profile: per-unit times and bytes on each device of the cluster (``skyjax.profile``, cached;
   a rehearsal's is its ``config.rehearse.profile``, :class:`~skyjax.runtime.rehearsal.Rehearsal`);
3. plan: the stages (``skyjax.plan``);
4. run: the pipeline executor of ``skyjax.runtime`` (local: one thread per stage device;
   distributed: this process's stage under ``jax.distributed``;
   :mod:`skyjax.runtime.executors`), the train loop, evaluation on every split;
5. outputs: ``summary.json``, ``plan.json``, ``metrics.jsonl``, ``trace.json``
   (``skyjax.report.outputs``).

Usable from a notebook as well as from ``python -m skyjax.main``.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import jax
import ml_collections
from absl import logging

from skyjax import checkpoint, cluster as cluster_lib, data as data_lib, failures, guard, optim
from skyjax import workdir as workdir_lib
from skyjax.report import outputs, watch
from skyjax import plan as plan_lib
from skyjax.config import validate_config
from skyjax.config.defaults import planned_pipelines
from skyjax.report.compare import step_boundary_s
from skyjax.models import bert, build
from skyjax.plan.model.extension import ExtraCost
from skyjax.profile import profiler
from skyjax.profile.chain import Workload, check_given
from skyjax.profile.format import Profile, load_profile
from skyjax.profile.options import Options
from skyjax.relax import Relaxation
from skyjax.runtime import memory
from skyjax.runtime.decentralized import average_now
from skyjax.runtime.executors import make_executor, make_transport, own_units
from skyjax.runtime.recovery import Recovery
from skyjax.runtime.rehearsal import Rehearsal
from skyjax.runtime.replanner import Replanner, calibration_plan
from skyjax.transport.server import ServerOptions
from skyjax.transport.watchdog import PeerLost
from skyjax.tree import tree_size

Batch = dict[str, Any]
# steps of the plan in use at the end whose spans summary.json's stage_comparison reports on
# (the shared-host model splits them by contention)
RECENT_STEPS = 50
# the run's last steps, measured (blocking) where actions do not block: the final report's
# spans, step boundaries and trace come from them
MEASURED_TAIL = 3


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       rehearsal: Rehearsal | None = None) -> dict:
    """Profile -> plan -> train -> eval; process 0 writes ``workdir/summary.json`` and returns it
    (other processes return the same summary without writing). ``rehearsal``: the run's
    :class:`~skyjax.runtime.rehearsal.Rehearsal` where the command made it before JAX started;
    else it is made here from ``config.rehearse`` (giving the config its profile's devices and
    layers), once either way."""
    wall_start = time.perf_counter()
    rss_start = memory.current_rss_bytes()
    if rehearsal is None:
        rehearsal = Rehearsal.from_config(config)
    validate_config(config)
    claim = workdir_lib.Claim(workdir) if jax.process_index() == 0 else None  # one run at a time
    try:
        return _train_and_evaluate(config, workdir, rehearsal, wall_start, rss_start)
    finally:
        if claim is not None:
            claim.release()


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                        rehearsal: Rehearsal | None, wall_start: float, rss_start: int) -> dict:
    extra, probes = shared_host(config)
    resume = checkpoint.prepare(config, workdir)  # refuses another run's checkpoint, by name

    # The model without parameter memory; the checkpoint's headers are checked here, before
    # anything compiles. Parameters are made later, only for this process's units.
    init = build.UnitInitializer(config.model, config.train.seed)
    compute_dtype = build.resolve_compute_dtype(config.train.compute_dtype)
    chain = build.abstract_chain(config.model, config.train.seed, config.allocation.granularity,
                                 compute_dtype)
    num_params = tree_size([u.params for u in chain])
    logging.info("model: %d units at %s granularity, %d parameters, computing in %s",
                 len(chain), config.allocation.granularity, num_params, compute_dtype)
    cluster, transport, profile, plan = cluster_and_plan(config, chain, workdir, rehearsal,
                                                         extra, probes)
    start_step = resume.step if resume else 0
    if rehearsal is not None:  # a run of days at its time scale is refused, before it compiles
        rehearsal.check_length(plan, config.train.steps - start_step, config.rehearse.allow_long)
    calibrate = calibration_steps(config, start_step)
    if calibrate:  # the first steps run on every device; then the plan of the measured times
        plan = calibration_plan(profile, plan, extra)
        logging.info("calibration: steps %d-%d run on the plan below, then the units move to "
                     "the plan of the times measured there", start_step + 1,
                     start_step + calibrate)
    # Checks, profile and plan succeeded: only now does the workdir change (skyjax.workdir).
    out = outputs.Outputs(workdir, is_chief=jax.process_index() == 0,
                          resumed_from_step=resume.step if resume else 0)
    if out.is_chief and not resume:
        checkpoint.replace_earlier(config, workdir)  # config.checkpoint.replace
    out.write_json("config.json", config.to_dict())
    out.write_json("profile.json", profile.to_json())
    out.write_json("plan.json", plan.to_json())
    label_names = data_lib.label_names(config)
    if label_names is not None:  # string labels: the id of each (checkpoints record it too)
        out.write_json("labels.json", {"label_names": label_names})
    outputs.log_plan(plan)

    mine = own_units(plan, len(chain))
    optimizer = optim.make_optimizer(config.train, clip=False)
    states = checkpoint.restored_states(resume, chain, mine, optimizer)
    executor = make_executor(config, chain if states else build.materialize(init, chain, mine),
                             plan, cluster, transport, states, rehearsal)
    # a relaxed averaging's state, and each pipeline's own replica where replicas differ
    checkpoint.restore_relaxed(resume, executor, chain, optimizer)
    saver = checkpoint.make_manager(config, workdir, chain, optimizer)
    # the units are on their devices now: no host copy (restored arrays, random blocks) stays
    del states
    init.release()
    eval_sets = data_lib.eval_splits(config) if config.data.eval_examples else {}
    every = config.allocation.replan_every if config.allocation.strategy == "dynamic" else 0
    replanner = Replanner(every, profile, plan, calibrate_steps=calibrate,
                          start_step=start_step, strategy=config.allocation.strategy,
                          extra=extra)
    try:
        recovery = Recovery(profile) if jax.process_count() > 1 else None
        result = train_loop(config, executor, out, eval_sets, replanner,
                            resume.step if resume else 0, saver, recovery)
        result["resumed_from_step"] = resume.step if resume else 0
        result["calibration_strategy"] = plan.strategy  # the plan the run started on
        result["metric"] = data_lib.metric(config)
        executor = result.pop("executor")
        # the last step's exchange spans of every stage, for trace.json and timeline.png
        result["last_step"] = executor.gather_exchange(result["last_step"])
        final_evals = evaluate_splits(executor, eval_sets, config.train.steps, out,
                                      data_lib.metric(config))
    finally:
        executor.close()
    if replanner.history:  # the plan in use at the end, on the measured-corrected profile
        plan, profile = replanner.plan, replanner.profile
        result["replans"] = replanner.history
        out.write_json("plan.json", plan.to_json())
    if recovery is not None and recovery.history:  # the survivors' pipelines
        plan = executor.plan
        result["recoveries"] = recovery.history
        out.write_json("plan.json", plan.to_json())
    summary = outputs.make_summary(config, plan.to_json(), result, final_evals,
                                   len(profile.units), num_params,
                                   time.perf_counter() - wall_start)
    summary["memory"] = memory.run_report(optim.make_optimizer(config.train, clip=False),
                                           chain, mine, rss_start,
                                           memory.averaging_bytes(executor))
    if rehearsal is not None:
        calls = memory.gather_to_chief(rehearsal.ledger.to_json(), "skyjax/rehearsal")
        summary["rehearsal"] = rehearsal.report(plan, result["step_times"], calls)
        if out.is_chief:
            outputs.log_rehearsal(summary["rehearsal"])
    summary["stage_comparison"] = outputs.stage_report(plan, profile, result["last_step"],
                                                       result["boundaries"],
                                                       result["recent_spans"], extra)
    out.write_json("trace.json", outputs.trace_json(plan, profile, result["last_step"],
                                                    summary["stage_comparison"], extra))
    if out.is_chief:  # plan.png, timeline.png
        watch.write_pictures(workdir, plan, profile, result["last_step"], cluster.jax_devices)
    out.write_json("summary.json", summary)
    if out.is_chief:
        outputs.log_summary(summary)
    return summary


def shared_host(config: ml_collections.ConfigDict) -> tuple[ExtraCost | None, Any]:
    """The optional shared-host model (``config.cluster.shared_host``, :mod:`skyjax.hostmodel`):
    its cost terms for the planner and its probes for the profiler, with this process prepared
    for it; ``(None, None)`` otherwise, and then nothing of it is imported."""
    if not config.cluster.shared_host:
        return None, None
    from skyjax import hostmodel

    hostmodel.activate()
    return hostmodel.SharedHostModel(), hostmodel.probes()


def cluster_and_plan(config: ml_collections.ConfigDict, chain: list[bert.Unit], workdir: str,
                     rehearsal: Rehearsal | None, extra: ExtraCost | None, probes: Any
                     ) -> tuple[cluster_lib.Cluster, Any, Profile, plan_lib.Plan]:
    """The cluster, this process's transport, the profile and the plan. A rehearsal plans its
    profile first, so that its cluster's links carry the plan's declared bytes; its profile and
    plan are then in its time base (:class:`~skyjax.runtime.rehearsal.Rehearsal`)."""
    server = ServerOptions.from_config(config.cluster)
    if rehearsal is not None:
        plan = rehearsal.time_base(plan_phase(config, rehearsal.profile, extra))
        cluster = rehearsal.cluster(plan, config.cluster.mode)
        transport = make_transport(cluster, config.cluster.peer_timeout_s, server)
        return cluster, transport, rehearsal.scaled, plan
    cluster = cluster_lib.cluster_from_config(config)
    transport = make_transport(cluster, config.cluster.peer_timeout_s, server)
    profile = profile_phase(config, chain, workdir, cluster, transport, probes)
    return cluster, transport, profile, plan_phase(config, profile, extra)


def profile_phase(config: ml_collections.ConfigDict, chain: list[bert.Unit], workdir: str,
                  cluster: cluster_lib.Cluster, transport: Any = None,
                  probes: Any = None) -> Profile:
    """Per-unit timings on every device: ``config.profile.path`` if given, else the cached
    ``workdir/profiles/<key>.json`` or a new measurement (:func:`profiler.profile_or_load`)."""
    if config.profile.path:
        profile = load_profile(config.profile.path)
        check_given(profile, config, chain[0].compute_dtype, logging.warning)
        if profile.num_units != len(chain) or profile.num_devices != cluster.num_devices:
            raise ValueError(
                f"config.profile.path={config.profile.path!r} has {profile.num_units} units and "
                f"{profile.num_devices} devices; this run has {len(chain)} units "
                f"({config.allocation.granularity}) and {cluster.num_devices} devices")
        return profile
    return profiler.profile_or_load(
        workdir, Workload.from_config(config), cluster, optim.make_optimizer(config.train),
        Options.from_config(config, host=probes), chain=chain,
        reprofile=bool(config.profile.reprofile), transport=transport, namespace="train")


def plan_phase(config: ml_collections.ConfigDict, profile: Profile,
               extra: ExtraCost | None = None) -> plan_lib.Plan:
    """The plan for the profile (``dynamic`` plans as ``optimal`` and re-plans while training;
    ``allocation.max_pipelines``: up to that many pipelines in data parallel, 0 auto
    (:func:`~skyjax.config.defaults.planned_pipelines`); ``relax``: what it may relax on slow
    links, :mod:`skyjax.relax`)."""
    return plan_lib.plan(profile, config.allocation.strategy, config.pipeline.schedule,
                         config.pipeline.microbatches, extra=extra,
                         max_pipelines=planned_pipelines(config),
                         relax=Relaxation.from_config(config), warmup=config.pipeline.warmup)


def calibration_steps(config: ml_collections.ConfigDict, start_step: int) -> int:
    """``config.allocation.calibrate_steps``, or 0 (logged) where calibration has nothing to do:
    the even split (it plans from no times) or too few steps left to move the units after it."""
    steps = config.allocation.calibrate_steps
    if steps and config.allocation.strategy == "even":
        logging.info("config.allocation.calibrate_steps=%d ignored: the even split does not "
                     "plan from times", steps)
        return 0
    if steps and start_step + steps >= config.train.steps:
        logging.info("config.allocation.calibrate_steps=%d ignored: only %d step(s) left to "
                     "train", steps, config.train.steps - start_step)
        return 0
    return steps


def train_loop(config: ml_collections.ConfigDict, executor, out: outputs.Outputs,
               eval_sets: dict[str, list[Batch]], replanner: Replanner | None = None,
               start_step: int = 0, saver: checkpoint.CheckpointManager | None = None,
               recovery: Recovery | None = None) -> dict:
    """Runs ``config.train.steps`` pipelined steps; returns times, metrics, the last spans, the
    step boundaries of the plan in use at the end (``skyjax.report.compare.step_boundary_s``,
    between consecutive steps after the first with no evaluation or re-plan between them) and
    the executor in use at the end (re-planning, or ``recovery`` from a lost process with
    several pipelines, may have replaced it)."""
    t = config.train
    schedule = optim.learning_rate_schedule(t)
    step_times: list[float] = []
    metrics: dict[str, float] = {}
    evals: list[dict] = []
    boundaries: list[float] = []
    recent: collections.deque = collections.deque(maxlen=RECENT_STEPS)  # the final plan's spans
    last = prev = None
    start = time.perf_counter()
    metric = data_lib.metric(config) if eval_sets else "accuracy"
    regression = config.model.num_labels == 1  # no accuracy to report
    batches = data_lib.StepBatches(data_lib.train_batches(config, start_step), start_step)
    progress = watch.train_progress(config, out.is_chief)  # lines with ETA; a bar on a terminal
    try:
        for step in range(start_step, t.steps):
            # a stop signal whose KeyboardInterrupt Python discarded (skyjax.failures) ends the
            # run here, before another step or checkpoint
            failures.check_stop()
            # the step's batch and the next one's, built ahead by the prefetch thread; none
            # where this process's stage reads no batch (train_step_inputs)
            tic = time.perf_counter()
            args = train_step_inputs(executor, batches, step, t.steps)
            measure = measured_step(config, step, replanner)
            while True:
                try:
                    last = executor.train_step(*args, measure=measure)
                    break
                except PeerLost as e:  # several pipelines: go on without the lost one's
                    if recovery is None:
                        raise
                    executor = recovery(executor, e, step)
                    boundaries, prev = [], None
                    recent.clear()
            step_times.append(time.perf_counter() - tic)
            # a NaN or infinite loss or gradient norm stops the run here, before any checkpoint
            guard.check_step(step, last, lambda: guard.stage_names(executor),
                             lambda: last_checkpoint(saver, start_step))
            # spans are times only in measured steps (dispatch times otherwise)
            if last.measured:
                boundaries += step_boundary_s([prev.spans if prev else [], last.spans])
            if step > start_step and last.measured:  # the first step holds compiles
                recent.append(last.spans)
            # the first step's boundary also holds its first log line and one-off work
            prev = last if step > start_step and last.measured else None
            # a process that does not gather the loss (distributed, not process 0) reports
            # only what it knows: no "loss nan accuracy nan" on its lines
            known = getattr(last, "has_loss", True)
            progress.update(step + 1, last.loss if known else None)
            metrics = {} if not known else {"loss": last.loss} if regression else {
                "loss": last.loss, "accuracy": last.accuracy}
            if log_step(config, step):
                record = {"step": step + 1, **metrics, "learning_rate": float(schedule(step)),
                          "step_time_s": step_times[-1],
                          **watch.step_extras(last, step_times[-1], progress)}
                logging.info("%s", progress.line(record))
                out.log_metrics(record)
            if eval_sets and t.eval_every and (step + 1) % t.eval_every == 0 \
                    and step + 1 < t.steps:
                for split, r in evaluate_splits(executor, eval_sets, step + 1, out,
                                                metric).items():
                    evals.append({"step": step + 1, "split": split, **r})
                prev = None
            if replanner is not None and step + 1 < t.steps:
                replanner.observe(step, last)
                running, executor = executor, replanner.maybe_switch(step, executor)
                if executor is not running:  # another plan: its own boundaries and spans
                    boundaries, prev = [], None
                    recent.clear()
            checkpoint.after_step(saver, step, executor)
    finally:
        progress.close()
        getattr(batches, "close", lambda: None)()
    return {"metrics": metrics, "step_times": step_times, "evals": evals, "last_step": last,
            "boundaries": boundaries, "recent_spans": list(recent),
            "train_time_s": time.perf_counter() - start, "executor": executor}


def train_step_inputs(executor: Any, batches: Any, step: int, steps: int) -> tuple:
    """``executor.train_step``'s arguments for ``step`` of ``steps``: the step's batch and the
    next step's (None after the last step), ready from ``batches`` (a
    :class:`skyjax.data.StepBatches`); both None, skipped, where the executor's stage reads no
    batch."""
    batch, next_batch = batches.take(step, getattr(executor, "needs_batch", True),
                                     step + 1 < steps)
    return step, batch, next_batch


def measured_step(config: ml_collections.ConfigDict, step: int,
                  replanner: Replanner | None = None) -> bool:
    """Whether ``step`` runs measured: its calls block so that its spans are compute times, for
    what reads them (a log line's stage times, the re-planner's and calibration's observations,
    the final report of the last :data:`MEASURED_TAIL` steps). Stages whose calls block anyway
    (CPU, emulation) measure every step; others only these (docs/design.md, "Host waits in a
    step"). The same answer on every process: it depends on the step and the config only."""
    t = config.train
    return (log_step(config, step) or step + MEASURED_TAIL >= t.steps
            or (replanner is not None and replanner.observes(step)))


def log_step(config: ml_collections.ConfigDict, step: int) -> bool:
    """Whether ``step`` writes a metrics line: every ``train.log_every``, the first and the
    last."""
    t = config.train
    return (step + 1) % t.log_every == 0 or step == 0 or step + 1 == t.steps


def last_checkpoint(saver: checkpoint.CheckpointManager | None, start_step: int) -> int | None:
    """The latest committed checkpoint's step (for messages), None when there is none."""
    if saver is not None and saver.every > 0:
        return checkpoint.latest_step(saver.directory)
    return start_step or None


def evaluate_splits(executor, eval_sets: dict[str, list[Batch]], step: int,
                    out: outputs.Outputs, metric: str = "accuracy") -> dict[str, dict]:
    """Every validation split through the pipeline, scored by ``metric``
    (``skyjax.scores``); one metrics.jsonl line per split. A peer mode's replicas are made one
    model first (``runtime.decentralized.average_now``)."""
    results = {}
    if eval_sets:
        average_now(executor, step - 1)
    for split, batches in eval_sets.items():
        results[split] = executor.evaluate(batches, metric)
        logging.info("eval %s at step %d: %s", split, step, results[split])
        out.log_metrics({"step": step, "split": split, **results[split]})
    return results
