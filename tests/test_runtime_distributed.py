"""Distributed pipeline executor: one process per stage under jax.distributed on localhost.

The test starts this module as a worker in N processes (``skyjax.launcher.launch``); the workers
write their results to files the test then compares with full-model references computed here:
several steps give the same losses as single-device training, over uneven plans, m < p, a
re-plan that moves every unit and a plan that leaves a process idle.
"""

from __future__ import annotations

import json

import numpy as np
import optax
import pytest

pytestmark = pytest.mark.slow


def _run(tmp_path, nprocs: int, spec: dict) -> None:
    from tests.helpers import launch_workers

    rc, text = launch_workers(tmp_path, "test_runtime_distributed", nprocs, spec)
    assert rc == 0, text[-6000:]


def _plan(blocks, devices, schedule, m):
    """plan.json of a hand-made plan (the workers read it with ``Plan.from_json``)."""
    from tests import helpers as ref

    return ref.make_plan(blocks, schedule, m, devices).to_json()


def test_rebuild_moves_units_between_processes_without_changing_the_math(tmp_path):
    """Several steps over 3 processes (1F1B, m = 2 < p = 3) give single-device training's
    losses, clipping on, and still do after a re-plan mid-run moves every unit (params +
    optimizer state) to another process, in another order, leaving one process idle. (Each
    schedule's gradients against jax.grad are tests/test_runtime_local.py's: the stages' math
    is the same in one process or several.) Process 0 only dispatches (``sync_actions`` off:
    the transfer transport sends arrays still being computed, as on GPUs), processes 1 and 2
    wait on every call (CPU's way); process 0 has a stage in both plans, next to each."""
    from tests import helpers as ref

    steps, m, clip = 4, 2, 0.5
    first = _plan([(0, 1), (1, 3), (3, 5)], [0, 1, 2], "1f1b", m)
    second = _plan([(0, 3), (3, 5)], [2, 0], "1f1b", m)  # every unit moves; process 1 idles
    _run(tmp_path, 3, {"plan": first, "then": second, "steps": steps,
                       "clip": clip, "sync": [False, True, True]})
    want = ref.reference_losses(ref.fresh_chain(), steps, m, clip)
    got = json.loads((tmp_path / "losses.json").read_text())
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------- worker

def _worker() -> None:
    from skyjax.plan import Plan
    from skyjax.runtime.distributed_executor import DistributedExecutor

    from tests import helpers as ref

    spec, pid, n, device, transport = ref.worker_start()
    chain = ref.fresh_chain()
    ex = DistributedExecutor(chain, Plan.from_json(spec["plan"]), transport, pid, device,
                             batch_size=ref.BATCH, seq_len=ref.SEQ, optimizer=optax.adamw(1e-3),
                             max_grad_norm=spec.get("clip"), rng=ref.rng_for,
                             sync_actions=spec.get("sync", [True] * n)[pid])
    losses = []
    for step in range(spec["steps"]):
        if "then" in spec and step == spec["steps"] // 2:
            ex = ex.rebuild(Plan.from_json(spec["then"]))
        losses.append(ex.train_step(step, ref.make_batch(step)).loss)
    ref.worker_end(spec, pid, losses)


if __name__ == "__main__":
    _worker()
