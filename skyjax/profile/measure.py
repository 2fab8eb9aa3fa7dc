"""Measures what the planner needs, on the devices that will run the plan: ``profile.json``.

For every unit of the model chain and every device of the :class:`~skyjax.cluster.Cluster`:

* ``forward_s`` / ``backward_s``: one micro-batch through the unit, timed through the runtime's own
  :class:`~skyjax.runtime.stage.StageProgram` (a single-unit stage: jitted forward that keeps the
  ``jax.vjp`` residuals, jitted backward that applies them; the last unit includes the loss) and
  :func:`skyjax.cluster.timed_call` (the same slow-down emulation the runtime uses). Compilation
  and warm-up calls are excluded; the mean of the fastest half of the repeats is kept
  (:func:`robust_time`). Devices are measured one
  after another, interleaved repeat by repeat so that load drift on a shared host hits them all.
  The number of repeats shrinks for big units (a time budget per unit and device, at least
  ``min_repeats``).
* ``state_bytes``: params + gradients + optimizer state, exactly from the pytrees
  (``jax.eval_shape`` of the optimizer's ``init``: AdamW keeps two more copies);
  ``activation_bytes``: the residual arrays the stage's forward returns (what backward needs, per
  micro-batch in flight); ``output_bytes``: the unit's output carry (the message to the next
  stage). ``memory_analysis()`` of the compiled forward/backward is recorded as extra keys.
* device memory: the emulated cap, else the backend's ``bytes_limit``, else host RAM shared by
  this process's devices.
* links: ping-pong transfers of two sizes between every pair of devices through the transfer
  path (``jax.device_put`` + :class:`~skyjax.cluster.LinkEmulation` in one process, the
  runtime's :class:`Transport` across processes); latency and bandwidth from the two sizes.

Identical units (encoder layers: same kind, parameter shapes and input shapes) are measured once
and reused; identical devices (same kind, same emulated slow-down) likewise. A model given only by
its config is profiled on a one-layer skeleton whose layer stands for every layer, so BERT-large
with 160 layers costs no more than one layer.

Profiles are cached under ``workdir/profiles/<key>.json`` where the key hashes everything that
changes the numbers (:func:`cache_key`); :func:`profile_or_load` reuses them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
import warnings
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from skyjax import cluster as cluster_lib
from skyjax.models import bert
from skyjax.profile.format import Profile, ProfileError, load_profile, save_profile
from skyjax.runtime.transport import tree_nbytes as tree_bytes

PROFILER_VERSION = 1
MAX_BANDWIDTH_Bps = 1e13  # reported when a transfer's time does not grow with its size
Log = Callable[[str], None]


@dataclasses.dataclass
class Options:
    """How hard to measure. ``repeats``: most timed repetitions per unit and device;
    ``budget_s``: timing budget per unit class and device class, which lowers the repeats of big
    units down to ``min_repeats``; ``dedup_units`` / ``dedup_devices``: measure identical units /
    devices once; ``link_sizes``: the two message sizes of the link probes (bytes)."""

    repeats: int = 5
    min_repeats: int = 3
    budget_s: float = 3.0
    dedup_units: bool = True
    dedup_devices: bool = True
    link_sizes: tuple[int, int] = (1 << 10, 1 << 20)
    link_repeats: int = 5
    memory_analysis: bool = True

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> "Options":
        repeats = int(getattr(getattr(config, "profile", None), "repeats", cls.repeats))
        opts = cls(repeats=repeats, min_repeats=min(cls.min_repeats, repeats))
        return dataclasses.replace(opts, **overrides)


# ------------------------------------------------------------------------------- helpers

def _shapes(tree: Any) -> Any:
    return jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), tree)


def microbatch_shape(config: Any) -> tuple[int, int]:
    """``(micro-batch size, seq_len)`` of a config."""
    size = int(config.data.batch_size) // max(int(config.pipeline.microbatches), 1)
    return max(size, 1), int(config.data.seq_len)


def model_config(config: Any) -> bert.BertConfig:
    """The model's shape: from ``config.model``, or the pretrained directory's config.json."""
    m = config.model
    if getattr(m, "pretrained", ""):
        with open(os.path.join(m.pretrained, "config.json")) as f:
            return bert.BertConfig.from_hf(json.load(f), num_labels=int(m.num_labels))
    from skyjax import train  # lazily: train imports this module

    return train.bert_config(config)


def _optimizer(config: Any):
    """The training optimizer (for the exact size of its state)."""
    try:
        from skyjax import train

        return train.make_optimizer(config)
    except Exception:  # noqa: BLE001 - configs without train keys: plain AdamW
        from skyjax.runtime.stage import make_optimizer

        return make_optimizer(1e-3)


def _optimizer_desc(config: Any) -> dict:
    t = getattr(config, "train", None)
    clip = float(getattr(t, "grad_clip_norm", 0.0) or 0.0) if t is not None else 0.0
    return {"name": "adamw", "clip": clip > 0}


def robust_time(xs: Sequence[float]) -> float:
    """Mean of the fastest half (rounded up) of the repeats. Interference from other processes
    only ever adds time, so the fast half is the least disturbed; on this 2-core shared host it
    kept device ratios within a few % where the median drifted by up to 30%."""
    xs = sorted(xs)
    return float(np.mean(xs[:max((len(xs) + 1) // 2, 1)]))


def _fmt_s(s: float) -> str:
    return f"{s * 1e3:8.2f} ms" if s < 10 else f"{s:8.2f} s "


def _fmt_b(b: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{int(b)} B"


# --------------------------------------------------------------------------------- chains

@dataclasses.dataclass
class ChainSpec:
    """The units to measure (``chain``) and the full model's units as indices into it."""

    chain: list[bert.Unit]
    names: list[str]  # one per unit of the full model
    rep: list[int]  # full-model unit -> index into chain
    kinds: list[str]
    param_bytes: list[int]  # per full-model unit


def full_chain(chain: list[bert.Unit]) -> ChainSpec:
    n = len(chain)
    return ChainSpec(chain, [u.name for u in chain], list(range(n)), [u.kind for u in chain],
                     [tree_bytes(u.params) for u in chain])


def skeleton_chain(mcfg: bert.BertConfig, granularity: str, seed: int = 0) -> ChainSpec:
    """A one-layer model's units standing for the ``mcfg.num_hidden_layers`` identical layers."""
    from flax import nnx

    layers = mcfg.num_hidden_layers
    small = bert.BertForSequenceClassification(dataclasses.replace(mcfg, num_hidden_layers=1),
                                               rngs=nnx.Rngs(seed))
    chain = bert.units(small, granularity)
    per_layer = len(chain) - 2
    names, rep = [chain[0].name], [0]
    for i in range(layers):
        for j in range(per_layer):
            names.append(chain[1 + j].name.replace("layer_0", f"layer_{i}", 1))
            rep.append(1 + j)
    names.append(chain[-1].name)
    rep.append(len(chain) - 1)
    return ChainSpec(chain, names, rep, [chain[r].kind for r in rep],
                     [tree_bytes(chain[r].params) for r in rep])


def _chain_spec(config: Any, mcfg: bert.BertConfig, chain: list[bert.Unit] | None,
                options: "Options") -> ChainSpec:
    """The given chain, else a skeleton (identical layers measured once) or, with
    ``dedup_units=False``, the whole model."""
    granularity = str(config.allocation.granularity)
    if chain is not None:
        return full_chain(chain)
    if options.dedup_units:
        return skeleton_chain(mcfg, granularity)
    from flax import nnx

    model = bert.BertForSequenceClassification(mcfg, rngs=nnx.Rngs(0))
    return full_chain(bert.units(model, granularity))


def sample_microbatch(mcfg: bert.BertConfig, size: int, seq_len: int, seed: int = 0
                      ) -> tuple[dict, np.ndarray]:
    """A random micro-batch (first unit's carry, labels) of the profiled shape."""
    rs = np.random.RandomState(seed)
    ids = rs.randint(1, mcfg.vocab_size, size=(size, seq_len)).astype(np.int32)
    types = np.zeros_like(ids)
    types[:, seq_len // 2:] = 1 if mcfg.type_vocab_size > 1 else 0
    mask = np.ones_like(ids)
    labels = rs.randint(0, mcfg.num_labels, size=(size,)).astype(np.int32)
    return bert.initial_carry(ids, types, mask), labels


# ------------------------------------------------------------------------ unit measurement

@dataclasses.dataclass
class _UnitResult:
    forward_s: dict  # device class -> seconds
    backward_s: dict
    activation_bytes: int
    repeats: int
    out_carry: Any
    memory: dict  # memory_analysis figures
    compile_s: float
    samples: tuple = ()  # raw (forward, backward) seconds per device class


def _stage_program(unit: bert.Unit, is_last: bool):
    from skyjax.runtime.stage import StageProgram

    return StageProgram([unit], is_last=is_last, microbatches=1, optimizer=None, train=True)


def _memory_analysis(compiled) -> dict:
    try:
        ma = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend has it
        return {}
    if ma is None:
        return {}
    return {k: int(getattr(ma, k)) for k in ("temp_size_in_bytes", "argument_size_in_bytes",
                                             "output_size_in_bytes") if hasattr(ma, k)}


def _measure_unit(unit: bert.Unit, is_last: bool, carry: Any, labels: np.ndarray,
                  targets: list[tuple[Any, float]], options: Options) -> _UnitResult:
    """Times one unit on each ``(jax device, slowdown)`` target (interleaved repeats)."""
    prog = _stage_program(unit, is_last)
    states = []
    compile_s = 0.0
    estimate = 0.0
    activation_bytes = 0
    out_carry = None
    memory: dict = {}
    for k, (dev, slowdown) in enumerate(targets):
        params = jax.device_put([unit.params], dev)
        c = jax.device_put(carry, dev)
        rng = jax.device_put(jax.random.PRNGKey(0), dev)
        lab = jax.device_put(labels, dev) if is_last else None
        grads = jax.tree.map(jnp.zeros_like, params)
        # Compiled ahead of time for this device (the executable the jitted call would run),
        # which also gives its memory_analysis() without compiling twice.
        tic = time.perf_counter()
        fwd_c = prog.forward.lower(params, c, rng, lab).compile()
        out, res = cluster_lib.block(fwd_c(params, c, rng, lab))
        ct = None if is_last else {key: jnp.ones_like(v) for key, v in out.items()
                                   if jnp.issubdtype(v.dtype, jnp.floating)}
        bwd_c = prog.backward.lower(params, res, ct, grads).compile()
        grads, _ = cluster_lib.block(bwd_c(params, res, ct, grads))
        compile_s += time.perf_counter() - tic
        if k == 0:
            activation_bytes = tree_bytes(res)
            out_carry = out
            if options.memory_analysis:
                memory = {f"forward_{k2}": v for k2, v in _memory_analysis(fwd_c).items()}
                memory.update({f"backward_{k2}": v for k2, v in _memory_analysis(bwd_c).items()})
        # One warm-up call each, not kept; it sizes the number of repeats.
        (_, res), tf = cluster_lib.timed_call(fwd_c, params, c, rng, lab, slowdown=slowdown)
        (grads, _), tb = cluster_lib.timed_call(bwd_c, params, res, ct, grads, slowdown=slowdown)
        estimate = max(estimate, tf + tb)
        states.append([params, c, rng, lab, ct, grads, res, fwd_c, bwd_c])
    repeats = int(min(options.repeats,
                      max(options.min_repeats, options.budget_s // max(estimate, 1e-9))))
    fwd = {k: [] for k in range(len(targets))}
    bwd = {k: [] for k in range(len(targets))}
    n = len(targets)
    for r in range(repeats):
        # Rotating the order spreads over all devices whatever the host does after the longest
        # emulated sleep (other processes grab the cores), instead of always hitting device 0.
        for k in [(r + i) % n for i in range(n)]:
            slowdown = targets[k][1]
            params, c, rng, lab, ct, grads, res, fwd_c, bwd_c = states[k]
            del res
            states[k][6] = None  # free the previous residuals before the next forward
            # Each timed call directly follows an untimed one of the same program: after an
            # idle gap (another device's emulated sleep) the first call runs up to 2x slower on
            # a shared VM (cold caches / reclaimed pages), which would bias the device measured
            # right after a slow one.
            cluster_lib.block(fwd_c(params, c, rng, lab))
            (_, res), tf = cluster_lib.timed_call(fwd_c, params, c, rng, lab, slowdown=slowdown)
            grads, _ = cluster_lib.block(bwd_c(params, res, ct, grads))
            (grads, _), tb = cluster_lib.timed_call(bwd_c, params, res, ct, grads, slowdown=slowdown)
            states[k][5], states[k][6] = grads, res
            fwd[k].append(tf)
            bwd[k].append(tb)
    del states
    return _UnitResult({k: robust_time(v) for k, v in fwd.items()},
                       {k: robust_time(v) for k, v in bwd.items()},
                       activation_bytes, repeats, out_carry, memory, compile_s, (fwd, bwd))


def _signature(unit: bert.Unit, is_last: bool, carry: Any) -> tuple:
    return (unit.kind, is_last, jax.tree.structure(unit.params), str(_shapes(unit.params)),
            str(_shapes(carry)))


def device_classes(cluster: cluster_lib.Cluster, dedup: bool,
                   only: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
    """``(representative device of each class, class of each device)``; a class = same kind,
    process and slow-down (only those devices in ``only`` are measured; others get class -1)."""
    reps: list[int] = []
    keys: dict = {}
    cls = []
    for d, spec in enumerate(cluster.devices):
        if only is not None and d not in only:
            cls.append(-1)
            continue
        key = (spec.kind, spec.process_index, spec.slowdown) if dedup else d
        if key not in keys:
            keys[key] = len(reps)
            reps.append(d)
        cls.append(keys[key])
    return reps, cls


def measure_units(spec: ChainSpec, mcfg: bert.BertConfig, microbatch: tuple[int, int],
                  cluster: cluster_lib.Cluster, options: Options, optimizer: Any,
                  log: Log, only_devices: Sequence[int] | None = None) -> dict:
    """Times and sizes every unit of ``spec`` on the cluster's devices (or ``only_devices``).

    Returns ``units`` (profile records), ``forward_s`` / ``backward_s`` ``[U, D]`` (NaN for
    devices not measured) and ``compile_s``.
    """
    reps, cls = device_classes(cluster, options.dedup_devices, only_devices)
    targets = [(cluster.jax_devices[d], cluster.devices[d].slowdown) for d in reps]
    carry, labels = sample_microbatch(mcfg, *microbatch)
    n_chain = len(spec.chain)
    measured: dict[tuple, tuple[int, _UnitResult]] = {}
    per_chain: list[tuple[int, _UnitResult]] = []  # (representative chain index, result)
    compile_s = 0.0
    total = len(spec.names)
    for i, unit in enumerate(spec.chain):
        is_last = i == n_chain - 1
        sig = _signature(unit, is_last, carry)
        if options.dedup_units and sig in measured:
            rep_i, result = measured[sig]
            log(f"[profile] unit {unit.name}: same shapes as {spec.chain[rep_i].name}, reused")
        else:
            result = _measure_unit(unit, is_last, carry, labels, targets, options)
            rep_i = i
            measured[sig] = (i, result)
            compile_s += result.compile_s
            stands = spec.rep.count(i)
            note = f", stands for {stands} units" if stands > 1 else ""
            for k, d in enumerate(reps):
                dspec = cluster.devices[d]
                log(f"[profile] unit {i + 1}/{n_chain} {unit.name:<22} on {dspec.name:<14} "
                    f"(x{dspec.slowdown:g}): forward {_fmt_s(result.forward_s[k])} "
                    f"backward {_fmt_s(result.backward_s[k])} ({result.repeats} repeats{note})")
        per_chain.append((rep_i, result))
        if not is_last:
            carry = result.out_carry
    # Output bytes from shapes alone.
    c = jax.eval_shape(lambda: sample_microbatch(mcfg, *microbatch)[0])
    out_bytes = []
    for unit in spec.chain:
        c = jax.eval_shape(lambda p, x: unit.apply(p, x, None, False), unit.params, c)
        out_bytes.append(tree_bytes(c))
    units, fwd, bwd = [], np.full((total, cluster.num_devices), np.nan), np.full(
        (total, cluster.num_devices), np.nan)
    opt_cache: dict[int, int] = {}
    for u, (name, r) in enumerate(zip(spec.names, spec.rep)):
        unit = spec.chain[r]
        rep_i, result = per_chain[r]
        if r not in opt_cache:
            opt_cache[r] = tree_bytes(jax.eval_shape(optimizer.init, [unit.params]))
        pb = spec.param_bytes[u]
        rec = {"name": name, "state_bytes": 2 * pb + opt_cache[r],
               "activation_bytes": result.activation_bytes, "output_bytes": out_bytes[r],
               "kind": spec.kinds[u], "param_bytes": pb, "optimizer_bytes": opt_cache[r],
               "measured_as": spec.chain[rep_i].name, "repeats": result.repeats}
        rec.update(result.memory)
        units.append(rec)
        for d, k in enumerate(cls):
            if k >= 0:
                fwd[u, d] = result.forward_s[k]
                bwd[u, d] = result.backward_s[k]
    return {"units": units, "forward_s": fwd, "backward_s": bwd, "compile_s": compile_s}


# -------------------------------------------------------------------------------- links

def fit_link(sizes: Sequence[int], one_way_s: Sequence[float]) -> tuple[float, float]:
    """``(latency_s, bandwidth_Bps)`` of ``t = latency + bytes / bandwidth`` through two points."""
    (s1, s2), (t1, t2) = sizes, one_way_s
    if t2 > t1 and s2 > s1:
        bw = min((s2 - s1) / (t2 - t1), MAX_BANDWIDTH_Bps)
    else:
        bw = MAX_BANDWIDTH_Bps
    return max(t1 - s1 / bw, 0.0), float(bw)


def link_classes(cluster: cluster_lib.Cluster, dedup: bool) -> dict[tuple, list[tuple[int, int]]]:
    """Unordered device pairs grouped by what determines their link (kinds, processes, same
    JAX device, emulated parameters both ways)."""
    groups: dict[tuple, list[tuple[int, int]]] = {}
    lat, bw = cluster.link_latency_s, cluster.link_bandwidth_Bps
    for i in range(cluster.num_devices):
        for j in range(i + 1, cluster.num_devices):
            a, b = cluster.devices[i], cluster.devices[j]
            if dedup:
                key = (a.kind, b.kind, a.process_index == b.process_index,
                       cluster.jax_devices[i] == cluster.jax_devices[j],
                       float(lat[i, j]), float(bw[i, j]), float(lat[j, i]), float(bw[j, i]))
            else:
                key = (i, j)
            groups.setdefault(key, []).append((i, j))
    return groups


def _local_transfer(cluster: cluster_lib.Cluster) -> tuple[Callable, str]:
    """``(send(x, src, dst) -> x on dst, path name)``: the runtime's ``LocalTransport`` (one
    two-stage transport per device pair, with the cluster's link emulation), or
    ``jax.device_put`` plus the emulation if the runtime is not there."""
    try:
        from skyjax.runtime.transport import LocalTransport
    except ImportError:
        emulation = cluster.links

        def put(x, src: int, dst: int):
            y = jax.block_until_ready(jax.device_put(x, cluster.jax_devices[dst]))
            emulation.wait(src, dst, tree_bytes(x))
            return y

        return put, "device_put"
    pairs: dict[tuple[int, int], Any] = {}

    def send(x, src: int, dst: int):
        key = (min(src, dst), max(src, dst))
        if key not in pairs:
            a, b = key
            pairs[key] = LocalTransport([cluster.jax_devices[a], cluster.jax_devices[b]],
                                        cluster.links if cluster.emulate_links else None,
                                        link_ids=[a, b], timeout_s=60.0)
        t = pairs[key]
        s, r = (0, 1) if src == key[0] else (1, 0)
        t.for_stage(s).send(0, x, r)
        return t.for_stage(r).recv(0, jax.ShapeDtypeStruct(x.shape, x.dtype), s)

    return send, "LocalTransport"


def probe_links(cluster: cluster_lib.Cluster, options: Options, log: Log,
                transfer: Callable | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """Latency and bandwidth ``[D, D]`` from ping-pong transfers (``transfer(x, src, dst)``
    returns ``x`` on ``dst``; default: the runtime's ``LocalTransport`` with the cluster's link
    emulation). The third result has the raw one-way times and the path used."""
    n = cluster.num_devices
    send, path = (transfer, "custom") if transfer else _local_transfer(cluster)
    lat = np.zeros((n, n))
    bw = np.full((n, n), MAX_BANDWIDTH_Bps)
    raw = {}
    sizes = tuple(int(s) for s in options.link_sizes)
    for key, pairs in link_classes(cluster, options.dedup_devices).items():
        i, j = pairs[0]
        one_way = []
        for size in sizes:
            x = jax.device_put(jnp.zeros((max(size // 4, 1),), jnp.float32),
                               cluster.jax_devices[i])
            send(send(x, i, j), j, i)  # warm-up
            rtts = []
            for _ in range(max(options.link_repeats, 1)):
                tic = time.perf_counter()
                send(send(x, i, j), j, i)
                rtts.append(time.perf_counter() - tic)
            one_way.append(robust_time(rtts) / 2)
        latency, bandwidth = fit_link(sizes, one_way)
        raw[f"{cluster.devices[i].name}<->{cluster.devices[j].name}"] = one_way
        for a, b in pairs:
            lat[a, b] = lat[b, a] = latency
            bw[a, b] = bw[b, a] = bandwidth
        log(f"[profile] link {cluster.devices[i].name} <-> {cluster.devices[j].name}"
            f"{f' (+{len(pairs) - 1} alike)' if len(pairs) > 1 else ''}: latency "
            f"{latency * 1e6:.1f} us, bandwidth {bandwidth / 1e9:.3g} GB/s")
    return lat, bw, {"path": path, "one_way_s": raw}


# ------------------------------------------------------------------------------- profile

def cache_payload(config: Any, cluster: cluster_lib.Cluster, mcfg: bert.BertConfig | None = None,
                  options: Options | None = None) -> dict:
    """Everything that changes a profile's numbers (hashed into the cache key)."""
    mcfg = mcfg or model_config(config)
    options = options or Options.from_config(config)
    size, seq_len = microbatch_shape(config)
    return {
        "profiler_version": PROFILER_VERSION,
        "jax": jax.__version__,
        "model": dataclasses.asdict(mcfg),
        "microbatch": {"size": size, "seq_len": seq_len},
        "dtype": "float32",
        "granularity": str(config.allocation.granularity),
        "mode": str(config.cluster.mode),
        "devices": [{k: v for k, v in d.items() if k != "name"} for d in cluster.describe()],
        "links": {"emulated": cluster.emulate_links,
                  "latency_s": cluster.link_latency_s.tolist(),
                  "bandwidth_Bps": [[b if math.isfinite(b) else None for b in row]
                                    for row in cluster.link_bandwidth_Bps.tolist()]},
        "optimizer": _optimizer_desc(config),
        "dedup": [options.dedup_units, options.dedup_devices],
    }


def cache_key(config: Any, cluster: cluster_lib.Cluster, mcfg: bert.BertConfig | None = None,
              options: Options | None = None) -> str:
    """sha256 of the canonical JSON of :func:`cache_payload`."""
    payload = json.dumps(cache_payload(config, cluster, mcfg, options), sort_keys=True,
                         separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def _device_records(cluster: cluster_lib.Cluster) -> list[dict]:
    out = []
    for d, spec in enumerate(cluster.devices):
        mem, source = cluster.memory_bytes(d)
        out.append({"name": spec.name, "memory_bytes": int(mem), "kind": spec.kind,
                    "slowdown": spec.slowdown, "region": spec.region,
                    "process_index": spec.process_index, "memory_source": source})
    return out


def profile(config: Any, *, chain: list[bert.Unit] | None = None,
            cluster: cluster_lib.Cluster | None = None, options: Options | None = None,
            log: Log | None = None) -> Profile:
    """Measures a profile in this process (all of ``cluster``'s devices, one after another).

    ``chain``: the model's units if already built (identical ones are measured once); without it
    a one-layer skeleton of ``config.model`` stands for every layer.
    """
    log = log or logging.info
    start = time.perf_counter()
    cluster = cluster or cluster_lib.cluster_from_config(config)
    options = options or Options.from_config(config)
    mcfg = model_config(config)
    granularity = str(config.allocation.granularity)
    spec = _chain_spec(config, mcfg, chain, options)
    microbatch = microbatch_shape(config)
    log(f"[profile] {len(spec.names)} units ({granularity}), micro-batch {microbatch[0]} x "
        f"{microbatch[1]}, {cluster.num_devices} device(s), up to {options.repeats} repeats")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Dd]onat.*")
        measured = measure_units(spec, mcfg, microbatch, cluster, options, _optimizer(config), log)
        unit_s = time.perf_counter() - start
        lat, bw, raw = probe_links(cluster, options, log)
    return _assemble(config, cluster, options, mcfg, microbatch, measured, lat, bw,
                     {"link_probe": raw["path"], "link_one_way_s": raw["one_way_s"],
                      "units_s": unit_s, "compile_s": measured["compile_s"],
                      "profile_time_s": time.perf_counter() - start})


def _assemble(config, cluster, options, mcfg, microbatch, measured, lat, bw, meta) -> Profile:
    key = cache_key(config, cluster, mcfg, options)
    d = {
        "version": 1,
        "microbatch": {"size": microbatch[0], "seq_len": microbatch[1]},
        "units": measured["units"],
        "devices": measured.get("devices") or _device_records(cluster),
        "forward_s": measured["forward_s"].tolist(),
        "backward_s": measured["backward_s"].tolist(),
        "links": {"latency_s": lat.tolist(), "bandwidth_Bps": bw.tolist()},
        "cache_key": key,
        "profiler": {"version": PROFILER_VERSION, "jax": jax.__version__,
                     "granularity": str(config.allocation.granularity),
                     "mode": str(config.cluster.mode), "dtype": "float32",
                     "repeats": options.repeats, "dedup_units": options.dedup_units,
                     "dedup_devices": options.dedup_devices,
                     "created": time.strftime("%Y-%m-%dT%H:%M:%S"), **meta},
    }
    return Profile.from_json(d)


def cache_path(workdir: str, key: str) -> str:
    return os.path.join(workdir, "profiles", f"{key}.json")


def profile_or_load(config: Any, workdir: str, *, chain: list[bert.Unit] | None = None,
                    cluster: cluster_lib.Cluster | None = None, reprofile: bool | None = None,
                    options: Options | None = None, transport: Any = None,
                    log: Log | None = None) -> Profile:
    """The cached profile for this config and cluster, measured first if there is none.

    The cache lives at ``workdir/profiles/<cache_key>.json``; ``reprofile`` (default
    ``config.profile.reprofile``) forces a new measurement. The profile in use is also written
    to ``workdir/profile.json``. Under ``jax.distributed`` with several processes, pass the
    runtime's ``transport``: every process takes part in measuring (its own device) and all of
    them return the same profile (process 0 decides, measures links, writes and shares it).
    """
    log = log or logging.info
    cluster = cluster or cluster_lib.cluster_from_config(config)
    options = options or Options.from_config(config)
    if reprofile is None:
        reprofile = bool(getattr(getattr(config, "profile", None), "reprofile", False))
    key = cache_key(config, cluster, options=options)
    path = cache_path(workdir, key)
    if jax.process_count() > 1:
        return _profile_or_load_distributed(config, workdir, key, path, chain, cluster, reprofile,
                                            options, transport, log)
    prof = None if reprofile else _try_load(path, log)
    if prof is None:
        prof = profile(config, chain=chain, cluster=cluster, options=options, log=log)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        save_profile(prof, path)
        log(f"[profile] measured in {prof.extra['profiler']['profile_time_s']:.1f} s; "
            f"cached as {path}")
    os.makedirs(workdir, exist_ok=True)
    save_profile(prof, os.path.join(workdir, "profile.json"))
    return prof


def _try_load(path: str, log: Log) -> Profile | None:
    if not os.path.exists(path):
        return None
    try:
        prof = load_profile(path)
    except ProfileError as e:
        log(f"[profile] ignoring unreadable cache {path}: {e}")
        return None
    log(f"[profile] reusing cached profile {path}")
    return prof


# ------------------------------------------------------------------------ distributed

def profile_distributed(config: Any, transport: Any, rank: int, *,
                        cluster: cluster_lib.Cluster, chain: list[bert.Unit] | None = None,
                        options: Options | None = None, log: Log | None = None,
                        tag_base: int = 900_000) -> Profile | None:
    """One process per device: each measures its own device (``rank``) for every unit kind,
    results are gathered to rank 0 (``transport.gather_to_first``), links are probed pairwise by
    ping-pong through ``transport.send`` / ``recv`` (which apply the link emulation). Returns
    the profile on rank 0 and None elsewhere. Every rank must call it."""
    log = log or logging.info
    start = time.perf_counter()
    options = options or Options.from_config(config)
    mcfg = model_config(config)
    spec = _chain_spec(config, mcfg, chain, options)
    microbatch = microbatch_shape(config)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Dd]onat.*")
        mine = measure_units(spec, mcfg, microbatch, cluster, options, _optimizer(config), log,
                             only_devices=[rank])
    unit_s = time.perf_counter() - start
    gathered = transport.gather_to_first(
        {"rank": rank, "forward_s": mine["forward_s"][:, rank].tolist(),
         "backward_s": mine["backward_s"][:, rank].tolist(), "units": mine["units"],
         "compile_s": mine["compile_s"], "memory": list(cluster.memory_bytes(rank))}, tag_base)
    # Links: every unordered pair in turn, the others wait at a barrier.
    n = cluster.num_devices
    sizes = tuple(int(s) for s in options.link_sizes)
    rtts: dict[str, list[float]] = {}
    tag = tag_base + 1
    for i in range(n):
        for j in range(i + 1, n):
            transport.barrier(tag)
            tag += 1
            for size in sizes:
                count = max(size // 4, 1)
                like = jax.ShapeDtypeStruct((count,), jnp.float32)
                if rank == i:
                    x = jax.device_put(jnp.zeros((count,), jnp.float32), cluster.jax_devices[i])
                    times = []
                    for r in range(max(options.link_repeats, 1) + 1):
                        tic = time.perf_counter()
                        transport.send(tag, x, j)
                        jax.block_until_ready(transport.recv(tag + 1, like, j))
                        if r:  # the first round trip is a warm-up
                            times.append(time.perf_counter() - tic)
                    rtts[f"{i},{j},{size}"] = [robust_time(times) / 2]
                elif rank == j:
                    for _ in range(max(options.link_repeats, 1) + 1):
                        y = jax.block_until_ready(transport.recv(tag, like, i))
                        transport.send(tag + 1, y, i)
                tag += 2
    links = transport.gather_to_first({"rank": rank, "one_way": rtts}, tag)
    transport.barrier(tag + 1)
    if rank != 0:
        return None
    fwd = np.zeros((len(spec.names), n))
    bwd = np.zeros((len(spec.names), n))
    units = gathered[0]["units"]
    compile_s = 0.0
    for g in gathered:
        fwd[:, g["rank"]] = g["forward_s"]
        bwd[:, g["rank"]] = g["backward_s"]
        compile_s = max(compile_s, g["compile_s"])
    lat = np.zeros((n, n))
    bw = np.full((n, n), MAX_BANDWIDTH_Bps)
    one_way = {}
    for g in links:
        one_way.update(g["one_way"])
    for i in range(n):
        for j in range(i + 1, n):
            ts = [one_way[f"{i},{j},{s}"][0] for s in sizes]
            lat[i, j], bw[i, j] = fit_link(sizes, ts)
            lat[j, i], bw[j, i] = lat[i, j], bw[i, j]
    devices = _device_records(cluster)
    for g in gathered:  # each process knows its own device's memory
        devices[g["rank"]]["memory_bytes"], devices[g["rank"]]["memory_source"] = g["memory"]
    measured = {"units": units, "forward_s": fwd, "backward_s": bwd, "compile_s": compile_s,
                "devices": devices}
    return _assemble(config, cluster, options, mcfg, microbatch, measured, lat, bw,
                     {"link_probe": "transport", "link_one_way_s": one_way, "units_s": unit_s,
                      "compile_s": compile_s, "profile_time_s": time.perf_counter() - start})


_DIST_CALLS = 0


def _profile_or_load_distributed(config, workdir, key, path, chain, cluster, reprofile, options,
                                 transport, log) -> Profile:
    """Process 0 decides (cache hit or measure) and shares the profile through the
    jax.distributed key-value store."""
    from skyjax.runtime.distributed import broadcast_json

    global _DIST_CALLS
    rank = jax.process_index()
    _DIST_CALLS += 1  # every process calls as often: a fresh key-value namespace per call
    decision_key = f"skyjax/profile/{_DIST_CALLS}/{key}/decision"
    data_key = f"skyjax/profile/{_DIST_CALLS}/{key}/json"
    timeout_s = 3600.0
    prof = None if rank or reprofile else _try_load(path, log)
    decision = broadcast_json("load" if prof is not None else "measure", decision_key, timeout_s)
    if decision == "measure":
        if transport is None:
            raise ValueError("profiling under jax.distributed needs the runtime's transport")
        prof = profile_distributed(config, transport, rank, cluster=cluster, chain=chain,
                                   options=options, log=log)
        if rank == 0:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            save_profile(prof, path)
    shared = broadcast_json(prof.to_json() if rank == 0 else None, data_key, timeout_s)
    if rank == 0:
        os.makedirs(workdir, exist_ok=True)
        save_profile(prof, os.path.join(workdir, "profile.json"))
        return prof
    return Profile.from_json(shared)


# -------------------------------------------------------------------------------- report

def summary_table(prof: Profile) -> str:
    """A short text table: per device its total forward+backward time over all units, memory,
    and its speed relative to the fastest; then per unit kind its bytes."""
    total = (prof.forward_s + prof.backward_s).sum(axis=0)
    fastest = float(total.min()) if total.size else 1.0
    lines = [f"{'device':<16} {'kind':<10} {'slowdown':>8} {'fwd+bwd (all units)':>20} "
             f"{'rel':>6} {'memory':>10}"]
    for d, dev in enumerate(prof.devices):
        lines.append(f"{dev['name']:<16} {str(dev.get('kind', '')):<10} "
                     f"{dev.get('slowdown', 1):>8g} {_fmt_s(float(total[d])):>20} "
                     f"{float(total[d]) / fastest:>6.2f} {_fmt_b(dev['memory_bytes']):>10}")
    seen = set()
    lines.append(f"{'unit':<22} {'count':>5} {'state':>10} {'activations':>12} {'output':>10}")
    for u in prof.units:
        kind = u.get("kind", u["name"])
        if kind in seen:
            continue
        seen.add(kind)
        count = sum(1 for v in prof.units if v.get("kind", v["name"]) == kind)
        lines.append(f"{u['name']:<22} {count:>5} {_fmt_b(u['state_bytes']):>10} "
                     f"{_fmt_b(u['activation_bytes']):>12} {_fmt_b(u['output_bytes']):>10}")
    n = prof.num_devices
    if n > 1:
        off = [(i, j) for i in range(n) for j in range(n) if i != j]
        lat = [prof.latency_s[i, j] for i, j in off]
        bw = [prof.bandwidth_Bps[i, j] for i, j in off]
        lines.append(f"links: latency {min(lat) * 1e6:.1f}-{max(lat) * 1e6:.1f} us, bandwidth "
                     f"{min(bw) / 1e9:.3g}-{max(bw) / 1e9:.3g} GB/s")
    return "\n".join(lines)
