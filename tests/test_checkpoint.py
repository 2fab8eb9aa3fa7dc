"""Checkpoints indexed by unit, in one process (local executors): save under one plan and
granularity, restore under another with bit-equal states and the losses of an uninterrupted run;
a half-written save is never restored; incomplete or mismatched checkpoints are refused by name.
The multi-process cases are in tests/test_checkpoint_distributed.py."""

from __future__ import annotations

import os

import jax
import numpy as np
import optax
import pytest

from skyjax.checkpoint import (CheckpointError, CheckpointManager, CheckpointMismatch,
                               check_compatible, committed_steps, find_resume, restore_units)
from skyjax.checkpoint import layout
from skyjax.models import bert
from skyjax.runtime.local_executor import LocalExecutor
from tests import helpers as ref

RUN = {"seed": 0, "dataset": "synthetic"}
M = 2


def _optimizer():
    return optax.adamw(1e-2, weight_decay=0.01)


def _executor(chain, blocks, states=None):
    return LocalExecutor(chain, ref.make_plan(blocks, "1f1b", M), jax.devices()[:len(blocks)],
                         batch_size=ref.BATCH, seq_len=ref.SEQ, optimizer=_optimizer(),
                         max_grad_norm=0.5, rng=ref.rng_for, unit_states=states)


def _manager(directory, chain, every=2, keep=2):
    return CheckpointManager(str(directory), every, keep, chain, _optimizer(), RUN)


def _train(ex, steps, start=0):
    return [ex.train_step(s, ref.make_batch(s)).loss for s in range(start, steps)]


def _flat(chain, states):
    """``{tensor name: array}`` of unit states (by parameter path: granularity-independent)."""
    from skyjax.checkpoint.names import state_entries

    return {n: np.asarray(x) for u, (p, o) in states.items()
            for n, x in state_entries(chain[u].path, p, o) if not n.startswith("unit/")}


@pytest.mark.slow
def test_restore_under_another_plan_granularity_and_device_count(tmp_path):
    layer = ref.fresh_chain("layer")
    ex = _executor(layer, [(0, 2), (2, 5)])
    manager = _manager(tmp_path, layer)
    losses = _train(ex, 2)
    manager.save(2, ex.unit_states())
    saved = _flat(layer, ex.unit_states())
    losses += _train(ex, 5, start=2)
    ex.close()

    sub = ref.fresh_chain("sublayer")  # 11 units, 3 devices, another cut
    resume = find_resume(str(tmp_path))
    assert resume.step == 2
    check_compatible(resume, RUN, sub, _optimizer())
    states = restore_units(resume, sub, range(len(sub)), _optimizer())
    restored = _flat(sub, states)
    assert restored.keys() == saved.keys()
    for name in saved:
        np.testing.assert_array_equal(restored[name], saved[name], err_msg=name)
        assert restored[name].dtype == saved[name].dtype
    counts = {int(np.asarray(o[0].count)) for _, o in states.values()}
    assert counts == {2}  # AdamW's step count, per unit, from the layer units
    ex2 = _executor(sub, [(0, 3), (3, 8), (8, 11)], states)
    resumed = _train(ex2, 5, start=2)
    ex2.close()
    np.testing.assert_allclose(resumed, losses[2:], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_keep_prunes_and_stale_partial_is_ignored_then_removed(tmp_path):
    chain = ref.fresh_chain()
    ex = _executor(chain, [(0, 5)])
    manager = _manager(tmp_path, chain, every=1, keep=2)
    for step in range(1, 4):
        _train(ex, step, start=step - 1)
        manager.save(step, ex.unit_states())
    assert committed_steps(str(tmp_path)) == [2, 3]
    # A save killed half-way: tensors written, never committed (no meta.json, not renamed).
    half = layout.partial_dir(str(tmp_path), 4, "deadbeef")
    os.makedirs(half)
    (tmp_path / "4.partial-deadbeef" / "process_0.safetensors").write_bytes(b"garbage")
    assert find_resume(str(tmp_path)).step == 3
    restore_units(find_resume(str(tmp_path)), chain, range(5), _optimizer())
    _manager(tmp_path, chain)  # a new attempt clears the leftovers
    assert not os.path.exists(half)
    ex.close()


def test_a_unit_written_by_no_process_is_not_committed(tmp_path):
    chain = ref.fresh_chain()
    ex = _executor(chain, [(0, 5)])
    states = ex.unit_states()
    del states[3]
    with pytest.raises(CheckpointError, match=r"unit layer_2: tensor params/layers/2/"):
        _manager(tmp_path, chain).save(1, states)
    assert committed_steps(str(tmp_path)) == []
    ex.close()


def test_mismatched_checkpoint_is_refused_by_name(tmp_path):
    chain = ref.fresh_chain()
    ex = _executor(chain, [(0, 5)])
    _manager(tmp_path, chain).save(1, ex.unit_states())
    ex.close()
    resume = find_resume(str(tmp_path))
    with pytest.raises(CheckpointMismatch, match=r"seed=0.*seed=1"):
        check_compatible(resume, {**RUN, "seed": 1}, chain, _optimizer())
    with pytest.raises(CheckpointMismatch, match=r"dataset='synthetic'.*glue/sst2"):
        check_compatible(resume, {**RUN, "dataset": "glue/sst2"}, chain, _optimizer())
    wider = bert.BertConfig(**{**ref.CFG.__dict__, "intermediate_size": 64})
    other = bert.units(bert.BertForSequenceClassification(wider, __import__("flax").nnx.Rngs(0)))
    with pytest.raises(CheckpointMismatch,
                       match=r"unit layer_0: tensor params/layers/0/intermediate/dense/bias has "
                             r"shape \(48,\) float32 in the checkpoint, \(64,\) float32"):
        check_compatible(resume, RUN, other, _optimizer())
    deeper = bert.BertConfig(**{**ref.CFG.__dict__, "num_hidden_layers": 2})
    fewer = bert.units(bert.BertForSequenceClassification(deeper, __import__("flax").nnx.Rngs(0)))
    with pytest.raises(CheckpointMismatch, match=r"params/layers/2/.* belongs to no unit"):
        check_compatible(resume, RUN, fewer, _optimizer())
    with pytest.raises(CheckpointMismatch, match=r"unit embeddings: tensor unit/embeddings/1/count is not in"):
        check_compatible(resume, RUN, chain, optax.chain(optax.scale_by_adam(),
                                                          optax.scale_by_adam()))


# ------------------------------------------------------------ verified checkpoints (issue 39)

def _states(chain, scale=1.0):
    """Every unit's (params, AdamW state), without an executor (nothing compiles)."""
    opt = _optimizer()
    out = {}
    for u, unit in enumerate(chain):
        params = jax.tree.map(lambda x: np.asarray(x) * scale, unit.params)
        out[u] = (params, opt.init(params))
    return out


def _saved(tmp_path, steps=(1, 2, 3, 4), keep=0):
    chain = ref.fresh_chain("layer")
    manager = _manager(tmp_path, chain, every=1, keep=keep)
    for step in steps:
        manager.save(step, _states(chain, 1.0 + step / 10))
    return chain, manager


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


@pytest.mark.parametrize("damage", ["corrupt", "truncate", "meta", "meta_edit", "missing"])
def test_damaged_latest_checkpoint_is_named_and_skipped(tmp_path, caplog, damage):
    chain, _ = _saved(tmp_path)
    latest = layout.step_dir(str(tmp_path), 4)
    tensors = layout.tensors_file(latest, 0)
    meta = os.path.join(latest, layout.META)
    if damage == "corrupt":  # bytes overwritten in place: same size
        with open(tensors, "r+b") as f:
            f.seek(os.path.getsize(tensors) // 2)
            f.write(b"\xff" * 4096)
    elif damage == "truncate":
        os.truncate(tensors, os.path.getsize(tensors) // 2)
    elif damage == "meta":
        os.truncate(meta, os.path.getsize(meta) // 2)
    elif damage == "meta_edit":  # still valid JSON, one value changed
        text = open(meta).read().replace('"step": 4', '"step": 5')
        open(meta, "w").write(text)
    else:
        os.remove(tensors)
    before = {s: sorted(os.listdir(layout.step_dir(str(tmp_path), s))) for s in (1, 2, 3)}
    caplog.set_level("WARNING")
    resume = find_resume(str(tmp_path))
    assert resume.step == 3 and resume.meta["verified"]
    lines = _warnings(caplog)
    assert any(line.startswith("checkpoint 4 skipped, it does not verify: ") and
               "\n" not in line for line in lines), lines
    # the earlier checkpoints are intact and restore
    assert {s: sorted(os.listdir(layout.step_dir(str(tmp_path), s))) for s in (1, 2, 3)} == before
    check_compatible(resume, RUN, chain, _optimizer())
    got = restore_units(resume, chain, range(len(chain)), _optimizer())
    want = _flat(chain, _states(chain, 1.3))
    for name, x in _flat(chain, got).items():
        np.testing.assert_array_equal(x, want[name])


def test_no_checkpoint_verifies_is_refused(tmp_path):
    _saved(tmp_path, steps=(1,))
    tensors = layout.tensors_file(layout.step_dir(str(tmp_path), 1), 0)
    os.truncate(tensors, 100)
    with pytest.raises(CheckpointMismatch,
                       match=r"no checkpoint under .* verifies \(latest, 1"):
        find_resume(str(tmp_path))


def test_checkpoint_without_checksums_is_accepted_unverified(tmp_path, caplog):
    """A checkpoint of an older skyjax (no checksums) still resumes, with a line saying so."""
    import json

    _saved(tmp_path, steps=(2,))
    meta_path = os.path.join(layout.step_dir(str(tmp_path), 2), layout.META)
    meta = json.load(open(meta_path))
    del meta["files"], meta["checksum"]
    json.dump(meta, open(meta_path, "w"))
    caplog.set_level("WARNING")
    resume = find_resume(str(tmp_path))
    assert resume.step == 2 and resume.meta["verified"] is False
    assert any("checkpoint 2 has no checksums" in line and "accepted unverified" in line
               for line in _warnings(caplog))


def test_non_finite_state_is_never_committed(tmp_path):
    from skyjax.guard import NonFiniteError

    chain, manager = _saved(tmp_path, steps=(1, 2), keep=1)
    states = _states(chain)
    params, opt = states[1]
    leaf = jax.tree.leaves(params)[0]
    leaf.flat[0] = np.nan
    with pytest.raises(NonFiniteError, match=r"checkpoint 3: tensor params/.* holds 1 NaN"):
        manager.save(3, states)
    assert committed_steps(str(tmp_path)) == [2]  # the last good one, kept
    assert find_resume(str(tmp_path)).step == 2


def test_prune_keeps_the_new_step_and_spares_later_unverified_ones(tmp_path):
    """keep=2 after resuming from 2 with a damaged 3 and 4 on disk: committing 3 replaces the
    damaged 3, keeps 2, and leaves 4 alone (it is no older than the new checkpoint)."""
    chain, _ = _saved(tmp_path, steps=(1, 2, 3, 4))
    for step in (3, 4):
        os.truncate(layout.tensors_file(layout.step_dir(str(tmp_path), step), 0), 10)
    assert find_resume(str(tmp_path)).step == 2
    manager = _manager(tmp_path, chain, every=1, keep=2)
    record = manager.save(3, _states(chain, 1.3))
    assert record["pruned"] == [1]
    assert committed_steps(str(tmp_path)) == [2, 3, 4]
    assert find_resume(str(tmp_path)).step == 3
