"""Checkpoints written by several processes (``skyjax.launch`` on 127.0.0.1): every unit comes
back bit for bit (restoring on fewer processes, under another plan and granularity, with the
losses of an uninterrupted run, is tests/test_fault.py's); a process killed in the middle of a
save leaves the previous checkpoint the latest, and the survivors exit with ``EXIT_PEER_LOST``
naming it.

The workers are this module run by the launcher (``_worker`` at the end)."""

from __future__ import annotations

import os

import numpy as np
import optax
import pytest

from skyjax.names import EXIT_PEER_LOST
from tests.helpers import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
M, CLIP = 2, 0.5


def _run(tmp_path, nprocs: int, spec: dict) -> tuple[int, str]:
    from tests.helpers import launch_workers

    return launch_workers(tmp_path, "test_checkpoint_distributed", nprocs, spec)


def _plan(blocks, devices):
    from tests import helpers as ref

    return ref.make_plan(blocks, "1f1b", M, devices).to_json()


def _optimizer():
    return optax.adamw(1e-3)  # as tests/test_runtime_local.reference_losses (after clipping)


def test_saved_by_three_processes_every_tensor_restores_bit_for_bit(tmp_path):
    from skyjax.checkpoint import find_resume, restore_units
    from skyjax.checkpoint.names import state_entries
    from tests import helpers as ref

    ckpt = str(tmp_path / "checkpoints")
    # 3 processes in reverse order, uneven blocks.
    rc, text = _run(tmp_path, 3, {"plan": _plan([(0, 1), (1, 3), (3, 5)], [2, 1, 0]),
                                  "granularity": "layer", "steps": 2, "save_at": 2,
                                  "ckpt": ckpt})
    assert rc == 0, text[-6000:]
    resume = find_resume(ckpt)
    assert resume.step == 2 and resume.meta["processes"] == 3
    written = sorted(f for f in os.listdir(resume.path) if f.endswith(".safetensors"))
    assert written == ["process_0.safetensors", "process_1.safetensors",
                       "process_2.safetensors"]
    chain = ref.fresh_chain("layer")
    restored = restore_units(resume, chain, range(len(chain)), _optimizer())
    seen = set()
    for k in range(3):
        with np.load(tmp_path / f"states{k}.npz") as f:
            for name in f.files:
                seen.add(name)
                u = int(name.split("|")[0])
                got = dict(state_entries(chain[u].path, *restored[u]))[name.split("|")[1]]
                np.testing.assert_array_equal(np.asarray(got), f[name], err_msg=name)
                assert np.asarray(got).dtype == f[name].dtype
    want = {f"{u}|{n}" for u in range(len(chain))
            for n, _ in state_entries(chain[u].path, *restored[u])}
    assert seen == want  # every tensor of every unit was written by its owner and came back
    # (Continuing from it on 2 processes, sublayer units, with the losses of a run never stopped:
    # tests/test_fault.py kills one of 3 processes and finishes on the 2 survivors.)


def test_killed_in_a_save_keeps_the_previous_checkpoint_and_survivors_name_it(tmp_path):
    from skyjax.checkpoint import committed_steps, find_resume, restore_units
    from tests import helpers as ref

    """No launcher here (it would stop the survivors at once): the survivors must notice."""
    ckpt = str(tmp_path / "checkpoints")
    codes, texts = _spawn(tmp_path, 3, {"plan": _plan([(0, 2), (2, 4), (4, 5)], [0, 1, 2]),
                                        "granularity": "layer", "steps": 4, "save_at": 1,
                                        "die_in_save": {"process": 2, "step": 3}, "ckpt": ckpt,
                                        "peer_timeout_s": 3})
    assert codes == [EXIT_PEER_LOST, EXIT_PEER_LOST, -9], "\n".join(texts)[-6000:]
    for text in texts[:2]:
        assert "process 2 (stage 2, units [4, 5)) lost: no heartbeat" in text, text[-3000:]
    assert committed_steps(ckpt) == [1, 2]
    assert any(".partial-" in d for d in os.listdir(ckpt))  # the killed save, never committed
    chain = ref.fresh_chain()
    restore_units(find_resume(ckpt), chain, range(len(chain)), _optimizer())


def _spawn(tmp_path, n: int, spec: dict) -> tuple[list[int], list[str]]:
    """``n`` workers started directly (coordinator on 127.0.0.1); their exit codes and output."""
    import subprocess
    import sys

    from skyjax import env_vars
    from skyjax.cluster.network import free_port

    from tests.helpers import worker_env

    env = dict(os.environ, **worker_env(tmp_path, spec),
               **{env_vars.COORDINATOR: f"127.0.0.1:{free_port()}",
                  env_vars.NUM_PROCESSES: str(n)})
    procs = [subprocess.Popen([sys.executable, "-m", "test_checkpoint_distributed"],
                              env={**env, env_vars.PROCESS_ID: str(k)}, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for k in range(n)]
    texts = []
    try:
        for p in procs:
            texts.append(p.communicate(timeout=240)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [p.returncode for p in procs], texts


# ------------------------------------------------------------------------------------- worker

def _worker() -> None:
    import signal

    from skyjax import checkpoint
    from skyjax.checkpoint import store
    from skyjax.checkpoint.names import state_entries
    from skyjax.plan import Plan
    from skyjax.runtime.distributed_executor import DistributedExecutor
    from skyjax.transport import group as distributed
    from tests import helpers as ref

    spec, pid, n, device, transport = ref.worker_start(watchdog=True)
    chain = ref.fresh_chain(spec["granularity"])
    plan = Plan.from_json(spec["plan"])
    resume = checkpoint.find_resume(spec["ckpt"])
    start = resume.step if resume else 0
    mine = [u for s in plan.stages if s.device == pid for u in range(*s.units)]
    states = checkpoint.restore_units(resume, chain, mine, _optimizer()) if resume else None
    ex = DistributedExecutor(chain, plan, transport, pid, device, batch_size=ref.BATCH,
                             seq_len=ref.SEQ, optimizer=_optimizer(), max_grad_norm=CLIP,
                             rng=ref.rng_for, unit_states=states)
    manager = checkpoint.CheckpointManager(
        spec["ckpt"], spec.get("save_at", 0), 0, chain, _optimizer(), {"seed": 0},
        process_index=pid, num_processes=n, client=distributed.key_value_client(),
        kv_get=distributed.kv_get, timeout_s=120)
    die = spec.get("die_in_save")
    if die and die["process"] == pid:
        write = store.write_tensors

        def write_then_die(step_path, process, entries, units):
            if step_path.split(os.sep)[-1].startswith(f"{die['step']}.partial"):
                write(step_path, process, entries, units)
                os.kill(os.getpid(), signal.SIGKILL)  # tensors written, never reported
            return write(step_path, process, entries, units)

        store.write_tensors = write_then_die
    losses = []
    for step in range(start, spec["steps"]):
        losses.append(ex.train_step(step, ref.make_batch(step)).loss)
        if manager.due(step + 1):
            manager.save(step + 1, ex.unit_states())
            if step + 1 == spec.get("save_at") and "die_in_save" not in spec:
                arrays = {f"{u}|{name}": np.asarray(x) for u, (p, o) in ex.unit_states().items()
                          for name, x in state_entries(chain[u].path, p, o)}
                np.savez(os.path.join(spec["out"], f"states{pid}.npz"), **arrays)
    ref.worker_end(spec, pid, losses)


if __name__ == "__main__":
    _worker()
