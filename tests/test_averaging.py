"""Relaxed runs (``skyjax.runtime.averaging``, hand-off codecs in the stage programs): they
change the math a little and knowingly, keep every replica identical, give the same losses
in one process or several, and the int8 error feedback carries what rounding dropped."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from skyjax import plan as plan_lib
from skyjax.runtime import averaging
from skyjax.runtime.local_executor import LocalExecutor
from tests.helpers import BATCH, SEQ, fresh_chain, make_batch, rng_for

CLIP, STEPS = 0.5, 6
OUTER = {"outer_every": 3, "outer_lr": 0.7, "outer_momentum": 0.9}


def relaxed_plan(pipelines, shares, averaging="exact", **outer):
    """``pipelines[i]``: ``[(device, (start, end), codec to the next stage), ...]``."""
    stages = [plan_lib.Stage(d, block, 0.0, 0.0, 0, pipeline=i, codec=codec)
              for i, stages in enumerate(pipelines) for d, block, codec in stages]
    return plan_lib.Plan("manual", "1f1b", sum(shares), stages, 0.0, 0.0, False,
                         shares=list(shares) if len(shares) > 1 else None,
                         averaging=averaging, **outer)


def run(plan, steps=STEPS):
    ex = LocalExecutor(fresh_chain(), plan, jax.devices(), batch_size=BATCH, seq_len=SEQ,
                       optimizer=optax.adamw(1e-3), max_grad_norm=CLIP, rng=rng_for)
    losses, replicas = [], []
    for step in range(steps):
        losses.append(ex.train_step(step, make_batch(step)).loss)
        replicas.append([jax.tree.map(np.asarray, ex.replica_params(i))  # before donation
                         for i in range(plan.num_pipelines)])
    counts = [s.program.compile_counts for s in ex.stages]
    ex.close()
    return np.array(losses), replicas, counts


def identical(a, b) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


TWO = [[(0, (0, 3), "none"), (1, (3, 5), "none")], [(2, (0, 5), "none")]]


@pytest.fixture(scope="module")
def exact():
    """Two pipelines, exact hand-offs and averaging (same math as one pipeline)."""
    losses, _, _ = run(relaxed_plan(TWO, [2, 2]))
    return losses


@pytest.mark.slow
def test_coded_hand_offs_change_the_math_a_little_and_compile_once(exact):
    coded = [[(0, (0, 3), "int8"), (1, (3, 5), "none")], [(2, (0, 5), "none")]]
    losses, _, counts = run(relaxed_plan(coded, [2, 2]))
    assert 0 < np.abs(losses - exact).max() < 1e-3
    # each program compiled once: a stage with replicas runs its last backward by buckets, one
    # program per bucket (a unit each: 3, 2 and 5 units)
    assert [c.pop("backward_bucket", 0) for c in counts] == [3, 2, 5]
    assert all(c == {"forward": 1, "backward": 1, "update": 1} for c in counts)


@pytest.mark.slow
@pytest.mark.parametrize("mode,outer", [("int8", {}), ("diloco", OUTER)])
def test_relaxed_averaging_keeps_the_replicas_identical(exact, mode, outer):
    """int8: identical after every step. DiLoCo (H = 3): they drift apart between outer steps
    and are identical again after each one."""
    losses, replicas, _ = run(relaxed_plan(TWO, [2, 2], mode, **outer))
    assert 0 < np.abs(losses - exact).max() < (2e-3 if mode == "int8" else 3e-2)
    for step, (a, b) in enumerate(replicas):
        if mode == "int8" or (step + 1) % outer["outer_every"] == 0:
            assert identical(a, b), step
        else:
            assert not identical(a, b), step


def test_error_feedback_carries_what_rounding_dropped():
    """Over steps, the decoded gradients sum to the true ones less the last residual, which
    stays within half a rounding step of its block: nothing is lost, only delayed."""
    rng = np.random.default_rng(0)
    grads = [[{"w": jnp.asarray(rng.standard_normal((4, 64)) * 10 ** rng.uniform(-3, 0),
                                jnp.float32)}] for _ in range(30)]
    residual = jax.tree.map(jnp.zeros_like, grads[0])
    applied = jax.tree.map(jnp.zeros_like, grads[0])
    for g in grads:
        coded, residual = averaging.encode_with_feedback(g, residual)
        applied = jax.tree.map(jnp.add, applied, averaging.decode_int8(coded, g))
    true = jax.tree.map(lambda *x: sum(x), *grads)
    np.testing.assert_allclose(applied[0]["w"] + residual[0]["w"], true[0]["w"], atol=1e-5)
    last = np.asarray(grads[-1][0]["w"]) + 0  # the residual's scale: one step of a block
    step = np.abs(np.asarray(applied[0]["w"] + residual[0]["w"] - applied[0]["w"]))
    assert (step.max(axis=-1) <= np.abs(last).max(axis=-1) + np.abs(true[0]["w"]).max()).all()
    assert np.abs(residual[0]["w"]).max() < 0.05 * np.abs(true[0]["w"]).max()


def test_the_outer_step_is_nesterov_on_the_weighted_pseudo_gradient():
    anchor = [{"w": jnp.array([1.0, 2.0])}]
    momentum = [{"w": jnp.array([0.5, 0.0])}]
    delta = [{"w": jnp.array([0.2, -0.4])}]
    new, v = averaging.outer_update(anchor, momentum, delta, 0.7, 0.9)
    want_v = 0.9 * np.array([0.5, 0.0]) + np.array([0.2, -0.4])
    np.testing.assert_allclose(v[0]["w"], want_v, rtol=1e-6)
    np.testing.assert_allclose(new[0]["w"], np.array([1.0, 2.0]) - 0.7 * (
        np.array([0.2, -0.4]) + 0.9 * want_v), rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("mode,outer", [("int8", {}), ("diloco", OUTER)])
def test_a_relaxed_plan_gives_the_same_losses_in_one_process_or_several(mode, outer):
    """The distributed executor (threads over one transport, as under ``jax.distributed``),
    with a process left idle by the plan (it joins every per-pipeline all-reduce), gives the
    local executor's losses for the same relaxed plan: coded hand-offs and the relaxed
    averaging are the same math wherever they run."""
    from tests.helpers import distributed_losses

    pipelines = [[(0, (0, 2), "int4"), (1, (2, 5), "none")], [(2, (0, 5), "none")]]
    plan = relaxed_plan(pipelines, [3, 1], mode, **outer)
    steps = 6
    local, _, _ = run(plan, steps)
    np.testing.assert_allclose(distributed_losses(plan, steps, CLIP), local, atol=1e-6, rtol=0)


def test_every_relaxed_mode_has_its_state_named_and_charged():
    """Each averaging mode's runtime class names its state (what checkpoints save) and the
    planner charges as many copies of a stage's gradients as it holds."""
    from skyjax.names import AVERAGING
    from skyjax.plan.data_parallel.pipelines import state_copies

    assert averaging.state_class("exact") is None and state_copies("exact") == 0
    for mode in AVERAGING[1:]:
        cls = averaging.state_class(mode)
        assert cls is not None and cls.name == mode, mode
        assert len(cls.STATE) == state_copies(mode) > 0, mode
        assert set(cls.SHARED) <= set(cls.STATE), mode
