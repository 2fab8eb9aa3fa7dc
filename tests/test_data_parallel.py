"""Several pipelines in data parallel (``Plan.shares``; ``PipelineStage.reduce_replicas``): the
same seed gives the same losses with 1, 2 or 3 pipelines, any shares, plans, schedules and
granularities, dropout on; the replicas of a unit stay bit-identical; a checkpoint written by
several pipelines restores under one and back."""

import jax
import numpy as np
import optax
import pytest

from skyjax import plan as plan_lib
from skyjax.runtime.local_executor import LocalExecutor
from tests.helpers import BATCH, SEQ, fresh_chain, make_batch, rng_for

STEPS, CLIP = 20, 0.5  # a small clip norm: global-norm clipping is active every step


def multi_plan(pipelines, shares, schedule, groups=None):
    """A hand-made plan: ``pipelines[i]`` is ``[(device, (start, end)), ...]`` in order;
    ``groups``: the exchange's link groups (None: direct)."""
    stages = [plan_lib.Stage(d, block, 0.0, 0.0, 0, pipeline=i)
              for i, stages in enumerate(pipelines) for d, block in stages]
    return plan_lib.Plan("manual", schedule, sum(shares), stages, step_time_s=0.0,
                         bottleneck_s=0.0, exact=False,
                         shares=list(shares) if len(shares) > 1 else None,
                         exchange_groups=groups)


def run(granularity, pipelines, shares, schedule, steps=STEPS, unit_states=None, groups=None):
    chain = fresh_chain(granularity)
    ex = LocalExecutor(chain, multi_plan(pipelines, shares, schedule, groups), jax.devices(),
                       batch_size=BATCH, seq_len=SEQ, optimizer=optax.adamw(1e-3),
                       max_grad_norm=CLIP, rng=rng_for, unit_states=unit_states)
    losses = [ex.train_step(step, make_batch(step)).loss for step in range(steps)]
    return ex, losses


@pytest.fixture(scope="module")
def one_pipeline():
    """The reference: one pipeline of two stages, 1F1B, 4 micro-batches, layer units."""
    ex, losses = run("layer", [[(0, (0, 2)), (1, (2, 5))]], [4], "1f1b")
    ex.close()
    return losses


@pytest.mark.parametrize("granularity,pipelines,shares,schedule", [
    # two pipelines of different shapes and shares (3 + 1 micro-batches), GPipe
    pytest.param("layer", [[(0, (0, 3)), (1, (3, 5))], [(2, (0, 5))]], [3, 1], "gpipe",
                 marks=pytest.mark.slow),
    # three one-stage pipelines, 1F1B, shares 2 + 1 + 1
    pytest.param("layer", [[(2, (0, 5))], [(0, (0, 5))], [(1, (0, 5))]], [2, 1, 1], "1f1b",
                 marks=pytest.mark.slow),
    # two pipelines at sub-layer granularity (11 units), cuts that do not line up
    pytest.param("sublayer", [[(0, (0, 4)), (1, (4, 11))], [(2, (0, 7)), (3, (7, 11))]], [2, 2],
                 "1f1b", marks=pytest.mark.slow),
    # zero bubble (B and W split, Ws filled in): a three-stage and a one-stage pipeline, 3 + 1
    pytest.param("layer", [[(0, (0, 2)), (1, (2, 3)), (2, (3, 5))], [(3, (0, 5))]], [3, 1],
                 "zb-h1", marks=pytest.mark.slow),
])
def test_same_losses_with_any_number_of_pipelines(one_pipeline, granularity, pipelines, shares,
                                                  schedule):
    ex, losses = run(granularity, pipelines, shares, schedule)
    replicas = [ex.replica_params(i) for i in range(len(pipelines))]
    ex.close()
    np.testing.assert_allclose(losses, one_pipeline, atol=1e-5, rtol=0)
    for other in replicas[1:]:  # every owner summed the same replicas in the same order
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                     replicas[0], other)


@pytest.mark.parametrize("granularity,pipelines,shares,groups", [
    # three pipelines on four devices, two link groups: units 0-3 reduce in {0, 3} and go
    # alone from 2; units 4-10 reduce in {1, 2} and go alone from 3 (plan.exchange)
    pytest.param("sublayer", [[(0, (0, 4)), (1, (4, 11))], [(2, (0, 11))], [(3, (0, 11))]],
                 [2, 1, 1], [[0, 3], [1, 2]], marks=pytest.mark.slow),
    # one group of every owner: reduce to a representative per unit and back
    pytest.param("layer", [[(0, (0, 2)), (1, (2, 5))], [(2, (0, 3)), (3, (3, 5))]], [2, 2],
                 [[0, 1, 2, 3]], marks=pytest.mark.slow),
])
def test_the_exchange_through_link_groups_keeps_the_losses_and_bit_identical_replicas(
        one_pipeline, granularity, pipelines, shares, groups):
    """The exchange through link groups (runtime.exchange) sums in another fixed order: the
    losses are a one-pipeline run's, and every replica holds the same bits."""
    ex, losses = run(granularity, pipelines, shares, "1f1b", groups=groups)
    replicas = [ex.replica_params(i) for i in range(len(pipelines))]
    assert all(s.role.routes is not None for s in ex.stages)
    ex.close()
    np.testing.assert_allclose(losses, one_pipeline, atol=1e-5, rtol=0)
    for other in replicas[1:]:
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                     replicas[0], other)


def test_the_dropout_masks_do_not_depend_on_the_micro_batch_count():
    """Keys per example: the same batch through 1 or 4 micro-batches gives one loss, and dropout
    is on (it differs from the eval-mode loss). With a key per micro-batch, 1 and 2 micro-batches
    gave different losses."""
    from skyjax.models import bert

    chain = fresh_chain()
    params = [u.params for u in chain]
    batch = make_batch(0)

    def loss(m):
        size, total = BATCH // m, 0.0
        for mb in range(m):
            sl = {k: v[mb * size:(mb + 1) * size] for k, v in batch.items()}
            carry = bert.initial_carry(sl["input_ids"], sl["token_type_ids"], sl["attention_mask"])
            logits = bert.apply_units(chain, params, carry, rng_for(0, mb * size, size),
                                      True)["logits"]
            total += float(optax.softmax_cross_entropy_with_integer_labels(
                logits, sl["labels"]).sum())
        return total / BATCH

    def loss_without_dropout():
        carry = bert.initial_carry(batch["input_ids"], batch["token_type_ids"],
                                   batch["attention_mask"])
        logits = bert.apply_units(chain, params, carry, None, False)["logits"]
        return float(optax.softmax_cross_entropy_with_integer_labels(
            logits, batch["labels"]).mean())

    assert loss(1) == pytest.approx(loss(4), abs=1e-6)
    assert loss(1) != pytest.approx(float(np.mean([loss_without_dropout()])), abs=1e-4)


@pytest.mark.slow
def test_a_checkpoint_of_two_pipelines_restores_under_one_and_back(tmp_path):
    """Replicas write one copy (pipeline 0's): a checkpoint saved by two pipelines continues
    under one pipeline, and one saved by one pipeline under two, with the losses of an
    uninterrupted run."""
    from skyjax.checkpoint import CheckpointManager, find_resume, restore_units

    two = [[(0, (0, 3)), (1, (3, 5))], [(2, (0, 5))]]
    one = [[(0, (0, 2)), (1, (2, 5))]]
    chain = fresh_chain()
    whole, want = run("layer", one, [4], "1f1b", steps=6)
    whole.close()
    got = []
    for step, (first, then) in enumerate([(two, one), (one, two)]):
        directory = tmp_path / str(step)
        ex, head = run("layer", first, [3, 1] if first is two else [4],
                       "gpipe" if first is two else "1f1b", steps=3)
        manager = CheckpointManager(str(directory), 1, 1, chain, optax.adamw(1e-3),
                                    {"seed": 0, "dataset": "synthetic"})
        manager.save(3, ex.unit_states())
        ex.close()
        resume = find_resume(str(directory))
        states = restore_units(resume, chain, range(len(chain)), optax.adamw(1e-3))
        ex = LocalExecutor(chain, multi_plan(then, [3, 1] if then is two else [4], "1f1b"),
                           jax.devices(), batch_size=BATCH, seq_len=SEQ,
                           optimizer=optax.adamw(1e-3), max_grad_norm=CLIP, rng=rng_for,
                           unit_states=states)
        got.append(head + [ex.train_step(s, make_batch(s)).loss for s in range(3, 6)])
        ex.close()
    for losses in got:
        np.testing.assert_allclose(losses, want, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_distributed_executor_runs_two_pipelines_with_the_same_losses(one_pipeline):
    """Three processes (threads over one transport, as ``DistributedExecutor`` runs under
    ``jax.distributed``): pipeline 0 on processes 0 and 1, pipeline 1 on process 2; process 0
    reports the losses of every micro-batch, in order, equal to one pipeline's."""
    from skyjax.runtime.distributed_executor import DistributedExecutor
    from skyjax.transport import LocalTransport
    from tests.helpers import run_as_processes

    devices = jax.local_devices()[:3]
    transport = LocalTransport(devices, timeout_s=120)
    plan = multi_plan([[(0, (0, 2)), (1, (2, 5))], [(2, (0, 5))]], [1, 3], "1f1b")
    steps = 6

    def process(k):
        ex = DistributedExecutor(fresh_chain(), plan, transport.for_stage(k), k, devices[k],
                                 batch_size=BATCH, seq_len=SEQ, optimizer=optax.adamw(1e-3),
                                 max_grad_norm=CLIP, rng=rng_for)
        out = [ex.train_step(s, make_batch(s)) for s in range(steps)]
        return [m.loss for m in out], ex.unit_states(), ex.unit_params()

    results = run_as_processes(process, 3, transport, timeout_s=300)
    np.testing.assert_allclose(results[0][0], one_pipeline[:steps], atol=1e-5, rtol=0)
    assert sorted(results[0][1]) == [0, 1] and sorted(results[1][1]) == [2, 3, 4]
    assert results[2][1] == {}  # pipeline 1 holds replicas: a checkpoint takes pipeline 0's
    mine = results[0][2] + results[1][2]  # pipeline 0's copy, chain order
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 mine, results[2][2])


@pytest.mark.slow
@pytest.mark.parametrize("granularity,pipelines,shares,groups", [
    # the direct exchange: every piece of a stage's own gradients leaves during its backward
    ("layer", [[(0, (0, 2)), (1, (2, 5))], [(2, (0, 3)), (3, (3, 5))]], [2, 2], None),
    # link groups: phase 1's pieces and phase 2's where a device is its group alone leave early
    ("sublayer", [[(0, (0, 4)), (1, (4, 11))], [(2, (0, 11))], [(3, (0, 11))]], [2, 1, 1],
     [[0, 3], [1, 2]]),
])
def test_the_bucketed_exchange_keeps_the_losses_and_replicas_bit_for_bit(
        granularity, pipelines, shares, groups):
    """The exchange behind the backward (runtime.replicas.backward_by_buckets): the pieces sent
    while the backward computes change nothing: the losses and every replica are those of the
    exchange after the whole backward, bit for bit."""
    def bucketed_run(overlap):
        ex = LocalExecutor(fresh_chain(granularity),
                           multi_plan(pipelines, shares, "1f1b", groups), jax.devices(),
                           batch_size=BATCH, seq_len=SEQ, optimizer=optax.adamw(1e-3),
                           max_grad_norm=CLIP, rng=rng_for)
        for stage in ex.stages:
            stage.exchange_overlap = overlap
        losses = [ex.train_step(step, make_batch(step)).loss for step in range(3)]
        sent = [len(stage.exchange_sent) for stage in ex.stages]
        replicas = [ex.replica_params(i) for i in range(len(pipelines))]
        ex.close()
        return losses, sent, replicas

    (losses, sent, replicas), (after, none, replicas_after) = bucketed_run(True), bucketed_run(
        False)
    assert all(sent) and not any(none)  # every stage sent pieces early; none without overlap
    assert losses == after
    for other in replicas[1:] + replicas_after:
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                     replicas[0], other)
