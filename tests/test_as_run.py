"""skyjax.plan.as_run: plans chosen and shown by the step as it runs (the simulator's)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.plan import InfeasibleError, as_run
from skyjax.plan.model.schedules import warmups
from skyjax.plan.replay.simulate import simulate_plan
from tests.helpers import make_profile, random_profile


def _latency_heavy(rng: np.random.Generator, d: int, u: int):
    """Heterogeneous devices in two or three regions: links inside a region fast, across them
    30-90 ms, sized so that latency rivals a stage's compute."""
    prof = random_profile(rng, d, u)
    region = rng.integers(0, 3, d)
    lat = np.where(region[:, None] == region[None, :], 1e-4, rng.uniform(0.03, 0.09, (d, d)))
    lat = (lat + lat.T) / 2
    np.fill_diagonal(lat, 0.0)
    bw = np.where(region[:, None] == region[None, :], 1e9, 1e8)
    return dataclasses.replace(prof, latency_s=lat, bandwidth_Bps=bw.astype(float),
                               forward_s=prof.forward_s * 0.05, backward_s=prof.backward_s * 0.05)


def _brute_force(prof, schedule: str, m: int, max_pipelines: int) -> float:
    """The least simulated step over every plan, enumerated here: devices used, their split
    into pipelines, each pipeline's order and cuts, the shares, and under 1F1B every warm-up
    row (at least 1F1B's, at most m - 1, not increasing, within memory)."""
    best = np.inf
    n, u = prof.num_devices, prof.num_units
    for size in range(1, n + 1):
        for used in itertools.combinations(range(n), size):
            for k in range(1, min(max_pipelines, size, m) + 1):
                for labels in itertools.product(range(k), repeat=size):
                    if set(labels) != set(range(k)) or labels[0] != 0 or any(
                            labels[i] > max(labels[:i]) + 1 for i in range(1, size)):
                        continue  # each split once: pipelines numbered by first device
                    blocks = [[d for d, lab in zip(used, labels) if lab == j] for j in range(k)]
                    per = [[[(d, bounds[i], bounds[i + 1]) for i, d in enumerate(order)]
                            for order in itertools.permutations(b)
                            for cuts in itertools.combinations(range(1, u), len(b) - 1)
                            for bounds in [(0, *cuts, u)]] if len(b) <= u else []
                           for b in blocks]
                    for chains in itertools.product(*per):
                        for cut in itertools.combinations(range(1, m), k - 1):
                            edges = (0, *cut, m)
                            shares = [edges[i + 1] - edges[i] for i in range(k)]
                            best = min(best, _least_of(prof, schedule, list(chains), shares))
    return best


def _least_of(prof, schedule, chains, shares) -> float:
    try:
        base = plan_lib.evaluate_pipelines(prof, chains, shares, schedule)
    except InfeasibleError:
        return np.inf
    out = simulate_plan(base, prof).step_time_s
    if schedule != "1f1b":
        return out
    rows = []
    for c, m in zip(chains, shares):
        own = warmups(len(c), m)
        rows.append([w for w in itertools.product(*[range(o, max(o, m - 1) + 1) if k < len(c) - 1
                                                    else [o] for k, o in enumerate(own)])
                     if all(a >= b for a, b in zip(w, w[1:]))])
    for combo in itertools.product(*rows):
        stages, ok = list(base.stages), True
        for i, warm in enumerate(combo):
            m = shares[i]
            own = warmups(len(chains[i]), m)
            for k, g in enumerate(base.stage_ids(i)):
                s = stages[g]
                act = sum(prof.units[x]["activation_bytes"] for x in range(*s.units))
                mem = s.memory_bytes + (min(m, warm[k] + 1) - min(m, own[k] + 1)) * act
                ok &= mem <= prof.devices[s.device]["memory_bytes"]
                stages[g] = dataclasses.replace(s, warmup=warm[k] if warm[k] > own[k] else None)
        if ok:
            out = min(out, simulate_plan(dataclasses.replace(base, stages=stages),
                                         prof).step_time_s)
    return out


@pytest.mark.parametrize("max_pipelines", [1, 2])
def test_small_instances_equal_brute_force_by_the_simulator(max_pipelines):
    """On small instances (2-3 devices, 2-3 units, m 2-4, GPipe, 1F1B and zero bubble, some with
    30-90 ms links, some with tight memory) the plan's step is the least simulated step of every
    plan, it is exact, and its price is its own simulated step."""
    rng = np.random.default_rng(59 + max_pipelines)
    checked = 0
    for i in range(24):
        d, u = int(rng.integers(2, 4)), int(rng.integers(2, 4))
        prof = _latency_heavy(rng, d, u) if i % 2 else random_profile(rng, d, u)
        schedule = ("1f1b", "gpipe", "1f1b", "zb-h1")[i % 4]
        m = int(rng.integers(2, 5))
        want = _brute_force(prof, schedule, m, max_pipelines)
        if np.isinf(want):
            with pytest.raises(InfeasibleError):
                plan_lib.plan(prof, "optimal", schedule, m, max_pipelines=max_pipelines)
            continue
        got = plan_lib.plan(prof, "optimal", schedule, m, max_pipelines=max_pipelines)
        assert got.step_time_s == pytest.approx(want, rel=1e-9), (i, d, u, schedule, m)
        assert got.exact
        assert simulate_plan(got, prof).step_time_s == pytest.approx(got.step_time_s, rel=1e-12)
        assert got.model_s is not None and got.model_s > 0
        checked += 1
    assert checked >= 12


def test_run_bound_holds_for_every_plan():
    """``run_bound`` is below the simulated step of every plan of random instances, one
    pipeline or two, with and without slow links."""
    rng = np.random.default_rng(7)
    checked = 0
    for i in range(20):
        prof = _latency_heavy(rng, 3, 3) if i % 2 else random_profile(rng, 3, 3)
        schedule, m = ("1f1b", "gpipe", "zb-h2")[i % 3], int(rng.integers(1, 5))
        for k in (1, 2):
            bound = as_run.run_bound(prof, schedule, m, k)
            for p in as_run.every_plan(prof, schedule, m, k):
                assert simulate_plan(p, prof).step_time_s >= bound * (1 - 1e-12)
                checked += 1
    assert checked > 500


def test_at_scale_the_choice_is_never_slower_than_the_search_and_states_its_gap():
    """A latency-heavy 12-device instance, beyond brute force: the plan chosen is never slower
    (simulated) than the cost model's own plan, and it carries a bound below its step."""
    rng = np.random.default_rng(3)
    for max_pipelines in (1, 3):
        prof = _latency_heavy(rng, 12, 12)
        try:
            searched = plan_lib.searched_plan(prof, "optimal", "1f1b", 16,
                                              max_pipelines=max_pipelines)
        except InfeasibleError:
            continue
        got = plan_lib.plan(prof, "optimal", "1f1b", 16, max_pipelines=max_pipelines)
        assert got.step_time_s <= simulate_plan(searched, prof).step_time_s * (1 + 1e-12)
        assert got.model_s == pytest.approx(
            plan_lib.evaluate_pipelines(prof, [[(s.device, *s.units) for s in
                                                got.pipeline(i).stages]
                                               for i in range(got.num_pipelines)],
                                        got.pipeline_shares(), "1f1b").step_time_s
            if got.num_pipelines > 1 else got.model_s)
        assert got.exact or got.lower_bound_s <= got.step_time_s


def test_the_price_is_the_simulated_step_on_a_slow_link():
    """Two devices across a 50 ms link, m = 8: T charges the round trip per micro-batch, the run
    pays it where the micro-batches in flight cannot hide it; the plan's price is the simulated
    step, well below T, and T is kept as ``model_s``."""
    lat = np.array([[0.0, 0.05], [0.05, 0.0]])
    prof = make_profile(np.full((4, 2), 0.01), latency=lat, out=[1e3] * 4,
                        bandwidth=np.full((2, 2), 1e9))
    p = plan_lib.plan(prof, "optimal", "1f1b", 8)
    assert p.step_time_s == pytest.approx(simulate_plan(p, prof).step_time_s, rel=1e-12)
    if len(p.stages) > 1:
        assert p.step_time_s < 0.8 * p.model_s
    again = plan_lib.Plan.from_json(p.to_json())
    assert again.model_s == p.model_s and again.step_time_s == p.step_time_s


def test_the_best_candidates_pipelines_are_tried_in_every_averaging_mode_allowed():
    """Four devices each in its own region (100 Mbit/s, 40 ms): the cost model's T prefers
    decentral-int8 on four pipelines, the simulator DiLoCo on the same pipelines; from that one
    candidate the plan is DiLoCo's, at the least simulated step over the modes allowed."""
    from skyjax.relax import Relaxation

    n = 4
    lat, bw = np.full((n, n), 0.04), np.full((n, n), 12.5e6)
    np.fill_diagonal(lat, 0.0)
    prof = make_profile(np.full((6, n), 2e-2), state=np.full(6, 8e6), act=np.full(6, 1e5),
                        out=np.full(6, 131072.0), memory=np.full(n, 1e12), latency=lat,
                        bandwidth=bw)
    relax = Relaxation(averaging="diloco", peers="ring", peer_bits=8, min_gain=0.0)
    prof = dataclasses.replace(prof, relax=relax, codecs={"int8": {
        "output_bytes": [u["output_bytes"] * 0.27 for u in prof.units],
        "seconds_per_byte": [1e-10] * n}})
    chains = [[(d, 0, 6)] for d in range(n)]
    by_mode = {m: simulate_plan(plan_lib.evaluate_pipelines(prof, chains, [1] * n, "1f1b",
                                                            averaging=m), prof).step_time_s
               for m in relax.averagings}
    candidate = plan_lib.evaluate_pipelines(prof, chains, [1] * n, "1f1b",
                                            averaging="decentral-int8")
    got = as_run.best_as_run(prof, [candidate], warm=False)
    assert got.averaging == min(by_mode, key=by_mode.get) == "diloco" != candidate.averaging
    assert got.step_time_s == pytest.approx(by_mode["diloco"])
