"""A relaxed plan still learns: on the demo (``configs/local_demo.py``) and on
the CSV walkthrough (``configs/csv_pairs.py``), runs that the planner relaxes (int8 hand-offs on
a slow link, int8 or DiLoCo averaging between pipelines) end within 2 % of the exact run's eval
metric over the same steps. The demo does, for all three; the CSV walkthrough does not
(its exact run itself learns or not by the seed: the figures are in the comment above
``ASSERTED``, and only the demo is asserted).

The planner is forced as the README's relaxation example forces it, without its sleeps: each run
plans on a fixed profile (``config.profile.path``) whose devices sit in regions joined at
100 Mbit/s and 40 ms, with the codecs timed; memory caps make every plan cross a slow link (the
hand-off runs), or a whole model fits every device and the exchange crosses (the averaging runs).
The devices themselves run at the host's speed with no link emulation, so only the math differs:
the exact run is the reference under any plan (same seed, same losses), and each relaxed run
asserts that its plan.json holds the relaxation it is about.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from skyjax.profile.format import Profile, save_profile
from tests.helpers import REPO, make_profile, run_module

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CONFIGS = {"demo": f"{REPO}/configs/local_demo.py", "csv": f"{REPO}/configs/csv_pairs.py"}
DEVICES = {"demo": 4, "csv": 2}
STEPS = {"demo": 200, "csv": 300}  # the configs' own (DiLoCo on the demo is 5 % short at 120)
STATE = 8e6  # state bytes per unit: 2e6 gradient bytes, 0.16 s per unit across 100 Mbit/s
WIRE = {"bf16": 0.5, "int8": 0.27, "int4": 0.15}  # the codecs' bytes per uncoded byte
TOLERANCE = 0.02  # the relaxed run's eval metric within 2 % of the exact run's


def forcing_profile(n: int, regions: tuple[str, ...], caps: float) -> Profile:
    """6 units (the demo's 4 layers) on ``n`` equal devices in ``regions``: 100 Mbit/s and 40 ms
    between regions, fast inside one, ``caps`` bytes of memory each, every codec timed."""
    lat, bw = np.full((n, n), 1e-5), np.full((n, n), 1e10)
    for i in range(n):
        for j in range(n):
            if regions[i] != regions[j]:
                lat[i, j], bw[i, j] = 0.04, 12.5e6
    d = make_profile(np.full((6, n), 2e-2), state=np.full(6, STATE), act=np.full(6, 1e5),
                     out=np.full(6, 131072.0), memory=np.full(n, caps), latency=lat,
                     bandwidth=bw).to_json()
    for dev, region in zip(d["devices"], regions):
        dev["region"] = region
    d["codecs"] = {c: {"output_bytes": [u["output_bytes"] * WIRE[c] for u in d["units"]],
                       "seconds_per_byte": [1e-10 * (1 + i)] * n}
                   for i, c in enumerate(WIRE)}
    return Profile.from_json(d)


# relaxation -> (profile per config, flags): hand-offs cross one slow link (no device holds more
# than 2 of 6 units on the demo, 3 on the CSV's 2 devices); averaging over slow links only
CASES = {
    "int8 hand-offs": ({"demo": (("eu", "eu", "us", "us"), 2.25 * STATE),
                        "csv": (("eu", "us"), 3.5 * STATE)},
                       ["--config.allocation.max_pipelines=1", "--config.relax.handoff_bits=8"]),
    "int8 averaging": ({"demo": (("a", "b", "c", "d"), 1e12), "csv": (("eu", "us"), 1e12)},
                       ["--config.relax.averaging=int8"]),
    "diloco averaging": ({"demo": (("a", "b", "c", "d"), 1e12), "csv": (("eu", "us"), 1e12)},
                         ["--config.relax.averaging=diloco"]),
}


def run(tmp_path, config: str, profile: Profile, flags: list[str]) -> tuple[dict, dict]:
    """A run of ``config`` planned on ``profile``; its summary and plan."""
    path = tmp_path / "profile.json"
    save_profile(profile, str(path))
    n = DEVICES[config]
    done = run_module("skyjax.main", f"--config={CONFIGS[config]}",
                      f"--workdir={tmp_path / 'run'}", f"--config.profile.path={path}",
                      f"--config.train.steps={STEPS[config]}",
                      f"--config.train.log_every={STEPS[config]}",
                      "--config.allocation.calibrate_steps=0",
                      f"--config.cluster.slowdowns={(1,) * n}", "--config.relax.min_gain=0",
                      *flags, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    read = lambda name: json.loads((tmp_path / "run" / name).read_text())  # noqa: E731
    return read("summary.json"), read("plan.json")


def metric(summary: dict) -> float:
    return float(summary["eval_scores"][summary["metric"]])


@pytest.fixture(scope="module")
def exact(tmp_path_factory):
    """The exact run of each config (one pipeline on the hand-off profile; exactness makes it
    the reference for every plan)."""
    out = {}
    for config in ASSERTED:
        regions, caps = CASES["int8 hand-offs"][0][config]
        summary, plan = run(tmp_path_factory.mktemp(f"exact_{config}"), config,
                            forcing_profile(DEVICES[config], regions, caps),
                            ["--config.allocation.max_pipelines=1"])
        assert all(s.get("codec", "none") == "none" for s in plan["stages"])
        out[config] = summary
    return out


# The CSV walkthrough misses: its exact run learns late and by chance (Matthews on dev, 300
# steps: 0.978 at seed 0, 0.705 at seed 1; 600 steps: 1.000 and 0.166), so a relaxed run, which
# perturbs the trajectory as a seed does, lands anywhere: int8 hand-offs 0.861 (600 steps:
# 0.928), int8 averaging 1.000, DiLoCo (H = 10, 2 pipelines) 0.364 (600 steps: 0.315, loss
# still 0.85). Not run here (four runs that assert nothing) until the walkthrough's training is
# robust to a seed; adding "csv" to ASSERTED runs them.
ASSERTED = ("demo",)


@pytest.mark.parametrize("config", ASSERTED)
@pytest.mark.parametrize("case", list(CASES))
def test_a_relaxed_run_reaches_the_exact_runs_eval_metric(tmp_path, exact, config, case):
    profiles, flags = CASES[case]
    regions, caps = profiles[config]
    summary, plan = run(tmp_path, config, forcing_profile(DEVICES[config], regions, caps), flags)
    if case == "int8 hand-offs":  # the slow link carries int8, and only that one
        codecs = [s.get("codec", "none") for s in plan["stages"]]
        assert codecs.count("int8") == 1 and set(codecs) == {"none", "int8"}, plan
    else:
        assert len(plan["shares"]) > 1 and plan["averaging"] == case.split()[0], plan
    want, got = metric(exact[config]), metric(summary)
    assert want > (0.8 if config == "demo" else 0.3), exact[config]  # the exact run learned
    assert abs(got - want) <= TOLERANCE * want, (case, config, got, want)
    assert summary["final_loss"] != exact[config]["final_loss"]  # the math did change
