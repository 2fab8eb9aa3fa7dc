"""python -m skyjax.plan: table, --json, --out, --trace, clear errors with exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.cli import plan as plan_cli
from skyjax.profile.flops import paper_profile
from skyjax.profile.format import save_profile
from tests.helpers import make_profile, shared_profile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def profile_path(tmp_path):
    fwd = np.array([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0], [0.5, 1.0, 0.5]]) * 1e-3
    prof = make_profile(fwd, state=[1e6] * 4, act=[1e5] * 4, out=[1e6] * 4,
                        memory=[1e9, 1e9, 1e9], latency=np.full((3, 3), 1e-5),
                        bandwidth=np.full((3, 3), 1e10))
    path = tmp_path / "profile.json"
    save_profile(prof, str(path))
    return str(path)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "skyjax.plan", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)


def test_table_json_out_trace(profile_path, tmp_path, capsys):
    out, trace = tmp_path / "plan.json", tmp_path / "trace.json"
    assert plan_cli.main(["--profile", profile_path, "--strategy", "optimal", "--schedule",
                          "gpipe", "--microbatches", "4", "--out", str(out),
                          "--trace", str(trace)]) == 0
    text = capsys.readouterr().out
    for word in ("stage", "device", "units", "compute", "comm", "memory", "share", "100%",
                 "exact"):
        assert word in text
    plan = json.loads(out.read_text())
    assert set(plan) >= {"strategy", "schedule", "microbatches", "stages", "step_time_s",
                         "bottleneck_s", "exact"}
    assert plan["schedule"] == "gpipe" and plan["microbatches"] == 4 and plan["exact"] is True
    assert plan["stages"][0]["units"][0] == 0 and plan["stages"][-1]["units"][1] == 4
    assert set(plan["stages"][0]) == {"device", "units", "compute_s", "comm_s", "memory_bytes"}
    # --pipelines auto (the default): two equal devices on fast links beat one pipeline here,
    # each running the whole model on half the micro-batches
    assert plan["shares"] == [2, 2] and [s["units"] for s in plan["stages"]] == [[0, 4]] * 2
    events = json.loads(trace.read_text())["traceEvents"]
    shares = [plan["shares"][s.get("pipeline", 0)] for s in plan["stages"]]
    passes = [e for e in events if e["ph"] == "X" and e["pid"] == 0]
    assert sum(e["cat"] in ("forward", "backward") for e in passes) == 2 * sum(shares)
    assert sum(e["cat"] == "exchange" for e in passes) == 2  # each device's exchange
    assert plan_cli.main(["--profile", profile_path, "--schedule", "gpipe", "--microbatches",
                          "4", "--pipelines", "1", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert "shares" not in one and one["step_time_s"] > plan["step_time_s"]
    assert plan_cli.main(["--profile", profile_path, "--json", "--strategy", "even"]) == 0
    even = json.loads(capsys.readouterr().out)
    assert [s["units"] for s in even["stages"]] == [[0, 2], [2, 3], [3, 4]]


def test_subprocess_ok(profile_path):
    r = run_cli("--profile", profile_path, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["strategy"] == "optimal"


@pytest.mark.parametrize("edit,field", [
    (lambda d: d["units"][2].pop("activation_bytes"), "profile.units[2].activation_bytes"),
    (lambda d: d["forward_s"][1].pop(), "profile.forward_s[1]"),
    (lambda d: d["backward_s"][3].__setitem__(0, -1.0), "profile.backward_s[3][0]"),
    (lambda d: d["forward_s"][0].__setitem__(2, float("nan")), "profile.forward_s[0][2]"),
    (lambda d: d.__setitem__("version", 7), "profile.version"),
])
def test_bad_profile_one_line_exit_2(profile_path, edit, field):
    d = json.load(open(profile_path))
    edit(d)
    with open(profile_path, "w") as f:
        json.dump(d, f)
    r = run_cli("--profile", profile_path)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in r.stderr


def test_missing_file_and_infeasible(tmp_path, capsys):
    assert plan_cli.main(["--profile", str(tmp_path / "nope.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    prof = make_profile(np.ones((2, 2)), state=[10, 10], memory=[5, 5])
    path = tmp_path / "p.json"
    save_profile(prof, str(path))
    assert plan_cli.main(["--profile", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bytes" in err[0] and "device" in err[0]


def test_table_has_units_totals_and_the_bottleneck_marked(profile_path, capsys):
    assert plan_cli.main(["--profile", profile_path, "--strategy", "even"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("stage"))
    rows = [line for line in lines if line[:5].strip().isdigit()]
    assert len(rows) == 3 and "stage time" in header and "used" in header
    assert all(" ms" in r for r in rows)  # every time with its unit
    marked = [r for r in rows if r.endswith("<- bottleneck")]
    assert len(marked) == 1 and "100%" in marked[0]
    total = next(line for line in lines if line.startswith("total"))
    assert " 4 " in total  # all units
    # Columns line up: each row's compute ends where the header's "compute" ends.
    end = header.index("compute") + len("compute")
    assert all(r[end - 3:end] == " ms" for r in rows)


def test_plot_and_timeline_pictures(profile_path, tmp_path):
    pytest.importorskip("matplotlib")
    plot, timeline = tmp_path / "plan.png", tmp_path / "timeline.png"
    r = run_cli("--profile", profile_path, "--plot", str(plot), "--timeline", str(timeline))
    assert r.returncode == 0, r.stderr
    for path in (plot, timeline):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = run_cli("--profile", profile_path, "--plot", str(tmp_path / "no" / "such" / "p.png"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "does not exist" in r.stderr


def test_shared_host_model_on_when_the_profile_was_measured_under_it(tmp_path, capsys):
    """``--shared_host auto`` applies the shared-host model only to a profile whose devices
    record their host: two equal CPU processes on one host are better off as one stage (they
    would halve each other's speed), which the core model alone cannot see."""
    base = make_profile(np.full((6, 2), 0.1), latency=[[0.0, 0.01], [0.01, 0.0]])
    shared = shared_profile(base, (1, 1))
    stages = {}
    for name, prof in (("core", base), ("shared", shared)):
        path = tmp_path / f"{name}.json"
        save_profile(prof, str(path))
        for choice in ("auto", "on", "off"):
            assert plan_cli.main(["--profile", str(path), "--microbatches", "4", "--json",
                                  "--shared_host", choice]) == 0
            stages[name, choice] = len(json.loads(capsys.readouterr().out)["stages"])
    assert stages["core", "auto"] == stages["core", "off"] == 2
    assert stages["shared", "auto"] == stages["shared", "on"] == 1
    assert stages["shared", "off"] == 2


def test_certify_tightens_the_bound_never_the_plan(tmp_path, capsys):
    """``--certify`` computes the cost model's lower-bound certificates: the same plan, its
    bound (on the simulated step) still below its step, and one line on stderr with the cost
    model's plan, its T and the certified bound on T. The certificates bound T of one
    pipeline's plans: on the paper's case the searched plan's T is within 1 % of them."""
    path = tmp_path / "paper.json"
    save_profile(paper_profile(), str(path))
    out = {}
    for pipes in ("1", "auto"):
        for flags in ((), ("--certify",)):
            assert plan_cli.main(["--profile", str(path), "--schedule", "gpipe",
                                  "--microbatches", "32", "--json", "--pipelines", pipes,
                                  *flags]) == 0
            got = capsys.readouterr()
            out[pipes, flags] = json.loads(got.out)
            assert ("certificates: the cost model's plan has T" in got.err) == bool(flags)
        plain, certified = out[pipes, ()], out[pipes, ("--certify",)]
        assert plain["stages"] == certified["stages"]
        assert certified["exact"] or certified["lower_bound_s"] <= certified["step_time_s"]
    assert out["auto", ()]["stages"] == out["1", ()]["stages"]  # one pipeline is best here
    searched = plan_lib.searched_plan(paper_profile(), "optimal", "gpipe", 32, certify=True)
    bound = searched.step_time_s if searched.exact else searched.lower_bound_s
    assert searched.step_time_s <= 1.01 * bound


def test_time_scale_shows_the_rehearsals_time_base_and_declared_calls(profile_path, capsys):
    assert plan_cli.main(["--profile", profile_path, "--microbatches", "4", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plan_cli.main(["--profile", profile_path, "--microbatches", "4", "--json",
                          "--time_scale", "10"]) == 0
    scaled = json.loads(capsys.readouterr().out)
    assert [s["units"] for s in scaled["stages"]] == [s["units"] for s in plain["stages"]]
    assert scaled["step_time_s"] == pytest.approx(10 * plain["step_time_s"])
    assert plan_cli.main(["--profile", profile_path, "--microbatches", "4",
                          "--time_scale", "10"]) == 0
    out = capsys.readouterr().out
    assert "declared calls" in out and "declared messages" in out


@pytest.mark.parametrize("scale", ["inf", "0", "-2", "nan", "-inf"])
def test_a_time_scale_not_positive_and_finite_is_one_line_naming_the_flag(profile_path, scale,
                                                                         capsys):
    with pytest.raises(SystemExit) as e:
        plan_cli.main(["--profile", profile_path, f"--time_scale={scale}"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"python -m skyjax.plan: error: argument --time_scale: expected a positive "
                   f"finite number, got {scale} (--help for usage)"], err
    from skyjax.report import plan_report

    with pytest.raises(ValueError, match=r"--time_scale inf: expected a positive finite"):
        plan_report.plan_file(profile_path, "optimal", "1f1b", 4, time_scale=float("inf"))


def test_refusal_names_the_activations_in_flight(tmp_path, capsys):
    """The README's two-region cluster under one pipeline (every pair linked) is refused for
    what really does not fit: the first stages' micro-batches in flight under 1F1B."""
    from skyjax.cli.compose import main as compose_main

    out = tmp_path / "cluster.json"
    assert compose_main(["--cluster", "experiments/clusters/two_regions.json",
                         "--out", str(out)]) == 0
    capsys.readouterr()
    assert plan_cli.main(["--profile", str(out), "--microbatches", "8", "--pipelines", "1"]) == 1
    err = capsys.readouterr().err
    assert "bandwidth" not in err and "cannot reach" not in err
    assert ("the activations of the micro-batches in flight do not fit (1F1B keeps min(m, p - k) "
            "on stage k of p, m = 8)") in err
    assert "units [0, 2) (embeddings, layer0) over" in err


def test_summary_line_names_the_zero_bubble_credit(tmp_path, capsys):
    """A zero-bubble plan's summary shows its credit as a credit, in the line's own unit."""
    rng = np.random.default_rng(2)
    prof = make_profile(rng.uniform(0.01, 0.02, (4, 3)))
    path = tmp_path / "profile.json"
    save_profile(prof, str(path))
    assert plan_cli.main(["--profile", str(path), "--schedule", "zb-h1", "--microbatches",
                          "8", "--pipelines", "1"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines()
            if x.startswith("predicted step time")][0]
    assert "- zero-bubble credit " in line and "once-per-step costs -" not in line
    times = [tok for tok in line.replace(";", " ").replace("(", " ").split()
             if tok in ("s", "ms", "us", "ns")]
    assert len(set(times)) == 1, line
