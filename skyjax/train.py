"""Training and evaluation: ``train_and_evaluate(config, workdir) -> summary dict``.

A run goes through the phases of skyjax, each a small function:

1. ``build_model`` / ``bert.units``: the model as a chain of units at ``allocation.granularity``;
2. ``profile_phase``: per-unit times and bytes on each device (``skyjax.profile``, cached);
3. ``plan_phase``: the stages (``skyjax.plan.plan``);
4. ``train_loop`` / eval: the pipeline executors of ``skyjax.runtime`` (local: one thread per
   stage device; distributed: this process's stage under ``jax.distributed``).

Usable from a notebook as well as from ``python -m skyjax.main``. Process 0 writes
``workdir/summary.json`` (atomically), ``plan.json``, ``profile.json``, ``config.json``,
``metrics.jsonl`` and ``trace.json`` (a measured step next to the simulated one, for Perfetto).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

import jax
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import nnx

from skyjax import cluster as cluster_lib, data as data_lib, optim
from skyjax import plan as plan_lib
from skyjax.plan import replan, simulate
from skyjax.profile import profiler
from skyjax.baseline import microbatch_rng
from skyjax.config import validate_config
from skyjax.models import bert
from skyjax.jsonio import write_json_atomic
from skyjax.profile.chain import Workload
from skyjax.profile.format import Profile, load_profile
from skyjax.profile.options import Options
from skyjax.runtime import distributed
from skyjax.runtime.distributed_executor import DistributedExecutor
from skyjax.runtime.local_executor import LocalExecutor
from skyjax.trace import stage_events

Batch = dict[str, np.ndarray]


# --------------------------------------------------------------------------------------------
# Small helpers.

def write_json(path: str, obj: Any) -> None:
    """Writes ``obj`` as JSON to ``path`` atomically (temporary file + ``os.replace``)."""
    write_json_atomic(obj, path, indent=2)


def count_params(tree: Any) -> int:
    return int(sum(x.size for x in jax.tree.leaves(tree)))


def _append_jsonl(path: str, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


# --------------------------------------------------------------------------------------------
# Phase 1: model and units.

def bert_config(config: ml_collections.ConfigDict) -> bert.BertConfig:
    """The model shape from ``config.model`` (random init)."""
    m = config.model
    return bert.BertConfig(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size,
        num_hidden_layers=m.num_hidden_layers, num_attention_heads=m.num_attention_heads,
        intermediate_size=m.intermediate_size, hidden_act=m.hidden_act,
        hidden_dropout_prob=m.hidden_dropout_prob,
        attention_probs_dropout_prob=m.attention_probs_dropout_prob,
        max_position_embeddings=m.max_position_embeddings, type_vocab_size=m.type_vocab_size,
        layer_norm_eps=m.layer_norm_eps, initializer_range=m.initializer_range,
        num_labels=m.num_labels, pad_token_id=m.pad_token_id)


def build_model(config: ml_collections.ConfigDict) -> bert.BertForSequenceClassification:
    """Random init from ``config.model`` (seeded by ``config.train.seed``), or a Hugging Face
    checkpoint when ``config.model.pretrained`` names one."""
    if config.model.pretrained:
        return bert.from_pretrained(config.model.pretrained, num_labels=config.model.num_labels)
    return bert.BertForSequenceClassification(bert_config(config),
                                              rngs=nnx.Rngs(config.train.seed))


# --------------------------------------------------------------------------------------------
# Phases 2 and 3: profile and plan.

def profile_phase(config: ml_collections.ConfigDict, chain: list[bert.Unit], workdir: str,
                  cluster: cluster_lib.Cluster, transport: Any = None) -> Profile:
    """Per-unit timings on every device: ``config.profile.path`` if given, else the cached
    ``workdir/profiles/<key>.json`` or a new measurement (:func:`profiler.profile_or_load`)."""
    if config.profile.path:
        profile = load_profile(config.profile.path)
        if profile.num_units != len(chain) or profile.num_devices != cluster.num_devices:
            raise ValueError(
                f"config.profile.path={config.profile.path!r} has {profile.num_units} units and "
                f"{profile.num_devices} devices; this run has {len(chain)} units "
                f"({config.allocation.granularity}) and {cluster.num_devices} devices")
        return profile
    return profiler.profile_or_load(
        workdir, Workload.from_config(config), cluster, optim.make_optimizer(config.train),
        Options.from_config(config), chain=chain, reprofile=bool(config.profile.reprofile),
        transport=transport, namespace="train")


def plan_phase(config: ml_collections.ConfigDict, profile: Profile) -> plan_lib.Plan:
    """The plan for the profile (``dynamic`` plans as ``optimal``; see the README)."""
    return plan_lib.plan(profile, config.allocation.strategy, config.pipeline.schedule,
                          config.pipeline.microbatches)


# --------------------------------------------------------------------------------------------
# Phase 4: optimizer, executor, loop.

def learning_rate_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
    """Linear warmup from 0, then linear / cosine decay to 0 at the last step, or constant."""
    t = config.train
    warmup = min(t.warmup_steps, t.steps)
    decay_steps = max(t.steps - warmup, 1)
    if t.lr_schedule == "linear":
        decay = optax.linear_schedule(t.learning_rate, 0.0, decay_steps)
    elif t.lr_schedule == "cosine":
        decay = optax.cosine_decay_schedule(t.learning_rate, decay_steps)
    else:
        decay = optax.constant_schedule(t.learning_rate)
    if warmup == 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, t.learning_rate, warmup), decay],
                                [warmup])


def make_optimizer(config: ml_collections.ConfigDict, clip: bool = True
                   ) -> optax.GradientTransformation:
    """AdamW (no decay on biases and LayerNorm), after global-norm clipping when ``clip``.

    Pipeline stages pass ``clip=False``: they clip with the norm over *all* stages themselves.
    """
    t = config.train
    adamw = optax.adamw(learning_rate_schedule(config), b1=t.adam_b1, b2=t.adam_b2, eps=t.adam_eps,
                        weight_decay=t.weight_decay,
                        mask=lambda params: jax.tree.map(lambda p: p.ndim > 1, params))
    if clip and t.grad_clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(t.grad_clip_norm), adamw)
    return adamw


def make_executor(config: ml_collections.ConfigDict, chain: list[bert.Unit],
                  plan: plan_lib.Plan | dict, cluster: cluster_lib.Cluster, transport: Any = None):
    """The executor for ``config.cluster.mode``: all stages here, or this process's stage.
    ``plan``: a Plan (a plan.json dict is read with ``Plan.from_json``)."""
    if isinstance(plan, dict):
        plan = plan_lib.Plan.from_json(plan)
    kwargs = dict(batch_size=config.data.batch_size, seq_len=config.data.seq_len,
                  optimizer=optim.make_optimizer(config.train, clip=False),
                  max_grad_norm=config.train.grad_clip_norm or None,
                  rng=lambda step, mb: microbatch_rng(config.train.seed, step, mb))
    if jax.process_count() > 1:
        me = jax.process_index()
        return DistributedExecutor(chain, plan, transport, me, cluster.jax_devices[me],
                                   slowdown=cluster.slowdown(me), **kwargs)
    return LocalExecutor(chain, plan, cluster.jax_devices,
                         slowdowns=[d.slowdown for d in cluster.devices],
                         links=cluster.links if cluster.emulate_links else None, **kwargs)


def make_transport(cluster: cluster_lib.Cluster) -> Any:
    """The per-process transport under ``jax.distributed`` (None in a single process)."""
    if jax.process_count() == 1:
        return None
    from skyjax.runtime.transport import TransferServerTransport

    me = jax.process_index()
    return TransferServerTransport(me, jax.process_count(), cluster.jax_devices[me],
                                   cluster.links if cluster.emulate_links else None)


def stage_busy(metrics) -> list[float]:
    """Each stage's measured compute in one step (its forward and backward spans)."""
    busy: dict[int, float] = {}
    for r in metrics.results:
        for sp in r.spans:
            busy[sp.stage] = busy.get(sp.stage, 0.0) + sp.end - sp.start
    return [busy[k] for k in sorted(busy)]


class Replanner:
    """``allocation.strategy="dynamic"``: every ``replan_every`` steps, correct the profile with
    the measured stage times and switch plans when that is predicted to pay (``skyjax.plan.replan``)."""

    MIN_GAIN = 0.05

    def __init__(self, config: ml_collections.ConfigDict, profile: Profile, plan: plan_lib.Plan):
        self.every = config.allocation.replan_every if config.allocation.strategy == "dynamic" \
            else 0
        self.profile, self.plan = profile, plan
        self.busy: list[list[float]] = []
        self.history: list[dict] = []
        self._rebuilt_at = -1

    def observe(self, step: int, metrics) -> None:
        """Records a step's stage times (not a compiling step: the first, or one after a switch)."""
        if self.every and step > 0 and step != self._rebuilt_at and jax.process_index() == 0:
            self.busy.append(stage_busy(metrics))

    def maybe_switch(self, step: int, executor):
        """The executor to continue with after ``step`` (a rebuilt one if the plan changes)."""
        if not self.every or (step + 1) % self.every:
            return executor
        info = None
        if jax.process_index() == 0 and self.busy:
            decision = replan.decide(self.profile, self.plan, replan.stage_busy_s(self.busy))
            switch = decision.switch(self.MIN_GAIN)
            info = {"step": step + 1, "switch": switch, **decision.to_json()}
            self.profile = decision.profile
            self.plan = decision.candidate if switch else decision.current
            logging.info("re-plan after step %d: measured/predicted per device %s; %s (%.1f%% "
                         "predicted gain)", step + 1, info["factors"],
                         "switching plans" if switch else "keeping the plan", 100 * decision.gain)
        info = distributed.broadcast_json(info, f"skyjax/replan/{step}")
        self.busy = []
        if info is None:
            return executor
        self.history.append(info)
        if not info["switch"]:
            return executor
        self._rebuilt_at = step + 1
        return executor.rebuild(plan_lib.Plan.from_json(info["candidate"]))


def train_loop(config: ml_collections.ConfigDict, executor, workdir: str, eval_data: list[Batch],
               is_chief: bool, replanner: Replanner | None = None) -> dict:
    """Runs ``config.train.steps`` pipelined steps; returns times, metrics, the last spans and
    the executor in use at the end (re-planning may have replaced it)."""
    t = config.train
    schedule = learning_rate_schedule(config)
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    step_times: list[float] = []
    metrics: dict[str, float] = {}
    evals: list[dict] = []
    last = None
    start = time.perf_counter()
    for step, batch in zip(range(t.steps), data_lib.train_batches(config)):
        tic = time.perf_counter()
        last = executor.train_step(step, batch)
        step_times.append(time.perf_counter() - tic)
        metrics = {"loss": last.loss, "accuracy": last.accuracy}
        if is_chief and ((step + 1) % t.log_every == 0 or step == 0 or step + 1 == t.steps):
            record = {"step": step + 1, **metrics, "learning_rate": float(schedule(step)),
                      "step_time_s": step_times[-1]}
            logging.info("step %d: loss %.4f accuracy %.3f lr %.2e (%.3f s/step)", step + 1,
                         last.loss, last.accuracy, record["learning_rate"], step_times[-1])
            _append_jsonl(metrics_path, record)
        if eval_data and t.eval_every and (step + 1) % t.eval_every == 0 and step + 1 < t.steps:
            result = {"step": step + 1, **executor.evaluate(eval_data)}
            if is_chief:
                logging.info("eval at step %d: %s", step + 1, result)
                _append_jsonl(metrics_path, result)
            evals.append(result)
        if replanner is not None and step + 1 < t.steps:
            replanner.observe(step, last)
            executor = replanner.maybe_switch(step, executor)
    return {"metrics": metrics, "step_times": step_times, "evals": evals, "last_step": last,
            "train_time_s": time.perf_counter() - start, "executor": executor}


# --------------------------------------------------------------------------------------------
# Outputs.

def trace_json(plan: plan_lib.Plan, profile: Profile, last_step) -> dict:
    """A measured step's per-stage spans (pid 0) beside the simulator's trace of the plan."""
    spans = [s for r in (last_step.results if last_step else []) for s in r.spans]
    events = stage_events(spans, pid=0, name="measured step")
    simulated = simulate.simulate_plan(plan, profile).trace["traceEvents"]
    for e in simulated:
        e["pid"] = 10 + e.get("pid", 0)
        if e.get("name") == "process_name":
            e["args"] = {"name": f"simulated: {e['args']['name']}"}
    return {"traceEvents": events + simulated, "displayTimeUnit": "ms"}


def make_summary(config: ml_collections.ConfigDict, plan: dict, result: dict, final_eval: dict,
                 num_units: int, num_params: int, wall_s: float) -> dict:
    """The summary.json record of a finished run."""
    times = result["step_times"]
    steady = times[1:] or times  # the first step includes compilation
    median = statistics.median(steady)
    predicted = plan["step_time_s"]
    return {
        "steps": config.train.steps,
        "final_loss": result["metrics"].get("loss"),
        "final_train_accuracy": result["metrics"].get("accuracy"),
        "eval_accuracy": final_eval.get("eval_accuracy"),
        "eval_loss": final_eval.get("eval_loss"),
        "eval_examples": final_eval.get("eval_examples", 0),
        "evals": result["evals"],
        "step_time_s": median,
        "predicted_step_time_s": predicted,
        "prediction_error": (median - predicted) / median if predicted else None,
        "first_step_s": times[0],
        "train_time_s": result["train_time_s"],
        "wall_time_s": wall_s,
        "examples_per_s": config.data.batch_size / median,
        "num_params": num_params,
        "num_units": num_units,
        "num_stages": len(plan["stages"]),
        "mode": config.cluster.mode,
        "processes": jax.process_count(),
        "plan": plan,
        "replans": result.get("replans", []),
        "devices": [str(d) for d in jax.devices()],
        "jax_version": jax.__version__,
    }


# --------------------------------------------------------------------------------------------
# The whole run.

def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Profile -> plan -> train -> eval; process 0 writes ``workdir/summary.json`` and returns it
    (other processes return the same summary without writing)."""
    wall_start = time.perf_counter()
    validate_config(config)
    is_chief = jax.process_index() == 0
    if is_chief:
        os.makedirs(workdir, exist_ok=True)
        write_json(os.path.join(workdir, "config.json"), config.to_dict())
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    if is_chief and os.path.exists(metrics_path):
        os.remove(metrics_path)

    model = build_model(config)
    chain = bert.units(model, config.allocation.granularity)
    num_params = count_params([u.params for u in chain])
    logging.info("model: %d units at %s granularity, %d parameters", len(chain),
                 config.allocation.granularity, num_params)
    cluster = cluster_lib.cluster_from_config(config)
    transport = make_transport(cluster)
    profile = profile_phase(config, chain, workdir, cluster, transport)
    plan = plan_phase(config, profile)
    plan_json = plan.to_json()
    if is_chief:
        write_json(os.path.join(workdir, "plan.json"), plan_json)
        logging.info("plan (%s, %s, m=%d): %s; predicted step %.4f s", plan.strategy,
                     plan.schedule, plan.microbatches,
                     ", ".join(f"device {s.device}: units [{s.units[0]}, {s.units[1]})"
                               for s in plan.stages), plan.step_time_s)

    executor = make_executor(config, chain, plan_json, cluster, transport)
    del model, chain  # the stages hold their own copies
    eval_data = data_lib.eval_batches(config) if config.data.eval_examples else []
    replanner = Replanner(config, profile, plan)
    try:
        result = train_loop(config, executor, workdir, eval_data, is_chief, replanner)
        executor = result.pop("executor")
        final_eval = executor.evaluate(eval_data) if eval_data else {}
    finally:
        executor.close()
    if replanner.history:  # the plan in use at the end, on the measured-corrected profile
        plan, profile = replanner.plan, replanner.profile
        plan_json = plan.to_json()
        result["replans"] = replanner.history
        if is_chief:
            write_json(os.path.join(workdir, "plan.json"), plan_json)
    summary = make_summary(config, plan_json, result, final_eval, len(profile.units), num_params,
                           time.perf_counter() - wall_start)
    if is_chief:
        if final_eval:
            logging.info("final eval: %s", final_eval)
            _append_jsonl(metrics_path, {"step": config.train.steps, **final_eval})
        write_json(os.path.join(workdir, "trace.json"),
                   trace_json(plan, profile, result["last_step"]))
        write_json(os.path.join(workdir, "summary.json"), summary)
        logging.info("summary: eval_accuracy %s, final_loss %.4f, median step %.4f s "
                     "(predicted %.4f s), wall %.1f s", summary["eval_accuracy"],
                     summary["final_loss"], summary["step_time_s"],
                     summary["predicted_step_time_s"], summary["wall_time_s"])
    return summary
