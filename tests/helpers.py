"""What the tests share (no test module imports another, nor anything under experiments/):

- processes as threads over one ``LocalTransport`` (``run_as_processes``);
- profiles for the planner (hand-made, random, regions, fixed costs; the paper's 64 nodes are
  ``skyjax.profile.flops.paper_profile``) and the one brute-force planning oracle: every ordered
  subset of devices x every cut of the units, priced by the cost model itself (``all_plans``,
  ``brute_force``);
- the runtime's reference model, batches and plans (``CFG``, ``fresh_chain``, ...);
- tiny configs, a profile measured as the orchestrators measure it, ``python -m skyjax.main``
  runs, and runs killed and resumed;
- a GLUE vocabulary and a TensorBoard event reader.

Heavy imports (JAX, Flax) are made where used, so that the planner's tests import no JAX.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.plan import InfeasibleError
from skyjax.plan.pricing.cost import Solution, evaluate_tables
from skyjax.profile.format import Profile

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS_DIR)
DEMO = os.path.join(REPO, "configs", "local_demo.py")


# ---------------------------------------------------------------------- processes as threads

def one_device_xla_flags() -> str:
    """This session's ``XLA_FLAGS`` (tests/conftest.py) without its local device count: for
    processes with one CPU device each, compiled as the session compiles, so that their results
    compare with this process's bit for bit."""
    return " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                    if not f.startswith("--xla_force_host_platform_device_count"))


def run_as_processes(fn: Callable[[int], Any], n: int, transport: Any,
                     timeout_s: float = 300.0) -> list:
    """``[fn(0), ..., fn(n - 1)]``, each in its own thread (as the multi-process code runs in
    one process over one ``LocalTransport``); the first error aborts ``transport`` (so that the
    others do not wait for their timeout) and is raised."""
    results: list = [None] * n
    errors: list[BaseException] = []

    def one(k: int) -> None:
        try:
            results[k] = fn(k)
        except BaseException as e:  # noqa: BLE001 - handed to the test below
            errors.append(e)
            transport.abort(e)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), f"threads still running after {timeout_s} s"
    return results


# ------------------------------------------------------------------------ planner profiles

def make_profile(fwd, bwd=None, *, state=None, act=None, out=None, memory=None, latency=None,
                 bandwidth=None) -> Profile:
    """A profile from unit x device forward seconds (backward: 2x); memory, links ample."""
    fwd = np.asarray(fwd, float)
    u, d = fwd.shape
    bwd = 2 * fwd if bwd is None else np.asarray(bwd, float)
    state = np.ones(u) if state is None else state
    act = np.zeros(u) if act is None else act
    out = np.ones(u) if out is None else out
    memory = np.full(d, 1e18) if memory is None else memory
    latency = np.zeros((d, d)) if latency is None else np.asarray(latency, float)
    bandwidth = np.full((d, d), 1e12) if bandwidth is None else np.asarray(bandwidth, float)
    return Profile.from_json({
        "version": 1, "microbatch": {"size": 8, "seq_len": 128},
        "units": [{"name": f"u{i}", "state_bytes": float(state[i]),
                   "activation_bytes": float(act[i]), "output_bytes": float(out[i])}
                  for i in range(u)],
        "devices": [{"name": f"d{j}", "memory_bytes": float(memory[j])} for j in range(d)],
        "forward_s": fwd.tolist(), "backward_s": bwd.tolist(),
        "links": {"latency_s": latency.tolist(), "bandwidth_Bps": bandwidth.tolist()}})


def random_profile(rng: np.random.Generator, d: int, u: int) -> Profile:
    """Heterogeneous times, memory, links (some unreachable), tight-ish memory."""
    speed = rng.uniform(0.3, 3.0, d)
    fwd = rng.uniform(0.05, 1.0, (u, 1)) * speed[None] * rng.uniform(0.7, 1.4, (u, d))
    bwd = fwd * rng.uniform(1.2, 2.5, (u, d))
    state = rng.integers(1, 100, u) * 1000.0
    act = rng.integers(0, 40, u) * 1000.0
    out = rng.integers(1, 100, u) * 1e5
    memory = rng.uniform(0.15, 1.2, d) * (state.sum() + 3 * act.sum())
    latency = rng.uniform(0.0, 0.05, (d, d))
    bandwidth = rng.choice([1e7, 1e8, 1e9], (d, d)) * (rng.random((d, d)) > 0.15)
    return make_profile(fwd, bwd, state=state, act=act, out=out, memory=memory, latency=latency,
                        bandwidth=bandwidth)


def region_profile(rng: np.random.Generator, d: int, u: int, regions: int) -> Profile:
    """Devices of a few speed kinds in regions: fast links inside, slow ones across, memory
    that binds with many micro-batches in flight."""
    kind = rng.integers(1, 4, d)
    region = np.sort(rng.integers(0, regions, d))
    fwd = rng.uniform(0.2, 1.0, (u, 1)) * kind[None, :]
    state = rng.integers(1, 50, u) * 1000.0
    act = rng.integers(1, 20, u) * 1000.0
    memory = rng.uniform(0.3, 1.0, d) * (state.sum() + 2 * act.sum())
    if rng.random() < 0.5:
        memory[:] = memory.max()  # equal memory: the in-flight level argument at its tightest
    same = region[:, None] == region[None, :]
    latency = np.where(same, 0.001, rng.uniform(0.2, 1.0))
    bandwidth = np.where(same, 1e9, 1e6)
    out = rng.integers(1, 100, u) * 1e4
    return make_profile(fwd, state=state, act=act, out=out, memory=memory, latency=latency,
                        bandwidth=bandwidth)


def realign_profile(m: int = 16) -> Profile:
    """17 units whose memory needs repeat 1, 1, 2 (so a block's size depends on where it
    starts), 4 fast devices with 5 bytes and 2 slow ones (x2.5) with 2: at GPipe m the optimum
    puts a slow device holding one unit between fast ones."""
    need = np.array([1.0, 1.0, 2.0] * 6)[:17]
    fwd = np.ones((17, 1)) * np.array([1.0] * 4 + [2.5] * 2)[None] / 3
    return make_profile(fwd, state=np.zeros(17), act=need / m, out=np.ones(17),
                        memory=np.array([5.0] * 4 + [2.0] * 2))


def with_overheads(p: Profile, rng: np.random.Generator, scale: float = 0.3,
                   inputs: bool = False) -> Profile:
    """Random fixed costs; ``inputs``: also a random ``input_s`` (drawn last, so that the other
    random cases stay as they were; so is an older files' ``batch_s``, which profiles ignore)."""
    d = p.to_json()
    n_u, n_d = p.num_units, p.num_devices
    d["update_s"] = (rng.uniform(0, scale, (n_u, n_d))).tolist()
    d["overheads"] = {k: rng.uniform(0, scale, n_d).tolist() for k in
                      ("forward_call_s", "backward_call_s", "update_call_s", "message_s")}
    d["overheads"]["sync_s"] = float(rng.uniform(0, scale))
    if inputs:
        d["overheads"]["input_s"] = rng.uniform(0, scale / 4, n_d).tolist()
        d["overheads"]["batch_s"] = float(rng.uniform(0, scale / 4))
    return Profile.from_json(d)


def shared_profile(profile: Profile, slowdowns, hosts=None) -> Profile:
    """``profile`` with CPU device records of one process each on ``hosts`` (default: one)."""
    import dataclasses

    hosts = hosts or ["h"] * len(slowdowns)
    devices = [dict(dv, kind="cpu", slowdown=float(k), host=h, process_index=i)
               for i, (dv, k, h) in enumerate(zip(profile.devices, slowdowns, hosts))]
    return dataclasses.replace(profile, devices=devices)


# ------------------------------------------------------------- the brute-force planning oracle

def assignments(num_units: int, num_devices: int,
                devices_ok: Callable[[tuple[int, ...]], bool] | None = None
                ) -> Iterator[list[tuple[int, int, int]]]:
    """Every plan's assignment [(device, first unit, end unit), ...]: each ordered subset of the
    devices (those ``devices_ok`` accepts) x each cut of the units into as many blocks."""
    u = num_units
    for n in range(1, min(u, num_devices) + 1):
        for devs in itertools.permutations(range(num_devices), n):
            if devices_ok is not None and not devices_ok(devs):
                continue
            for cuts in itertools.combinations(range(1, u), n - 1):
                b = (0,) + cuts + (u,)
                yield list(zip(devs, b, b[1:]))


def all_plans(profile: Profile, schedule: str, m: int,
              devices_ok: Callable[[tuple[int, ...]], bool] | None = None
              ) -> Iterator[plan_lib.Plan]:
    """Every plan that fits memory and links (``assignments``), priced by the cost model:
    ``skyjax.plan.pricing.cost.evaluate``, on tables built once."""
    t = plan_lib.tables(profile, schedule, m)
    for assignment in assignments(profile.num_units, profile.num_devices, devices_ok):
        try:
            yield evaluate_tables(profile, t, assignment, "brute force", False, None)
        except InfeasibleError:
            continue


def brute_force(profile: Profile, schedule: str, m: int) -> float:
    """The optimum: the least T over every plan (``all_plans``), priced by the cost model; inf
    where none fits. A plan is priced only where it could beat the best so far: T is never
    below the plan's unit work alone, sum_k W_k + (m - 1) max_k W_k (every other term of the
    cost model adds time; zero bubble: less ``Tables.max_credit``, at least any plan's credit),
    which is checked on every plan priced."""
    t = plan_lib.tables(profile, schedule, m)
    u, d = profile.num_units, profile.num_devices
    work = np.asarray(profile.forward_s, float) + np.asarray(profile.backward_s, float)
    pre = np.concatenate([np.zeros((1, d)), np.cumsum(work, axis=0)])  # [U + 1, D]
    best = math.inf
    for n in range(1, min(u, d) + 1):
        combos = list(itertools.combinations(range(1, u), n - 1))
        cuts = np.array(combos, int).reshape(len(combos), n - 1)
        starts = np.concatenate([np.zeros((len(cuts), 1), int), cuts], axis=1)
        ends = np.concatenate([cuts, np.full((len(cuts), 1), u)], axis=1)
        for devs in itertools.permutations(range(d), n):
            w = pre[ends, devs] - pre[starts, devs]  # [cuts, n]: each stage's unit work
            alone = w.sum(axis=1) + (m - 1) * w.max(axis=1) - t.max_credit()
            for c in np.argsort(alone, kind="stable"):
                if alone[c] >= best:
                    break
                try:
                    p = evaluate_tables(profile, t, list(zip(devs, starts[c], ends[c])),
                                        "brute force", False, None)
                except InfeasibleError:
                    continue
                assert p.step_time_s >= alone[c] * (1 - 1e-12), (p, alone[c])
                best = min(best, p.step_time_s)
    return best


def as_solution(plan: plan_lib.Plan) -> Solution:
    """A plan as the searches' ``Solution``: its sum of stage times plus the first stage's
    update, its bottleneck, its assignment."""
    return Solution(float(sum(s.time_s for s in plan.stages)) + plan.stages[0].update_s,
                    plan.bottleneck_s, [(s.device, *s.units) for s in plan.stages])


def price(profile: Profile, assignment, schedule: str, m: int) -> plan_lib.Plan | None:
    """``assignment``'s plan under the cost model, or None where it does not fit."""
    try:
        return plan_lib.evaluate(profile, assignment, schedule, m, "priced")
    except InfeasibleError:
        return None


def check_plan_valid(prof: Profile, plan: plan_lib.Plan) -> None:
    """Distinct devices, the units in order, reachable links, memory within each device, and
    the plan's T as the cost model prices its assignment."""
    devs = [s.device for s in plan.stages]
    assert len(set(devs)) == len(devs)
    assert plan.stages[0].units[0] == 0 and plan.stages[-1].units[1] == prof.num_units
    for s, nxt in zip(plan.stages, plan.stages[1:]):
        assert s.units[1] == nxt.units[0]
        assert prof.bandwidth_Bps[s.device, nxt.device] > 0
    for s in plan.stages:
        assert s.memory_bytes <= prof.devices[s.device]["memory_bytes"]
    again = plan_lib.evaluate(prof, [(s.device, *s.units) for s in plan.stages], plan.schedule,
                              plan.microbatches)
    assert again.step_time_s == pytest.approx(plan.step_time_s, rel=1e-12)


def check_optimal_equals(prof, schedule: str, m: int, want: float, case) -> plan_lib.Plan | None:
    """The optimal plan against the brute-force optimum ``want``: infeasible exactly when
    ``want`` is infinite (then None), else exact, equal to it, valid, and above both bounds."""
    if math.isinf(want):
        with pytest.raises(InfeasibleError):
            plan_lib.searched_plan(prof, "optimal", schedule, m)
        return None
    got = plan_lib.searched_plan(prof, "optimal", schedule, m)
    assert got.exact
    assert got.step_time_s == pytest.approx(want, rel=1e-9), case
    t = plan_lib.tables(prof, schedule, m)
    assert plan_lib.lower_bound(t) <= want * (1 + 1e-9)
    assert plan_lib.min_bottleneck(t) <= got.bottleneck_s * (1 + 1e-9)
    check_plan_valid(prof, got)
    return got


def region_instances(seed: int, count: int, devices: tuple[int, int], units: tuple[int, int]):
    """(rng, profile, GPipe tables) of random region instances (2 or 3 regions, a third with
    call costs, m = 2, 4, 8 in turn) with at least two link groups."""
    from skyjax.plan.pricing.classes import link_groups

    rng = np.random.default_rng(seed)
    for i in range(count):
        prof = region_profile(rng, int(rng.integers(*devices)), int(rng.integers(*units)),
                              int(rng.integers(2, 4)))
        if i % 3 == 0:
            prof = with_overheads(prof, rng, 0.05)
        t = plan_lib.tables(prof, "gpipe", (2, 4, 8)[i % 3])
        if len(link_groups(t)) >= 2:
            yield rng, prof, t


def group_visits(groups: list[list[int]], plan: plan_lib.Plan) -> tuple[int, bool]:
    """(how often ``plan`` crosses from one link group (``skyjax.plan.pricing.classes.link_groups``) to
    another, whether it visits every link group exactly once, in one run)."""
    group_of = {d: i for i, g in enumerate(groups) for d in g}
    seq = [group_of[s.device] for s in plan.stages]
    crossings = sum(a != b for a, b in zip(seq, seq[1:]))
    return crossings, crossings + 1 == len(set(seq)) == len(groups)


# ------------------------------------------------------------- the runtime's reference model

BATCH, SEQ = 8, 16
_CFG = dict(vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
            intermediate_size=48, max_position_embeddings=32, num_labels=3,
            hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


def random_chains(rng, devices, units, pipelines):
    """``pipelines`` chains of (device, start, end) on disjoint random devices, random cuts."""
    perm = [int(d) for d in rng.permutation(devices)]
    chains = []
    for i in range(pipelines):
        n = int(rng.integers(1, min(units, len(perm) - (pipelines - i - 1)) + 1))
        devs, perm = perm[:n], perm[n:]
        cuts = sorted(int(c) for c in rng.choice(np.arange(1, units), n - 1, replace=False))
        b = [0] + cuts + [units]
        chains.append(list(zip(devs, b, b[1:])))
    return chains


def distributed_losses(plan: Any, steps: int, max_grad_norm: float, processes: int = 4,
                       timeout_s: float = 300) -> list[float]:
    """Process 0's losses of ``steps`` steps of ``plan`` on the reference model, one
    ``DistributedExecutor`` per device in ``processes`` processes over a ``LocalTransport``."""
    import jax
    import optax

    from skyjax.runtime.distributed_executor import DistributedExecutor
    from skyjax.transport import LocalTransport

    devices = jax.local_devices()[:processes]
    transport = LocalTransport(devices, timeout_s=120)

    def process(k):
        ex = DistributedExecutor(fresh_chain(), plan, transport.for_stage(k), k, devices[k],
                                 batch_size=BATCH, seq_len=SEQ, optimizer=optax.adamw(1e-3),
                                 max_grad_norm=max_grad_norm, rng=rng_for)
        return [ex.train_step(s, make_batch(s)).loss for s in range(steps)]

    return run_as_processes(process, processes, transport, timeout_s=timeout_s)[0]


# A test module run as workers under the launcher: the test writes a spec (JSON) and launches
# the module, whose ``__main__`` reads it (``worker_start``) and writes its results to
# ``spec["out"]``.
SPEC_ENV = "SKYJAX_TEST_SPEC"


def worker_env(tmp_path, spec: dict, name: str = "spec.json") -> dict[str, str]:
    """The environment of workers (modules of tests/, CPU, one device each) that read ``spec``
    plus ``out``: ``tmp_path``, written to ``tmp_path / name``."""
    spec_path = tmp_path / name
    spec_path.write_text(json.dumps({**spec, "out": str(tmp_path)}))
    return {"PYTHONPATH": os.pathsep.join([TESTS_DIR, REPO]), "XLA_FLAGS": one_device_xla_flags(),
            "JAX_PLATFORMS": "cpu", SPEC_ENV: str(spec_path)}


def launch_workers(tmp_path, module: str, nprocs: int, spec: dict) -> tuple[int, str]:
    """``module`` (a file in tests/) in ``nprocs`` workers (:func:`worker_env`) under
    ``skyjax.launcher.launch``; the launcher's exit status and output."""
    import io

    from skyjax.launcher import launch

    out = io.BytesIO()
    rc = launch([], nprocs, timeout_s=240, env=worker_env(tmp_path, spec, f"spec{nprocs}.json"),
                module=module, stdout=out, grace_s=2)
    return rc, out.getvalue().decode(errors="replace")


def worker_start(watchdog: bool = False) -> tuple[dict, int, int, Any, Any]:
    """A launched worker's start: its spec, ``jax.distributed`` initialised (with ``watchdog``,
    the peer watchdog too, timing out after the spec's ``peer_timeout_s``, default 30 s);
    (spec, process index, process count, device, its ``TransferServerTransport``)."""
    import jax

    from skyjax.transport import TransferServerTransport
    from skyjax.transport import group as distributed

    with open(os.environ[SPEC_ENV]) as f:
        spec = json.load(f)
    distributed.initialize()
    if watchdog:
        distributed.start_watchdog(spec.get("peer_timeout_s", 30))
    pid, n = jax.process_index(), jax.process_count()
    device = jax.local_devices()[0]
    transport = TransferServerTransport(pid, n, device, namespace="test", timeout_s=120)
    return spec, pid, n, device, transport


def worker_end(spec: dict, pid: int, losses: list[float]) -> None:
    """Process 0 writes ``losses`` to ``spec["out"]/losses.json``; every worker shuts down."""
    from skyjax.transport import group as distributed

    if pid == 0:
        with open(os.path.join(spec["out"], "losses.json"), "w") as f:
            json.dump(losses, f)
    distributed.shutdown()


def __getattr__(name: str):
    """``CFG``, the reference model's ``BertConfig``: built on first use (it imports Flax)."""
    if name == "CFG":
        from skyjax.models import bert

        return bert.BertConfig(**_CFG)
    raise AttributeError(name)


def make_batch(step, regression=False):
    """Batch ``step`` of the reference task; ``regression``: float labels."""
    rng = np.random.default_rng(step)
    ids = rng.integers(1, _CFG["vocab_size"], (BATCH, SEQ)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 10:] = 0
    mask[5, 6:] = 0
    types = np.zeros_like(ids)
    types[:, 8:] = 1
    labels = rng.integers(0, 3, BATCH)
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask,
            "labels": labels.astype(np.float32) * 0.75 if regression else labels.astype(np.int32)}


def rng_for(step, first, count):
    """Dropout keys of examples ``first .. first + count - 1`` of step ``step``: one each."""
    import jax
    import jax.numpy as jnp

    key = jax.random.fold_in(jax.random.key(7), step)
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(first + jnp.arange(count))


def make_plan(blocks, schedule, m, devices=None):
    """A hand-made plan: ``blocks[k]`` on ``devices[k]`` (default: device k); no predicted costs."""
    devices = range(len(blocks)) if devices is None else devices
    stages = [plan_lib.Stage(d, (a, b), 0.0, 0.0, 0) for d, (a, b) in zip(devices, blocks)]
    return plan_lib.Plan("manual", schedule, m, stages, step_time_s=0.0, bottleneck_s=0.0,
                         exact=False)


def fresh_chain(granularity="layer", num_labels=3):
    """The reference model's units; ``num_labels`` 1: a regression head."""
    from flax import nnx

    from skyjax.models import bert

    cfg = bert.BertConfig(**{**_CFG, "num_labels": num_labels})
    return bert.units(bert.BertForSequenceClassification(cfg, nnx.Rngs(0)), granularity)


def reference_loss(chain, params, batch, step, m):
    from skyjax.metrics import classification_loss
    from skyjax.models import bert

    size = BATCH // m
    total = 0.0
    for mb in range(m):
        sl = {k: v[mb * size:(mb + 1) * size] for k, v in batch.items()}
        carry = bert.initial_carry(sl["input_ids"], sl["token_type_ids"], sl["attention_mask"])
        out = bert.apply_units(chain, params, carry, rng_for(step, mb * size, size), True)
        total += classification_loss(out["logits"], sl["labels"])[0] / m
    return total


def reference_losses(chain, steps, m, max_grad_norm, jit=False):
    """The losses of single-device training (AdamW after global-norm clipping); ``jit``: one
    compiled step (faster where op-by-op dispatch costs more than compiling, e.g. bf16)."""
    import jax
    import optax

    optimizer = optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adamw(1e-3))

    def train_step(params, state, batch, step):
        loss, grads = jax.value_and_grad(lambda p: reference_loss(chain, p, batch, step, m))(params)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    train_step = jax.jit(train_step) if jit else train_step
    params = jax.tree.map(np.array, [u.params for u in chain])
    state = optimizer.init(params)
    losses = []
    for step in range(steps):
        params, state, loss = train_step(params, state, make_batch(step), step)
        losses.append(float(loss))
    return losses


def executor(chain, blocks, schedule, m, optimizer, max_grad_norm=None, **kwargs):
    """A LocalExecutor of ``blocks`` on devices 0, 1, ... (``kwargs``: more of its arguments)."""
    import jax

    from skyjax.runtime.local_executor import LocalExecutor

    devices = jax.devices()[:len(blocks)]
    return LocalExecutor(chain, make_plan(blocks, schedule, m), devices, batch_size=BATCH,
                         seq_len=SEQ, optimizer=optimizer, max_grad_norm=max_grad_norm, rng=rng_for,
                         **kwargs)


# ------------------------------------------------------------------ configs, profiles, runs

def tiny_config(n=1, layers=2, hidden=32, seq_len=16, batch=8, **cluster):
    """A tiny model on ``n`` emulated devices (``cluster``: more config.cluster fields)."""
    from skyjax.config import defaults as config_defaults

    c = config_defaults.base_config()
    m = c.model
    m.hidden_size, m.num_hidden_layers, m.num_attention_heads, m.intermediate_size = (
        hidden, layers, 2, 4 * hidden)
    c.data.seq_len, c.data.batch_size = seq_len, batch
    c.pipeline.microbatches = 1
    c.profile.repeats = 3
    c.cluster.num_devices = n
    c.cluster.update(cluster)
    return c


def tiny_run_config(**train_overrides):
    """A tiny model trained for 2 steps (``train_overrides``: config.train fields)."""
    from skyjax.config import defaults as config_defaults

    config = config_defaults.base_config()
    m = config.model
    m.hidden_size, m.num_hidden_layers, m.num_attention_heads, m.intermediate_size = 32, 2, 2, 64
    config.data.batch_size = 8
    config.data.eval_examples = 16
    config.train.steps = 2
    config.train.log_every = 1
    config.train.update(train_overrides)
    return config


def quiet(msg):
    del msg


def measure(c, *, chain=None, options=None, log=quiet):
    """A fresh profile of config ``c``, built as the orchestrators build it."""
    from skyjax import cluster as cl
    from skyjax.optim import make_optimizer
    from skyjax.profile.chain import Workload
    from skyjax.profile.measure import profile
    from skyjax.profile.options import Options

    return profile(Workload.from_config(c), cl.cluster_from_config(c), make_optimizer(c.train),
                   options or Options.from_config(c), chain=chain, log=log)


# ``python -m skyjax.main`` flags that take configs/local_demo.py back to the defaults' one
# device: no emulated devices, one micro-batch, no calibration steps
ONE_DEVICE = ["--config.cluster.num_devices=1", "--config.cluster.slowdowns=()",
              "--config.pipeline.microbatches=1", "--config.allocation.calibrate_steps=0"]
# ... and for a tiny model on one device
TINY = [*ONE_DEVICE, "--config.model.hidden_size=32", "--config.model.num_hidden_layers=2",
        "--config.model.num_attention_heads=2", "--config.model.intermediate_size=64",
        "--config.data.batch_size=8", "--config.data.eval_examples=20",
        "--config.pipeline.microbatches=2", "--config.train.log_every=1"]


def run_module(module: str, *args: str, env: dict | None = None,
               timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m module args`` from the repository root on CPU, ``env`` added."""
    return _run_python(["-m", module, *args], env, timeout)


def run_code(code: str, env: dict | None = None, timeout: int = 300
             ) -> subprocess.CompletedProcess:
    """``python -c code`` as :func:`run_module` runs a module."""
    return _run_python(["-c", code], env, timeout)


def _run_python(args: list[str], env: dict | None, timeout: int) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
                    JAX_PLATFORMS="cpu", **(env or {}))
    return subprocess.run([sys.executable, *args], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def run_main(workdir, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m skyjax.main`` on configs/local_demo.py with ``args``."""
    return run_module("skyjax.main", f"--config={DEMO}", f"--workdir={workdir}", *args,
                      timeout=timeout)


# ---------------------------------------------------------------- runs killed and resumed

_STEP = re.compile(r"step (\d+)/(\d+)")
_COMMIT = re.compile(r"checkpoint (\d+) committed")


def _lines(proc: subprocess.Popen) -> Iterator[str]:
    for raw in iter(proc.stdout.readline, b""):
        yield raw.decode(errors="replace").rstrip("\n")


def _summary(workdir: str) -> dict:
    with open(os.path.join(workdir, "summary.json")) as f:
        return json.load(f)


def main_summary(workdir: str, args: list[str], timeout_s: float = 600) -> dict:
    """An uninterrupted ``python -m skyjax.main`` run; its summary.json."""
    subprocess.run([sys.executable, "-m", "skyjax.main", "--workdir", workdir, *args], cwd=REPO,
                   check=True, capture_output=True, timeout=timeout_s)
    return _summary(workdir)


def kill_and_resume_local(workdir: str, args: list[str], resume_args: list[str],
                          kill_after_checkpoint: int, timeout_s: float = 600) -> dict:
    """``python -m skyjax.main`` with ``args``, SIGKILLed once checkpoint
    ``kill_after_checkpoint`` is committed, then run again (same workdir) with ``resume_args``:
    the step it was killed at, the step it resumed from, the final loss."""
    cmd = [sys.executable, "-m", "skyjax.main", "--workdir", workdir]
    proc = subprocess.Popen(cmd + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=REPO)
    last_step, killed = 0, False
    try:
        for line in _lines(proc):
            m = _STEP.search(line)
            if m:
                last_step = int(m.group(1))
            m = _COMMIT.search(line)
            if m and int(m.group(1)) >= kill_after_checkpoint:
                proc.send_signal(signal.SIGKILL)
                killed = True
                break
        proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if not killed:
        raise RuntimeError("the run ended before the checkpoint to kill after was committed")
    subprocess.run(cmd + resume_args, check=True, capture_output=True, cwd=REPO,
                   timeout=timeout_s)
    summary = _summary(workdir)
    return {"killed_at_step": last_step, "resumed_from_step": summary["resumed_from_step"],
            "steps_lost": last_step - summary["resumed_from_step"],
            "final_loss": summary["final_loss"]}


def _launch_and_kill(launcher_args: list[str], workdir: str, args: list[str], victim: int,
                     kill_now, timeout_s: float) -> list[str]:
    """``python -m skyjax.launch *launcher_args -- --workdir workdir *args``; process ``victim``
    is SIGKILLed at the first output line for which ``kill_now(line)`` holds. Returns the
    output lines; raises when the launcher fails."""
    cmd = [sys.executable, "-m", "skyjax.launch", *launcher_args, "--timeout", str(timeout_s),
           "--", "--workdir", workdir, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO,
                            start_new_session=True)
    pids, killed, text = {}, False, []
    try:
        for line in _lines(proc):
            text.append(line)
            if line.startswith("[launch] started") and not pids:
                pids = {int(k): int(p) for k, p in re.findall(r"p(\d+):(\d+)", line)}
            if not killed and kill_now(line):
                os.kill(pids[victim], signal.SIGKILL)
                killed = True
        rc = proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if rc:
        raise RuntimeError(f"the launcher exited with {rc}:\n" + "\n".join(text[-40:]))
    return text


def kill_one_of_launched(workdir: str, args: list[str], num_processes: int, victim: int,
                         kill_after_checkpoint: int, timeout_s: float = 900) -> dict:
    """``python -m skyjax.launch --max_restarts 1`` of ``num_processes``; process ``victim`` is
    SIGKILLed once checkpoint ``kill_after_checkpoint`` is committed and the job finishes on
    the others: the step it resumed from, the processes after, the final loss, the output."""
    steps: list[int] = []

    def kill_now(line: str) -> bool:
        m = _STEP.search(line)
        if m:
            steps.append(int(m.group(1)))
        m = _COMMIT.search(line)
        return bool(m) and int(m.group(1)) >= kill_after_checkpoint

    text = _launch_and_kill(["--num_processes", str(num_processes), "--max_restarts", "1"],
                            workdir, args, victim, kill_now, timeout_s)
    summary = _summary(workdir)
    last_step = steps[-1] if steps else 0  # the last step logged before the kill
    return {"killed_at_step": last_step, "resumed_from_step": summary["resumed_from_step"],
            "steps_lost": last_step - summary["resumed_from_step"],
            "processes_after": summary["processes"], "final_loss": summary["final_loss"],
            "log": text}


def kill_one_pipeline(workdir: str, args: list[str], num_processes: int, victim: int,
                      kill_after_step: int, timeout_s: float = 600) -> dict:
    """``python -m skyjax.launch --survive_losses`` of ``num_processes``; process ``victim`` is
    SIGKILLed once process 0 logs step ``kill_after_step``, and the others finish the run: the
    step of the kill and the summary."""
    killed_at: list[int] = []

    def kill_now(line: str) -> bool:
        m = _STEP.search(line)
        if m and line.startswith("[p0]") and int(m.group(1)) >= kill_after_step:
            killed_at.append(int(m.group(1)))
            return True
        return False

    text = _launch_and_kill(["--num_processes", str(num_processes), "--survive_losses"],
                            workdir, args, victim, kill_now, timeout_s)
    return {"killed_at_step": killed_at[0], "summary": _summary(workdir), "log": text}


# ------------------------------------------------------------------------- data and outputs

# WordPiece over TFDS's GLUE mock data's alphabet (" abcdefghij"): whole pieces, continuations,
# and no "##j", so a word with a later "j" becomes [UNK].
VOCAB = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("abcdefghij")
         + ["##" + c for c in "abcdefghi"] + ["abc", "##de", "hi", "##fg", "j"])


def write_vocab(path, tokens=VOCAB) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "vocab.txt"), "w") as f:
        f.write("\n".join(tokens) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory) -> str:
    """A tokenizer directory of :data:`VOCAB` (a fixture: import it into the test module)."""
    return write_vocab(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def reference_tokenizer(vocab_dir: str) -> Any:
    """The ``BertTokenizerFast`` of ``vocab_dir``, which batches are checked against."""
    import transformers

    return transformers.BertTokenizerFast.from_pretrained(vocab_dir, local_files_only=True)


def text_config(vocab_dir: str, name: str, num_labels: int, data: dict[str, Any]) -> Any:
    """The base config reading text data ``name`` with the tokenizer of ``vocab_dir``, every
    held-out example, then the config.data fields of ``data`` (not validated)."""
    from skyjax.config import defaults as config_defaults

    config = config_defaults.base_config()
    config.data.name = name
    config.data.tokenizer = vocab_dir
    config.data.eval_examples = -1
    config.model.num_labels = num_labels
    for key, value in data.items():
        config.data[key] = value
    return config


def take(iterator: Any, n: int) -> list[dict[str, np.ndarray]]:
    """The first ``n`` batches of a batch iterator, which is then closed."""
    out = [next(iterator) for _ in range(n)]
    iterator.close()
    return out


def tokenized(tokenizer: Any, rows: list[dict], columns: tuple[str, ...], seq_len: int,
              labels: np.ndarray) -> dict[str, np.ndarray]:
    """The batch of one ``tokenizer(a, b, truncation=True, ...)`` call per row (text read from
    ``columns``, bytes decoded), with ``labels``: what the data pipeline must give."""
    enc: dict[str, list] = {"input_ids": [], "token_type_ids": [], "attention_mask": []}
    for r in rows:
        texts = [r[c].decode() if isinstance(r[c], bytes) else r[c] for c in columns]
        e = tokenizer(*texts, truncation=True, max_length=seq_len, padding="max_length")
        for k in enc:
            enc[k].append(e[k])
    return {**{k: np.asarray(v, np.int32) for k, v in enc.items()}, "labels": labels}


def read_events(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] through TensorFlow's reader, which checks every checksum."""
    import glob

    tf = pytest.importorskip("tensorflow")
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(f"{logdir}/events.out.tfevents.*")):
        for e in tf.compat.v1.train.summary_iterator(path):
            for v in e.summary.value:
                out.setdefault(v.tag, []).append((e.step, v.simple_value))
    return out


CSV_PAIRS = os.path.join(REPO, "configs", "csv_pairs.py")
TINY_CSV = ["--config.model.hidden_size=32", "--config.model.num_hidden_layers=2",
            "--config.model.num_attention_heads=2", "--config.model.intermediate_size=64",
            "--config.data.eval_examples=0", "--config.cluster.slowdowns=(1, 1)"]


def diloco_run(tmp_path, steps: int = 4, outer_every: int = 3) -> str:
    """configs/csv_pairs.py's model, tiny, trained ``steps`` steps by two pipelines (one per
    device) with DiLoCo averaging, an outer step every ``outer_every`` steps, checkpointed after
    its last step: by default mid-period, where the pipelines' replicas differ. The planner is
    forced as tests/test_relax_quality.py's averaging runs force it (the devices in two regions
    joined at 100 Mbit/s, ample memory, the int8 codec slow); returns the workdir."""
    n, units = 2, 4
    latency, bandwidth = np.full((n, n), 0.04), np.full((n, n), 12.5e6)
    np.fill_diagonal(latency, 0.0)
    # hand-offs of 2.6 MB: a pipeline across the link waits for its bytes (its latency the
    # warm-ups hide), so two pipelines averaging by DiLoCo run faster
    d = make_profile(np.full((units, n), 2e-2), state=np.full(units, 8e6),
                     act=np.full(units, 1e5), out=np.full(units, 2.6e6),
                     memory=np.full(n, 1e12), latency=latency, bandwidth=bandwidth).to_json()
    for j, device in enumerate(d["devices"]):
        device["region"] = f"r{j}"
    d["codecs"] = {"int8": {"output_bytes": [u["output_bytes"] * 0.27 for u in d["units"]],
                            "seconds_per_byte": [1e-7] * n}}
    from skyjax.profile.format import save_profile

    save_profile(Profile.from_json(d), str(tmp_path / "diloco_profile.json"))
    workdir = str(tmp_path / "diloco_run")
    done = run_module("skyjax.main", f"--config={CSV_PAIRS}", f"--workdir={workdir}", *TINY_CSV,
                      f"--config.train.steps={steps}", f"--config.checkpoint.every={steps}",
                      f"--config.profile.path={tmp_path / 'diloco_profile.json'}",
                      "--config.relax.averaging=diloco", "--config.relax.min_gain=0",
                      f"--config.relax.outer_every={outer_every}", timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    with open(os.path.join(workdir, "plan.json"), encoding="utf-8") as f:
        plan = json.load(f)
    assert plan["averaging"] == "diloco" and len(plan["shares"]) == 2, plan
    return workdir
