"""Checks a config before anything is built or compiled.

``validate_config(config)`` raises ``ValueError`` naming the offending key, e.g.
``config.model.num_attention_heads=3 does not divide config.model.hidden_size=128``. It checks
the keys against the schema first (:mod:`skyjax.config.keys`), then each group's values and the
relations between keys: the model, training, the pipeline, the allocation, the relaxation and a
rehearsal here; the data (:mod:`skyjax.config.data_checks`) and the cluster
(:mod:`skyjax.config.cluster_checks`) in modules of their own.
"""

from __future__ import annotations

import math
import os
from typing import Any

import ml_collections

from skyjax import names
from skyjax.config import defaults
from skyjax.config.cluster_checks import check_cluster
from skyjax.config.data_checks import check_data
from skyjax.config.keys import check_keys
from skyjax.config.rules import NUMBER, at_least, fail, one_of, positive, probability
from skyjax.models import hf_config


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Raises ``ValueError`` naming the first bad key; returns None when the config is usable."""
    check_keys(config, defaults.base_config(), "config")
    _check_rehearse(config)  # first: it says which keys a rehearsal's profile sets
    max_positions = _check_model(config.model)
    check_data(config, max_positions)
    _check_train(config.train)
    _check_pipeline(config)
    _check_allocation(config.allocation, config)
    _check_relax(config)
    check_cluster(config.cluster)
    at_least("config.profile.repeats", config.profile.repeats, 1)
    at_least("config.profile.passes", config.profile.passes, 1)
    if config.profile.passes > 1 and not config.cluster.shared_host:
        fail(f"config.profile.passes={config.profile.passes} needs config.cluster.shared_host="
             f"True (several passes serve a host whose speed moves; real devices take one)")
    at_least("config.checkpoint.every", config.checkpoint.every, 0)
    at_least("config.checkpoint.keep", config.checkpoint.keep, 0)
    if config.profile.path and not os.path.isfile(config.profile.path):
        fail(f"config.profile.path={config.profile.path!r}: file not found")


def _check_model(m: Any) -> int:
    """Checks config.model; returns the model's max_position_embeddings (the pretrained
    checkpoint's, when there is one: its config.json gives the shape)."""
    if m.num_labels < 1:
        fail(f"config.model.num_labels={m.num_labels} must be >= 1 (1: a regression head)")
    one_of("config.model.attention", m.attention, names.ATTENTION_PATHS)
    if m.pretrained:
        return _pretrained_max_positions(m.pretrained)
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings", "type_vocab_size"):
        positive(f"config.model.{key}", m[key])
    if m.hidden_size % m.num_attention_heads:
        fail(f"config.model.num_attention_heads={m.num_attention_heads} does not divide "
             f"config.model.hidden_size={m.hidden_size}")
    one_of("config.model.hidden_act", m.hidden_act, defaults.HIDDEN_ACTS)
    probability("config.model.hidden_dropout_prob", m.hidden_dropout_prob)
    probability("config.model.attention_probs_dropout_prob", m.attention_probs_dropout_prob)
    positive("config.model.layer_norm_eps", m.layer_norm_eps)
    positive("config.model.initializer_range", m.initializer_range)
    if not 0 <= m.pad_token_id < m.vocab_size:
        fail(f"config.model.pad_token_id={m.pad_token_id} is outside "
             f"[0, config.model.vocab_size={m.vocab_size})")
    return m.max_position_embeddings


def _pretrained_max_positions(path: str) -> int:
    try:
        return hf_config.max_positions(hf_config.read(path, model_types=hf_config.MODEL_TYPES))
    except hf_config.PretrainedConfigError as e:
        fail(str(e))


def _check_train(t: Any) -> None:
    at_least("config.train.steps", t.steps, 1)
    at_least("config.train.seed", t.seed, 0)
    positive("config.train.learning_rate", t.learning_rate)
    one_of("config.train.lr_schedule", t.lr_schedule, defaults.LR_SCHEDULES)
    at_least("config.train.warmup_steps", t.warmup_steps, 0)
    at_least("config.train.weight_decay", t.weight_decay, 0.0)
    probability("config.train.adam_b1", t.adam_b1)
    probability("config.train.adam_b2", t.adam_b2)
    positive("config.train.adam_eps", t.adam_eps)
    at_least("config.train.grad_clip_norm", t.grad_clip_norm, 0.0)
    at_least("config.train.log_every", t.log_every, 1)
    at_least("config.train.eval_every", t.eval_every, 0)
    one_of("config.train.compute_dtype", t.compute_dtype, names.COMPUTE_DTYPE_CHOICES)


def _check_pipeline(config: Any) -> None:
    p = config.pipeline
    one_of("config.pipeline.schedule", p.schedule, names.SCHEDULE_CHOICES)
    one_of("config.pipeline.warmup", p.warmup, names.WARMUPS)
    at_least("config.pipeline.microbatches", p.microbatches, 1)
    one_of("config.pipeline.sync_actions", p.sync_actions, names.SYNC_ACTIONS)
    if config.data.batch_size % p.microbatches:
        fail(f"config.pipeline.microbatches={p.microbatches} does not divide "
             f"config.data.batch_size={config.data.batch_size}")


def _check_allocation(a: Any, config: Any) -> None:
    one_of("config.allocation.strategy", a.strategy, names.STRATEGIES)
    one_of("config.allocation.granularity", a.granularity, names.GRANULARITIES)
    # 0 (auto): the planner chooses; where several pipelines are not planned (strategy other than
    # optimal, calibrate_steps, shared_host) it quietly means one (defaults.planned_pipelines)
    at_least("config.allocation.max_pipelines", a.max_pipelines, 0)
    if a.max_pipelines > 1:
        if a.max_pipelines > config.pipeline.microbatches:
            fail(f"config.allocation.max_pipelines={a.max_pipelines} exceeds "
                 f"config.pipeline.microbatches={config.pipeline.microbatches}: each "
                 "pipeline takes at least one micro-batch of every batch")
        if a.strategy != "optimal":
            fail(f"config.allocation.max_pipelines={a.max_pipelines} needs "
                 f"config.allocation.strategy='optimal' (several pipelines are planned once), "
                 f"got {a.strategy!r}")
        if a.calibrate_steps:
            fail(f"config.allocation.max_pipelines={a.max_pipelines} cannot be combined with "
                 f"config.allocation.calibrate_steps={a.calibrate_steps}: calibration "
                 "re-plans one pipeline")
        if config.cluster.shared_host:
            fail(f"config.allocation.max_pipelines={a.max_pipelines} cannot be combined with "
                 "config.cluster.shared_host=True: the shared-host model plans one pipeline")
    at_least("config.allocation.replan_every", a.replan_every, 0)
    at_least("config.allocation.calibrate_steps", a.calibrate_steps, 0)
    if a.calibrate_steps == 1:
        fail("config.allocation.calibrate_steps=1: the first step compiles and is not "
             "measured; use 0 (off) or at least 2")
    if a.replan_every and a.strategy != "dynamic":
        fail(f"config.allocation.replan_every={a.replan_every} needs "
             f"config.allocation.strategy='dynamic', got {a.strategy!r}")


def _check_relax(config: Any) -> None:
    """The relaxation's keys, and that the planner chooses it once (an optimal plan, no
    calibration, no shared host)."""
    r = config.relax
    one_of("config.relax.handoff_bits", r.handoff_bits, (32, 16, 8, 4, 2))
    one_of("config.relax.averaging", r.averaging, names.AVERAGING)
    at_least("config.relax.outer_every", r.outer_every, 1)
    if not r.outer_lr > 0:
        fail(f"config.relax.outer_lr={r.outer_lr}: expected a positive learning rate")
    if not 0 <= r.outer_momentum < 1:
        fail(f"config.relax.outer_momentum={r.outer_momentum}: expected a value in [0, 1)")
    if not 0 <= r.min_gain < 1:
        fail(f"config.relax.min_gain={r.min_gain}: expected a fraction in [0, 1)")
    one_of("config.relax.outer_compression", r.outer_compression, names.OUTER_COMPRESSIONS)
    if not 0 < r.outer_topk <= 1:
        fail(f"config.relax.outer_topk={r.outer_topk}: expected a fraction in (0, 1]")
    one_of("config.relax.peers", r.peers, names.PEER_SCHEDULES)
    at_least("config.relax.async_steps", r.async_steps, 0)
    one_of("config.relax.peer_bits", r.get("peer_bits", 32), names.PEER_BITS)
    relaxed = (r.handoff_bits != 32 or r.averaging != "exact" or r.peers != "none"
               or r.async_steps > 0)
    a = config.allocation
    if relaxed and (a.strategy != "optimal" or a.calibrate_steps or config.cluster.shared_host):
        fail(f"config.relax (handoff_bits={r.handoff_bits}, averaging={r.averaging!r}) needs "
             f"config.allocation.strategy='optimal' without calibrate_steps or "
             f"cluster.shared_host: the relaxation is chosen once, by the planner")


def _check_rehearse(config: Any) -> None:
    """A rehearsal takes its devices, links and plan from its profile: keys that would set them
    otherwise, or re-plan from this host's times, are refused by name."""
    r = config.rehearse
    if not (isinstance(r.time_scale, NUMBER) and math.isfinite(r.time_scale)
            and r.time_scale > 0):
        fail(f"config.rehearse.time_scale={r.time_scale!r}: expected a positive number")
    if not r.profile:
        return
    if not os.path.isfile(r.profile):
        fail(f"config.rehearse.profile={r.profile!r}: "
             + ("is a directory, not a profile.json" if os.path.isdir(r.profile)
                else "file not found"))
    c, a = config.cluster, config.allocation
    clash = [("config.profile.path", config.profile.path),
             ("config.cluster.slowdowns", tuple(c.slowdowns)),
             ("config.cluster.memory_caps_bytes", tuple(c.memory_caps_bytes)),
             ("config.cluster.regions", tuple(c.regions)),
             ("config.cluster.link_latency_s", c.link_latency_s),
             ("config.cluster.link_bandwidth_Bps", c.link_bandwidth_Bps),
             ("config.cluster.region_links", tuple(c.region_links)),
             ("config.cluster.shared_host", c.shared_host),
             ("config.allocation.calibrate_steps", a.calibrate_steps)]
    for key, value in clash:
        if value:
            fail(f"{key}={value!r} cannot be combined with config.rehearse.profile="
                 f"{r.profile!r}: the rehearsed profile declares every device, link and time "
                 "(leave the key at its default)")
    if a.strategy == "dynamic":
        fail(f"config.allocation.strategy='dynamic' cannot be combined with "
             f"config.rehearse.profile={r.profile!r}: a rehearsal runs the profile's plan "
             "(re-planning would plan from this host's times)")
