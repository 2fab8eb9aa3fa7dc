"""Rehearsal (declared timing): a cluster's profile composed from parts, every call and message of
the real runtime taking the time the profile declares, the math unchanged, and the measured step
against the simulator's (skyjax.profile.cluster_profile, skyjax.plan.replay.rehearsal,
skyjax.cluster.rehearsal, skyjax.runtime.rehearsal)."""

from __future__ import annotations

import copy
import json
import os
import time

import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.cluster.rehearsal import RehearsalLedger, RehearsalLinks, rehearsed_call
from skyjax.plan.replay.rehearsal import rehearsal_times, scale_plan, scale_profile
from skyjax.plan.replay.simulate import simulate_plan
from skyjax.plan.pricing.stage_times import stage_actions_s
from skyjax.profile.cluster_profile import ClusterError, compose
from skyjax.profile.format import save_profile
from skyjax.relax import Relaxation

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


# ------------------------------------------------------------------------ a cluster from parts

def test_compose_places_kinds_in_regions_with_a_link_per_region_pair():
    spec = two_regions()
    spec["regions"]["asia"] = {"slow": 2}
    spec["links"]["between"].append({"regions": ["us", "asia"], "latency_s": 0.1,
                                     "bandwidth_Bps": 1e8})
    spec["links"]["default"] = {"latency_s": 0.2, "bandwidth_Bps": 5e7}
    p = compose(spec)
    assert p.num_devices == 18 and p.num_units == 8
    regions = [d["region"] for d in p.devices]
    assert regions == ["eu"] * 8 + ["us"] * 8 + ["asia"] * 2
    assert [d["kind"] for d in p.devices[:8]] == ["fast"] * 4 + ["slow"] * 4
    # a slow device takes twice a fast one's unit times (half the FLOP rate, same call cost)
    assert np.allclose(p.forward_s[3, 4] - 20e-6, 2 * (p.forward_s[3, 0] - 20e-6))
    assert p.latency_s[0, 1] == 1e-5 and p.bandwidth_Bps[0, 1] == 1.25e10
    assert p.latency_s[0, 8] == p.latency_s[8, 0] == 0.02
    assert p.latency_s[8, 16] == 0.1 and p.bandwidth_Bps[17, 9] == 1e8
    assert p.latency_s[0, 16] == 0.2 and p.bandwidth_Bps[0, 17] == 5e7  # the default pair
    assert p.latency_s[5, 5] == 0.0
    assert {"int8", "bf16", "int4"} <= set(p.codecs)


def test_compose_takes_a_measured_kind_from_its_profile(tmp_path):
    measured = compose({"kinds": {"x": {"flops_per_s": 1e13, "memory_bytes": 1e9}},
                        "model": {"layers": 2}, "regions": {"lab": {"x": 1}},
                        "links": {"inside": {"latency_s": 0, "bandwidth_Bps": 1e9}}})
    measured.forward_s[:] *= 3.0  # as if measured slower than its FLOPs
    save_profile(measured, str(tmp_path / "x.json"))
    p = compose({"kinds": {"x": {"profile": "x.json"},
                           "y": {"flops_per_s": 1e13, "memory_bytes": 1e9}},
                 "model": {"layers": 2}, "regions": {"a": {"x": 2}, "b": {"y": 1}},
                 "links": {"inside": {"latency_s": 1e-5, "bandwidth_Bps": 1e10},
                           "default": {"latency_s": 0.05, "bandwidth_Bps": 1e8}}},
                base=str(tmp_path))
    assert np.allclose(p.forward_s[:, 0], measured.forward_s[:, 0])
    assert np.allclose(p.forward_s[:, 2] * 3.0, measured.forward_s[:, 0])
    assert p.latency_s[0, 2] == 0.05


@pytest.mark.parametrize("edit, words", [
    (lambda s: s["regions"]["eu"].update(gpu=2), "cluster.regions.eu.gpu: no such kind"),
    (lambda s: s["links"].update(between=[]), "no link between regions 'eu' and 'us'"),
    (lambda s: s["kinds"]["fast"].update(flops_per_s=-1), "cluster.kinds.fast.flops_per_s=-1"),
    (lambda s: s["links"]["between"][0].update(regions=["eu", "mars"]),
     "cluster.links.between[0].regions"),
    (lambda s: s["links"]["inside"].pop("bandwidth_Bps"), "cluster.links.inside: missing key"),
])
def test_compose_names_the_bad_key(edit, words):
    spec = two_regions()
    edit(spec)
    with pytest.raises(ClusterError, match=".*".join(map(__import__("re").escape,
                                                         [words]))):
        compose(spec)


def test_compose_cli_writes_a_profile_and_refuses_in_one_line(tmp_path):
    from tests.helpers import run_module

    spec = tmp_path / "c.json"
    spec.write_text(json.dumps(two_regions()))
    out = run_module("skyjax.profile.compose", "--cluster", str(spec), "--out",
                     str(tmp_path / "p.json"))
    assert out.returncode == 0, out.stderr
    assert "16 devices, 8 units" in out.stdout
    bad = two_regions()
    bad["links"]["between"] = []
    spec.write_text(json.dumps(bad))
    out = run_module("skyjax.profile.compose", "--cluster", str(spec), "--out",
                     str(tmp_path / "q.json"))
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "no link between regions" in out.stderr


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

def _config(profile_path: str, steps: int, **relax):
    import configs.rehearse as base

    config = base.get_config()
    config.unlock()
    config.rehearse.profile = profile_path
    config.rehearse.time_scale = 8.0
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
    losses are a one-device run's, and the median step is the simulator's within 15 %."""
    from skyjax import train

    path = str(tmp_path / "cluster.json")
    save_profile(compose(two_regions()), path)
    config = _config(path, steps=5)
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
