"""Several pipelines in data parallel (skyjax.plan.data_parallel.pipelines, pipeline_split): the planner against
brute force, one pipeline unchanged, when several win or lose, plan.json, the simulator."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.plan import InfeasibleError
from skyjax.plan.pricing.cost import evaluate_tables
from skyjax.plan.data_parallel.split import candidate_splits, greedy_shares, search
from skyjax.plan.pricing.exchange import BACK, BETWEEN, IN_GROUP, PHASES, routing, routing_s
from skyjax.plan.data_parallel.pipelines import evaluate_pipelines, exchange_s, fractional_bound, grad_prefix
from skyjax.plan.replay.simulate import simulate_plan
from skyjax.plan.model.types import Plan
from tests.helpers import make_profile, random_chains, random_profile


def _partitions(items: list[int], k_max: int):
    """Every set partition of ``items`` into at most k_max blocks (independent of the planner's
    enumeration)."""
    if not items:
        yield []
        return
    head, rest = items[0], items[1:]
    for part in _partitions(rest, k_max):
        for i in range(len(part)):
            yield part[:i] + [[head] + part[i]] + part[i + 1:]
        if len(part) < k_max:
            yield [[head]] + part


def _chains(prof, block, schedule, m_i, memo):
    """Every chain on ``block`` that fits with m_i micro-batches: each ordered subset of its
    devices x each cut, priced by the cost model, as (T_i without sync_s, plan), least T_i
    first."""
    key = (tuple(block), m_i)
    if key not in memo:
        t = plan_lib.tables(prof, schedule, m_i)
        found = []
        u = prof.num_units
        for n in range(1, min(u, len(block)) + 1):
            for devs in itertools.permutations(block, n):
                for cuts in itertools.combinations(range(1, u), n - 1):
                    b = (0,) + cuts + (u,)
                    try:
                        p = evaluate_tables(prof, t, list(zip(devs, b, b[1:])), "bf", False,
                                            None)
                    except InfeasibleError:
                        continue
                    found.append((p.step_time_s - t.sync_s, p))
        memo[key] = sorted(found, key=lambda x: x[0])
    return memo[key]


def _allreduce(prof, plans) -> float:
    """AR from the design doc's formula, written out independently."""
    per: dict[int, float] = {}
    gb = [u.get("param_bytes", u["state_bytes"] / 4) for u in prof.units]
    for i, pi in enumerate(plans):
        for j, pj in enumerate(plans):
            for s in pi.stages if i != j else ():
                for r in pj.stages:
                    lo, hi = max(s.units[0], r.units[0]), min(s.units[1], r.units[1])
                    if lo < hi:
                        bw = prof.bandwidth_Bps[s.device, r.device]
                        c = (prof.latency_s[s.device, r.device] + sum(gb[lo:hi]) / bw
                             if bw > 0 else math.inf)
                        per[s.device] = per.get(s.device, 0.0) + c
    direct = max(per.values(), default=0.0)
    # or through one group of all used devices (the profile names no regions): the routing of
    # skyjax.plan.pricing.exchange, checked on its own by test_exchange_routing_replays_exactly
    chains = [[(s.device, *s.units) for s in p.stages] for p in plans]
    used = sorted(d for c in chains for d, _, _ in c)
    if len(plans) < 2 or len(used) < 2:
        return direct
    grouped = exchange_s(chains, grad_prefix(prof), prof.latency_s, prof.bandwidth_Bps,
                         groups=[used])[0]
    return min(direct, grouped)


def _brute_force(prof, schedule, m, k_max, every=True) -> float:
    """The least T over every partition into at most k_max blocks x every composition of m x
    (``every``) every tuple of chains, one per block, or else each block's least-T_i chain
    (the first of the least T_i, as the planner's chain search would have it)."""
    memo: dict = {}
    ars: dict = {}
    best = math.inf
    for part in _partitions(list(range(prof.num_devices)), k_max):
        for cuts in itertools.combinations(range(1, m), len(part) - 1):
            b = (0,) + cuts + (m,)
            shares = [y - x for x, y in zip(b, b[1:])]
            lists = [_chains(prof, blk, schedule, m_i, memo) for blk, m_i in zip(part, shares)]
            if not all(lists):
                continue
            if not every:
                lists = [[x for x in lst if x[0] == lst[0][0]] for lst in lists]
            for combo in itertools.product(*lists):
                top = max(s for s, _ in combo) + prof.sync_s
                if top >= best:  # AR >= 0
                    continue
                key = tuple(tuple((s.device, *s.units) for s in p.stages) for _, p in combo)
                if key not in ars:
                    ars[key] = _allreduce(prof, [p for _, p in combo])
                best = min(best, top + ars[key])
    return best


N_BRUTE = 36


def test_planner_matches_brute_force():
    """Every split, share and tuple of chains (one per pipeline) enumerated on random instances
    (3-6 devices, 5-3 units, m 4-6, GPipe and 1F1B, memory that sometimes binds, random links,
    some unreachable): the planner matches it and says exact. Counted: the instances where a
    chain with a larger T_i but a cheaper exchange beats each pipeline's least-T_i chain."""
    rng = np.random.default_rng(36)
    cases = several = 0
    gains = []
    for i in range(N_BRUTE):
        d = (3, 4, 5, 3, 4, 6)[i % 6]
        u = {3: 5, 4: 4, 5: 3, 6: 3}[d]
        prof = random_profile(rng, d, u)
        schedule, m = ("gpipe", "1f1b")[i % 2], int(rng.integers(4, 7))
        k_max = 3 if d < 6 else 2
        want = _brute_force(prof, schedule, m, k_max)
        if math.isinf(want):
            with pytest.raises(InfeasibleError):
                plan_lib.searched_plan(prof, "optimal", schedule, m, max_pipelines=k_max)
            continue
        got = plan_lib.searched_plan(prof, "optimal", schedule, m, max_pipelines=k_max)
        assert got.step_time_s == pytest.approx(want, rel=1e-9), (i, d, u, schedule, m)
        assert got.exact
        least = _brute_force(prof, schedule, m, k_max, every=False)
        assert want <= least * (1 + 1e-12)
        if want < least * (1 - 1e-9):
            gains.append(1 - want / least)
        if got.num_pipelines > 1:
            several += 1
            again = evaluate_pipelines(prof, [[(s.device, *s.units) for s in
                                               got.pipeline(p).stages]
                                              for p in range(got.num_pipelines)],
                                       got.shares, schedule)
            assert again.step_time_s == pytest.approx(got.step_time_s, rel=1e-12)
            assert sum(got.shares) == m and got.microbatches == m
            assert got.bottleneck_s == max(s.time_s for s in got.stages)
        cases += 1
    print(f"brute force: {cases} feasible, {several} with several pipelines; a chain beyond "
          f"the least T_i wins on {len(gains)}, by up to {max(gains, default=0):.1%} of T")
    assert cases >= N_BRUTE * 3 // 4 and several >= N_BRUTE // 4, (cases, several)
    assert gains, "no instance where a chain beyond each pipeline's least T_i wins"


def test_one_pipeline_is_todays_plan():
    rng = np.random.default_rng(7)
    for i in range(4):
        prof = random_profile(rng, 4, 5)
        for schedule in ("gpipe", "1f1b"):
            try:
                old = plan_lib.plan(prof, "optimal", schedule, 6)
            except InfeasibleError:
                continue
            assert plan_lib.plan(prof, "optimal", schedule, 6, max_pipelines=1) == old
            assert old.shares is None and old.allreduce_s == 0.0
    prof = make_profile(rng.uniform(0.5, 1.0, (4, 3)))
    assert plan_lib.plan(prof, "even", max_pipelines=4) == plan_lib.plan(prof, "even")
    with pytest.raises(ValueError, match="max_pipelines"):
        plan_lib.plan(prof, max_pipelines=-1)
    # 0: auto, up to min(16, devices, micro-batches) pipelines
    assert plan_lib.plan(prof, max_pipelines=0) == plan_lib.plan(prof, max_pipelines=4)


def _four_fast(state: float, bandwidth: float) -> object:
    """4 identical devices, 2 units, links of 0.5 s latency."""
    lat = np.full((4, 4), 0.5)
    np.fill_diagonal(lat, 0.0)
    return make_profile(np.ones((2, 4)), state=[state, state], out=[1e3, 1e3], latency=lat,
                        bandwidth=np.full((4, 4), bandwidth))


def test_several_pipelines_win_and_lose():
    prof = _four_fast(4e6, 1e9)  # 1 MB of gradients per unit: cheap to exchange
    one = plan_lib.plan(prof, "optimal", "gpipe", 8)
    several = plan_lib.plan(prof, "optimal", "gpipe", 8, max_pipelines=4)
    assert several.num_pipelines > 1 and several.step_time_s < 0.7 * one.step_time_s
    assert several.exact and sum(several.shares) == 8
    assert several.allreduce_s > 0
    devs = [s.device for s in several.stages]
    assert len(devs) == len(set(devs))
    heavy = _four_fast(4e12, 1e9)  # 1 TB per unit over 1 GB/s: exchanging costs 1000 s
    one = plan_lib.plan(heavy, "optimal", "gpipe", 8)
    assert plan_lib.plan(heavy, "optimal", "gpipe", 8, max_pipelines=4) == one
    with pytest.raises(ValueError, match="one pipeline"):  # any extra terms (no JAX here)
        plan_lib.plan(prof, max_pipelines=2, extra=object())


def test_json_round_trip():
    prof = _four_fast(4e6, 1e9)
    p = plan_lib.plan(prof, "optimal", "1f1b", 8, max_pipelines=4)
    assert p.num_pipelines > 1
    d = json.loads(json.dumps(p.to_json()))
    assert d["shares"] == p.shares and d["allreduce_s"] == p.allreduce_s
    assert Plan.from_json(d) == p
    assert [s.pipeline for s in p.stages] == sorted(s.pipeline for s in p.stages)


def test_simulator_equals_model_on_equal_stages():
    """overlap_comm=False and every stage of a pipeline equal (no links, latency 0): each
    pipeline's simulated step is its T_i exactly (simulate's balanced case), so the step is
    max T_i + AR + sync_s = T, less what the exchange behind the backward hides (unit 1's
    gradient leaves while unit 0's backward runs): between T - AR and T. With 1 and 3
    micro-batches, the pipelines also differ."""
    prof = make_profile(np.ones((4, 4)), state=[4e6] * 4, out=[0.0] * 4,
                        latency=np.zeros((4, 4)), bandwidth=np.full((4, 4), 1e9))
    p = evaluate_pipelines(prof, [[(0, 0, 2), (1, 2, 4)], [(2, 0, 2), (3, 2, 4)]], [3, 1],
                           "1f1b")
    assert p.allreduce_s == pytest.approx(2e6 / 1e9)  # one peer each: 2 units of 1 MB
    for schedule in ("gpipe", "1f1b"):
        p = evaluate_pipelines(prof, [[(0, 0, 2), (1, 2, 4)], [(2, 0, 2), (3, 2, 4)]], [3, 1],
                               schedule)
        sim = simulate_plan(p, prof, overlap_comm=False)
        assert p.step_time_s - p.allreduce_s < sim.step_time_s < p.step_time_s
        assert p.pipeline_step_s == [pytest.approx(6 * 2 + 2 * 6), pytest.approx(12)]
        assert len(sim.busy_s) == 4 and sim.busy_s[0] == pytest.approx(3 * 6)
        assert {s.microbatch for s in sim.spans if s.stage == 2 and s.kind in "FB"} == {3}
        # each device draws its exchange (one phase: direct) on its row, ending at the step
        ex = [s for s in sim.spans if s.kind == "X2"]
        assert sorted(s.stage for s in ex) == [0, 1, 2, 3]
        assert max(s.end for s in ex) == pytest.approx(sim.step_time_s - prof.sync_s)
        assert max(s.end for s in sim.spans if s.kind in "FB") < max(s.end for s in ex)
        assert len(simulate_plan(p, prof).trace["traceEvents"]) > 0


def test_evaluate_pipelines_checks():
    prof = _four_fast(4e6, 1e9)
    with pytest.raises(ValueError, match="already in another pipeline"):
        evaluate_pipelines(prof, [[(0, 0, 2)], [(0, 0, 2)]], [4, 4])
    bw = np.full((4, 4), 1e9)
    bw[0, 1] = 0.0
    cut = make_profile(np.ones((2, 4)), bandwidth=bw)
    with pytest.raises(InfeasibleError, match="exchange"):
        evaluate_pipelines(cut, [[(0, 0, 2)], [(1, 0, 2)]], [4, 4])
    one = evaluate_pipelines(prof, [[(0, 0, 1), (1, 1, 2)]], [8])
    assert one == plan_lib.evaluate(prof, [(0, 0, 1), (1, 1, 2)], "1f1b", 8, "custom")


def test_scale_candidates_and_bound():
    """At scale (no exhaustive search): greedy shares, candidate splits are disjoint,
    and the fractional bound holds against every plan found."""
    assert greedy_shares([lambda x: 2.0 * x, lambda x: 1.0 * x], 6) == [2, 4]
    rng = np.random.default_rng(5)
    kind = np.repeat([1.0, 2.0], 6)
    region = np.arange(12) // 6
    lat = np.where(region[:, None] == region[None, :], 1e-4, 0.05)
    fwd = rng.uniform(0.5, 1.0, (6, 1)) * kind[None, :]
    prof = make_profile(fwd, state=np.full(6, 1e6), out=np.full(6, 1e4), latency=lat,
                        bandwidth=np.full((12, 12), 1e9))
    t = plan_lib.tables(prof, "1f1b", 8)
    splits = candidate_splits(t, 4)
    for split in splits:  # disjoint pipelines on whole regions (a region may be left out)
        used = sorted(d for p in split for d in p)
        assert len(used) == len(set(used)) and set(region[used]) == {r for r in (0, 1) if
                                                                     r in region[used]}
        assert len(used) == 6 * len(set(region[used]))
    assert any(len(sum(split, [])) == 12 for split in splits)
    single = plan_lib.plan(prof, "optimal", "1f1b", 8)
    p = search(prof, "1f1b", 8, 4, single)
    assert not p.exact and p.step_time_s <= single.step_time_s
    assert fractional_bound(t) <= p.lower_bound_s * (1 + 1e-12) <= p.step_time_s


def test_exchange_routing_replays_exactly():
    """The exchange through link groups (skyjax.plan.pricing.exchange) on random pipelines and groups:
    its messages are exactly the three phases' (every other member to its group's
    representative, representatives to each other, back), a float32 replay of them leaves every
    owner of a unit with the same bits (the sum within rounding), its cost is the per-phase sum
    of the slowest sender's messages, and with every group of one device it is the direct
    exchange, priced by the design doc's formula."""
    rng = np.random.default_rng(51)
    for case in range(40):
        d, u, k = int(rng.integers(3, 9)), int(rng.integers(1, 7)), int(rng.integers(2, 5))
        k = min(k, d)
        chains = random_chains(rng, d, u, k)
        used = sorted(x for c in chains for x, _, _ in c)
        labels = rng.integers(0, 3, d)
        groups = [[x for x in used if labels[x] == g] for g in range(3)]
        groups = [g for g in groups if len(g) > 1]
        r = routing(chains, groups)
        label = {x: next((i for i, g in enumerate(groups) if x in g), -1 - x) for x in used}
        owner = [{ui: dv for dv, a, b in c for ui in range(a, b)} for c in chains]
        want = set()
        for ui in range(u):
            byg = {}
            for i in range(k):
                byg.setdefault(label[owner[i][ui]], []).append(owner[i][ui])
            assert r.order[ui] == list(byg.values())
            for members, rep in zip(byg.values(), r.rep[ui]):
                assert rep in members
                want |= {(IN_GROUP, x, rep, ui) for x in members if x != rep}
                want |= {(BACK, rep, x, ui) for x in members if x != rep}
            want |= {(BETWEEN, a, b, ui) for a in r.rep[ui] for b in r.rep[ui] if a != b}
        got = [(m.phase, m.src, m.dst, ui) for m in r.messages for ui in m.units]
        assert sorted(got) == sorted(want) and len(got) == len(set(got))
        # float32 replay: what each device holds of each unit, phase by phase
        vals = {(x, ui): rng.standard_normal(5).astype(np.float32)
                for i in range(k) for ui, x in owner[i].items()}
        truth = {ui: np.sum([vals[owner[i][ui], ui] for i in range(k)], axis=0)
                 for ui in range(u)}
        inbox, partial, total = {}, {}, {}
        for m in r.messages:
            if m.phase == IN_GROUP:
                for ui in m.units:
                    inbox[m.dst, m.src, ui] = vals[m.src, ui]
        for ui in range(u):
            for members, rep in zip(r.order[ui], r.rep[ui]):
                acc = vals[rep, ui] if members[0] == rep else inbox[rep, members[0], ui]
                for x in members[1:]:
                    acc = acc + (vals[rep, ui] if x == rep else inbox[rep, x, ui])
                partial[rep, ui] = acc
            for rep in r.rep[ui]:
                acc = partial[r.rep[ui][0], ui]  # received as sent: the same bits
                for q in r.rep[ui][1:]:
                    acc = acc + partial[q, ui]
                total[rep, ui] = acc
            for members, rep in zip(r.order[ui], r.rep[ui]):
                for x in members:
                    np.testing.assert_array_equal(total[rep, ui], total[r.rep[ui][0], ui])
            np.testing.assert_allclose(total[r.rep[ui][0], ui], truth[ui], rtol=1e-5,
                                       atol=1e-5)
        gp = np.concatenate([[0.0], np.cumsum(rng.uniform(1, 9, u) * 1e6)])
        lat, bw = rng.uniform(0, 0.01, (d, d)), rng.uniform(1e8, 1e9, (d, d))
        per = {p: {} for p in PHASES}
        for ph, a, b, ui in got:
            per[ph][a, b] = per[ph].get((a, b), 0.0) + gp[ui + 1] - gp[ui]
        phase_s = []
        for ph in per.values():
            send = {}
            for (a, b), g in ph.items():
                send[a] = send.get(a, 0.0) + lat[a, b] + g / bw[a, b]
            phase_s.append(max(send.values(), default=0.0))
        assert routing_s(r, gp, lat, bw)[0] == pytest.approx(sum(phase_s), rel=1e-12)
        # every group one device: the direct exchange
        direct = routing_s(routing(chains, None), gp, lat, bw)[0]
        by_pair = {}
        for i, ci in enumerate(chains):
            for j, cj in enumerate(chains):
                for x, a, b in ci if i != j else ():
                    for y, a2, b2 in cj:
                        lo, hi = max(a, a2), min(b, b2)
                        if lo < hi:
                            c = lat[x, y] + (gp[hi] - gp[lo]) / bw[x, y]
                            by_pair[x] = by_pair.get(x, 0.0) + c
        assert direct == pytest.approx(max(by_pair.values()), rel=1e-12), case


def test_more_pipelines_allowed_is_never_worse():
    """Beyond the exhaustive search (over 8 devices), each pipeline count is screened in turn
    from what fewer found, and the exhaustive search takes the counts in turn too: allowing
    more pipelines never gives a worse plan."""
    from tests.helpers import region_profile

    rng = np.random.default_rng(5)
    for case in range(3):
        prof = region_profile(rng, 12, 6, 3)
        prof.units = [dict(u, param_bytes=u["state_bytes"] / 4) for u in prof.units]
        steps = [plan_lib.plan(prof, "optimal", "1f1b", 12, max_pipelines=n).step_time_s
                 for n in (1, 2, 3, 4, 6, 12)]
        assert all(b <= a * (1 + 1e-12) for a, b in zip(steps, steps[1:])), (case, steps)
    for case in range(4):  # the exhaustive search: counts in turn, every chain per pipeline
        prof = random_profile(rng, 5, 4)
        steps = []
        for n in (1, 2, 3, 5):
            try:
                steps.append(plan_lib.plan(prof, "optimal", "gpipe", 6,
                                           max_pipelines=n).step_time_s)
            except InfeasibleError:
                steps.append(math.inf)
        assert all(b <= a * (1 + 1e-12) for a, b in zip(steps, steps[1:])), (case, steps)
