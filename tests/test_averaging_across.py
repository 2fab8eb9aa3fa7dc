"""Averaging per link class (``int8-across``, ``diloco-across``; skyjax.relax): exact inside a
link group (region), relaxed between groups. The planner prices what the runtime does, message
by message and phase by phase; the runtime keeps the replicas bit-identical (int8-across: every
step; diloco-across: inside a region every step, across after each outer step); with one group
of every device each is the exact exchange bit for bit, with every pipeline a group of its own
each is its all-pipelines mode (int8, diloco) bit for bit, and a region of several pipelines
is one data-parallel replica of the all-pipelines mode."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from skyjax import plan as plan_lib
from skyjax.plan.replay.rehearsal import rehearsal_times
from skyjax.plan.pricing.exchange import (BACK, BETWEEN, IN_GROUP, PHASES, pipeline_groups,
                                          routing, routing_s)
from skyjax.plan.data_parallel.pipelines import INT8_WIRE, grad_prefix, relaxed_exchange
from skyjax.profile.format import Profile
from skyjax.relax import Relaxation
from skyjax.runtime import averaging
from skyjax.runtime.local_executor import LocalExecutor
from tests.helpers import (BATCH, SEQ, fresh_chain, make_batch, make_profile, random_chains,
                           rng_for)

H = 3


def with_regions(prof: Profile, labels, rate, param_bytes) -> Profile:
    """``prof`` with device j in region ``labels[j]``, each unit's ``param_bytes`` and an int8
    codec timed at ``rate`` seconds per byte (per device)."""
    js = prof.to_json()
    for j, dev in enumerate(js["devices"]):
        dev["region"] = f"r{labels[j]}"
    for unit, b in zip(js["units"], param_bytes):
        unit["param_bytes"] = float(b)
    js["codecs"] = {"int8": {"output_bytes": [u["output_bytes"] * 0.27 for u in js["units"]],
                             "seconds_per_byte": list(np.broadcast_to(
                                 np.asarray(rate, float), (len(labels),)).tolist())}}
    return Profile.from_json(js)


def regional_profile(rng, d: int, u: int, labels, outer_every: int = H) -> Profile:
    """Random links, unit bytes and int8 coding rates; device j in region ``labels[j]``."""
    prof = make_profile(np.full((u, d), 0.01), latency=rng.uniform(0, 0.01, (d, d)),
                        bandwidth=rng.uniform(1e8, 1e9, (d, d)))
    prof = with_regions(prof, labels, rng.uniform(1e-10, 1e-9, d), rng.uniform(1, 9, u) * 1e6)
    return dataclasses.replace(prof, relax=Relaxation(averaging="diloco",
                                                      outer_every=outer_every))


def phase_s(route, gp, lat, bw, coded=(), rate=None, phases=PHASES) -> float:
    """The design doc's AR from the messages: per phase the slowest sender's messages one after
    another; coded phases send INT8_WIRE of the bytes plus the sender's coding."""
    total = 0.0
    for ph in phases:
        send = {}
        for m in route.messages:
            if m.phase != ph:
                continue
            g = sum(gp[x + 1] - gp[x] for x in m.units)
            c = lat[m.src, m.dst] + g * (INT8_WIRE if ph in coded else 1.0) / bw[m.src, m.dst]
            c += rate[m.src] * g if ph in coded else 0.0
            send[m.src] = send.get(m.src, 0.0) + c
        total += max(send.values(), default=0.0)
    return total


def test_per_class_exchange_replays_and_prices_exactly():
    """On random pipelines and regions: a replay of int8-across's messages (phase 1 exact sums at
    the representatives, phase 2 the int8 codes of partial sum + residual, phase 3 the totals)
    leaves every owner with the same bits, the sum within the codec's rounding, and each
    representative keeping what rounding dropped. The planner's price of each mode is the
    per-phase formula of those messages (int8-across: phase 2 coded; diloco-across: phases 1 and
    3 every step, 2 and 3 / H), each offered only where it is neither exact nor its
    all-pipelines mode, and it keeps the least, ties to the less relaxed."""
    rng = np.random.default_rng(7)
    seen = set()
    for case in range(40):
        d, u, k = int(rng.integers(3, 9)), int(rng.integers(1, 7)), int(rng.integers(2, 5))
        k = min(k, d)
        chains = random_chains(rng, d, u, k)
        if case % 2:  # pipelines inside one region each, so that diloco-across applies
            labels = np.zeros(d, int)
            for i, c in enumerate(chains):
                labels[[x for x, _, _ in c]] = int(rng.integers(0, 3))
        else:
            labels = rng.integers(0, 3, d)
        prof = regional_profile(rng, d, u, labels)
        used = sorted(x for c in chains for x, _, _ in c)
        groups = [[x for x in used if labels[x] == g] for g in range(3)]
        groups = [g for g in groups if len(g) > 1]
        gp = grad_prefix(prof)
        lat, bw = prof.latency_s, prof.bandwidth_Bps
        rate = np.asarray(prof.codecs["int8"]["seconds_per_byte"])
        owner = [{x: dv for dv, a, b in c for x in range(a, b)} for c in chains]
        price = {m: relaxed_exchange(chains, gp, prof, (m,)) for m in
                 ("exact", "int8-across", "int8", "diloco-across", "diloco")}
        direct = routing(chains, None)
        assert price["int8"][0] == pytest.approx(
            phase_s(direct, gp, lat, bw, PHASES, rate), rel=1e-12)
        assert price["diloco"][0] == pytest.approx(phase_s(direct, gp, lat, bw) / H, rel=1e-12)
        r = routing(chains, groups, np.diff(gp)) if groups else None
        phases = {m.phase for m in r.messages} if r else set()
        if {IN_GROUP, BETWEEN} <= phases:  # some unit sums in a group and crosses groups
            seen.add("int8-across")
            assert sorted(price["int8-across"][2]) == sorted(groups)
            assert price["int8-across"][0] == pytest.approx(
                phase_s(r, gp, lat, bw, (BETWEEN,), rate), rel=1e-12)
        else:  # exact or int8 here: not offered
            assert np.isinf(price["int8-across"][0])
        pg = pipeline_groups(chains, groups) if groups else None
        if pg is not None and 1 < len(set(pg)) < len(pg):
            seen.add("diloco-across")
            assert price["diloco-across"][0] == pytest.approx(
                phase_s(r, gp, lat, bw, phases=(IN_GROUP, BACK))
                + phase_s(r, gp, lat, bw, phases=(BETWEEN, BACK)) / H, rel=1e-12)
        else:  # exact or diloco here (or a pipeline across regions): not offered
            assert np.isinf(price["diloco-across"][0])
        chosen = relaxed_exchange(chains, gp, prof)
        least = min(p[0] for p in price.values())
        first = next(m for m, p in price.items() if p[0] == least)  # the less relaxed on ties
        assert chosen[0] == least and chosen[1] == first
        if r is None:
            continue
        # replay int8-across: what each device holds of each unit, message by message
        vals = {(x, ui): rng.standard_normal((2, 64)).astype(np.float32)
                for i in range(k) for ui, x in owner[i].items()}
        residual = {(rep, ui): rng.standard_normal((2, 64)).astype(np.float32) * 1e-3
                    for ui in range(u) for rep in r.rep[ui]}
        inbox = {}
        for m in r.messages:
            if m.phase == IN_GROUP:
                for ui in m.units:
                    inbox[m.dst, m.src, ui] = vals[m.src, ui]
        partial, code, total = {}, {}, {}
        for ui in range(u):
            for members, rep in zip(r.order[ui], r.rep[ui]):
                acc = None
                for x in members:
                    g = vals[rep, ui] if x == rep else inbox[rep, x, ui]
                    acc = g if acc is None else acc + g
                partial[rep, ui] = acc
                coded, res = averaging.encode_with_feedback([jnp.asarray(acc)],
                                                            [jnp.asarray(residual[rep, ui])])
                code[rep, ui] = coded
                np.testing.assert_allclose(  # what rounding dropped is kept
                    np.asarray(res[0]) + np.asarray(averaging.decode_int8(coded, [acc])[0]),
                    acc + residual[rep, ui], atol=1e-5)
        got = {}
        for m in r.messages:
            if m.phase == BETWEEN:
                for ui in m.units:
                    got[m.dst, m.src, ui] = code[m.src, ui]
        for ui in range(u):
            for rep in r.rep[ui]:  # one group: its partial sum is the total, nothing coded
                parts = [partial[rep, ui]] if len(r.rep[ui]) == 1 else [
                    np.asarray(averaging.decode_int8(code[rep, ui] if q == rep else got[rep, q, ui],
                                                     [jnp.zeros((2, 64))])[0])
                    for q in r.rep[ui]]
                acc = parts[0]
                for p in parts[1:]:
                    acc = acc + p
                total[rep, ui] = acc
            back = {}
            for m in r.messages:
                if m.phase == BACK and ui in m.units:
                    back[m.dst] = total[m.src, ui]
            held = [total[x, ui] if x in r.rep[ui] else back[x]
                    for i in range(k) for x in [owner[i][ui]]]
            for h in held[1:]:
                np.testing.assert_array_equal(h, held[0])
            truth = sum(partial[q, ui] for q in r.rep[ui])
            step = max(np.abs(partial[q, ui]).max() for q in r.rep[ui]) / 127
            assert np.abs(held[0] - truth).max() <= len(r.rep[ui]) * (step + 2e-3)
    assert seen == {"int8-across", "diloco-across"}


def test_the_planner_takes_the_per_class_mode_where_it_pays():
    """Two regions of two devices behind a slow link, four one-device pipelines: int8 between
    the regions only sends one copy of each unit across per region, so within the int8 bound
    the planner picks int8-across over int8; within the DiLoCo bound the cheapest of the five.
    The plan records the mode, its groups and representatives (plan.json round trip), its
    price is the routing's, and the declared messages (rehearsal) code only the slow pairs."""
    same = np.arange(4)[:, None] // 2 == np.arange(4)[None, :] // 2
    slow = with_regions(make_profile(np.full((6, 4), 0.002), state=np.full(6, 4e6),
                                     latency=np.where(same, 1e-4, 0.04),
                                     bandwidth=np.where(same, 4e9, 12.5e6)),
                        [0, 0, 1, 1], 4e-10, np.full(6, 1e6))
    shares = [1, 1, 1, 1]
    chains = [[(d, 0, 6)] for d in range(4)]
    prof = dataclasses.replace(slow, relax=Relaxation(averaging="int8", min_gain=0.0))
    plan = plan_lib.evaluate_pipelines(prof, chains, shares)
    assert plan.averaging == "int8-across" and plan.exchange_groups == [[0, 1], [2, 3]]
    gp = grad_prefix(slow)
    r = routing(chains, plan.exchange_groups, given=plan.exchange_reps)
    rate = np.asarray(slow.codecs["int8"]["seconds_per_byte"])
    assert plan.allreduce_s == pytest.approx(
        phase_s(r, gp, slow.latency_s, slow.bandwidth_Bps, (BETWEEN,), rate), rel=1e-12)
    assert plan.allreduce_s < relaxed_exchange(chains, gp, prof, ("int8",))[0]
    back = plan_lib.Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert back.to_json() == plan.to_json() and back.averaging == "int8-across"
    dec = rehearsal_times(plan, slow)
    for m in r.messages:
        g = sum(gp[x + 1] - gp[x] for x in m.units)
        across = m.phase == BETWEEN
        assert dec.wire_bytes[m.src, m.dst] == pytest.approx(g * (INT8_WIRE if across else 1))
        assert (dec.coding_s[m.src, m.dst] > 0) == across
    loose = dataclasses.replace(slow, relax=Relaxation(averaging="diloco", outer_every=4,
                                                       min_gain=0.0))
    plan = plan_lib.evaluate_pipelines(loose, chains, shares)
    assert plan.averaging == "diloco-across" and plan.outer_every == 4
    assert plan.allreduce_s == pytest.approx(min(
        relaxed_exchange(chains, gp, loose, (m,))[0] for m in loose.relax.averagings))
    assert json.loads(json.dumps(plan.to_json()))["averaging"] == "diloco-across"


# ---------------------------------------------------------------------------------- runs

CLIP, STEPS = 0.5, 6
OUTER = {"outer_every": H, "outer_lr": 0.7, "outer_momentum": 0.9}


def make_plan(pipelines, shares, mode="exact", groups=None, **outer):
    stages = [plan_lib.Stage(d, block, 0.0, 0.0, 0, pipeline=i)
              for i, stages in enumerate(pipelines) for d, block in stages]
    return plan_lib.Plan("manual", "1f1b", sum(shares), stages, 0.0, 0.0, False,
                         shares=list(shares), averaging=mode, exchange_groups=groups, **outer)


_RUNS: dict[str, tuple] = {}  # the same plan runs once per session (the exact references)


def run(plan, steps=STEPS):
    key = json.dumps([plan.to_json(), steps], sort_keys=True)
    if key not in _RUNS:
        _RUNS[key] = _run(plan, steps)
    return _RUNS[key]


def _run(plan, steps):
    ex = LocalExecutor(fresh_chain(), plan, jax.devices(), batch_size=BATCH, seq_len=SEQ,
                       optimizer=optax.adamw(1e-3), max_grad_norm=CLIP, rng=rng_for)
    losses, replicas = [], []
    for step in range(steps):
        losses.append(ex.train_step(step, make_batch(step)).loss)
        replicas.append([jax.tree.map(np.asarray, ex.replica_params(i))
                         for i in range(plan.num_pipelines)])
    ex.close()
    return np.array(losses), replicas


def identical(a, b) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# three pipelines: 0 and 1 in region {0, 1}, 2 in region {2, 3}
THREE = [[(0, (0, 5))], [(1, (0, 5))], [(2, (0, 2)), (3, (2, 5))]]
REGIONS = [[0, 1], [2, 3]]
# the same regions with each region's pipelines as one: the all-pipelines mode's reference
MERGED = [[(0, (0, 5))], [(2, (0, 2)), (3, (2, 5))]]


@pytest.mark.slow
@pytest.mark.parametrize("mode,outer", [("int8-across", {}), ("diloco-across", OUTER)])
def test_one_group_of_every_device_is_the_exact_exchange_bit_for_bit(mode, outer):
    groups = [[0, 1, 2, 3]]
    exact, exact_replicas = run(make_plan(THREE, [1, 1, 2], "exact", groups))
    losses, replicas = run(make_plan(THREE, [1, 1, 2], mode, groups, **outer))
    np.testing.assert_array_equal(losses, exact)
    assert all(identical(a, b) for a, b in zip(replicas[-1], exact_replicas[-1]))


@pytest.mark.slow
@pytest.mark.parametrize("mode,outer", [("int8", {}), ("diloco", OUTER)])
def test_every_pipeline_a_group_of_its_own_is_the_all_pipelines_mode_bit_for_bit(mode, outer):
    pipelines = [[(0, (0, 5))], [(2, (0, 2)), (3, (2, 5))]]
    want, _ = run(make_plan(pipelines, [2, 2], mode, **outer))
    losses, _ = run(make_plan(pipelines, [2, 2], mode + "-across", [[0], [2, 3]], **outer))
    np.testing.assert_array_equal(losses, want)


@pytest.mark.slow
@pytest.mark.parametrize("mode,outer", [("int8", {}), ("diloco", OUTER)])
def test_a_region_of_pipelines_is_one_replica_of_the_relaxed_math(mode, outer):
    """Three pipelines in two regions: region {0, 1}'s two pipelines sum exactly, so the run is
    the all-pipelines mode over two pipelines, one per region (within float32 summation
    order); int8-across keeps every replica identical after every step, diloco-across those
    of a region after every step and all after each outer step; both differ from exact."""
    exact, _ = run(make_plan(THREE, [1, 1, 2], "exact", REGIONS))
    want, _ = run(make_plan(MERGED, [2, 2], mode, **outer))
    losses, replicas = run(make_plan(THREE, [1, 1, 2], mode + "-across", REGIONS, **outer))
    np.testing.assert_allclose(losses, want, atol=1e-4 if mode == "int8" else 1e-5, rtol=0)
    assert 0 < np.abs(losses - exact).max() < (2e-3 if mode == "int8" else 3e-2)
    for step, (a, b, c) in enumerate(replicas):
        assert identical(a, b), step
        if mode == "int8" or (step + 1) % H == 0:
            assert identical(a, c), step
        else:
            assert not identical(a, c), step


@pytest.mark.slow
@pytest.mark.parametrize("mode,outer", [("int8-across", {}), ("diloco-across", OUTER)])
def test_a_per_class_plan_gives_the_same_losses_in_one_process_or_several(mode, outer):
    """The distributed executor (threads over one transport) with a process the plan leaves
    idle (it joins each region's norm all-reduce) gives the local executor's losses."""
    from tests.helpers import distributed_losses

    pipelines = [[(0, (0, 5))], [(1, (0, 5))], [(2, (0, 5))]]
    plan = make_plan(pipelines, [1, 1, 2], mode, [[0, 1], [2, 3]], **outer)
    local, _ = run(plan)
    np.testing.assert_allclose(distributed_losses(plan, STEPS, CLIP), local, atol=1e-6, rtol=0)


def test_a_plan_kept_after_a_loss_keeps_its_per_class_mode_or_its_math():
    """The survivors' plan (``pipeline_split.without_devices``) keeps the plan's mode where the
    pipelines left still offer it, else the mode of its math there: one region left, each is
    exact; no region of two devices left, each is its all-pipelines mode."""
    from skyjax.plan.data_parallel.split import without_devices

    same = np.arange(4)[:, None] // 2 == np.arange(4)[None, :] // 2
    prof = with_regions(make_profile(np.full((6, 4), 0.002), state=np.full(6, 4e6),
                                     latency=np.where(same, 1e-4, 0.04),
                                     bandwidth=np.where(same, 4e9, 12.5e6)),
                        [0, 0, 1, 1], 4e-10, np.full(6, 1e6))
    prof = dataclasses.replace(prof, relax=Relaxation(averaging="diloco", outer_every=4))
    chains = [[(d, 0, 6)] for d in range(4)]
    for mode, after in (("int8-across", {(1,): "int8-across", (2, 3): "exact",
                                         (1, 3): "int8"}),
                        ("diloco-across", {(1,): "diloco-across", (2, 3): "exact",
                                           (1, 3): "diloco"})):
        plan = plan_lib.evaluate_pipelines(prof, chains, [1, 1, 1, 1], averaging=mode)
        assert plan.averaging == mode and plan.exchange_groups == [[0, 1], [2, 3]]
        for lost, want in after.items():
            kept = without_devices(prof, plan, list(lost))
            assert (kept.averaging, kept.num_pipelines) == (want, 4 - len(lost)), lost
            if want != "exact":
                assert kept.allreduce_s == relaxed_exchange(
                    [[(d, 0, 6)] for d in range(4) if d not in lost], grad_prefix(prof), prof,
                    (want,))[0]
