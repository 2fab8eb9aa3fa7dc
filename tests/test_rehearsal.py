"""Rehearsal (declared timing) of a cluster composed from parts: every call and message of the
real runtime taking the time the profile declares, the math unchanged, and the measured step
against the simulator's (skyjax.plan.replay.rehearsal, skyjax.cluster.rehearsal,
skyjax.runtime.rehearsal; the composition: tests/test_cluster_profile.py)."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import re
import threading
import time

import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.cluster.rehearsal import RehearsalLedger, RehearsalLinks, rehearsed_call
from skyjax.plan.replay.rehearsal import rehearsal_times, scale_plan, scale_profile
from skyjax.plan.replay.simulate import simulate_plan
from skyjax.plan.pricing.stage_times import stage_actions_s
from skyjax.profile.cluster_profile import compose
from skyjax.profile.format import save_profile
from skyjax.relax import Relaxation
from tests.helpers import REPO

GB = 1e9


def two_regions(cross_Bps: float = 1.25e9, memory: float = 6e8, layers: int = 6) -> dict:
    """16 devices of two kinds in two regions (as experiments/clusters/two_regions.json)."""
    return {"kinds": {"fast": {"flops_per_s": 2e13, "memory_bytes": memory},
                      "slow": {"flops_per_s": 1e13, "memory_bytes": memory}},
            "model": {"layers": layers},
            "regions": {"eu": {"fast": 4, "slow": 4}, "us": {"fast": 4, "slow": 4}},
            "links": {"inside": {"latency_s": 1e-5, "bandwidth_Bps": 1.25e10},
                      "between": [{"regions": ["eu", "us"], "latency_s": 0.02,
                                   "bandwidth_Bps": cross_Bps}]}}


# ------------------------------------------------------------------------ declared times

def test_declared_times_are_the_cost_models_and_scale_exactly():
    prof = compose(two_regions(cross_Bps=1.25e8))
    plan = plan_lib.plan(prof, "optimal", "1f1b", 8, max_pipelines=4,
                         relax=Relaxation(handoff_bits=8))
    assert plan.num_pipelines >= 2
    dec = rehearsal_times(plan, prof)
    for i in range(plan.num_pipelines):
        fwd, bwd, link = stage_actions_s(plan.pipeline(i), prof)
        ids = plan.stage_ids(i)
        assert [dec.stages[g].forward_s for g in ids] == fwd
        assert [dec.stages[g].backward_s for g in ids] == bwd
        stages = plan.pipeline(i).stages
        for k in range(len(stages) - 1):  # the declared link delay is the simulator's
            d, e = stages[k].device, stages[k + 1].device
            links = RehearsalLinks(dec.latency_s, dec.bandwidth_Bps, dec.wire_bytes, dec.coding_s)
            assert links.delay(d, e, 123) == pytest.approx(link[k], rel=1e-12)
            assert links.delay(e, d, 1) == pytest.approx(link[k], rel=1e-12)
            assert links.delay(d, e, 0) == prof.latency_s[d, e]
    k = 7.5
    sim = simulate_plan(plan, prof).step_time_s
    assert simulate_plan(scale_plan(plan, k), scale_profile(prof, k)).step_time_s == \
        pytest.approx(k * sim, rel=1e-9)
    assert scale_plan(plan, k).step_time_s == pytest.approx(k * plan.step_time_s)


def test_declared_call_waits_out_its_time_and_counts_overruns():
    ledger = RehearsalLedger()

    def work(x):
        time.sleep(x)
        return x

    for _ in range(2):  # the first call of a program compiles: not in the ledger
        _, took = rehearsed_call(work, 0.0, seconds=0.02, ledger=ledger)
        assert took >= 0.02
    _, took = rehearsed_call(work, 0.03, seconds=0.01, ledger=ledger)  # an overrun
    assert took >= 0.03
    rec = ledger.to_json()
    assert rec["calls"] == 2 and rec["overruns"] == 1
    assert rec["overrun_max_s"] >= 0.019


def test_fit_config_takes_the_profiles_devices_and_layers(tmp_path):
    from skyjax.config import base_config
    from skyjax.runtime.rehearsal import fit_config

    path = str(tmp_path / "p.json")
    save_profile(compose(two_regions(layers=5)), path)
    config = base_config()
    config.rehearse.profile = path
    fit_config(config)
    assert config.cluster.num_devices == 16 and config.model.num_hidden_layers == 5
    config.allocation.granularity = "sublayer"  # 7 units are not 3L + 2
    with pytest.raises(ValueError, match="has 7 units; a BERT at config.allocation.granularity"):
        fit_config(config)


def test_rehearsal_keys_that_would_undo_the_profile_are_refused(tmp_path):
    from skyjax.config import base_config, validate_config

    path = str(tmp_path / "p.json")
    save_profile(compose(two_regions()), path)
    config = base_config()
    config.rehearse.profile = path
    config.cluster.slowdowns = (1, 2)
    with pytest.raises(ValueError, match=r"config.cluster.slowdowns=\(1, 2\) cannot be combined "
                                         r"with config.rehearse.profile"):
        validate_config(config)
    config.cluster.slowdowns = ()
    config.rehearse.time_scale = 0.0
    with pytest.raises(ValueError, match="config.rehearse.time_scale=0.0"):
        validate_config(config)


# ------------------------------------------------------------------------ rehearsed runs

def _config(profile_path: str, steps: int, time_scale: float = 8.0, **relax):
    import configs.rehearse as base

    config = base.get_config()
    config.unlock()
    config.rehearse.profile = profile_path
    config.rehearse.time_scale = time_scale
    config.train.steps = steps
    config.train.log_every = 1
    config.pipeline.microbatches = 8
    for k, v in relax.items():
        setattr(config.relax, k, v)
    return config


def _losses(workdir: str) -> list[float]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [r["loss"] for r in map(json.loads, f) if "loss" in r]


@pytest.mark.slow
def test_sixteen_declared_devices_two_pipelines_same_math_and_step_as_simulated(tmp_path):
    """16 declared devices in two regions, two pipelines exchanging across the 20 ms link: the
    losses are a one-device run's, and the median step is the simulator's within 15 %. Time
    scale 16: the exchange's pieces are many small messages, and a busy host's cost per
    message must stay small beside what they declare."""
    from skyjax import train

    path = str(tmp_path / "cluster.json")
    save_profile(compose(two_regions()), path)
    config = _config(path, steps=5, time_scale=16.0)
    summary = train.train_and_evaluate(config, str(tmp_path / "rehearsal"))
    r = summary["rehearsal"]
    assert r["devices"] == 16 and r["pipelines"] >= 2, r
    assert abs(r["error"]) < 0.15, r
    assert r["calls"]["calls"] > 0

    plain = copy.deepcopy(config)
    plain.rehearse.profile = ""
    plain.cluster.num_devices = 1
    plain.allocation.max_pipelines = 1
    train.train_and_evaluate(plain, str(tmp_path / "one"))
    np.testing.assert_allclose(_losses(str(tmp_path / "rehearsal")),
                               _losses(str(tmp_path / "one")), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_int8_on_the_cross_region_link_rehearses_within_15_percent(tmp_path):
    """A slow cross-region link (1 Gbit/s): the plan's pipelines cross it in int8; the
    rehearsed step is the simulator's within 15 %."""
    from skyjax import train

    path = str(tmp_path / "cluster.json")
    save_profile(compose(two_regions(cross_Bps=1.25e8)), path)
    config = _config(path, steps=4, handoff_bits=8)
    summary = train.train_and_evaluate(config, str(tmp_path / "w"))
    plan = summary["plan"]
    with open(path) as f:
        regions = [d["region"] for d in json.load(f)["devices"]]
    crossing = [s for i, s in enumerate(plan["stages"][:-1])
                if s.get("pipeline", 0) == plan["stages"][i + 1].get("pipeline", 0)
                and regions[s["device"]] != regions[plan["stages"][i + 1]["device"]]]
    assert crossing and all(s.get("codec") == "int8" for s in crossing), plan
    r = summary["rehearsal"]
    assert r["pipelines"] >= 2 and abs(r["error"]) < 0.15, r
    assert np.isfinite(summary["final_loss"])


def three_regions() -> dict:
    """6 devices of two kinds in three regions joined by 30, 60 and 90 ms links, each too small
    for the 4-layer model alone: a cut-down experiments/clusters/three_regions.json, where the
    pipeline crosses a region boundary and the links' latency, not compute, sets the step."""
    return {"kinds": {"fast": {"flops_per_s": 2e13, "memory_bytes": 6e8},
                      "slow": {"flops_per_s": 1e13, "memory_bytes": 6e8}},
            "model": {"layers": 4},
            "regions": {"us": {"fast": 2}, "eu": {"fast": 1, "slow": 1}, "asia": {"slow": 2}},
            "links": {"inside": {"latency_s": 1e-5, "bandwidth_Bps": 1.25e10},
                      "between": [
                          {"regions": ["us", "eu"], "latency_s": 0.03, "bandwidth_Bps": 1.25e9},
                          {"regions": ["us", "asia"], "latency_s": 0.06, "bandwidth_Bps": 1.25e9},
                          {"regions": ["eu", "asia"], "latency_s": 0.09,
                           "bandwidth_Bps": 1.25e9}]}}


@pytest.mark.slow
def test_a_latency_heavy_rehearsal_takes_the_predicted_step_within_10_percent(tmp_path):
    """Three regions joined by 30-90 ms links: the measured median step is the plan's headline
    prediction (``step_time_s``, what ``skyjax.plan`` prints and the run logs) within 10 %.
    The declared times are waits (time scale 8: a layer's call 10-20 ms against ~1 ms of real
    compute, a hand-off across regions 240-720 ms), so the margin holds on a busy host."""
    from skyjax import train

    path = str(tmp_path / "cluster.json")
    save_profile(compose(three_regions()), path)
    config = _config(path, steps=6)
    summary = train.train_and_evaluate(config, str(tmp_path / "w"))
    r, plan = summary["rehearsal"], summary["plan"]
    with open(path) as f:
        regions = [d["region"] for d in json.load(f)["devices"]]
    assert len({regions[s["device"]] for s in plan["stages"]}) >= 2, plan  # it crosses a link
    gap = r["measured_step_s"] / plan["step_time_s"] - 1
    assert abs(gap) < 0.10, (f"measured {r['measured_step_s']:.4f} s, predicted "
                             f"{plan['step_time_s']:.4f} s ({100 * gap:+.1f} %)", r)
    assert summary["predicted_step_time_s"] == pytest.approx(plan["step_time_s"], rel=1e-9)


def test_a_bad_rehearsal_profile_is_one_line_before_jax_starts(tmp_path):
    from tests.helpers import run_module

    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 2}')
    out = run_module("skyjax.main", "--config", "configs/rehearse.py", "--workdir",
                     str(tmp_path / "w"), f"--config.rehearse.profile={bad}")
    assert out.returncode == 64
    assert out.stderr.strip().splitlines()[-1].startswith(
        f"skyjax.main: Invalid config: config.rehearse.profile='{bad}': profile.microbatch")
    assert not (tmp_path / "w").exists()


# ------------------------------------------------------------------------ stopping

def test_a_stop_ends_declared_waits_and_link_delays_in_every_thread():
    """A stage failing, or the run interrupted, ends waits of an hour at once: declared calls
    (``WaitStop``) and a message held back by its declared link (the transport's abort)."""
    import jax

    from skyjax.cluster.rehearsal import Stopped, WaitStop, rehearsed_wait
    from skyjax.transport import LocalTransport
    from skyjax.transport.base import TransportError

    stop, ledger, ended = WaitStop(), RehearsalLedger(), []

    def call():
        try:
            rehearsed_call(lambda: None, seconds=3600.0, ledger=ledger, stop=stop)
        except Stopped as e:
            ended.append(str(e))

    links = RehearsalLinks(np.array([[0.0, 3600.0], [3600.0, 0.0]]), np.full((2, 2), 1e9))
    transport = LocalTransport(jax.devices()[:1] * 2, links)

    def recv():
        try:
            transport.for_stage(1).recv(0, None, 0)
        except TransportError as e:
            ended.append(str(e))

    threads = [threading.Thread(target=call, daemon=True) for _ in range(3)]
    threads.append(threading.Thread(target=recv, daemon=True))
    for t in threads:
        t.start()
    transport.for_stage(0).send(0, np.zeros(2), 1)  # held back an hour by its link
    time.sleep(0.5)
    failure = RuntimeError("stage 2 failed")
    stop.set(failure)
    transport.abort(failure)
    for t in threads:
        t.join(30)
    assert not [t for t in threads if t.is_alive()], "a wait outlived its run's stop"
    assert len(ended) == 4 and all("stage 2 failed" in e for e in ended), ended
    with pytest.raises(Stopped):  # a later wait ends at once too
        rehearsed_wait(3600.0, stop)


def _small_cluster(tmp_path) -> str:
    """Two declared devices, two layers: the smallest rehearsal."""
    path = str(tmp_path / "cluster.json")
    save_profile(compose({"kinds": {"fast": {"flops_per_s": 2e13, "memory_bytes": 6e8}},
                          "model": {"layers": 2}, "regions": {"eu": {"fast": 2}},
                          "links": {"inside": {"latency_s": 1e-5, "bandwidth_Bps": 1.25e10}}}),
                 path)
    return path


# Ctrl-C's SIGINT at its default in the child (a background test runner may ignore it)
_SIGINT_DEFAULT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                   "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


def _stop_while_waiting(tmp_path, sig: int, module: str, args: list[str], started: str,
                        timeout_s: float = 60.0) -> tuple[int, list[str], float]:
    """Starts ``python -m module *args``; once a line holds ``started`` (the plan: a declared
    call of hours comes next), waits a moment and sends ``sig``. The exit status, the output's
    lines and the seconds from the signal to the exit (``timeout_s`` at most)."""
    log_path = tmp_path / "log"
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", _SIGINT_DEFAULT, "-m", module, *args],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while started not in log_path.read_text():
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "no plan line in 600 s"
            time.sleep(0.2)
        time.sleep(3.0)  # into the first declared call (or its compile, which ends first)
        assert proc.poll() is None, log_path.read_text()[-3000:]
        sent = time.monotonic()
        proc.send_signal(sig)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        return rc, log_path.read_text().splitlines(), time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


STOPPED = "skyjax.main: interrupted; stopped (committed checkpoints are kept)"


def _rehearse_args(path: str, workdir: str, time_scale: str = "1e8") -> list[str]:
    return ["--config", "configs/rehearse.py", "--workdir", workdir,
            f"--config.rehearse.profile={path}", "--config.train.steps=4",
            f"--config.rehearse.time_scale={time_scale}"]


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM,
                                                             marks=pytest.mark.slow)])
def test_a_stop_signal_ends_a_rehearsal_waiting_out_a_declared_call(tmp_path, sig):
    """At 1e8 every declared call lasts hours; Ctrl-C or SIGTERM ends the run (one process,
    a thread per stage) at once, with the interrupted line and 130."""
    workdir = str(tmp_path / "w")
    args = _rehearse_args(_small_cluster(tmp_path), workdir) + [
        "--config.rehearse.allow_long=True"]
    rc, lines, took = _stop_while_waiting(tmp_path, sig, "skyjax.main", args, "predicted step")
    assert rc == 130 and lines[-1] == STOPPED, (rc, took, lines[-10:])
    assert took < 60.0
    assert not os.path.exists(os.path.join(workdir, "summary.json"))


@pytest.mark.slow
def test_a_stop_signal_ends_a_rehearsal_of_one_process_per_device(tmp_path):
    """The same under ``skyjax.launch``, one process per declared device: SIGTERM to the
    launcher ends every process with its own line, none of them killed."""
    workdir = str(tmp_path / "w")
    args = ["--num_processes", "2", "--grace", "60", "--"] + _rehearse_args(
        _small_cluster(tmp_path), workdir) + ["--config.rehearse.allow_long=True",
                                              "--config.cluster.mode=distributed"]
    rc, lines, took = _stop_while_waiting(tmp_path, signal.SIGTERM, "skyjax.launch", args,
                                          "predicted step", timeout_s=90.0)
    assert rc == 128 + signal.SIGTERM, (rc, took, lines[-10:])
    assert "[launch] interrupted (signal 15); stopping all processes" in lines
    assert f"[p0] {STOPPED}" in lines and f"[p1] {STOPPED}" in lines, lines[-10:]
    assert took < 60.0  # the processes ended on their own, not at the SIGKILL after --grace


def test_a_rehearsal_predicted_to_run_for_days_is_refused_in_one_line(tmp_path):
    from tests.helpers import run_module

    workdir = tmp_path / "w"
    out = run_module("skyjax.main", *_rehearse_args(_small_cluster(tmp_path), str(workdir),
                                                    "1e9"))
    assert out.returncode == 64, out.stderr[-2000:]
    line = out.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"skyjax\.main: config\.rehearse\.time_scale=1e\+09: the run's 4 step\(s\) "
                        r"are predicted to take [\d,]+ days of wall-clock time \([\d.e+]+ s a "
                        r"step at this scale\); a rehearsal predicted to take over 24 h starts "
                        r"only with --config\.rehearse\.allow_long=True \(or lower the time "
                        r"scale\)", line), line
    assert not os.path.exists(workdir / "plan.json")



@pytest.mark.slow
def test_a_decoder_with_tied_weights_rehearses_with_the_same_math(tmp_path):
    """configs/gpt2_text.py rehearsed on a declared 4-device profile whose first and last units
    carry the tied embedding's bytes (profile.json tied_bytes): the tied message travels on the
    declared link, the losses are the one-device run's, and the median step is the simulator's
    (which prices that message) within 25 %."""
    import importlib.util

    from skyjax import train
    from tests.helpers import make_profile

    spec = importlib.util.spec_from_file_location(
        "gpt2_text", os.path.join(REPO, "configs", "gpt2_text.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    profile = make_profile(np.full((6, 4), 1e-2), latency=np.full((4, 4), 2e-3),
                           bandwidth=np.full((4, 4), 1e8))
    for u in (0, 5):
        profile.units[u]["tied_bytes"] = 512 * 64 * 4
    path = str(tmp_path / "declared.json")
    save_profile(profile, path)
    config = module.get_config()
    config.rehearse.profile = path
    config.cluster.slowdowns = ()
    config.allocation.calibrate_steps = 0
    config.allocation.max_pipelines = 1  # one pipeline: its first and last stage swap
    config.train.steps, config.train.log_every, config.data.eval_examples = 8, 1, 0
    summary = train.train_and_evaluate(config, str(tmp_path / "rehearsal"))
    r = summary["rehearsal"]
    assert r["devices_used"] >= 2 and r["pipelines"] == 1 and abs(r["error"]) < 0.25, r
    plain = module.get_config()
    plain.cluster.num_devices, plain.cluster.slowdowns = 1, ()
    plain.allocation.calibrate_steps = 0
    plain.train.steps, plain.train.log_every, plain.data.eval_examples = 8, 1, 0
    plain.profile.repeats = 1
    train.train_and_evaluate(plain, str(tmp_path / "one"))
    np.testing.assert_allclose(_losses(str(tmp_path / "rehearsal")),
                               _losses(str(tmp_path / "one")), rtol=0, atol=1e-5)
