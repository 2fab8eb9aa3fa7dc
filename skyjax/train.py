"""Training and evaluation: ``train_and_evaluate(config, workdir) -> summary dict``.

The run goes through four phases, each a small function, so that the profiler, the planner and
the pipeline runtime slot in one at a time:

1. ``build_model`` / ``bert.units``: the model as a chain of units at ``allocation.granularity``;
2. ``profile_phase``: per-unit times on each device (not yet: returns None);
3. ``plan_phase``: the stages (for now one stage on device 0 holding every unit);
4. ``train_loop`` and ``evaluate``: jitted steps over the composed units, optax AdamW.

Usable from a notebook as well as from ``python -m skyjax.main``. Writes ``workdir/summary.json``
(atomically), ``workdir/plan.json``, ``workdir/config.json`` and ``workdir/metrics.jsonl``.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import nnx

from skyjax import data as data_lib
from skyjax.config_validation import validate_config
from skyjax.models import bert

Params = list[dict[str, Any]]  # one pure param dict per unit
Batch = dict[str, np.ndarray]

# Streams folded into the root key jax.random.PRNGKey(config.train.seed).
_DROPOUT_STREAM = 1


# --------------------------------------------------------------------------------------------
# Small helpers.

def write_json(path: str, obj: Any) -> None:
    """Writes ``obj`` as JSON to ``path`` atomically (temporary file + ``os.replace``)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp_", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def microbatch_rng(seed: int, step: int, microbatch: int) -> jax.Array:
    """The dropout key of one micro-batch: the same on every stage and for every plan."""
    key = jax.random.fold_in(jax.random.PRNGKey(seed), _DROPOUT_STREAM)
    return jax.random.fold_in(jax.random.fold_in(key, step), microbatch)


def global_norm(tree: Any) -> jax.Array:
    """The L2 norm of all leaves together."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def count_params(tree: Any) -> int:
    return int(sum(x.size for x in jax.tree.leaves(tree)))


def tree_bytes(tree: Any) -> int:
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


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

def profile_phase(config: ml_collections.ConfigDict, chain: list[bert.Unit],
                  workdir: str) -> dict | None:
    """Per-unit, per-device timings (profile.json). Single-device runs need none yet."""
    del config, chain, workdir
    return None


def plan_phase(config: ml_collections.ConfigDict, chain: list[bert.Unit],
               profile: dict | None) -> dict:
    """The plan (plan.json form). For now: one stage on device 0 with every unit."""
    del profile
    c = config.cluster
    if c.mode != "local" or c.num_devices != 1 or any(s != 1 for s in c.slowdowns):
        raise NotImplementedError(
            f"config.cluster.mode={c.mode!r}, config.cluster.num_devices={c.num_devices}, "
            f"config.cluster.slowdowns={tuple(c.slowdowns)}: only one local device without "
            "emulated slow-downs is implemented yet (the pipeline runtime comes next)")
    # params + grads + two Adam moments, all float32 like the params.
    state_bytes = 4 * sum(tree_bytes(u.params) for u in chain)
    return {"strategy": config.allocation.strategy, "schedule": config.pipeline.schedule,
            "microbatches": config.pipeline.microbatches,
            "stages": [{"device": 0, "units": [0, len(chain)], "compute_s": None, "comm_s": 0.0,
                        "memory_bytes": state_bytes}],
            "step_time_s": None, "bottleneck_s": None, "exact": True}


# --------------------------------------------------------------------------------------------
# Phase 4: optimizer, steps, loops.

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


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """AdamW (no decay on biases and LayerNorm) after global-norm clipping."""
    t = config.train
    adamw = optax.adamw(learning_rate_schedule(config), b1=t.adam_b1, b2=t.adam_b2, eps=t.adam_eps,
                        weight_decay=t.weight_decay,
                        mask=lambda params: jax.tree.map(lambda p: p.ndim > 1, params))
    if t.grad_clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(t.grad_clip_norm), adamw)
    return adamw


def forward(chain: list[bert.Unit], params: Params, batch: Batch, rng: jax.Array | None,
            train: bool) -> jax.Array:
    """Logits of the composed units."""
    carry = bert.initial_carry(batch["input_ids"], batch["token_type_ids"],
                               batch["attention_mask"])
    return bert.apply_units(chain, params, carry, rng, train)["logits"]


def make_train_step(chain: list[bert.Unit], optimizer: optax.GradientTransformation,
                    seed: int, microbatches: int) -> Callable:
    """``step(params, opt_state, batch, step) -> (params, opt_state, metrics)``, jitted.

    The batch is split into ``microbatches`` equal micro-batches whose gradients are averaged
    (what a pipeline computes), each with dropout key ``microbatch_rng(seed, step, i)``.
    """

    def loss_fn(params: Params, mb: Batch, rng: jax.Array):
        loss, acc = bert.classification_loss(forward(chain, params, mb, rng, True), mb["labels"])
        return loss, acc

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def step_fn(params: Params, opt_state: Any, batch: Batch, step: jax.Array):
        split = jax.tree.map(lambda x: x.reshape(microbatches, -1, *x.shape[1:]), batch)

        def accumulate(acc, i):
            mb = jax.tree.map(lambda x: x[i], split)
            (loss, accuracy), grads = grad_fn(params, mb, microbatch_rng(seed, step, i))
            acc = jax.tree.map(jnp.add, acc, (grads, loss, accuracy))
            return acc, None

        zeros = (jax.tree.map(jnp.zeros_like, params), jnp.zeros(()), jnp.zeros(()))
        (grads, loss, accuracy), _ = jax.lax.scan(accumulate, zeros, jnp.arange(microbatches))
        grads, loss, accuracy = jax.tree.map(lambda x: x / microbatches, (grads, loss, accuracy))
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {"loss": loss, "accuracy": accuracy, "grad_norm": global_norm(grads)}
        return params, opt_state, metrics

    return jax.jit(step_fn, donate_argnums=(0, 1))


def make_eval_step(chain: list[bert.Unit]) -> Callable:
    """``eval_step(params, batch) -> sums of (loss, correct, weight)``, jitted; uses ``weights``."""

    def eval_fn(params: Params, batch: Batch):
        logits = forward(chain, params, batch, None, False)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, batch["labels"][:, None], axis=-1)[:, 0]
        correct = (jnp.argmax(logits, axis=-1) == batch["labels"]).astype(jnp.float32)
        w = batch["weights"]
        return {"loss": jnp.sum(nll * w), "correct": jnp.sum(correct * w), "count": jnp.sum(w)}

    return jax.jit(eval_fn)


def evaluate(eval_step: Callable, params: Params, batches: Iterable[Batch]) -> dict[str, float]:
    """Mean loss and accuracy over the weighted eval examples."""
    totals = {"loss": 0.0, "correct": 0.0, "count": 0.0}
    for batch in batches:
        for k, v in eval_step(params, batch).items():
            totals[k] += float(v)
    n = max(totals["count"], 1.0)
    return {"eval_loss": totals["loss"] / n, "eval_accuracy": totals["correct"] / n,
            "eval_examples": int(totals["count"])}


def _append_jsonl(path: str, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def train_loop(config: ml_collections.ConfigDict, chain: list[bert.Unit], params: Params,
               workdir: str, eval_fn: Callable[[Params], dict[str, float]] | None) -> dict:
    """Runs ``config.train.steps`` optimizer steps; returns params, times and last metrics."""
    t = config.train
    optimizer = make_optimizer(config)
    opt_state = optimizer.init(params)
    train_step = make_train_step(chain, optimizer, t.seed, config.pipeline.microbatches)
    schedule = learning_rate_schedule(config)
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    step_times: list[float] = []
    metrics: dict[str, float] = {}
    evals: list[dict] = []
    start = time.perf_counter()
    for step, batch in zip(range(t.steps), data_lib.train_batches(config)):
        tic = time.perf_counter()
        params, opt_state, out = train_step(params, opt_state, batch, jnp.int32(step))
        out = jax.block_until_ready(out)
        step_times.append(time.perf_counter() - tic)
        if (step + 1) % t.log_every == 0 or step == 0 or step + 1 == t.steps:
            metrics = {k: float(v) for k, v in out.items()}
            record = {"step": step + 1, **metrics, "learning_rate": float(schedule(step)),
                      "step_time_s": step_times[-1]}
            logging.info("step %d: loss %.4f accuracy %.3f grad_norm %.3f lr %.2e (%.3f s/step)",
                         step + 1, metrics["loss"], metrics["accuracy"], metrics["grad_norm"],
                         record["learning_rate"], step_times[-1])
            _append_jsonl(metrics_path, record)
        if eval_fn and t.eval_every and (step + 1) % t.eval_every == 0 and step + 1 < t.steps:
            result = {"step": step + 1, **eval_fn(params)}
            logging.info("eval at step %d: %s", step + 1, result)
            _append_jsonl(metrics_path, result)
            evals.append(result)
    return {"params": params, "metrics": metrics, "step_times": step_times, "evals": evals,
            "train_time_s": time.perf_counter() - start}


# --------------------------------------------------------------------------------------------
# The whole run.

def make_summary(config: ml_collections.ConfigDict, plan: dict, result: dict,
                 final_eval: dict, num_units: int, wall_s: float) -> dict:
    """The summary.json record of a finished run."""
    times = result["step_times"]
    steady = times[1:] or times  # the first step includes compilation
    median = statistics.median(steady)
    return {
        "steps": config.train.steps,
        "final_loss": result["metrics"].get("loss"),
        "final_train_accuracy": result["metrics"].get("accuracy"),
        "eval_accuracy": final_eval.get("eval_accuracy"),
        "eval_loss": final_eval.get("eval_loss"),
        "eval_examples": final_eval.get("eval_examples", 0),
        "evals": result["evals"],
        "step_time_s": median,
        "predicted_step_time_s": plan["step_time_s"],
        "first_step_s": times[0],
        "train_time_s": result["train_time_s"],
        "wall_time_s": wall_s,
        "examples_per_s": config.data.batch_size / median,
        "num_params": count_params(result["params"]),
        "num_units": num_units,
        "plan": plan,
        "devices": [str(d) for d in jax.devices()],
        "jax_version": jax.__version__,
    }


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Profile -> plan -> train -> eval; writes ``workdir/summary.json`` and returns it."""
    wall_start = time.perf_counter()
    validate_config(config)
    os.makedirs(workdir, exist_ok=True)
    write_json(os.path.join(workdir, "config.json"), config.to_dict())
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(metrics_path):
        os.remove(metrics_path)

    model = build_model(config)
    chain = bert.units(model, config.allocation.granularity)
    logging.info("model: %d units at %s granularity, %d parameters", len(chain),
                 config.allocation.granularity, count_params([u.params for u in chain]))
    profile = profile_phase(config, chain, workdir)
    plan = plan_phase(config, chain, profile)
    write_json(os.path.join(workdir, "plan.json"), plan)

    eval_data = data_lib.eval_batches(config) if config.data.eval_examples else []
    eval_step = make_eval_step(chain)
    eval_fn = (lambda p: evaluate(eval_step, p, eval_data)) if eval_data else None
    params = jax.tree.map(jnp.copy, [u.params for u in chain])  # donated: keep the units' own
    result = train_loop(config, chain, params, workdir, eval_fn)
    final_eval = eval_fn(result["params"]) if eval_fn else {}
    if final_eval:
        logging.info("final eval: %s", final_eval)
        _append_jsonl(metrics_path, {"step": config.train.steps, **final_eval})

    summary = make_summary(config, plan, result, final_eval, len(chain),
                           time.perf_counter() - wall_start)
    write_json(os.path.join(workdir, "summary.json"), summary)
    logging.info("summary: eval_accuracy %s, final_loss %.4f, median step %.4f s, wall %.1f s",
                 summary["eval_accuracy"], summary["final_loss"], summary["step_time_s"],
                 summary["wall_time_s"])
    return summary
