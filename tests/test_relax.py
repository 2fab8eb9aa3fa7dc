"""The relaxation bound (``skyjax.relax``) and what the planner chooses within it: a codec per
link and an averaging across pipelines, priced by the cost model, exact when nothing is allowed;
the profile and plan formats that carry them."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.names import CODEC_BITS
from skyjax.plan.data_parallel.pipelines import INT8_WIRE
from skyjax.plan.replay.simulate import simulate_plan
from skyjax.plan.pricing.stage_times import stage_actions_s
from skyjax.profile.format import Profile, ProfileError
from skyjax.relax import EXACT, Relaxation
from tests.helpers import assignments, make_profile, random_profile

WIRE = {"bf16": 0.5, "int8": 0.27, "int4": 0.15}  # bytes per uncoded byte (the tests' codecs)


def with_codecs(profile: Profile, rate: np.ndarray | float = 1e-10,
                names=("bf16", "int8", "int4")) -> Profile:
    """The profile with a ``codecs`` section: bytes scaled per codec, ``rate`` seconds per byte
    (per device, or one for all; int4 and int8 twice and three times bf16's)."""
    d = profile.to_json()
    out = [u["output_bytes"] for u in d["units"]]
    rates = np.broadcast_to(np.asarray(rate, float), (profile.num_devices,))
    d["codecs"] = {c: {"output_bytes": [x * WIRE[c] for x in out],
                       "seconds_per_byte": (rates * (1 + i)).tolist()}
                   for i, c in enumerate(names)}
    return Profile.from_json(d)


def brute_force_codecs(prof: Profile, schedule: str, m: int, bits: int) -> float:
    """The least T over every chain and every codec per link that ``bits`` allows, priced here
    from the profile's fields (the cost model of docs/design.md, version-1 profile: no fixed
    costs): a coded link sends the codec's bytes both ways and pays the two ends' coding."""
    allowed = [c for c, b in CODEC_BITS.items() if b >= bits]
    work = prof.forward_s + prof.backward_s
    state = [u["state_bytes"] for u in prof.units]
    act = [u["activation_bytes"] for u in prof.units]
    out = [u["output_bytes"] for u in prof.units]
    best = math.inf
    for chain in assignments(prof.num_units, prof.num_devices):
        p = len(chain)
        fits = all(sum(state[a:b]) + (m if schedule == "gpipe" else min(m, p - k))
                   * sum(act[a:b]) <= prof.devices[d]["memory_bytes"]
                   for k, (d, a, b) in enumerate(chain))
        if not fits:
            continue
        for codecs in itertools.product(allowed, repeat=p - 1):
            ts = []
            for k, (d, a, b) in enumerate(chain):
                t = float(work[a:b, d].sum())
                if k < p - 1:
                    e, c = chain[k + 1][0], codecs[k]
                    bw = prof.bandwidth_Bps[d, e]
                    if bw <= 0:
                        t = math.inf
                    else:
                        wire = out[b - 1] if c == "none" else prof.codecs[c]["output_bytes"][b - 1]
                        coding = 0.0 if c == "none" else (
                            prof.codecs[c]["seconds_per_byte"][d]
                            + prof.codecs[c]["seconds_per_byte"][e]) * out[b - 1]
                        t += 2 * (prof.latency_s[d, e] + wire / bw) + coding
                ts.append(t)
            best = min(best, sum(ts) + (m - 1) * max(ts))
    return best


@pytest.mark.parametrize("seed", range(8))
def test_planner_matches_brute_force_over_codecs(seed):
    rng = np.random.default_rng(100 + seed)
    d = int(rng.integers(2, 5))
    prof = with_codecs(random_profile(rng, d, int(rng.integers(2, 5))),
                       rng.uniform(0, 2e-8, d))
    schedule, m = ("gpipe", "1f1b")[seed % 2], int(rng.integers(1, 6))
    for bits in (32, 16, 8, 4):
        want = brute_force_codecs(prof, schedule, m, bits)
        try:
            got = plan_lib.searched_plan(prof, "optimal", schedule, m,
                                relax=Relaxation(bits, min_gain=0.0))
        except plan_lib.InfeasibleError:
            assert math.isinf(want)
            continue
        assert got.exact
        assert got.step_time_s == pytest.approx(want, rel=1e-9)
        for s in got.stages:  # only codecs the bound allows
            assert CODEC_BITS[s.codec] >= bits
        # the plan re-prices to itself
        again = plan_lib.evaluate(_relaxed(prof, bits),
                                  [(s.device, *s.units) for s in got.stages], schedule, m)
        assert again.step_time_s == pytest.approx(got.step_time_s, rel=1e-12)


def _relaxed(prof: Profile, bits: int) -> Profile:
    import dataclasses

    return dataclasses.replace(prof, relax=Relaxation(bits, min_gain=0.0))


def two_regions(lat: float, bw: float, *, caps: float | None = None, param_bytes=4e6,
                out_bytes=132096.0, unit_s=0.002) -> Profile:
    """4 equal devices, two regions of two (fast links inside), 6 units shaped like the demo's
    (state 4x its parameter bytes), the cross-region links ``lat`` / ``bw``."""
    u = 6
    region = np.array([0, 0, 1, 1])
    same = region[:, None] == region[None, :]
    fwd = np.full((u, 4), unit_s)
    prof = make_profile(fwd, state=np.full(u, 4 * param_bytes), act=np.full(u, 3e6),
                        out=np.full(u, out_bytes),
                        memory=np.full(4, caps if caps else 1e12),
                        latency=np.where(same, 1e-4, lat), bandwidth=np.where(same, 4e9, bw))
    d = prof.to_json()
    for unit in d["units"]:
        unit["param_bytes"] = param_bytes
    return with_codecs(Profile.from_json(d), 4e-10)


def test_slow_link_gets_a_codec_fast_links_none():
    caps = 27e6  # no split of the 6 units over two devices fits (in-flight activations)
    slow = two_regions(0.04, 12.5e6, caps=caps, param_bytes=1e6)
    exact = plan_lib.plan(slow, "optimal", "1f1b", 4)
    relaxed = plan_lib.plan(slow, "optimal", "1f1b", 4, relax=Relaxation(8))
    assert all(s.codec == "none" for s in exact.stages) and exact.is_exact
    crossing = [k for k in range(len(relaxed.stages) - 1)
                if (relaxed.stages[k].device < 2) != (relaxed.stages[k + 1].device < 2)]
    assert crossing and all(relaxed.stages[k].codec == "int8" for k in crossing)
    assert all(s.codec == "none" for k, s in enumerate(relaxed.stages) if k not in crossing)
    assert relaxed.step_time_s < exact.step_time_s
    assert relaxed.to_json()["stages"][crossing[0]]["codec"] == "int8"
    four = plan_lib.plan(slow, "optimal", "1f1b", 4, relax=Relaxation(4))
    assert four.stages[crossing[0]].codec == "int4" and four.step_time_s < relaxed.step_time_s
    # 10 Gbit/s and 1 ms: coding costs more than the bytes it saves
    fast = two_regions(1e-3, 10e9 / 8, caps=caps, param_bytes=1e6)
    loose = plan_lib.plan(fast, "optimal", "1f1b", 4, relax=Relaxation(4, "diloco"))
    assert loose.is_exact
    assert loose.to_json() == plan_lib.plan(fast, "optimal", "1f1b", 4).to_json()


def test_two_regions_relax_the_averaging_where_it_pays():
    """Exact: the pipelines stay in one region (an exchange across the slow link costs more
    than the other region's devices gain). Relaxed: every device works, averaged across."""
    slow = two_regions(0.04, 12.5e6, param_bytes=1e6)
    region = lambda plan: {s.device // 2 for s in plan.stages}  # noqa: E731
    exact = plan_lib.plan(slow, "optimal", "1f1b", 4, max_pipelines=4)
    assert len(region(exact)) == 1 and exact.averaging == "exact"
    diloco = plan_lib.plan(slow, "optimal", "1f1b", 4, max_pipelines=4,
                           relax=Relaxation(averaging="diloco", outer_every=50))
    assert region(diloco) == {0, 1} and diloco.averaging == "diloco"
    assert diloco.num_pipelines >= 3 and diloco.step_time_s < exact.step_time_s
    assert diloco.outer_every == 50
    back = plan_lib.Plan.from_json(json.loads(json.dumps(diloco.to_json())))
    assert (back.averaging, back.outer_every, back.outer_lr, back.outer_momentum) == (
        "diloco", 50, 0.7, 0.5)
    int8 = plan_lib.plan(slow, "optimal", "1f1b", 4, max_pipelines=4,
                         relax=Relaxation(averaging="int8"))
    if len(region(int8)) == 2:  # int8 sends INT8_WIRE of the bytes, plus coding
        assert int8.averaging == "int8" and int8.step_time_s < exact.step_time_s
    assert INT8_WIRE == pytest.approx((1 + 4 / 64) / 4)
    # 10 Gbit/s and 1 ms, compute 10x longer: DiLoCo would save under min_gain of the step
    fast = two_regions(1e-3, 10e9 / 8, param_bytes=1e6, unit_s=0.02)
    exact = plan_lib.plan(fast, "optimal", "1f1b", 4, max_pipelines=4)
    chosen = plan_lib.plan(fast, "optimal", "1f1b", 4, max_pipelines=4,
                           relax=Relaxation(averaging="diloco"))
    assert chosen.to_json() == exact.to_json() and chosen.averaging == "exact"
    eager = plan_lib.plan(fast, "optimal", "1f1b", 4, max_pipelines=4,
                          relax=Relaxation(averaging="diloco", min_gain=0.0))
    assert eager.averaging == "diloco"
    assert exact.step_time_s * 0.95 <= eager.step_time_s < exact.step_time_s


@pytest.mark.parametrize("seed", range(4))
def test_no_relaxation_plans_exactly_as_before(seed):
    """With a codecs section but the default bound, every plan is the plan of the profile
    without one (same json), one pipeline or several."""
    rng = np.random.default_rng(seed)
    base = random_profile(rng, 4, 4)
    coded = with_codecs(base, 1e-12)
    for pipes in (1, 2):
        try:
            want = plan_lib.plan(base, "optimal", "gpipe", 4, max_pipelines=pipes).to_json()
        except plan_lib.InfeasibleError:
            continue
        assert plan_lib.plan(coded, "optimal", "gpipe", 4, max_pipelines=pipes).to_json() == want
        assert plan_lib.plan(coded, "optimal", "gpipe", 4, max_pipelines=pipes,
                             relax=EXACT).to_json() == want


def test_a_codec_the_profile_has_not_timed_is_named():
    prof = with_codecs(random_profile(np.random.default_rng(0), 3, 3), names=("bf16",))
    with pytest.raises(ValueError, match=r"relax.handoff_bits=8 allows the int8 codec but the "
                                         r"profile has not measured it"):
        plan_lib.plan(prof, "optimal", "1f1b", 4, relax=Relaxation(8))
    assert plan_lib.plan(prof, "optimal", "1f1b", 4, relax=Relaxation(16))


def test_averaging_without_the_int8_timings_plans_the_modes_it_can_price(tmp_path, capsys):
    """diloco allows every mode up to it, int8 included: a profile without the int8 codec is
    planned over the modes it can price (exact and the DiLoCo ones), and the command says in
    one line which modes it left out and why; a bound that names an int8 mode still needs it."""
    import dataclasses

    from skyjax.cli import plan as plan_cli
    from skyjax.plan.pricing.exchange import unpriced_modes
    from skyjax.profile.format import save_profile

    slow = dataclasses.replace(two_regions(0.04, 12.5e6, param_bytes=1e6), codecs={})
    relax = Relaxation(averaging="diloco")
    assert unpriced_modes(dataclasses.replace(slow, relax=relax)) == ("int8-across", "int8")
    got = plan_lib.plan(slow, "optimal", "1f1b", 4, max_pipelines=4, relax=relax)
    assert not got.averaging.startswith("int8")
    path = tmp_path / "profile.json"
    save_profile(slow, str(path))
    assert plan_cli.main(["--profile", str(path), "--microbatches", "4", "--pipelines", "4",
                          "--averaging", "diloco"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["note: relax.averaging=diloco also allows int8-across and int8, left out: "
                   "the profile lacks the int8 codec's timings (profile.codecs.int8; profile "
                   "with this bound to price them)"]
    with pytest.raises(ValueError, match=r"^relax\.averaging=int8: pricing the int8 exchange "
                                         r"needs the int8 codec's timings"):
        plan_lib.plan(slow, "optimal", "1f1b", 4, max_pipelines=4,
                      relax=Relaxation(averaging="int8"))
    with pytest.raises(ValueError, match=r"^relax\.peer_bits=8: pricing decentral-int8 "
                                         r"needs the int8 codec's timings"):
        plan_lib.plan(slow, "optimal", "1f1b", 4, max_pipelines=4,
                      relax=Relaxation(peers="ring", peer_bits=8))


def test_the_simulator_charges_the_codec():
    """A coded link: the simulated actions carry the coding time and the link the codec's bytes;
    their sums are the cost model's stage times."""
    prof = two_regions(0.04, 12.5e6, caps=27e6, param_bytes=1e6)
    plan = plan_lib.plan(prof, "optimal", "1f1b", 1, relax=Relaxation(8))
    fwd, bwd, link = stage_actions_s(plan, prof)
    model = sum(s.time_s for s in plan.stages)
    assert sum(fwd) + sum(bwd) + 2 * sum(link) == pytest.approx(model, rel=1e-9)
    sim = simulate_plan(plan, prof, overlap_comm=False)  # one micro-batch: T, exactly
    assert sim.step_time_s == pytest.approx(plan.step_time_s, rel=1e-9)


def test_profile_codecs_round_trip_and_name_bad_fields():
    prof = with_codecs(random_profile(np.random.default_rng(1), 2, 3))
    again = Profile.from_json(json.loads(json.dumps(prof.to_json())))
    np.testing.assert_array_equal(again.codecs["int4"]["output_bytes"],
                                  prof.codecs["int4"]["output_bytes"])
    d = prof.to_json()
    d["codecs"]["int3"] = d["codecs"].pop("int4")
    with pytest.raises(ProfileError, match=r"profile\.codecs\.int3: unknown codec"):
        Profile.from_json(d)
    d = prof.to_json()
    d["codecs"]["int8"]["seconds_per_byte"] = [1e-9]
    with pytest.raises(ProfileError, match=r"profile\.codecs\.int8\.seconds_per_byte: expected "
                                           r"2 entries"):
        Profile.from_json(d)


def test_the_bound():
    assert Relaxation().is_exact and Relaxation().handoff_codecs == ("none",)
    assert Relaxation(8).handoff_codecs == ("none", "bf16", "int8")
    assert Relaxation(averaging="diloco").averagings == ("exact", "int8-across", "int8",
                                                         "diloco-across", "diloco")
    assert Relaxation(averaging="int8-across").averagings == ("exact", "int8-across")
    assert Relaxation(averaging="int8-across").measured_codecs == ("int8",)
    assert Relaxation(16, "int8").measured_codecs == ("bf16", "int8")
    # the per-axis bounds: decentral from peers, decentral-int8 with peer_bits 8 (int8 timed)
    assert Relaxation(peers="ring", async_steps=2).averagings == ("exact", "decentral", "async")
    assert Relaxation(peers="ring", peer_bits=8).averagings == ("exact", "decentral",
                                                                "decentral-int8")
    assert Relaxation(peers="ring", peer_bits=8).measured_codecs == ("int8",)
    assert Relaxation(peer_bits=8).averagings == ("exact",)  # peers none: no peer mode
    for bad, match in (({"handoff_bits": 5}, "relax.handoff_bits"),
                       ({"averaging": "topk"}, "relax.averaging"),
                       ({"averaging": "diloco", "outer_every": 0}, "relax.outer_every"),
                       ({"peers": "ring", "peer_bits": 4}, "relax.peer_bits")):
        with pytest.raises(ValueError, match=match):
            Relaxation(**bad)


def test_a_lost_pipeline_keeps_what_the_plan_relaxed():
    """After a loss the survivors' plan (``pipeline_split.without_devices``) keeps each kept
    stage's codec and the averaging: losing a process does not silently change the relaxed
    math of the others."""
    from skyjax.plan.data_parallel.split import without_devices

    stages = [plan_lib.Stage(0, (0, 3), 0.0, 0.0, 0, codec="int8"), plan_lib.Stage(1, (3, 6), 0.0,
                                                                                   0.0, 0),
              plan_lib.Stage(2, (0, 3), 0.0, 0.0, 0, pipeline=1, codec="int4"),
              plan_lib.Stage(3, (3, 6), 0.0, 0.0, 0, pipeline=1),
              plan_lib.Stage(4, (0, 6), 0.0, 0.0, 0, pipeline=2)]
    plan = plan_lib.Plan("optimal", "1f1b", 4, stages, 0.0, 0.0, False, shares=[2, 1, 1],
                         averaging="diloco", outer_every=7, outer_lr=0.7, outer_momentum=0.5)
    prof = with_codecs(make_profile(np.full((6, 5), 0.002), state=np.full(6, 4e6),
                                    out=np.full(6, 132096.0)))
    after = without_devices(prof, plan, [3])
    assert [(s.device, s.codec) for s in after.stages] == [(0, "int8"), (1, "none"),
                                                          (4, "none")]
    assert (after.averaging, after.outer_every) == ("diloco", 7)


def test_a_bound_with_peer_modes_never_plans_slower_than_without_them():
    """The relaxed plan of a bound with peer modes is the faster of that bound's search and the
    same bound's without them (the searches rank by T, and the candidates found with the peer
    modes priced may leave out the ordered modes' best): a looser bound never plans slower."""
    import dataclasses

    from skyjax.plan import planner

    prof = random_profile(np.random.default_rng(4), 2, 2)
    base = plan_lib.plan(prof, "optimal", "gpipe", 2)
    full = Relaxation(averaging="diloco", peers="ring", async_steps=2, min_gain=0.0)
    assert full.ordered_only == Relaxation(averaging="diloco", min_gain=0.0)
    assert Relaxation(averaging="diloco").ordered_only is None
    asked = []

    def plan_of(profile, cutoff, steps):
        asked.append(profile.relax)
        return dataclasses.replace(base, step_time_s=steps[profile.relax], model_s=1.0)

    for with_peers, without in ((9.0, 8.0), (7.0, 8.0)):
        steps = {Relaxation(): 10.0, full: with_peers, full.ordered_only: without}
        got = planner._exact_or_relaxed(prof, "optimal", full,
                                        lambda p, c: plan_of(p, c, steps))
        assert got.step_time_s == min(with_peers, without)
    assert asked[1:3] == [full, full.ordered_only]
