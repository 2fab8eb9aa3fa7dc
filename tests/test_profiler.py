"""skyjax.profile: measured per-unit times on emulated heterogeneous devices, exact bytes, link
probes, the profile cache, the multi-process path, the CLI, and plans made from measured
profiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx

from skyjax import cluster as cl
from skyjax import env_vars
from skyjax.models import bert
from skyjax.optim import make_optimizer
from skyjax import plan as plan_lib
from skyjax.profile import links
from skyjax.profile.cache import cache_key, cache_path
from skyjax.models.build import model_config
from skyjax.profile.chain import Workload, sample_microbatch, skeleton_chain
from skyjax.profile.distributed import profile_distributed
from skyjax.profile.format import Profile, load_profile
from skyjax.profile.options import Options
from skyjax.profile.profiler import profile_or_load
from skyjax.report.profile_table import summary_table
from skyjax.programs.stage import StageProgram
from skyjax.tree import tree_nbytes
from tests.helpers import measure, quiet, run_as_processes, tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A string condition: evaluated at test time, so that importing this module (as the children of
# the multi-process test do) does not start a JAX backend before jax.distributed.
needs3 = pytest.mark.skipif("len(__import__('jax').local_devices()) < 3",
                            reason="needs 3 local devices (XLA_FLAGS="
                            "--xla_force_host_platform_device_count, tests/conftest.py)")


def cached(c, workdir, *, reprofile=False, log=quiet, cluster=None, **kwargs):
    """The cached profile of config ``c`` in ``workdir`` (as train.profile_phase asks for it)."""
    return profile_or_load(workdir, Workload.from_config(c), cluster or cl.cluster_from_config(c),
                           make_optimizer(c.train), Options.from_config(c), reprofile=reprofile,
                           log=log, **kwargs)


def key_of(c):
    return cache_key(Workload.from_config(c), cl.cluster_from_config(c), Options.from_config(c))


@pytest.mark.slow
def test_profile_shapes_and_exact_bytes():
    c = tiny_config(1)
    lines = []
    model = bert.BertForSequenceClassification(model_config(c.model), rngs=nnx.Rngs(0))
    chain = bert.units(model, "layer")
    prof = measure(c, chain=chain, log=lines.append)  # as train.py calls it
    assert [u["name"] for u in prof.units] == [u.name for u in chain]
    # net of the fixed cost per call, so a unit as cheap as a bare call is 0, never below
    assert prof.forward_s.shape == (4, 1) and np.all(prof.forward_s >= 0)
    assert np.all(prof.backward_s >= 0) and (prof.forward_s + prof.backward_s).sum() > 0
    assert prof.microbatch == {"size": 8, "seq_len": 16}
    # Layers are measured once and reused; lines name units and devices.
    assert prof.forward_s[1, 0] == prof.forward_s[2, 0]
    assert prof.units[2]["measured_as"] == "layer_0"
    assert any("layer_0" in line and "proc0:cpu0" in line for line in lines)
    assert any("layer_1: same shapes as layer_0, reused" in line for line in lines)

    optimizer = make_optimizer(c.train)
    carry, labels = sample_microbatch(model_config(c.model), 8, 16)
    for u, unit in enumerate(chain):
        rec = prof.units[u]
        params = tree_nbytes(unit.params)
        opt = tree_nbytes(jax.eval_shape(optimizer.init, [unit.params]))
        assert rec["param_bytes"] == params
        assert rec["state_bytes"] == 2 * params + opt  # params + grads + optimizer state
        assert opt >= 2 * params  # AdamW: two moments
        # activation_bytes = the residuals the runtime's stage forward keeps for backward.
        is_last = u == len(chain) - 1
        prog = StageProgram([unit], is_last=is_last, microbatches=1)
        out, res = prog.forward([unit.params], carry, jax.random.PRNGKey(0),
                                labels if is_last else None)
        assert rec["activation_bytes"] == tree_nbytes(res)
        nxt = unit.apply(unit.params, carry, None, False)
        assert rec["output_bytes"] == tree_nbytes(nxt)
        carry = nxt
        # temp_bytes: the largest scratch of the unit's stage calls, the update's included
        temps = [rec[f"{call}_temp_size_in_bytes"] for call in ("forward", "backward", "update")]
        assert rec["temp_bytes"] == max(temps) > 0
    assert prof.units[1]["output_bytes"] == 8 * 16 * 32 * 4 + 8 * 16 * 4  # hidden + mask
    dev = prof.devices[0]
    assert dev["memory_bytes"] > 0 and dev["kind"] == "cpu" and dev["slowdown"] == 1.0
    assert prof.latency_s.shape == (1, 1)
    # putting one micro-batch's inputs: a host transfer of a few small arrays, timed
    assert prof.input_s.shape == (1,) and prof.input_s[0] > 0
    assert set(prof.extra) >= {"cache_key", "profiler"}
    assert Profile.from_json(json.loads(json.dumps(prof.to_json()))).num_units == 4
    table = summary_table(prof)
    assert "proc0:cpu0" in table and "layer_0" in table


def test_sublayer_skeleton_matches_model_units():
    c = tiny_config(1, layers=3)
    c.allocation.granularity = "sublayer"
    spec = skeleton_chain(model_config(c.model), "sublayer")
    model = bert.BertForSequenceClassification(model_config(c.model), rngs=nnx.Rngs(0))
    chain = bert.units(model, "sublayer")
    assert spec.names == [u.name for u in chain]
    assert spec.kinds == [u.kind for u in chain]
    assert spec.param_bytes == [tree_nbytes(u.params) for u in chain]
    assert len(spec.chain) == 5


@pytest.mark.slow
@needs3
def test_measured_slowdowns_keep_order_and_ratios():
    """Emulated slow-downs (1, 2, 4) are measured, not read: per-device totals in that order,
    each 2x step measured as more than 1.05x. The emulation sleeps (k - 1)x the fastest run seen,
    and on a loaded host a typical run is several times that (7x at a load of five times the
    cores), so a kx device measures about (7 + k - 1) / 7 of the x1 device's time there."""
    c = tiny_config(3, layers=2, hidden=64, seq_len=32, slowdowns=(1, 2, 4))
    opts = Options(repeats=15, min_repeats=15, dedup_units=True, link_repeats=3)
    prof = measure(c, options=opts)
    total = (prof.forward_s + prof.backward_s).sum(axis=0)
    ratios = total / total[0]
    assert total[1] > 1.05 * total[0] and total[2] > 1.05 * total[1], ratios
    assert [d["slowdown"] for d in prof.devices] == [1, 2, 4]
    # A plan from this measured profile gives the slowest device fewer units than the fastest.
    plan = plan_lib.plan(prof, "optimal", "1f1b", microbatches=4)
    count = {d: 0 for d in range(3)}
    for st in plan.stages:
        count[st.device] += st.units[1] - st.units[0]
    assert count[2] < count[0], plan
    even = plan_lib.plan(prof, "even", "1f1b", microbatches=4)
    assert plan.step_time_s <= even.step_time_s


@pytest.mark.slow
@needs3
def test_memory_cap_in_profile_and_planner_avoids_device():
    c = tiny_config(3, layers=4, memory_caps_bytes=(0, 1, 0))
    prof = measure(c, options=Options(repeats=3, link_repeats=2))
    assert prof.devices[1]["memory_bytes"] == 1
    assert prof.devices[1]["memory_source"] == "emulated"
    assert prof.devices[0]["memory_bytes"] > 1 and prof.devices[0]["memory_source"] == "host"
    # The shared-host model's inputs (host, its cores) are recorded only under that model.
    assert "cpus" not in prof.devices[0] and "host" not in prof.devices[0]
    # Identical devices (same kind, no slow-down) are measured once: equal columns.
    assert np.array_equal(prof.forward_s[:, 0], prof.forward_s[:, 2])
    plan = plan_lib.plan(prof, "optimal", "1f1b", microbatches=2)
    assert all(st.device != 1 for st in plan.stages)
    # Device 1 made 10x faster: unconstrained, the planner gives it a big block of layers.
    prof.forward_s[:, 1] = prof.forward_s[:, 0] / 10
    prof.backward_s[:, 1] = prof.backward_s[:, 0] / 10
    for d in range(3):
        prof.devices[d]["memory_bytes"] = 1 << 40
    free = plan_lib.plan(prof, "optimal", "1f1b", microbatches=2)

    def layers_on_1(plan):
        return max([sum(prof.units[u]["kind"] == "layer" for u in range(*st.units))
                    for st in plan.stages if st.device == 1] or [0])

    assert layers_on_1(free) >= 2, free
    # Capped to less than two layers' state: it gets at most one layer, within the cap.
    layer = prof.units[1]
    cap = 2 * layer["state_bytes"] - 1
    prof.devices[1]["memory_bytes"] = cap
    capped = plan_lib.plan(prof, "optimal", "1f1b", microbatches=2)
    assert layers_on_1(capped) <= 1, capped
    assert all(st.memory_bytes <= cap for st in capped.stages if st.device == 1)


@pytest.mark.slow
def test_profile_cache_reused_and_invalidated(tmp_path, monkeypatch):
    monkeypatch.delenv(env_vars.PROFILE_CACHE)  # the workdir's own cache
    workdir = str(tmp_path)
    c = tiny_config(1)
    lines = []
    p1 = cached(c, workdir, log=lines.append)
    key = p1.extra["cache_key"]
    assert key == key_of(c)
    path = cache_path(workdir, key)
    assert os.path.exists(path)
    # the run's own outputs (profile.json) are written by the run, not by the cache
    assert not os.path.exists(os.path.join(workdir, "profile.json"))
    mtime = os.path.getmtime(path)
    lines.clear()
    p2 = cached(c, workdir, log=lines.append)
    assert any("reusing" in line for line in lines)
    assert p2.to_json() == p1.to_json() and os.path.getmtime(path) == mtime
    # Anything that changes the numbers changes the key: model, micro-batch shape, emulation.
    for change in ({"data.seq_len": 8}, {"data.batch_size": 4}, {"model.hidden_size": 64},
                   {"cluster.slowdowns": (2,)}, {"allocation.granularity": "sublayer"}):
        c2 = tiny_config(1)
        for k, v in change.items():
            section, name = k.split(".")
            c2[section][name] = v
        assert key_of(c2) != key, change
    # The repeats are not part of the key (they change precision, not the quantity).
    c3 = tiny_config(1)
    c3.profile.repeats = 7
    assert key_of(c3) == key
    c2 = tiny_config(1, seq_len=8)
    p3 = cached(c2, workdir)
    assert p3.microbatch["seq_len"] == 8 and p3.extra["cache_key"] != key
    assert len(os.listdir(os.path.join(workdir, "profiles"))) == 2
    # SKYJAX_PROFILE_CACHE: one cache for every workdir
    monkeypatch.setenv(env_vars.PROFILE_CACHE, str(tmp_path / "shared"))
    shared = cached(c2, str(tmp_path / "elsewhere"))
    assert os.listdir(tmp_path / "shared") == [f"{shared.extra['cache_key']}.json"]
    assert not os.path.exists(tmp_path / "elsewhere" / "profiles")
    assert cached(c2, str(tmp_path / "third")).to_json() == shared.to_json()
    monkeypatch.delenv(env_vars.PROFILE_CACHE)
    # --reprofile measures again and overwrites the cache entry.
    p4 = cached(c, workdir, reprofile=True)
    assert p4.extra["profiler"]["created"] >= p1.extra["profiler"]["created"]
    assert os.path.getmtime(path) >= mtime
    assert load_profile(path).to_json() == p4.to_json()


@pytest.mark.slow
def test_a_measured_profile_records_its_model_and_a_run_of_another_is_refused(tmp_path,
                                                                              monkeypatch):
    """A profile of another hidden size has as many units and devices: without the record a run
    would plan from the other model's times."""
    from skyjax import names, train
    from skyjax.models.build import abstract_chain
    from skyjax.profile.format import save_profile
    from tests.helpers import TINY, make_profile, run_main

    c = tiny_config(1)
    prof = cached(c, str(tmp_path))  # measured here, or cached before records existed: stamped
    assert prof.model == Workload.from_config(c).record()
    assert (prof.model["hidden_size"], prof.model["intermediate_size"],
            prof.model["granularity"], prof.model["compute_dtype"]) == (32, 128, "layer",
                                                                         "float32")
    path = str(tmp_path / "p.json")
    save_profile(prof, path)
    assert load_profile(path).model == prof.model
    c.profile.path = path
    c.train.compute_dtype = "auto"  # float32 on CPU: the profile's
    cluster = cl.cluster_from_config(c, jax.devices()[:1])
    chain = abstract_chain(c.model, 0, "layer")
    assert train.profile_phase(c, chain, str(tmp_path), cluster).model == prof.model
    other = tiny_config(1, hidden=64)
    other.model.intermediate_size = 128
    other.profile.path = path
    with pytest.raises(ValueError, match=r"config\.profile\.path=.* was measured for "
                                         r"hidden_size=32; this run has hidden_size=64"):
        train.profile_phase(other, abstract_chain(other.model, 0, "layer"), str(tmp_path),
                            cluster)
    # skyjax.main refuses it before JAX starts: one line, exit 64, the workdir untouched
    proc = run_main(tmp_path / "run", *TINY, "--config.model.hidden_size=64",
                    "--config.model.intermediate_size=128", "--config.pipeline.microbatches=1",
                    "--config.data.seq_len=16", f"--config.profile.path={path}")
    assert proc.returncode == names.EXIT_BAD_INPUT, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("skyjax.main: ") and "was measured for hidden_size=32; this run has " \
        "hidden_size=64 (config.model.hidden_size)" in last, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()
    # a profile without the record (hand-built, or older) is accepted, with a warning line
    warned = []
    monkeypatch.setattr(train.logging, "warning", warned.append)
    save_profile(make_profile(np.full((4, 1), 1e-3)), path)
    assert train.profile_phase(other, abstract_chain(other.model, 0, "layer"), str(tmp_path),
                               cluster).model is None
    assert len(warned) == 1 and "has no model record" in warned[0]


def test_fit_link():
    lat, bw = links.fit_link((1000, 1_001_000), (0.001 + 1000 / 1e8, 0.001 + 1_001_000 / 1e8))
    assert lat == pytest.approx(0.001) and bw == pytest.approx(1e8)
    lat, bw = links.fit_link((1000, 2000), (0.002, 0.001))  # noise: no size dependence
    assert bw == links.MAX_BANDWIDTH_Bps and lat == pytest.approx(0.002)


@needs3
def test_link_probes_measure_emulated_links():
    c = tiny_config(3, regions=("a", "a", "b"), link_latency_s=0.004, link_bandwidth_Bps=2e8)
    clu = cl.cluster_from_config(c)
    opts = Options(link_sizes=(1 << 10, 1 << 21), link_repeats=3)
    lat, bw, raw = links.probe_links(clu, opts, quiet)
    assert raw["path"] == "LocalTransport"
    # the emulated link sleeps 4 ms + bytes / 200 MB/s each way: lower bounds (a loaded host
    # only adds to them); its size dependence is found (a finite bandwidth)
    assert lat[0, 2] > 0.004 * 0.7 and lat[2, 1] == lat[0, 2]
    slow = max(raw["one_way_s"].values(), key=lambda t: t[0])
    assert slow[1] >= 0.004 + (1 << 21) / 2e8, raw
    assert bw[0, 2] < links.MAX_BANDWIDTH_Bps
    # same region: a real device-to-device copy, faster than the emulated link
    assert lat[0, 1] < lat[0, 2] and bw[0, 1] > bw[0, 2]
    assert lat[1, 0] == lat[0, 1]


@pytest.mark.slow
@needs3
def test_distributed_path_through_a_transport(monkeypatch):
    """profile_distributed on 3 'processes' (threads, one device each) over LocalTransport under
    the shared-host model: the processes time their devices one after another (none is timed
    beside another's load), in two passes whose turns run in opposite orders, and each unit's
    median pass is kept."""
    from skyjax.profile import distributed
    from skyjax.transport import LocalTransport

    turns, measure_units = [], distributed.units.measure_units

    def recorded(*args, only_devices, wake, **kwargs):
        start = time.perf_counter()
        out = measure_units(*args, only_devices=only_devices, wake=wake, **kwargs)
        turns.append((start, time.perf_counter(), only_devices[0], wake, out))
        return out

    monkeypatch.setattr(distributed.units, "measure_units", recorded)

    c = tiny_config(3, slowdowns=(1, 1, 3), regions=("a", "a", "b"), link_latency_s=0.003)
    clu = cl.cluster_from_config(c)
    transport = LocalTransport(clu.jax_devices, clu.links, timeout_s=120)
    from skyjax.hostmodel import probes

    opts = Options(repeats=5, link_repeats=3, passes=2, host=probes())  # the shared-host model
    workload, optimizer = Workload.from_config(c), make_optimizer(c.train)
    results = run_as_processes(
        lambda r: profile_distributed(workload, clu, optimizer, opts, transport.for_stage(r), r,
                                      log=quiet), 3, transport)
    prof = results[0]
    assert results[1] is None and results[2] is None
    assert prof.extra["profiler"]["link_probe"] == "transport"
    # Call costs are taken out of unit times (clipped at 0: a tiny head may not exceed them).
    assert prof.forward_s.shape == (4, 3) and np.all(prof.forward_s >= 0)
    assert np.all(prof.forward_s[1:3] > 0)  # the layers
    total = (prof.forward_s + prof.backward_s).sum(axis=0)
    # The x3 device shows ~3x the others' work on a quiet host (2.3-3.9x measured), 1.28x at a
    # load of five times the cores, where the x1 devices' medians take the other jobs' time:
    # 1.1x keeps the check (each device's own times, the slow-down applied) at any load. Against
    # the two x1 devices' mean, not the larger one, so one noisy median does not decide it.
    assert total[2] > 1.1 * np.mean(total[:2])
    order = sorted(turns, key=lambda t: t[0])
    assert all(a[1] <= b[0] for a, b in zip(order, order[1:])), [t[:3] for t in order]
    assert [t[2] for t in order] == [0, 1, 2, 2, 1, 0]  # the second pass in reverse
    assert [t[3] for t in order] == [True] * 3 + [False] * 3  # calls after idle: first pass
    assert prof.devices[2]["wake_s"]  # ... and kept
    for d in range(3):  # per unit, the passes' median: of two, their mean
        first, second = (t[4] for t in order if t[2] == d)
        for key, got in (("forward_s", prof.forward_s), ("backward_s", prof.backward_s)):
            np.testing.assert_allclose(got[:, d], (first[key][:, d] + second[key][:, d]) / 2)
    assert prof.extra["profiler"]["passes"] == 2
    for d in range(3):  # each pass's work on each device, as measured
        np.testing.assert_allclose(prof.extra["profiler"]["pass_work_s"][d], [
            np.sum(t[4]["forward_s"][:, d] + t[4]["backward_s"][:, d]) for t in order
            if t[2] == d])
    assert prof.latency_s[0, 2] > 0.003 * 0.5  # the emulated link's sleep: a lower bound
    assert prof.latency_s[0, 1] < prof.latency_s[0, 2]
    # every device's message costs were probed, and message_s is theirs (skyjax.hostmodel.messages)
    costs = prof.extra["profiler"]["message_costs"]
    assert len(costs) == 3 and all(c["send_s"] >= 0 and c["recv_s"] >= 0 for c in costs)
    assert list(prof.message_s) == [c["message_s"] for c in costs]
    # the links' latency: the idle fit plus each end's half of its messages' extra delay
    assert all(c["delays_s"] and c["delay_extra_s"] >= 0 for c in costs)
    idle = np.asarray(prof.extra["profiler"]["idle_latency_s"])
    extra = np.array([c["delay_extra_s"] for c in costs])
    np.testing.assert_allclose(prof.latency_s,
                               idle + (extra[:, None] + extra[None, :]) / 2 * (1 - np.eye(3)))


@pytest.mark.slow
@needs3
def test_distributed_profile_times_every_device_at_once(monkeypatch):
    """Without the shared-host model (real accelerators) every process times its own device at
    the same time, in one pass, and none of the shared-host probes runs: no host, cores, calls
    after idle or message probe in the profile. A zero-bubble run's W is gathered per device."""
    from skyjax.profile import distributed
    from skyjax.transport import LocalTransport

    turns, measure_units = [], distributed.units.measure_units

    def recorded(*args, only_devices, **kwargs):
        start = time.perf_counter()
        out = measure_units(*args, only_devices=only_devices, **kwargs)
        turns.append((start, time.perf_counter(), only_devices[0]))
        return out

    monkeypatch.setattr(distributed.units, "measure_units", recorded)
    c = tiny_config(3, slowdowns=(1, 1, 3))
    clu = cl.cluster_from_config(c)
    transport = LocalTransport(clu.jax_devices, clu.links, timeout_s=120)
    opts = Options(repeats=3, link_repeats=2, weight=True)
    assert opts.concurrent
    workload, optimizer = Workload.from_config(c), make_optimizer(c.train)
    prof = run_as_processes(
        lambda r: profile_distributed(workload, clu, optimizer, opts, transport.for_stage(r), r,
                                      log=quiet), 3, transport)[0]
    assert sorted(t[2] for t in turns) == [0, 1, 2]  # one pass, each process its own device
    # all three measured at once: every one started before any other finished
    assert max(t[0] for t in turns) < min(t[1] for t in turns), turns
    for dv in prof.devices:
        assert not {"host", "cpus", "cpu_cores", "wake_s"} & set(dv), dv
    assert "message_costs" not in prof.extra["profiler"] or not any(
        prof.extra["profiler"]["message_costs"])
    assert np.all(prof.message_s == 0)
    assert prof.backward_weight_s.shape == (4, 3) and np.all(prof.backward_weight_s[1:3] > 0)


@pytest.mark.slow
def test_cli_writes_profile_and_table(tmp_path):
    out = tmp_path / "profile.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
    cmd = [sys.executable, "-m", "skyjax.profile", f"--config={REPO}/configs/local_demo.py",
           f"--out={out}", f"--workdir={tmp_path / 'wd'}", "--config.model.hidden_size=32",
           "--config.model.num_attention_heads=2", "--config.model.intermediate_size=64",
           "--config.data.batch_size=8", "--config.cluster.num_devices=2",
           "--config.cluster.slowdowns=(1, 3)", "--repeats=3"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    prof = load_profile(str(out))
    assert prof.num_devices == 2 and prof.num_units == 6
    assert "[profile] unit 2/3 layer_0" in proc.stdout and "rel" in proc.stdout
    assert "proc0:cpu1" in proc.stdout
    plan = plan_lib.plan(prof, "optimal", "1f1b", 4)
    assert plan.stages


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_multiprocess_profile_under_jax_distributed(tmp_path, monkeypatch):
    """2 processes (this module's __main__ block) under jax.distributed with the runtime's
    TransferServerTransport: each measures its own device, links are probed through the
    transport, all processes get the same profile; a second run reuses the cache."""
    import io

    monkeypatch.delenv(env_vars.PROFILE_CACHE)  # the workdir's own cache
    from skyjax.launcher import launch

    env = {"PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), REPO]),
           "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}
    outputs = []
    for _ in range(2):
        out = io.BytesIO()
        rc = launch([str(tmp_path)], 2, 300, env=env, module="test_profiler", stdout=out)
        text = out.getvalue().decode()
        assert rc == 0, text[-4000:]
        outputs.append(text)
    results = [sorted(line.split("RESULT ", 1)[1] for line in text.splitlines()
                      if "RESULT " in line) for text in outputs]
    assert len(results[0]) == 2 and results[0][0].split()[1:] == results[0][1].split()[1:]
    assert results[1] == results[0]  # the second run loaded the very same profile
    assert "reusing cached profile" in outputs[1]
    (cached,) = (tmp_path / "profiles").glob("*.json")
    prof = load_profile(str(cached))
    assert prof.extra["profiler"]["link_probe"] == "transport"
    assert [d["name"] for d in prof.devices] == ["proc0:cpu0", "proc1:cpu0"]
    # slow-downs (1, 3), each timed alone: whole calls (units net of the fixed cost per call,
    # plus that cost), since a tiny unit's net time can be 0 on either device; about 9 / 7 of
    # the x1 device's at a load of five times the cores (test_measured_slowdowns_keep_order...)
    calls = len(prof.units) * (prof.forward_call_s + prof.backward_call_s)
    total = (prof.forward_s + prof.backward_s).sum(axis=0) + calls
    assert total[1] > 1.15 * total[0]
    assert prof.latency_s[0, 1] > 0.003 * 0.5  # the emulated link's sleep: a lower bound
    assert np.all(prof.input_s > 0)  # each process timed its own device's input put


def _child(workdir: str) -> None:
    from skyjax.transport import group as distributed
    from skyjax.transport import TransferServerTransport

    distributed.initialize()
    rank, n = jax.process_index(), jax.process_count()
    c = tiny_config(n, slowdowns=(1, 3), regions=("a", "b"), link_latency_s=0.003)
    c.cluster.mode = "distributed"
    clu = cl.cluster_from_config(c)
    transport = TransferServerTransport(rank, n, clu.jax_devices[rank], clu.links,
                                        namespace="profile-test", timeout_s=120)
    prof = cached(c, workdir, cluster=clu, transport=transport, namespace="test", log=print)
    print(f"RESULT rank={rank} key={prof.extra['cache_key']} "
          f"fwd={np.round(prof.forward_s, 9).tolist()} lat={prof.latency_s.tolist()}", flush=True)
    distributed.shutdown()


if __name__ == "__main__":
    _child(sys.argv[1])


@pytest.mark.slow
def test_codecs_the_bound_allows_are_timed_and_sized():
    """A relaxation bound of 4 bits (``config.relax.handoff_bits``): the profile gains every
    codec's bytes per unit output (from shapes: int8 at least 3.5x, int4 at least 6x fewer
    than the uncoded carry of hidden 64 plus its mask) and each device's coding time, slower
    on the emulated 3x device; another cache key than the exact bound's; none by default."""
    c = tiny_config(2, layers=2, hidden=64, seq_len=32, slowdowns=(1, 3))
    assert Options.from_config(c).codecs == ()  # the exact bound times none
    c.relax.handoff_bits = 4
    opts = Options.from_config(c)
    assert opts.codecs == ("bf16", "int8", "int4")
    prof = measure(c, options=opts)
    assert set(prof.codecs) == {"bf16", "int8", "int4"}
    raw = np.array([u["output_bytes"] for u in prof.units[:-1]], float)
    for name, least in (("bf16", 1.9), ("int8", 3.5), ("int4", 6.0)):
        coded = np.asarray(prof.codecs[name]["output_bytes"][:-1])
        assert (raw / coded >= least).all(), (name, raw / coded)
        rate = np.asarray(prof.codecs[name]["seconds_per_byte"])
        # slower on the 3x device, by less than 3x under load: the emulation sleeps (k - 1)x the
        # fastest run seen, and a loaded host's typical run of so small a program is several
        # times that (1.35x seen with the suite's two workers, about 9 / 7 at five times the cores)
        assert (rate > 0).all() and rate[1] > 1.1 * rate[0], (name, rate)
    assert "codec_bytes" not in prof.units[0]
    exact = Options.from_config(tiny_config(2, layers=2, hidden=64, seq_len=32,
                                            slowdowns=(1, 3)))
    assert cache_key(Workload.from_config(c), cl.cluster_from_config(c), opts) != cache_key(
        Workload.from_config(c), cl.cluster_from_config(c), exact)
    again = Profile.from_json(json.loads(json.dumps(prof.to_json())))
    assert again.codecs["int8"]["output_bytes"].tolist() == prof.codecs["int8"][
        "output_bytes"].tolist()


def test_zero_bubble_runs_time_the_split_backward():
    """A zero-bubble (or "auto") run's profile also times each unit's backward split in B and W
    as a zero-bubble stage runs them (``backward_input`` then ``backward_weight``), under another
    cache key; ``backward_s`` stays the whole backward. On the tiny model W is positive, and
    B + W comes to the whole backward within a generous factor (1.1-1.3x on layers measured:
    two calls, and B keeps what W needs); the profile round-trips it and plans with it."""
    from skyjax.plan.pricing.passes import weight_s
    from skyjax.profile import measure as measure_lib
    from skyjax.profile import units
    from skyjax.profile.cache import cache_payload
    from skyjax.profile.chain import chain_spec

    c = tiny_config(1, layers=2, hidden=64, seq_len=32)
    plain = Options.from_config(c)
    assert not plain.weight and "weight" not in cache_payload(
        Workload.from_config(c), cl.cluster_from_config(c), plain)  # keys as before
    c.pipeline.schedule = "auto"
    assert Options.from_config(c).weight
    c.pipeline.schedule = "zb-h1"
    opts = Options.from_config(c)
    assert opts.weight and key_of(c) != cache_key(
        Workload.from_config(c), cl.cluster_from_config(c), plain)
    workload, clu = Workload.from_config(c), cl.cluster_from_config(c)
    spec = chain_spec(workload.model, workload.granularity, None, True)
    got = units.measure_units(spec, sample_microbatch(workload.model, *workload.microbatch), clu,
                              opts, make_optimizer(c.train), quiet, wake=False)
    bwd, b, w = got["backward_s"][:, 0], got["backward_input_s"][:, 0], got[
        "backward_weight_s"][:, 0]
    layers = [i for i, u in enumerate(got["units"]) if u["kind"] == "layer"]
    assert layers and np.all(w[layers] > 0) and np.all(b[layers] > 0), (b, w)
    ratio = (b + w)[layers] / bwd[layers]
    assert np.all((ratio > 0.5) & (ratio < 3.0)), ratio  # 1.1-1.3 measured
    assert np.all(w[layers] < 2.0 * bwd[layers]), (w, bwd)
    n = clu.num_devices
    prof = measure_lib.assemble(workload, clu, opts, "k", got, np.zeros((n, n)),
                                np.full((n, n), np.inf), {})
    np.testing.assert_array_equal(prof.backward_weight_s, got["backward_weight_s"])
    np.testing.assert_array_equal(prof.backward_input_s, got["backward_input_s"])
    np.testing.assert_array_equal(prof.backward_s, got["backward_s"])
    again = Profile.from_json(json.loads(json.dumps(prof.to_json())))
    np.testing.assert_array_equal(again.backward_weight_s, prof.backward_weight_s)
    np.testing.assert_array_equal(again.backward_input_s, prof.backward_input_s)
    np.testing.assert_array_equal(weight_s(again), prof.backward_weight_s)  # B and W as measured
    older = Profile.from_json({k: v for k, v in prof.to_json().items()
                               if k != "backward_input_s"})  # a profile without B: as before
    assert older.backward_input_s is None
    np.testing.assert_allclose(weight_s(older), np.minimum(prof.backward_weight_s,
                                                           prof.backward_s))


def test_a_decoders_skeleton_stands_for_its_layers_and_names_its_tied_bytes():
    """A GPT-2 shape given alone (python -m skyjax.profile): one layer's attention and MLP
    units stand for every layer; the micro-batch's labels are next tokens, one per position;
    the first and last unit hold the tied embedding (profile.json tied_bytes)."""
    from skyjax.models.decoder import DecoderConfig
    from skyjax.profile import chain as chain_lib
    from skyjax.profile.units import tied_nbytes

    cfg = DecoderConfig(family="gpt2", vocab_size=64, hidden_size=16, num_hidden_layers=3,
                        num_attention_heads=2, max_position_embeddings=16,
                        tie_word_embeddings=True, hidden_act="gelu_new")
    spec = chain_lib.skeleton_chain(cfg, "sublayer")
    assert spec.names == ["embeddings"] + [f"layer_{i}.{k}" for i in range(3)
                                           for k in ("attention", "mlp")] + ["head"]
    assert spec.rep == [0, 1, 2, 1, 2, 1, 2, 3]
    assert [tied_nbytes(spec.chain[r]) for r in (0, 1, 3)] == [64 * 16 * 4, 0, 64 * 16 * 4]
    carry, labels = chain_lib.sample_microbatch(cfg, 2, 8)
    assert labels.shape == (2, 8) and carry["input_ids"].shape == (2, 8)
    # GPT-2's n_inner None: the model record holds the size it computes with (4 x hidden)
    record = chain_lib.Workload(cfg, (2, 8), "layer", {"name": "adamw", "clip": True}).record()
    assert record["intermediate_size"] == 64 and record["hidden_size"] == 16
