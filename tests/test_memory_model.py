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
