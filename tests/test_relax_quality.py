"""A relaxed plan still learns: on the demo (``configs/local_demo.py``) and on
the CSV walkthrough (``configs/csv_pairs.py``), runs that the planner relaxes (int8 hand-offs on
a slow link, int8 or DiLoCo averaging between pipelines) end within 2 % of the exact run's eval
metric over the same steps, for all three, and so do DiLoCo with its outer deltas in top-k
2-bit (``relax.outer_compression``) and the peer modes (``decentral``, ``decentral-int8``,
``async``: :mod:`skyjax.runtime.decentralized`); the sparse hand-off codec does on the demo
only (figures in the comment above ``ASSERTED``).

The planner is forced as docs/guide/relaxation.md's example forces it, without its sleeps: each run
plans on a fixed profile (``config.profile.path``) whose devices sit in regions joined at
100 Mbit/s and 40 ms, with the codecs timed; memory caps make every plan cross a slow link (the
hand-off runs), or a whole model fits every device and the exchange crosses (the averaging runs).
The peer modes are forced: with them allowed the planner takes the plan it prices cheapest
(the exact exchange, run behind the backward, or another mode), so it is replaced in the run's
process by one pipeline per device in the mode under test (``FORCED``). The devices themselves
run at the host's speed with no link emulation, so only the math differs: the exact run is the
reference under any plan (same seed, same losses), and each relaxed run asserts that its
plan.json holds the relaxation it is about.
"""

from __future__ import annotations

import fcntl
import json
import os

import numpy as np
import pytest

from skyjax.profile.format import Profile, save_profile
from tests.helpers import REPO, make_profile, run_code, run_module

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CONFIGS = {"demo": f"{REPO}/configs/local_demo.py", "csv": f"{REPO}/configs/csv_pairs.py"}
DEVICES = {"demo": 4, "csv": 2}
# the demo's own (DiLoCo on the demo is 5 % short at 120); on the CSV walkthrough async (k = 1
# or 2) is 7-17 % short at 250 and reaches 1.000 at 300, where the Matthews correlations (seed
# 0) are: exact 1.000, DiLoCo 1.000, DiLoCo in top-k 2-bit 1.000, decentral 0.993,
# decentral-int8 1.000, async (k = 2) 1.000. The demo's peer modes: 1.000 each
STEPS = {"demo": 200, "csv": 300}
# The CSV walkthrough's own batch (32) learns its rule by the seed (below); 128 examples a step
# (and its 13 tokens in 16 positions rather than 24) learn it at seeds 0-2
FLAGS = {"demo": [], "csv": ["--config.data.batch_size=128", "--config.data.seq_len=16"]}
STATE = 8e6  # state bytes per unit: 2e6 gradient bytes, 0.16 s per unit across 100 Mbit/s
# the codecs' bytes per uncoded byte (topk2: the outer compression's, timed like a codec)
WIRE = {"bf16": 0.5, "int8": 0.27, "int4": 0.15, "sparse": 0.125, "topk2": 0.07}
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
    # the int4 hand-off codec (sign-flipped and rotated blocks, 15 levels), allowed from
    # handoff_bits 4
    "int4 hand-offs": ({"demo": (("eu", "eu", "us", "us"), 2.25 * STATE),
                        "csv": (("eu", "us"), 3.5 * STATE)},
                       ["--config.allocation.max_pipelines=1", "--config.relax.handoff_bits=4"]),
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
    # the peer modes (forced, FORCED): one peer per step on the ring, in float32 or in int8
    # differences to the pair's last mean; the exact average applied 2 steps late
    "decentral averaging": ({"demo": (("a", "b", "c", "d"), 1e12), "csv": (("eu", "us"), 1e12)},
                            ["--config.relax.peers=ring"]),
    "decentral-int8 averaging": (
        {"demo": (("a", "b", "c", "d"), 1e12), "csv": (("eu", "us"), 1e12)},
        ["--config.relax.peers=ring", "--config.relax.peer_bits=8"]),
    "async averaging": ({"demo": (("a", "b", "c", "d"), 1e12), "csv": (("eu", "us"), 1e12)},
                        ["--config.relax.async_steps=2"]),
}
# the cases whose plan is forced: one pipeline per device, whole micro-batches shared evenly,
# in this averaging (the run's own bound, config.relax, allows it)
FORCED = {"decentral averaging": "decentral", "decentral-int8 averaging": "decentral-int8",
          "async averaging": "async"}
_FORCING = """
import runpy, sys
import skyjax.train as train
def forced(profile, strategy, schedule, m, *args, relax, **kwargs):
    import dataclasses
    prof, n = dataclasses.replace(profile, relax=relax), profile.num_devices
    return train.plan_lib.evaluate_pipelines(
        prof, [[(d, 0, prof.num_units)] for d in range(n)],
        [m // n + (i < m % n) for i in range(n)], schedule, averaging={mode!r})
train.plan_lib.plan = forced
sys.argv = ["skyjax.main"] + {argv!r}
runpy.run_module("skyjax.main", run_name="__main__")
"""


def run(tmp_path, config: str, profile: Profile, flags: list[str], forced: str = ""
        ) -> tuple[dict, dict]:
    """A run of ``config`` planned on ``profile`` (``forced``: its plan one pipeline per device
    in that averaging); its summary and plan."""
    path = tmp_path / "profile.json"
    save_profile(profile, str(path))
    n = DEVICES[config]
    argv = [f"--config={CONFIGS[config]}", f"--workdir={tmp_path / 'run'}",
            f"--config.profile.path={path}", f"--config.train.steps={STEPS[config]}",
            f"--config.train.log_every={STEPS[config]}", "--config.allocation.calibrate_steps=0",
            f"--config.cluster.slowdowns={(1,) * n}", "--config.relax.min_gain=0",
            *FLAGS[config], *flags]
    done = (run_code(_FORCING.format(mode=forced, argv=argv), timeout=600) if forced
            else run_module("skyjax.main", *argv, timeout=600))
    assert done.returncode == 0, done.stderr[-4000:]
    read = lambda name: json.loads((tmp_path / "run" / name).read_text())  # noqa: E731
    return read("summary.json"), read("plan.json")


def metric(summary: dict) -> float:
    return float(summary["eval_scores"][summary["metric"]])


@pytest.fixture(scope="module")
def exact(tmp_path_factory):
    """The exact run's summary of a config, run when first asked for (one pipeline on the
    hand-off profile; exactness makes it the reference for every plan), once per test session:
    pytest-xdist's workers share it through a file in the session's folder, under a lock."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base

    def of(config: str) -> dict:
        path = shared / f"relax_quality_exact_{config}.json"
        with open(shared / f"relax_quality_exact_{config}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker waits for the run, then reads
            if not path.exists():
                regions, caps = CASES["int8 hand-offs"][0][config]
                summary, plan = run(tmp_path_factory.mktemp(f"exact_{config}"), config,
                                    forcing_profile(DEVICES[config], regions, caps),
                                    ["--config.allocation.max_pipelines=1"])
                assert all(s.get("codec", "none") == "none" for s in plan["stages"])
                path.write_text(json.dumps(summary))
            return json.loads(path.read_text())
    return of


# Figures (seed 0): the demo's eval accuracy after 200 steps, 1.000 for the exact run and all three
# relaxed ones; int4 hand-offs (sign-flipped and rotated blocks, 15 levels: 4.5 bits) 1.000 (rotated
# without the flips, as int4 once was: 1.000 too); DiLoCo + top-k 1/8 in 2 bits 1.000 (1/16: 0.995,
# 1/32: 0.961, 1/64: 0.921); sparse hand-offs (sign-flipped and rotated blocks, the top half on 8
# magnitudes from its least to its largest, the rest as signs at the dropped half's mean magnitude:
# 4 bits per value) 1.000 (the plain top half in 4 bits, the rest zero, 3.5 bits: 0.986; a quarter:
# 0.330, an eighth in int8: 0.654).
# The CSV walkthrough's Matthews correlation on dev after 250 steps of 128 examples: exact 1.000,
# int8 hand-offs 1.000, int8 averaging 1.000, DiLoCo (H = 10, 2 pipelines) 0.993, DiLoCo + top-k 1/8
# in 2 bits 1.000 (1/16: 0.971). Int4 hand-offs after 300 steps: 0.993 (final loss 0.0067; rotated
# without the flips 0.507, below). Sparse hand-offs after 300 steps: 0.821 (final loss 0.14, still
# learning; exact 1.000), so its case is not asserted on the CSV walkthrough. Its outcome there
# moves with the trajectory as a seed's does: the same codec with two other fixed sign patterns
# 0.993 and 1.000; every value's sign and 3-bit magnitude after the same flips and rotation (4.25
# bits, relative error 0.096 against the codec's 0.149) 0.970, 1.000 and 1.000 on the three
# patterns; int4 hand-offs (rotated, no flips) 0.507. At 250 steps
# the plain top half reached 0.053 (never left the first plateau, loss ln 3) for its cotangents
# (sparse forward, exact backward: 0.985; the reverse: 0.431): the examples' cotangents share
# most of their direction early on, so each lost the same small components and the batch's
# gradient kept the error; the rotation alone 0.477 (backward only), the dropped half as signs
# alone 0.766, both 0.720, the fixed position signs too 1.000 (both directions: 0.963 with 15
# levels and float32 scales, 4.5 bits; the codec's levels, simulated in float32, 1.000).
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


# In CI: all but int4 hand-offs on the demo; on the CSV walkthrough DiLoCo, the relaxation that
# changes the math most (each pipeline trains alone for H steps), DiLoCo in top-k, and the peer
# modes. Int4 hand-offs, and the CSV walkthrough's int8 hand-offs and int8 averaging (figures
# above), run by hand: RELAX_QUALITY_EVERY_CASE=1 (about 5 minutes more of the suite's 20).
BY_HAND = os.environ.get("RELAX_QUALITY_EVERY_CASE") == "1"
PAIRS = [(case, config) for config in ASSERTED for case in CASES
         if (config == "demo" and case != "int4 hand-offs") or case.startswith("diloco averaging")
         or case in FORCED or (BY_HAND and case != "sparse hand-offs")]


@pytest.mark.parametrize("case,config", PAIRS, ids=[f"{c}-{k}" for c, k in PAIRS])
def test_a_relaxed_run_reaches_the_exact_runs_eval_metric(tmp_path, exact, config, case):
    profiles, flags = CASES[case]
    regions, caps = profiles[config]
    summary, plan = run(tmp_path, config, forcing_profile(DEVICES[config], regions, caps), flags,
                        FORCED.get(case, ""))
    if case.endswith("hand-offs"):  # the slow link carries the codec, and only that one
        codec = case.split()[0]
        codecs = [s.get("codec", "none") for s in plan["stages"]]
        assert codecs.count(codec) == 1 and set(codecs) == {"none", codec}, plan
    else:
        assert len(plan["shares"]) > 1 and plan["averaging"] == case.split()[0], plan
        if "top-k" in case:
            assert plan["outer_compression"] == "topk2", plan
    reference = exact(config)
    want, got = metric(reference), metric(summary)
    assert want > (0.8 if config == "demo" else 0.95), reference  # the exact run learned
    assert abs(got - want) <= TOLERANCE * want, (case, config, got, want)
    assert summary["final_loss"] != reference["final_loss"]  # the math did change
