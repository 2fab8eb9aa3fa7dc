"""The planner's memory model charges what a stage holds: per unit its state (params, gradient
sums, optimizer state) and the scratch of its largest call (``temp_bytes``), and per micro-batch
in flight its residuals, all from the profile."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.optim import make_optimizer
from skyjax.profile.format import Profile, ProfileError
from skyjax.programs.stage import StageProgram
from skyjax.tree import tree_nbytes
from tests.helpers import make_profile


def _with_temps(profile: Profile, temps) -> Profile:
    d = profile.to_json()
    for rec, t in zip(d["units"], temps):
        rec["temp_bytes"] = float(t)
    return Profile.from_json(json.loads(json.dumps(d)))


def _shape_profile():
    """A profile of the tiny model's units whose bytes come from shapes alone: state = params +
    gradients (the same shapes) + AdamW's state; residuals = what the stage forward returns."""
    from skyjax.models import build
    from skyjax.profile.chain import sample_microbatch
    from tests.helpers import tiny_config

    c = tiny_config(2, layers=2)
    chain = build.abstract_chain(c.model, 0, "layer")
    optimizer = make_optimizer(c.train, clip=False)
    carry, labels = sample_microbatch(build.model_config(c.model), 4, 16)
    carry = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), carry)
    params, opt, acts = [], [], []
    for i, unit in enumerate(chain):
        last = i == len(chain) - 1
        prog = StageProgram([unit], is_last=last, microbatches=1)
        out, res = jax.eval_shape(prog.forward, [unit.params], carry, jax.random.PRNGKey(0),
                                  labels if last else None)
        params.append(tree_nbytes(unit.params))
        opt.append(tree_nbytes(jax.eval_shape(optimizer.init, [unit.params])))
        acts.append(tree_nbytes(res))
        carry = out
    state = [2 * p + o for p, o in zip(params, opt)]
    prof = make_profile(np.ones((len(chain), 2)), state=state, act=acts)
    return prof, np.array(params), np.array(opt), np.array(acts)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_stage_is_charged_params_gradients_optimizer_scratch_and_residuals(schedule):
    prof, params, opt, acts = _shape_profile()
    temps = np.array([3e5, 7e5, 7e5, 1e5])
    prof = _with_temps(prof, temps)
    m = 3
    plan = plan_lib.evaluate(prof, [(0, 0, 2), (1, 2, 4)], schedule, m)
    for k, (a, b) in enumerate([(0, 2), (2, 4)]):
        inflight = m if schedule == "gpipe" else min(m, 2 - k)
        want = (2 * params[a:b].sum() + opt[a:b].sum() + temps[a:b].sum()
                + inflight * acts[a:b].sum())
        assert plan.stages[k].memory_bytes == int(round(want))
    assert opt.min() >= 2 * params.min() > 0 and acts.min() > 0  # AdamW's two moments


def test_the_planner_keeps_a_units_scratch_within_its_devices_memory():
    state = np.full(4, 100.0)
    prof = make_profile(np.ones((4, 2)), state=state, memory=np.array([250.0, 1e9]))
    # without scratch, device 0 (faster for nothing: equal times) can hold two units
    fits = plan_lib.evaluate(prof, [(0, 0, 2), (1, 2, 4)], "gpipe", 2)
    assert fits.stages[0].memory_bytes == 200
    tight = _with_temps(prof, [60.0, 60.0, 0.0, 0.0])
    with pytest.raises(plan_lib.InfeasibleError, match="320 bytes but it has 250"):
        plan_lib.evaluate(tight, [(0, 0, 2), (1, 2, 4)], "gpipe", 2)
    best = plan_lib.plan(tight, strategy="optimal", schedule="gpipe", microbatches=2)
    for s in best.stages:
        assert s.memory_bytes <= (250 if s.device == 0 else 1e9)


def test_temp_bytes_is_optional_and_checked():
    prof = make_profile(np.ones((2, 1)), state=[5.0, 5.0])
    assert plan_lib.evaluate(prof, [(0, 0, 2)], "gpipe", 1).stages[0].memory_bytes == 10
    d = prof.to_json()
    d["units"][1]["temp_bytes"] = -1
    with pytest.raises(ProfileError, match=r"units\[1\]\.temp_bytes"):
        Profile.from_json(d)


def _relaxed_profile(memory: float, outer_every: int = 8) -> Profile:
    """Two devices over a 100 B/s link, two units of 400 state bytes (100 gradient bytes each):
    two one-stage pipelines hold 800 bytes each; exchanging their 200 gradient bytes costs 2 s
    exact, about 0.53 s in int8, 2 / H s with DiLoCo, against 6 s of compute per pipeline."""
    import dataclasses

    from skyjax.relax import Relaxation

    prof = make_profile(np.ones((2, 2)), state=np.full(2, 400.0), memory=np.full(2, memory),
                        bandwidth=np.array([[1e12, 100.0], [100.0, 1e12]]))
    d = prof.to_json()
    d["codecs"] = {"int8": {"output_bytes": [1.0, 1.0], "seconds_per_byte": [1e-9, 1e-9]}}
    return dataclasses.replace(Profile.from_json(d),
                               relax=Relaxation(averaging="diloco", outer_every=outer_every))


@pytest.mark.parametrize("memory,mode,held", [
    (1e9, "diloco", 1200),  # anchor + outer momentum: two copies of each stage's 200 bytes
    (1200, "diloco", 1200),  # exactly fits
    (1199, "int8", 1000),  # DiLoCo's state does not fit: the residual (one copy) does
    (999, "exact", 800),  # no relaxed state fits: exact
])
def test_a_relaxed_averagings_state_is_charged_and_must_fit(memory, mode, held):
    prof = _relaxed_profile(memory)
    chains = [[(0, 0, 2)], [(1, 0, 2)]]
    plan = plan_lib.evaluate_pipelines(prof, chains, [1, 1])
    assert plan.averaging == mode
    assert [s.memory_bytes for s in plan.stages] == [held, held]
    want = {"exact": 2.0, "int8": None, "diloco": 2.0 / 8}[mode]
    if want is not None:
        assert plan.allreduce_s == pytest.approx(want)
    # the search prices the split the same way: its plan is that one (one pipeline takes 12 s
    # on one device, 9 s across the link), whose stages fit with the state
    best = plan_lib.plan(prof, strategy="optimal", schedule="1f1b", microbatches=2,
                         max_pipelines=2, relax=prof.relax)
    if mode != "exact":
        assert best.averaging == mode and best.step_time_s == pytest.approx(plan.step_time_s)
    assert all(s.memory_bytes <= memory for s in best.stages)


def test_the_charge_is_what_the_runtime_holds():
    """``pipelines.state_copies`` copies of each stage's gradients (float32, as params) is what
    the averaging objects hold (``runtime.memory.averaging_bytes``)."""
    import optax

    from skyjax.plan.data_parallel.pipelines import state_copies
    from skyjax.runtime.local_executor import LocalExecutor
    from skyjax.runtime.memory import averaging_bytes
    from tests.helpers import BATCH, SEQ, fresh_chain, rng_for

    chain = fresh_chain()
    params = [tree_nbytes(u.params) for u in chain]
    stages = [plan_lib.Stage(d, block, 0.0, 0.0, 0, pipeline=i)
              for i, (d, block) in enumerate([(0, (0, 5)), (1, (0, 5))])]
    for mode, outer in [("exact", {}), ("int8", {}), ("diloco", {"outer_every": 2})]:
        plan = plan_lib.Plan("manual", "1f1b", 2, stages, 0.0, 0.0, False, shares=[1, 1],
                             averaging=mode, **outer)
        ex = LocalExecutor(chain, plan, jax.devices(), batch_size=BATCH, seq_len=SEQ,
                           optimizer=optax.adamw(1e-3), max_grad_norm=None, rng=rng_for)
        assert averaging_bytes(ex) == 2 * state_copies(mode) * sum(params), mode
        ex.close()


def _relaxed_brute_force(prof: Profile, schedule: str, m: int, charge: bool = True) -> float:
    """The least T over one pipeline and every split into 2..3 pipelines x shares x chains x
    averaging mode the bound allows whose state fits every stage (each stage's memory, priced
    exact, plus copies x its gradient bytes, checked here; ``charge`` False: not charged), AR
    priced per mode."""
    import dataclasses
    import itertools

    from skyjax.plan.data_parallel.pipelines import grad_prefix, relaxed_exchange
    from skyjax.relax import EXACT
    from tests.helpers import assignments, brute_force

    copies = {"exact": 0, "int8-across": 1, "int8": 1, "diloco-across": 2, "diloco": 2}
    exact_prof = dataclasses.replace(prof, relax=EXACT)
    g = grad_prefix(prof)
    best = brute_force(prof, schedule, m)
    n = prof.num_devices
    for labels in itertools.product(range(3), repeat=n):
        blocks = [[d for d in range(n) if labels[d] == b] for b in range(3)]
        blocks = [b for b in blocks if b]
        if len(blocks) < 2 or labels[0] != 0 or (max(labels) == 2 and 1 not in labels):
            continue  # each partition once (first appearance order)
        for cuts in itertools.combinations(range(1, m), len(blocks) - 1):
            b = (0,) + cuts + (m,)
            shares = [y - x for x, y in zip(b, b[1:])]
            options = [[[(blk[d], a, e) for d, a, e in c]
                        for c in assignments(prof.num_units, len(blk))] for blk in blocks]
            for chains in itertools.product(*options):
                try:
                    plan = plan_lib.evaluate_pipelines(exact_prof, chains, shares, schedule)
                except plan_lib.InfeasibleError:
                    continue
                order = sorted(range(len(chains)), key=lambda i: min(d for d, _, _ in chains[i]))
                chains = [chains[i] for i in order]
                top = max(plan.pipeline_step_s) + prof.sync_s
                for mode in prof.relax.averagings:
                    if all(s.memory_bytes + charge * round(
                            copies[mode] * (g[s.units[1]] - g[s.units[0]]))
                           <= prof.devices[s.device]["memory_bytes"] for s in plan.stages):
                        ar = relaxed_exchange(chains, g, prof, (mode,))[0]
                        best = min(best, top + ar)
    return best


def test_the_planner_prices_each_mode_only_where_its_state_fits():
    """Random 3-device instances whose memory leaves room for some relaxed states and not
    others, any averaging up to DiLoCo allowed: the planner's T is the brute force's, which
    takes a mode for a split only where its state fits every stage."""
    import dataclasses

    from skyjax.relax import Relaxation
    from tests.helpers import random_profile

    rng = np.random.default_rng(7)
    binds = 0
    for i in range(12):
        prof = random_profile(rng, 3, 3)
        d = prof.to_json()
        whole = sum(u["state_bytes"] + 3 * u["activation_bytes"] for u in d["units"])
        for j, dev in enumerate(d["devices"]):  # 40-90% of a whole pipeline at m = 3
            dev["memory_bytes"] = float(whole * rng.uniform(0.4, 0.9))
            dev["region"] = f"r{j % 2}"
        d["codecs"] = {"int8": {"output_bytes": [u["output_bytes"] * 0.27 for u in d["units"]],
                                "seconds_per_byte": [1e-10] * 3}}
        prof = dataclasses.replace(Profile.from_json(d), relax=Relaxation(
            averaging="diloco", outer_every=4, min_gain=0.0))
        schedule, m = ("gpipe", "1f1b")[i % 2], 3
        want = _relaxed_brute_force(prof, schedule, m)
        got = plan_lib.searched_plan(prof, "optimal", schedule, m, max_pipelines=3, relax=prof.relax)
        assert got.step_time_s == pytest.approx(want, rel=1e-9), i
        binds += want > _relaxed_brute_force(prof, schedule, m, charge=False) * (1 + 1e-9)
    assert binds >= 3  # instances where the state's charge changes the optimum
