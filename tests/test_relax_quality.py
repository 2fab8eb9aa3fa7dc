"""A relaxed plan still learns: on the demo (``configs/local_demo.py``) and on
the CSV walkthrough (``configs/csv_pairs.py``), runs that the planner relaxes (int8 hand-offs on
a slow link, int8 or DiLoCo averaging between pipelines) end within 2 % of the exact run's eval
metric over the same steps, for all three, and so does DiLoCo with its outer deltas in top-k
2-bit (``relax.outer_compression``); the sparse hand-off codec does on the demo only (figures in
the comment above ``ASSERTED``).

The planner is forced as docs/guide/relaxation.md's example forces it, without its sleeps: each run
plans on a fixed profile (``config.profile.path``) whose devices sit in regions joined at
100 Mbit/s and 40 ms, with the codecs timed; memory caps make every plan cross a slow link (the
hand-off runs), or a whole model fits every device and the exchange crosses (the averaging runs).
The devices themselves run at the host's speed with no link emulation, so only the math differs:
the exact run is the reference under any plan (same seed, same losses), and each relaxed run
asserts that its plan.json holds the relaxation it is about.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from skyjax.profile.format import Profile, save_profile
from tests.helpers import REPO, make_profile, run_module

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CONFIGS = {"demo": f"{REPO}/configs/local_demo.py", "csv": f"{REPO}/configs/csv_pairs.py"}
DEVICES = {"demo": 4, "csv": 2}
STEPS = {"demo": 200, "csv": 250}  # the demo's own (DiLoCo on the demo is 5 % short at 120)
# The CSV walkthrough's own batch (32) learns its rule by the seed (below); 128 examples a step
# (and its 13 tokens in 16 positions rather than 24) learn it at seeds 0-2
FLAGS = {"demo": [], "csv": ["--config.data.batch_size=128", "--config.data.seq_len=16"]}
STATE = 8e6  # state bytes per unit: 2e6 gradient bytes, 0.16 s per unit across 100 Mbit/s
# the codecs' bytes per uncoded byte (topk2: the outer compression's, timed like a codec)
WIRE = {"bf16": 0.5, "int8": 0.27, "int4": 0.15, "sparse": 0.11, "topk2": 0.07}
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
    # relax.outer_compression: DiLoCo's outer deltas in top-k (relax.outer_topk's default, 1/8
    # of each chunk) and 2 bits
    "diloco averaging in top-k 2-bit": (
        {"demo": (("a", "b", "c", "d"), 1e12), "csv": (("eu", "us"), 1e12)},
        ["--config.relax.averaging=diloco", "--config.relax.outer_compression=topk2"]),
    # the sparse hand-off codec (the top half of each block in 4 bits), allowed from
    # handoff_bits 2
    "sparse hand-offs": ({"demo": (("eu", "eu", "us", "us"), 2.25 * STATE),
                          "csv": (("eu", "us"), 3.5 * STATE)},
                         ["--config.allocation.max_pipelines=1", "--config.relax.handoff_bits=2"]),
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
                      *FLAGS[config], *flags, timeout=600)
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


# Figures (seed 0): the demo's eval accuracy after 200 steps, 1.000 for the exact run and all
# three relaxed ones; DiLoCo + top-k 1/8 in 2 bits 1.000 (1/16: 0.995, 1/32: 0.961, 1/64:
# 0.921); sparse hand-offs, the top half of each block in 4 bits, 0.986 (a quarter: 0.330, an
# eighth in int8: 0.654). The CSV walkthrough's Matthews correlation on dev after 250 steps of
# 128 examples: exact 1.000, int8 hand-offs 1.000, int8 averaging 1.000, DiLoCo (H = 10,
# 2 pipelines) 0.993, DiLoCo + top-k 1/8 in 2 bits 1.000 (1/16: 0.971); sparse hand-offs 0.053
# (never leaves the first plateau, loss ln 3: half of every activation dropped drowns the
# rule's small signal), so its case is not asserted on the CSV walkthrough.
# At the walkthrough's own 32 examples a step its exact run learns the rule (subject, then verb
# compared across the pair) late and by the seed (300 steps: 0.978 at seed 0, 0.54 to 0.71 at
# seeds 1-3, which separate only the contradictions), so a relaxed run, which perturbs the
# trajectory as a seed does, landed anywhere (0.36 to 1.00); a larger learning rate or a
# constant one never leaves the first plateau (loss ln 3), a smaller one is slower. Under Adam
# the rule's small gradient moves the weights by about lr x signal / batch noise, and the noise
# falls as the batch grows: at 128 examples the exact run reaches 1.000 at seeds 0, 1 and 2, but
# 0.533 at seed 3 (0.977 after 400 steps; at learning rate 1.5e-3, 1.000 at seeds 1 and 3 but
# 0.437 and 0.596 at seeds 0 and 2). Seeds 1-3 measured on one device (skyjax.baseline).
ASSERTED = ("demo", "csv")


# In CI: all on the demo; on the CSV walkthrough DiLoCo, the relaxation that changes the math
# most (each pipeline trains alone for H steps), and DiLoCo in top-k. Its int8 hand-offs and
# int8 averaging (figures above) run with the ids "int8 hand-offs-csv", "int8 averaging-csv" by
# hand: RELAX_QUALITY_EVERY_CASE=1 (about 2.5 minutes more of the suite's 20).
PAIRS = [(case, config) for config in ASSERTED for case in CASES
         if config == "demo" or case.startswith("diloco averaging")
         or (os.environ.get("RELAX_QUALITY_EVERY_CASE") == "1" and case != "sparse hand-offs")]


@pytest.mark.parametrize("case,config", PAIRS, ids=[f"{c}-{k}" for c, k in PAIRS])
def test_a_relaxed_run_reaches_the_exact_runs_eval_metric(tmp_path, exact, config, case):
    profiles, flags = CASES[case]
    regions, caps = profiles[config]
    summary, plan = run(tmp_path, config, forcing_profile(DEVICES[config], regions, caps), flags)
    if case.endswith("hand-offs"):  # the slow link carries the codec, and only that one
        codec = case.split()[0]
        codecs = [s.get("codec", "none") for s in plan["stages"]]
        assert codecs.count(codec) == 1 and set(codecs) == {"none", codec}, plan
    else:
        assert len(plan["shares"]) > 1 and plan["averaging"] == case.split()[0], plan
        if "top-k" in case:
            assert plan["outer_compression"] == "topk2", plan
    want, got = metric(exact[config]), metric(summary)
    assert want > (0.8 if config == "demo" else 0.95), exact[config]  # the exact run learned
    assert abs(got - want) <= TOLERANCE * want, (case, config, got, want)
    assert summary["final_loss"] != exact[config]["final_loss"]  # the math did change
