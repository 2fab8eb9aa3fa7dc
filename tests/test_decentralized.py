"""The peer modes (``skyjax.runtime.decentralized``, ``skyjax.plan.pricing.peers``): the peer
schedules are matchings; a decentral pair holds the same bits, and replicas differ by design;
decentral-int8's pair keeps one common mean and its sum, each end its own rounding;
"average now" at a checkpoint makes every replica one model; a run stopped and resumed equals
the uninterrupted one; the planner's choice over every plan and mode is the least simulated
step (brute force); their state is charged. That each learns as the exact run does, on the demo
and the CSV walkthrough: tests/test_relax_quality.py."""

from __future__ import annotations

import dataclasses
import itertools
import json

import jax
import numpy as np
import optax
import pytest

from skyjax import checkpoint
from skyjax import plan as plan_lib
from skyjax.checkpoint import CheckpointManager, find_resume
from skyjax.plan import InfeasibleError
from skyjax.plan.data_parallel.pipelines import INT8_WIRE, state_copies
from skyjax.plan.pricing import peers
from skyjax.plan.replay.simulate import simulate_plan
from skyjax.relax import Relaxation
from skyjax.runtime import decentralized
from skyjax.runtime.local_executor import LocalExecutor
from tests.helpers import BATCH, SEQ, fresh_chain, make_batch, random_profile, rng_for

CLIP = 0.5
RUN = {"seed": 0, "dataset": "synthetic"}
TWO = [[(0, (0, 3)), (1, (3, 5))], [(2, (0, 5))]]  # other cuts: a unit's owners differ
THREE = [[(0, (0, 5))], [(1, (0, 5))], [(2, (0, 2)), (3, (2, 5))]]


def _plan(pipelines, shares, averaging, **fields):
    stages = [plan_lib.Stage(d, block, 0.0, 0.0, 0, pipeline=i)
              for i, stages in enumerate(pipelines) for d, block in stages]
    return plan_lib.Plan("manual", "1f1b", sum(shares), stages, 0.0, 0.0, False,
                         shares=list(shares), averaging=averaging, **fields)


def _executor(chain, plan, states=None):
    return LocalExecutor(chain, plan, jax.devices(), batch_size=BATCH, seq_len=SEQ,
                         optimizer=optax.adamw(1e-3), max_grad_norm=CLIP, rng=rng_for,
                         unit_states=states)


def _replicas(ex, n):
    return [[np.asarray(x) for x in jax.tree.leaves(ex.replica_params(i))] for i in range(n)]


def _same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def chain():
    return fresh_chain()


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("schedule", ["ring", "exponential"])
def test_the_peer_schedules_are_matchings_that_mix_every_replica(n, schedule):
    """Each step pairs each pipeline with at most one other, symmetrically; over a period every
    pipeline is reached from every other (the pairs' graph is connected)."""
    edges = set()
    for t in range(3 * peers.period(n, schedule)):
        got = peers.pairs(t, n, schedule)
        ends = [i for p in got for i in p]
        assert len(ends) == len(set(ends)) and all(a < b < n for a, b in got)
        for a, b in got:
            assert peers.peer_of(a, t, n, schedule) == b and peers.peer_of(b, t, n, schedule) == a
        edges |= set(got)
    reach, todo = {0}, [0]
    while todo:
        i = todo.pop()
        for a, b in edges:
            for x, y in ((a, b), (b, a)):
                if x == i and y not in reach:
                    reach.add(y)
                    todo.append(y)
    assert reach == set(range(n))
    if schedule == "exponential" and n == 8:  # i XOR 1, 2, 4 in turn
        assert [peers.peer_of(5, t, 8, schedule) for t in range(4)] == [4, 7, 1, 4]
    if schedule == "ring" and n == 4:
        assert peers.pairs(0, 4, "ring") == [(0, 1), (2, 3)]
        assert peers.pairs(1, 4, "ring") == [(0, 3), (1, 2)]


def test_a_decentral_int8_meeting_keeps_the_pairs_sum_and_rounds_only_the_difference():
    """One meeting of decentral-int8 (the runtime's jitted functions): both ends see the same
    x~ of each other; after it the pair's sum is the one before (to float32 rounding), the
    common mean is within int8's step of the exact mean."""
    rng = np.random.default_rng(3)
    c = [rng.standard_normal((8, 128)).astype(np.float32)]
    x, y = ([c[0] + 1e-3 * rng.standard_normal((8, 128)).astype(np.float32)] for _ in range(2))
    cx, cy = decentralized.code_difference(x, c), decentralized.code_difference(y, c)
    sx, sy = decentralized.as_sent(cx, c), decentralized.as_sent(cy, c)
    again = decentralized.as_sent(jax.tree.map(np.asarray, cx), c)  # the peer's decode
    np.testing.assert_array_equal(np.asarray(sx[0]), np.asarray(again[0]))
    mean = decentralized.pair_mean(sx, sy)
    nx, ny = (decentralized.kept_after(p, s, mean) for p, s in ((x, sx), (y, sy)))
    np.testing.assert_allclose(np.asarray(nx[0]) + np.asarray(ny[0]), x[0] + y[0], atol=1e-6)
    step = max(np.abs(x[0] - c[0]).max(), np.abs(y[0] - c[0]).max()) / 254
    assert np.abs(np.asarray(mean[0]) - (x[0] + y[0]) / 2).max() <= 1.01 * step


def test_the_pair_mean_is_one_order_for_both_ends():
    """(lower + higher) * 0.5, whichever end computes it: the same bits, where (b + a) * 0.5 by
    the other end's own first would round the same too, but a mean weighted otherwise would not
    be symmetric."""
    rng = np.random.default_rng(0)
    a, b = ([rng.standard_normal((64, 33)).astype(np.float32)] for _ in range(2))
    lo = decentralized.pair_mean(a, b)
    again = decentralized.pair_mean(list(a), list(b))
    np.testing.assert_array_equal(np.asarray(lo[0]), np.asarray(again[0]))
    np.testing.assert_array_equal(np.asarray(lo[0]), (a[0] + b[0]) * np.float32(0.5))


@pytest.mark.slow
def test_a_decentral_pair_holds_the_same_bits_and_average_now_makes_one_model(tmp_path, chain):
    """Three pipelines on the ring (one sits out each step): after each step the pair holds the
    same bits, the one left out differs; a checkpoint's average now makes every replica
    bit-identical, and that is what the checkpoint holds."""
    plan = _plan(THREE, [1, 1, 2], "decentral", peer_schedule="ring")
    ex = _executor(chain, plan)
    for step in range(2):
        ex.train_step(step, make_batch(step))
        r = _replicas(ex, 3)
        (a, b), = peers.pairs(step, 3, "ring")
        out = ({0, 1, 2} - {a, b}).pop()
        assert _same(r[a], r[b]) and not _same(r[a], r[out]), step
    manager = CheckpointManager(str(tmp_path), 2, 1, chain, optax.adamw(1e-3), RUN)
    checkpoint.after_step(manager, 1, ex)
    r = _replicas(ex, 3)
    assert _same(r[0], r[1]) and _same(r[0], r[2])
    meta = find_resume(str(tmp_path)).meta
    assert meta["averaging"] == {"mode": "decentral", "pipelines": 3}
    ex.close()


@pytest.mark.slow
def test_a_decentral_int8_pair_shares_its_mean_keeps_its_sum_and_holds_what_is_charged(chain):
    """Two pipelines cut differently (a unit's owners differ), decentral-int8: after each step
    both ends hold the same common mean, bit for bit, and each replica is that mean plus its own
    rounding (int8's step on a step's change: small, not zero); the means held are what the
    planner charges (one copy per peer met). Average now clears them and makes one model."""
    plan = _plan(TWO, [2, 2], "decentral-int8", peer_schedule="ring")
    ex = _executor(chain, plan)
    by = {(s.pipeline, s.first_unit): s for s in ex.stages}
    for step in range(3):
        ex.train_step(step, make_batch(step))
        commons = [np.concatenate([np.ravel(x) for s in sorted(ex.stages, key=lambda s: (
            s.pipeline, s.first_unit)) if s.pipeline == i
            for x in jax.tree.leaves(s.averaging.common[1 - i])]) for i in range(2)]
        np.testing.assert_array_equal(commons[0], commons[1])
        r = [np.concatenate([np.ravel(x) for x in rep]) for rep in _replicas(ex, 2)]
        assert not np.array_equal(r[0], r[1])  # each keeps its own rounding
        for x in r:
            assert 0 < np.max(np.abs(x - commons[0])) < 1e-4
    relax = Relaxation(peers="ring", peer_bits=8)
    for s in ex.stages:
        params = sum(int(x.nbytes) for x in jax.tree.leaves(s.state.params))
        assert s.averaging.held_bytes() == state_copies("decentral-int8", 2, relax) * params
    decentralized.average_now(ex, 2)
    r = _replicas(ex, 2)
    assert _same(r[0], r[1]) and all(s.averaging.held_bytes() == 0 for s in by.values())
    ex.close()


def _losses(ex, start, stop, average_at=None):
    out = []
    for s in range(start, stop):
        out.append(ex.train_step(s, make_batch(s)).loss)
        if s == average_at:  # what a checkpoint after step s does first
            decentralized.average_now(ex, s)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mode,fields", [("decentral", {"peer_schedule": "exponential"}),
                                         ("decentral-int8", {"peer_schedule": "ring"}),
                                         ("async", {"staleness": 2})])
def test_a_stopped_and_resumed_peer_run_equals_the_uninterrupted_one(tmp_path, chain, mode,
                                                                       fields):
    """Checkpointed after step 3 of 5 (its average now included), restored (every pipeline's
    params and optimizer state), the run goes on with the uninterrupted run's losses."""
    steps, stop = 5, 3
    plan = _plan(TWO, [2, 2], mode, **fields)
    ex = _executor(chain, plan)
    want = _losses(ex, 0, steps, average_at=stop - 1)
    ex.close()
    ex = _executor(chain, plan)
    head = _losses(ex, 0, stop)
    manager = CheckpointManager(str(tmp_path), stop, 1, chain, optax.adamw(1e-3), RUN,
                                total_steps=steps)
    checkpoint.after_step(manager, stop - 1, ex)
    ex.close()
    np.testing.assert_array_equal(head, want[:stop])
    resume = find_resume(str(tmp_path))
    states = checkpoint.restore_units(resume, chain, range(len(chain)), optax.adamw(1e-3))
    ex = _executor(chain, plan, states)
    assert checkpoint.restore_relaxed(resume, ex, chain, optax.adamw(1e-3)) == ["replicas"]
    tail = _losses(ex, stop, steps)
    ex.close()
    np.testing.assert_allclose(tail, want[stop:], atol=1e-5, rtol=0)


def _brute_force(prof, schedule, m):
    """The least simulated step over every plan of up to two pipelines and every averaging mode
    ``prof.relax`` allows (warm-ups: 1F1B's own; the planner is asked for those too)."""
    best = np.inf
    n, u = prof.num_devices, prof.num_units
    for size in range(1, n + 1):
        for used in itertools.combinations(range(n), size):
            for labels in itertools.product(range(2), repeat=size):
                if labels[0] != 0:
                    continue
                blocks = [[d for d, x in zip(used, labels) if x == j] for j in range(2)]
                blocks = [b for b in blocks if b]
                if len(blocks) > m:
                    continue
                per = [[[(d, bd[i], bd[i + 1]) for i, d in enumerate(order)]
                        for order in itertools.permutations(b)
                        for cuts in itertools.combinations(range(1, u), len(b) - 1)
                        for bd in [(0, *cuts, u)]] if len(b) <= u else [] for b in blocks]
                for chains in itertools.product(*per):
                    for c in range(1, m) if len(chains) == 2 else [m]:
                        shares = [c, m - c] if len(chains) == 2 else [m]
                        for mode in prof.relax.averagings if len(chains) == 2 else [None]:
                            try:
                                p = plan_lib.evaluate_pipelines(prof, list(chains), shares,
                                                                schedule, averaging=mode)
                            except InfeasibleError:
                                continue
                            best = min(best, simulate_plan(p, prof).step_time_s)
    return best


def _int8_timed(prof):
    """``prof``'s codecs with the int8 codec timed (decentral-int8's wire and coding)."""
    return {"int8": {"output_bytes": [float(u["output_bytes"]) * 0.27 for u in prof.units],
                     "seconds_per_byte": [1e-9] * prof.num_devices}}


def test_the_planners_choice_is_the_least_simulated_step_over_every_plan_and_mode():
    """Small instances (2-3 devices, 2-3 units, m 2-3, GPipe, some links slow), decentral and
    async allowed, or decentral and decentral-int8: the plan is the least simulated step over
    every plan and mode."""
    rng = np.random.default_rng(60)
    chosen, checked = set(), 0
    for i in range(10):
        d, u = int(rng.integers(2, 4)), int(rng.integers(2, 4))
        prof = random_profile(rng, d, u)
        int8 = i % 4 > 1  # decentral-int8 allowed, async not
        if i % 2 or int8:  # slow links, ample memory: the exchange matters and every mode fits
            slower = 1e-5 if int8 else 1e-3  # int8: the bytes are most of the step
            prof = dataclasses.replace(prof, bandwidth_Bps=prof.bandwidth_Bps * slower, devices=[
                dict(x, memory_bytes=100 * x["memory_bytes"]) for x in prof.devices])
        relax = Relaxation(peers=("ring", "exponential")[i % 2],
                           async_steps=0 if int8 else 1 + i % 3, min_gain=0.0,
                           peer_bits=8 if int8 else 32)
        prof = dataclasses.replace(prof, relax=relax, codecs=_int8_timed(prof))
        m = int(rng.integers(2, 4))
        want = _brute_force(prof, "gpipe", m)
        if np.isinf(want):
            with pytest.raises(InfeasibleError):
                plan_lib.plan(prof, "optimal", "gpipe", m, max_pipelines=2, relax=relax)
            continue
        got = plan_lib.plan(prof, "optimal", "gpipe", m, max_pipelines=2, relax=relax)
        assert got.step_time_s == pytest.approx(want, rel=1e-9), (i, d, u, m)
        chosen.add(got.averaging if got.num_pipelines > 1 else "one")
        checked += 1
    assert {"async", "decentral-int8"} <= chosen and checked >= 6, (chosen, checked)


def test_the_peer_modes_state_is_charged_and_stated_in_the_plan():
    """async keeps its snapshot in flight and the n - 1 of its peers' (one exchange in flight,
    whatever k); decentral none.
    The plan states the peer schedule and the staleness, plan.json keeps them, and the plan's
    table says them."""
    relax = Relaxation(peers="ring", async_steps=3)
    assert state_copies("async", 2, relax) == 2 and state_copies("async", 4, relax) == 4
    assert state_copies("decentral", 4, relax) == 0
    assert [state_copies("decentral-int8", n, relax) for n in (2, 3, 4)] == [1, 2, 2]
    expo = Relaxation(peers="exponential", peer_bits=8)  # i XOR 1, 2, 4: three peers met
    assert [state_copies("decentral-int8", n, expo) for n in (4, 5, 8)] == [2, 3, 3]
    rng = np.random.default_rng(1)
    prof = random_profile(rng, 2, 2)
    prof = dataclasses.replace(prof, relax=relax, devices=[
        dict(x, memory_bytes=100 * x["memory_bytes"]) for x in prof.devices])
    chains = [[(0, 0, 2)], [(1, 0, 2)]]
    exact = plan_lib.evaluate_pipelines(prof, chains, [1, 1], "gpipe", averaging="exact")
    p = plan_lib.evaluate_pipelines(prof, chains, [1, 1], "gpipe", averaging="async")
    grads = sum(float(x["state_bytes"]) / 4 for x in prof.units)
    assert [s.memory_bytes - e.memory_bytes for s, e in zip(p.stages, exact.stages)] == [
        int(round(2 * grads))] * 2
    assert p.staleness == 3 and plan_lib.Plan.from_json(p.to_json()).staleness == 3
    d = plan_lib.evaluate_pipelines(prof, chains, [1, 1], "gpipe", averaging="decentral")
    assert plan_lib.Plan.from_json(json.loads(json.dumps(d.to_json()))).peer_schedule == "ring"
    from skyjax.report.plan_report import _averaging

    assert "staleness 3" in _averaging(p) and "one peer per step (ring)" in _averaging(d)


def test_a_rehearsal_declares_the_peer_modes_messages_in_float32():
    """A rehearsal's declared bytes: each pair of owners that may meet exchanges the float32
    parameters of the units they share (decentral, async: uncoded), as the simulator sends;
    decentral-int8 the int8 codec's bytes and coding time."""
    from skyjax.plan.replay.rehearsal import rehearsal_times

    rng = np.random.default_rng(2)
    prof = random_profile(rng, 3, 3)
    prof = dataclasses.replace(prof, relax=Relaxation(peers="ring", async_steps=1), devices=[
        dict(x, memory_bytes=100 * x["memory_bytes"]) for x in prof.devices])
    chains = [[(0, 0, 2), (1, 2, 3)], [(2, 0, 3)]]
    grads = [float(x["state_bytes"]) / 4 for x in prof.units]
    for mode in ("decentral", "async"):
        p = plan_lib.evaluate_pipelines(prof, chains, [1, 1], "gpipe", averaging=mode)
        times = rehearsal_times(p, prof)
        assert times.wire_bytes[0, 2] == times.wire_bytes[2, 0] == pytest.approx(sum(grads[:2]))
        assert times.wire_bytes[1, 2] == pytest.approx(grads[2])
        assert not times.coding_s.any()
    prof = dataclasses.replace(prof, relax=Relaxation(peers="ring", peer_bits=8),
                               codecs=_int8_timed(prof))
    p = plan_lib.evaluate_pipelines(prof, chains, [1, 1], "gpipe", averaging="decentral-int8")
    times = rehearsal_times(p, prof)
    assert times.wire_bytes[0, 2] == pytest.approx(sum(grads[:2]) * INT8_WIRE)
    assert times.coding_s[0, 2] == pytest.approx(1e-9 * sum(grads[:2]))
