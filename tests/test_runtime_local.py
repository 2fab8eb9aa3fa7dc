"""Local pipeline executor: gradients equal jax.grad of the full model, losses equal
single-device training, whatever the plan and schedule; each stage program compiles once."""

import jax
import numpy as np
import optax
import pytest

from tests.helpers import (BATCH, SEQ, executor, fresh_chain, make_batch, make_plan,
                           reference_loss, reference_losses, rng_for, run_as_processes)


# Each schedule over cuts of 2 stages, m below and at the stage count (m above it, over 3 stages:
# the losses below).
@pytest.mark.parametrize("blocks,m,schedule", [
    ([(0, 1), (1, 5)], 1, "gpipe"),  # the fast subset's GPipe check (its 1F1B: the losses)
    pytest.param([(0, 4), (4, 5)], 2, "gpipe", marks=pytest.mark.slow),
    pytest.param([(0, 4), (4, 5)], 2, "1f1b", marks=pytest.mark.slow),
])
def test_one_step_gradients_equal_full_model_grad(blocks, m, schedule):
    chain = fresh_chain()
    params0 = jax.tree.map(np.array, [u.params for u in chain])
    batch = make_batch(0)
    want = jax.grad(lambda p: reference_loss(chain, p, batch, 0, m))(params0)
    ex = executor(chain, blocks, schedule, m, optax.sgd(1.0))
    ex.train_step(0, batch)
    got = jax.tree.map(lambda before, after: before - np.asarray(after), params0, ex.unit_params())
    ex.close()
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=0), got, want)


def test_a_regression_head_pipelines_with_the_same_gradients_and_eval():
    """num_labels 1 (STS-B): float labels, mean squared error; the eval reports correlations."""
    from skyjax import baseline

    chain = fresh_chain(num_labels=1)
    params0 = jax.tree.map(np.array, [u.params for u in chain])
    batch = make_batch(0, regression=True)
    want = jax.grad(lambda p: reference_loss(chain, p, batch, 0, 2))(params0)
    ex = executor(chain, [(0, 3), (3, 5)], "1f1b", 2, optax.sgd(1.0))
    ex.train_step(0, batch)
    got = jax.tree.map(lambda before, after: before - np.asarray(after), params0, ex.unit_params())
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=0), got, want)
    held_out = [{**make_batch(7, regression=True), "weights": np.ones(BATCH, np.float32)}]
    result = ex.evaluate(held_out, "pearson_spearman")
    ex.close()
    step = baseline.make_eval_step(chain)
    single = baseline.evaluate(step, jax.tree.map(np.asarray, ex.unit_params()), held_out,
                               "pearson_spearman")
    assert set(result) == {"eval_loss", "eval_examples", "eval_pearson", "eval_spearman"}
    for key in result:
        assert result[key] == pytest.approx(single[key], abs=1e-5), key


@pytest.mark.parametrize("granularity,blocks,schedule,m", [
    ("layer", [(0, 2), (2, 4), (4, 5)], "1f1b", 4),  # m above p: 1F1B's steady phase
    pytest.param("sublayer", [(0, 1), (1, 9), (9, 11)], "gpipe", 2, marks=pytest.mark.slow),
])
def test_losses_equal_single_device_training(granularity, blocks, schedule, m):
    steps, clip = 4, 0.5  # a small clip norm so that global-norm clipping is active
    chain = fresh_chain(granularity)
    want = reference_losses(chain, steps, m, clip)
    ex = executor(chain, blocks, schedule, m, optax.adamw(1e-3), max_grad_norm=clip)
    got = [ex.train_step(step, make_batch(step)).loss for step in range(steps)]
    counts = [s.program.compile_counts for s in ex.stages]
    ex.close()
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert all(c == {"forward": 1, "backward": 1, "update": 1} for c in counts), counts


@pytest.mark.slow
def test_distributed_executor_posts_its_receives_ahead():
    """Each stage of the distributed runtime posts a receive before the action that needs it
    (``PipelineStage._pull_ahead`` through ``ProcessLink.prefetch``), addressed to the sending
    process. Without it every receive pulled only when called, and waited, when the sender was
    computing on its core, until that compute ended (up to a whole action; 27 -> 19 ms of link
    waits per step on the shipped model). Two processes as threads over LocalTransport, with
    stages 0 and 1 on processes 1 and 0."""
    from skyjax.runtime.distributed_executor import DistributedExecutor
    from skyjax.transport import LocalTransport

    class Prefetching:
        """One process's transport: LocalTransport's, plus a recorded ``prefetch``."""

        def __init__(self, link):
            self.link, self.posted, self.received = link, set(), []

        def prefetch(self, tag, like, src):
            self.posted.add((tag, src))

        def recv(self, tag, like, src):
            self.received.append(((tag, src), (tag, src) in self.posted))
            return self.link.recv(tag, like, src)

        def __getattr__(self, name):
            return getattr(self.link, name)

    devices = jax.local_devices()[:2]
    local = LocalTransport(devices, timeout_s=60)
    transports = [Prefetching(local.for_stage(k)) for k in range(2)]
    chain = fresh_chain()
    plan = make_plan([(0, 2), (2, len(chain))], "1f1b", 2, [1, 0])

    def process(k):
        ex = DistributedExecutor(chain, plan, transports[k], k, devices[k], batch_size=BATCH,
                                 seq_len=SEQ, optimizer=optax.sgd(0.1), max_grad_norm=None,
                                 rng=rng_for)
        ex.train_step(0, make_batch(0))

    run_as_processes(process, 2, local, timeout_s=120)
    # process 0 runs stage 1: activations in from process 1; process 1 runs stage 0: gradients
    for k, src in ((0, 1), (1, 0)):
        got = transports[k].received
        assert len(got) == 2 and all(s == src and posted for (_, s), posted in got), got


@pytest.mark.slow
def test_distributed_executor_gathers_the_metrics_before_the_update():
    """Process 0 collects the step's metrics after the actions and before the update: gathered
    after it, every step waited for the slowest stage's update, which the cost model (and the
    simulator) charge only for stage 0. A recording transport stands in for the processes."""
    from skyjax.runtime.distributed_executor import DistributedExecutor

    class Recorder:
        def __init__(self):
            self.calls = []

        def gather_to_first(self, obj, tag):
            leaf = jax.tree.leaves(ex.unit_params())[0]
            self.calls.append(("gather", np.array(leaf)))
            return [obj]

        def allreduce_sum(self, value, tag):
            self.calls.append(("allreduce", None))
            return value

    chain = fresh_chain()
    before = np.array(jax.tree.leaves(chain[0].params)[0])
    transport = Recorder()
    ex = DistributedExecutor(chain, make_plan([(0, len(chain))], "1f1b", 2, [0]), transport, 0,
                             jax.local_devices()[0], batch_size=BATCH, seq_len=SEQ,
                             optimizer=optax.sgd(0.1), max_grad_norm=1.0, rng=rng_for)
    metrics = ex.train_step(0, make_batch(0))
    assert [c for c, _ in transport.calls] == ["gather", "allreduce"]
    np.testing.assert_array_equal(transport.calls[0][1], before)  # not yet updated
    assert not np.array_equal(np.array(jax.tree.leaves(ex.unit_params())[0]), before)
    assert np.isfinite(metrics.loss) and len(metrics.results[0].spans) == 4


@pytest.mark.slow
def test_distributed_executor_puts_the_next_steps_inputs_in_its_first_wait():
    """Given the next step's batch (ready, as the training loop takes it from the prefetch
    thread), a stage that reads the batch (first: tokens; last: labels) puts the next step's
    inputs on its device just before its first receive of the step (the first stage's first
    backward waits for the round trip, the last stage's first forward for the fill), not at the
    step boundary; a middle stage is given no batch. The losses are those of a run that puts
    every step's inputs at its start. Three processes as threads over LocalTransport."""
    from skyjax.runtime.distributed_executor import DistributedExecutor
    from skyjax.transport import LocalTransport

    devices = jax.local_devices()[:3]
    chain = fresh_chain()
    plan = make_plan([(0, 1), (1, 3), (3, len(chain))], "1f1b", 2)
    batches = [make_batch(s) for s in range(3)]

    def run(ahead):
        local = LocalTransport(devices, timeout_s=60)
        events = [[] for _ in range(3)]  # per process: ("recv",) / ("inputs", step)

        class Recording:
            def __init__(self, k):
                self.k, self.link = k, local.for_stage(k)

            def recv(self, tag, like, src):
                events[self.k].append(("recv",))
                return self.link.recv(tag, like, src)

            def __getattr__(self, name):
                return getattr(self.link, name)

        def process(k):
            ex = DistributedExecutor(chain, plan, Recording(k), k, devices[k], batch_size=BATCH,
                                     seq_len=SEQ, optimizer=optax.sgd(0.1), max_grad_norm=1.0,
                                     rng=rng_for)
            step_inputs = ex.stage.step_inputs

            def recorded(step, microbatch, rng):
                events[k].append(("inputs", step))
                return step_inputs(step, microbatch, rng)

            ex.stage.step_inputs = recorded
            losses = []
            for step in range(3):
                batch = batches[step] if ex.needs_batch else None
                following = batches[step + 1] if ex.needs_batch and ahead and step < 2 else None
                losses.append(ex.train_step(step, batch, following).loss)
            return losses, ex.needs_batch

        return run_as_processes(process, 3, local, timeout_s=180), events

    (results, events), (plain, _) = run(True), run(False)
    assert [needs for _, needs in results] == [True, False, True]
    np.testing.assert_array_equal(results[0][0], plain[0][0])  # process 0 holds the metrics
    assert np.isfinite(results[0][0]).all()
    for k in (0, 2):
        first_recv = events[k].index(("recv",))
        assert events[k][:first_recv] == [("inputs", 0), ("inputs", 1)], events[k]
        assert events[k].count(("inputs", 1)) == 1 and events[k].count(("inputs", 2)) == 1
    assert [e for e in events[1] if e[0] == "inputs"] == [("inputs", s) for s in range(3)]


@pytest.mark.timeout(120)
def test_a_failing_stage_ends_the_others_declared_waits_and_is_the_error_raised():
    """Stage 1 fails while stage 0 waits out a declared call of an hour (a rehearsal): the
    executor stops the run's declared waits, and raises stage 1's error, not stage 0's report
    of the stop."""
    import concurrent.futures
    import threading
    import time

    from skyjax.cluster.rehearsal import RehearsalLedger, WaitStop, rehearsed_call
    from skyjax.runtime.local_executor import LocalExecutor
    from skyjax.transport.local import LocalTransport

    waits = WaitStop()

    class Rehearsal:  # what the executor asks of the run's rehearsal
        def stop(self, reason):
            waits.set(reason)

    def stage(k):
        if k == 1:
            time.sleep(0.2)
            raise ValueError("stage 1: bad input")
        rehearsed_call(lambda: None, seconds=3600.0, ledger=RehearsalLedger(), stop=waits)

    ex = object.__new__(LocalExecutor)
    ex._pool, ex.stages = concurrent.futures.ThreadPoolExecutor(max_workers=2), [0, 1]
    ex.transport, ex._args = LocalTransport(jax.devices()[:1] * 2), {"rehearsal": Rehearsal()}
    raised = []

    def run():
        try:
            ex._all(stage)
        except BaseException as e:  # noqa: BLE001 - checked below
            raised.append(e)
        ex.close()

    main = threading.Thread(target=run, daemon=True)
    main.start()
    main.join(60)
    assert not main.is_alive(), "stage 0 still waits out its declared call"
    assert len(raised) == 1 and isinstance(raised[0], ValueError), raised
    assert str(raised[0]) == "stage 1: bad input"


@pytest.mark.timeout(120)
def test_a_stop_between_stage_submissions_does_not_hold_the_cleanup():
    """A KeyboardInterrupt (Ctrl-C / SIGTERM) in the main thread after stage 0 was submitted
    but before stage 1: stage 0 waits for stage 1's message; the executor's cleanup
    (``close``, which joins the stage threads) must not wait for the transport's timeout."""
    import concurrent.futures
    import threading

    from skyjax.runtime.local_executor import LocalExecutor
    from skyjax.transport.base import TransportError
    from skyjax.transport.local import LocalTransport

    transport = LocalTransport(jax.devices()[:1] * 2, timeout_s=100_000)
    waiting, errors = threading.Event(), []

    class Pool(concurrent.futures.ThreadPoolExecutor):
        def submit(self, fn, *args):
            if args[0] == 1:
                waiting.wait()
                raise KeyboardInterrupt("signal 15")  # where a signal handler may raise
            return super().submit(fn, *args)

    def stage(k):
        waiting.set()
        try:
            transport.for_stage(k).recv(0, None, 1)  # stage 1's message, never sent
        except TransportError as e:
            errors.append(e)
            raise

    ex = object.__new__(LocalExecutor)
    ex._pool, ex.transport, ex.stages = Pool(max_workers=2), transport, [0, 1]
    ex._args = {"rehearsal": None}
    with pytest.raises(KeyboardInterrupt):
        ex._all(stage)
    ex.close()  # before the fix: stage 0 waited 100000 s, and this with it
    assert len(errors) == 1 and "aborted" in str(errors[0]), errors
