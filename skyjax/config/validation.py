"""Checks a config before anything is built or compiled.

``validate_config(config)`` raises ``ValueError`` naming the offending key, e.g.
``config.model.num_attention_heads=3 does not divide config.model.hidden_size=128``.
It checks keys against the schema in :mod:`skyjax.config.defaults` (unknown and missing keys),
value types, the allowed values of enum keys, and relations between keys.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from skyjax import names
from skyjax.cluster import network
from skyjax.config import defaults
from skyjax import scores
from skyjax.data import glue, synthetic, tables, text
from skyjax.data.text import DataError
from skyjax.models import hf_config

_NUMBER = (int, float)


def _fail(msg: str) -> None:
    raise ValueError(msg)


# --------------------------------------------------------------------------------------------
# Schema: keys and types.

def _check_schema(config: Mapping[str, Any], schema: Mapping[str, Any], prefix: str) -> None:
    """Unknown and missing keys and value types, recursively."""
    for key in config.keys():
        if key not in schema:
            known = ", ".join(sorted(schema.keys()))
            _fail(f"{prefix}.{key}: unknown config key (known keys of {prefix}: {known})")
    for key, default in schema.items():
        name = f"{prefix}.{key}"
        if key not in config:
            _fail(f"{name}: missing config key")
        value = config[key]
        if isinstance(default, (ml_collections.ConfigDict, dict)):
            if not isinstance(value, (ml_collections.ConfigDict, dict)):
                _fail(f"{name}={value!r} must be a group of keys, got {type(value).__name__}")
            _check_schema(value, default, name)
        else:
            _check_type(name, value, default)


def _check_type(name: str, value: Any, default: Any) -> None:
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, _NUMBER) and not isinstance(value, bool)
    elif isinstance(default, tuple):
        ok = isinstance(value, (tuple, list))
    else:
        ok = isinstance(value, type(default))
    if not ok:
        _fail(f"{name}={value!r} has type {type(value).__name__}, "
              f"expected {type(default).__name__}")
    if isinstance(default, float) and not math.isfinite(value):
        _fail(f"{name}={value!r} must be a finite number")
    if isinstance(default, int) and not isinstance(default, bool):
        limit = 2**32 - 1 if name.endswith(".seed") else 2**31 - 1  # what the device code takes
        if abs(value) > limit:
            _fail(f"{name}={value} is out of range (at most {limit})")


# --------------------------------------------------------------------------------------------
# Values.

def _one_of(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        _fail(f"{name}={value!r} is not one of {', '.join(map(repr, allowed))}")


def _at_least(name: str, value: float, low: float) -> None:
    if not value >= low:
        _fail(f"{name}={value!r} must be >= {low}")


def _positive(name: str, value: float) -> None:
    if not value > 0:
        _fail(f"{name}={value!r} must be > 0")


def _probability(name: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        _fail(f"{name}={value!r} must be in [0, 1)")


def _unparsed(name: str, text: str) -> None:
    """A numeric tuple flag that is no Python literal (``(1,nan)``: ``nan`` is a name, not a
    number) reaches the config as one string: name the entry that is not a number, not the
    count of one."""
    for item in text.strip("()[] ").split(","):
        try:
            ok = math.isfinite(float(item))
        except ValueError:
            ok = False
        if not ok:
            _fail(f"{name}: {item.strip()!r} in {text!r} is not a finite number")
    _fail(f"{name}={text!r} is not a tuple of numbers")


def _per_device(name: str, values: Sequence[Any], num_devices: int, kind: type | tuple) -> None:
    if kind is not str and len(values) == 1 and isinstance(values[0], str):
        _unparsed(name, values[0])
    if len(values) not in (0, num_devices):
        _fail(f"{name} has {len(values)} entries but config.cluster.num_devices={num_devices} "
              "(give one per device, or () for none)")
    for i, v in enumerate(values):
        if not isinstance(v, kind) or isinstance(v, bool):
            _fail(f"{name}[{i}]={v!r} has type {type(v).__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            _fail(f"{name}[{i}]={v!r} must be a finite number")


def _pretrained_max_positions(path: str) -> int:
    try:
        return int(hf_config.read(path).get("max_position_embeddings", 512))
    except hf_config.PretrainedConfigError as e:
        _fail(str(e))


def _check_model(m: Any) -> int:
    """Checks config.model; returns the model's max_position_embeddings."""
    if m.num_labels < 1:
        _fail(f"config.model.num_labels={m.num_labels} must be >= 1 (1: a regression head)")
    _one_of("config.model.attention", m.attention, names.ATTENTION_PATHS)
    if m.pretrained:  # the shape comes from the checkpoint's config.json
        return _pretrained_max_positions(m.pretrained)
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings", "type_vocab_size"):
        _positive(f"config.model.{key}", m[key])
    if m.hidden_size % m.num_attention_heads:
        _fail(f"config.model.num_attention_heads={m.num_attention_heads} does not divide "
              f"config.model.hidden_size={m.hidden_size}")
    _one_of("config.model.hidden_act", m.hidden_act, defaults.HIDDEN_ACTS)
    _probability("config.model.hidden_dropout_prob", m.hidden_dropout_prob)
    _probability("config.model.attention_probs_dropout_prob", m.attention_probs_dropout_prob)
    _positive("config.model.layer_norm_eps", m.layer_norm_eps)
    _positive("config.model.initializer_range", m.initializer_range)
    if not 0 <= m.pad_token_id < m.vocab_size:
        _fail(f"config.model.pad_token_id={m.pad_token_id} is outside "
              f"[0, config.model.vocab_size={m.vocab_size})")
    return m.max_position_embeddings


def _check_data(config: Any, max_positions: int) -> None:
    d, m = config.data, config.model
    if not (tables.is_files(d.name) or tables.is_hf(d.name)):
        _one_of("config.data.name", d.name, defaults.DATASETS)
    _positive("config.data.batch_size", d.batch_size)
    _at_least("config.data.seq_len", d.seq_len, 4)
    _at_least("config.data.prefetch", d.prefetch, 1)
    if d.seq_len > max_positions:
        _fail(f"config.data.seq_len={d.seq_len} is above "
              f"config.model.max_position_embeddings={max_positions}")
    if d.metric:
        try:
            scores.check_metric(d.metric, m.num_labels)
        except ValueError as e:
            _fail(str(e))
    if d.name in glue.TASKS:
        _check_glue(config)
        return
    if tables.is_files(d.name) or tables.is_hf(d.name):
        _check_tables(config)
        return
    _at_least("config.data.eval_examples", d.eval_examples, 0)
    s = d.synthetic
    _at_least("config.data.synthetic.max_markers", s.max_markers, 1)
    _at_least("config.data.synthetic.min_segment_len", s.min_segment_len, 1)
    need = 3 + 2 * max(s.min_segment_len, s.max_markers)
    if d.seq_len < need:
        _fail(f"config.data.seq_len={d.seq_len} is below {need}: two segments of "
              f"max(config.data.synthetic.min_segment_len={s.min_segment_len}, "
              f"config.data.synthetic.max_markers={s.max_markers}) tokens and 3 special tokens")
    vocab, _, _, where = glue.model_shape(config)  # the pretrained checkpoint's, if any
    if vocab < synthetic.min_vocab_size():
        key = (f"vocab_size={vocab} of {where}" if m.pretrained
               else f"config.model.vocab_size={vocab}")
        _fail(f"{key} is below {synthetic.min_vocab_size()}, the synthetic task's vocabulary")
    if m.num_labels != synthetic.NUM_LABELS:
        _fail(f"config.model.num_labels={m.num_labels} but the synthetic task has "
              f"{synthetic.NUM_LABELS} classes")


def _check_glue(config: Any) -> None:
    """GLUE: label count, tokenizer files and vocabulary size, data_dir (no TFDS import: whether
    the dataset is prepared is checked when the data is built, as is a missing tokenizer)."""
    d = config.data
    if d.eval_examples < -1:
        _fail(f"config.data.eval_examples={d.eval_examples} must be >= -1 (-1 = whole splits)")
    if d.data_dir and "://" not in d.data_dir and not os.path.isdir(d.data_dir):
        _fail(f"config.data.data_dir={d.data_dir!r}: directory not found")
    try:
        glue.check_config(config)
    except glue.DataError as e:
        _fail(str(e))


def _check_tables(config: Any) -> None:
    """Your own data: the keys, then the files (or dataset) read and their labels checked, so
    that a bad line is reported before anything is built."""
    d = config.data
    if d.eval_examples < -1:
        _fail(f"config.data.eval_examples={d.eval_examples} must be >= -1 (-1 = whole splits)")
    try:
        tables.check_keys(config)
        if not tables.is_files(d.name) and d.eval_files:
            _fail(f"config.data.eval_files={tuple(d.eval_files)!r} is for local files; hf: data "
                  "names its held-out splits in config.data.eval_splits")
        task = tables.load(config).task
        text.check_fit(config, task)
    except DataError as e:
        _fail(str(e))


def _check_train(t: Any) -> None:
    _at_least("config.train.steps", t.steps, 1)
    _at_least("config.train.seed", t.seed, 0)
    _positive("config.train.learning_rate", t.learning_rate)
    _one_of("config.train.lr_schedule", t.lr_schedule, defaults.LR_SCHEDULES)
    _at_least("config.train.warmup_steps", t.warmup_steps, 0)
    _at_least("config.train.weight_decay", t.weight_decay, 0.0)
    _probability("config.train.adam_b1", t.adam_b1)
    _probability("config.train.adam_b2", t.adam_b2)
    _positive("config.train.adam_eps", t.adam_eps)
    _at_least("config.train.grad_clip_norm", t.grad_clip_norm, 0.0)
    _at_least("config.train.log_every", t.log_every, 1)
    _at_least("config.train.eval_every", t.eval_every, 0)
    _one_of("config.train.compute_dtype", t.compute_dtype, names.COMPUTE_DTYPE_CHOICES)


def _check_pipeline(config: Any) -> None:
    p = config.pipeline
    _one_of("config.pipeline.schedule", p.schedule, names.SCHEDULE_CHOICES)
    _one_of("config.pipeline.warmup", p.warmup, names.WARMUPS)
    _at_least("config.pipeline.microbatches", p.microbatches, 1)
    _one_of("config.pipeline.sync_actions", p.sync_actions, names.SYNC_ACTIONS)
    if config.data.batch_size % p.microbatches:
        _fail(f"config.pipeline.microbatches={p.microbatches} does not divide "
              f"config.data.batch_size={config.data.batch_size}")


def _check_relax(config: Any) -> None:
    r = config.relax
    _one_of("config.relax.handoff_bits", r.handoff_bits, (32, 16, 8, 4))
    _one_of("config.relax.averaging", r.averaging, names.AVERAGING)
    _at_least("config.relax.outer_every", r.outer_every, 1)
    if not r.outer_lr > 0:
        _fail(f"config.relax.outer_lr={r.outer_lr}: expected a positive learning rate")
    if not 0 <= r.outer_momentum < 1:
        _fail(f"config.relax.outer_momentum={r.outer_momentum}: expected a value in [0, 1)")
    if not 0 <= r.min_gain < 1:
        _fail(f"config.relax.min_gain={r.min_gain}: expected a fraction in [0, 1)")
    relaxed = r.handoff_bits != 32 or r.averaging != "exact"
    a = config.allocation
    if relaxed and (a.strategy != "optimal" or a.calibrate_steps or config.cluster.shared_host):
        _fail(f"config.relax (handoff_bits={r.handoff_bits}, averaging={r.averaging!r}) needs "
              f"config.allocation.strategy='optimal' without calibrate_steps or "
              f"cluster.shared_host: the relaxation is chosen once, by the planner")


def _check_allocation(a: Any, config: Any) -> None:
    _one_of("config.allocation.strategy", a.strategy, names.STRATEGIES)
    _one_of("config.allocation.granularity", a.granularity, names.GRANULARITIES)
    # 0 (auto): the planner chooses; where several pipelines are not planned (strategy other than
    # optimal, calibrate_steps, shared_host) it quietly means one (defaults.planned_pipelines)
    _at_least("config.allocation.max_pipelines", a.max_pipelines, 0)
    if a.max_pipelines > 1:
        if a.max_pipelines > config.pipeline.microbatches:
            _fail(f"config.allocation.max_pipelines={a.max_pipelines} exceeds "
                  f"config.pipeline.microbatches={config.pipeline.microbatches}: each "
                  "pipeline takes at least one micro-batch of every batch")
        if a.strategy != "optimal":
            _fail(f"config.allocation.max_pipelines={a.max_pipelines} needs "
                  f"config.allocation.strategy='optimal' (several pipelines are planned once), "
                  f"got {a.strategy!r}")
        if a.calibrate_steps:
            _fail(f"config.allocation.max_pipelines={a.max_pipelines} cannot be combined with "
                  f"config.allocation.calibrate_steps={a.calibrate_steps}: calibration "
                  "re-plans one pipeline")
        if config.cluster.shared_host:
            _fail(f"config.allocation.max_pipelines={a.max_pipelines} cannot be combined with "
                  "config.cluster.shared_host=True: the shared-host model plans one pipeline")
    _at_least("config.allocation.replan_every", a.replan_every, 0)
    _at_least("config.allocation.calibrate_steps", a.calibrate_steps, 0)
    if a.calibrate_steps == 1:
        _fail("config.allocation.calibrate_steps=1: the first step compiles and is not "
              "measured; use 0 (off) or at least 2")
    if a.replan_every and a.strategy != "dynamic":
        _fail(f"config.allocation.replan_every={a.replan_every} needs "
              f"config.allocation.strategy='dynamic', got {a.strategy!r}")


def _check_cluster(c: Any) -> None:
    _one_of("config.cluster.mode", c.mode, names.MODES)
    _at_least("config.cluster.num_devices", c.num_devices, 1)
    n = c.num_devices
    _per_device("config.cluster.slowdowns", c.slowdowns, n, _NUMBER)
    for i, s in enumerate(c.slowdowns):
        if not s >= 1:
            _fail(f"config.cluster.slowdowns[{i}]={s!r} must be >= 1 (1 = full speed)")
    _per_device("config.cluster.memory_caps_bytes", c.memory_caps_bytes, n, int)
    for i, b in enumerate(c.memory_caps_bytes):
        _at_least(f"config.cluster.memory_caps_bytes[{i}]", b, 0)
    _per_device("config.cluster.regions", c.regions, n, str)
    _at_least("config.cluster.link_latency_s", c.link_latency_s, 0.0)
    _at_least("config.cluster.link_bandwidth_Bps", c.link_bandwidth_Bps, 0.0)
    _check_region_links(c)
    _positive("config.cluster.peer_timeout_s", c.peer_timeout_s)
    addr = c.coordinator_address
    if addr and (":" not in addr or not addr.rsplit(":", 1)[1].isdigit()):
        _fail(f"config.cluster.coordinator_address={addr!r} must be 'host:port' or ''")
    _check_transfer_server(c)


def _check_region_links(c: Any) -> None:
    """``cluster.region_links``: (region, region, latency_s, bandwidth_Bps) of named regions."""
    names_ = set(c.regions)
    for i, entry in enumerate(c.region_links):
        key = f"config.cluster.region_links[{i}]={entry!r}"
        if not (isinstance(entry, Sequence) and not isinstance(entry, str) and len(entry) == 4):
            _fail(f"{key}: expected (region, region, latency_s, bandwidth_Bps)")
        a, b, lat, bw = entry
        if a not in names_ or b not in names_ or a == b:
            _fail(f"{key}: expected two distinct regions of config.cluster.regions "
                  f"({', '.join(sorted(names_)) or 'none set'})")
        if not (isinstance(lat, _NUMBER) and math.isfinite(lat) and lat >= 0):
            _fail(f"{key}: latency {lat!r} must be seconds >= 0")
        if not (isinstance(bw, _NUMBER) and bw >= 0):
            _fail(f"{key}: bandwidth {bw!r} must be bytes per second >= 0 (0 = not emulated)")


def _check_transfer_server(c: Any) -> None:
    """The transfer server's address, port range (this process's environment variable too, when
    the key is empty) and buffers."""
    host = c.transfer_host
    if host and (host != host.strip() or not host.strip("[]") or
                 (":" in host and host.count(":") == 1)):
        _fail(f"config.cluster.transfer_host={host!r} must be an address or host name without "
              "a port, or ''")
    network.port_range(c.transfer_ports)  # ValueError naming the key or the variable
    _at_least("config.cluster.transfer_chunk_bytes", c.transfer_chunk_bytes, 1 << 16)
    _at_least("config.cluster.transfer_parallel_copies", c.transfer_parallel_copies, 1)


def _check_rehearse(config: Any) -> None:
    """A rehearsal takes its devices, links and plan from its profile: keys that would set them
    otherwise, or re-plan from this host's times, are refused by name."""
    r = config.rehearse
    if not (isinstance(r.time_scale, _NUMBER) and math.isfinite(r.time_scale)
            and r.time_scale > 0):
        _fail(f"config.rehearse.time_scale={r.time_scale!r}: expected a positive number")
    if not r.profile:
        return
    if not os.path.isfile(r.profile):
        _fail(f"config.rehearse.profile={r.profile!r}: "
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
            _fail(f"{key}={value!r} cannot be combined with config.rehearse.profile="
                  f"{r.profile!r}: the rehearsed profile declares every device, link and time "
                  "(leave the key at its default)")
    if a.strategy == "dynamic":
        _fail(f"config.allocation.strategy='dynamic' cannot be combined with "
              f"config.rehearse.profile={r.profile!r}: a rehearsal runs the profile's plan "
              "(re-planning would plan from this host's times)")


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Raises ``ValueError`` naming the first bad key; returns None when the config is usable."""
    _check_schema(config, defaults.base_config(), "config")
    _check_rehearse(config)  # first: it says which keys a rehearsal's profile sets
    max_positions = _check_model(config.model)
    _check_data(config, max_positions)
    _check_train(config.train)
    _check_pipeline(config)
    _check_allocation(config.allocation, config)
    _check_relax(config)
    _check_cluster(config.cluster)
    _at_least("config.profile.repeats", config.profile.repeats, 1)
    _at_least("config.profile.passes", config.profile.passes, 1)
    if config.profile.passes > 1 and not config.cluster.shared_host:
        _fail(f"config.profile.passes={config.profile.passes} needs config.cluster.shared_host="
              f"True (several passes serve a host whose speed moves; real devices take one)")
    _at_least("config.checkpoint.every", config.checkpoint.every, 0)
    _at_least("config.checkpoint.keep", config.checkpoint.keep, 0)
    if config.profile.path and not os.path.isfile(config.profile.path):
        _fail(f"config.profile.path={config.profile.path!r}: file not found")
