"""Host waits in a training step (``config.pipeline.sync_actions``): which stages block their
calls, that dispatching without blocking gives the very same floats, and that it waits on the
device a constant number of times per step, not once per micro-batch."""

from __future__ import annotations

import threading

import jax
import numpy as np
import optax
import pytest

from skyjax.cluster import actions_block, timed_call
from skyjax.cluster import emulation
from tests.helpers import executor, fresh_chain, make_batch


@pytest.mark.parametrize("setting,platform,emulated,want", [
    ("auto", "cpu", False, True),  # the host is the device: spans stay compute times
    ("auto", "gpu", False, False),
    ("auto", "tpu", False, False),
    ("auto", "gpu", True, True),  # the emulation times each call's real end
    ("off", "gpu", True, True),
    ("off", "cpu", False, False),
    ("on", "gpu", False, True),
])
def test_which_stages_block(setting, platform, emulated, want):
    assert actions_block(setting, platform, emulated) is want


def test_an_unknown_setting_names_the_key():
    with pytest.raises(ValueError, match="config.pipeline.sync_actions='sometimes'"):
        actions_block("sometimes", "cpu", False)


def test_timed_call_waits_unless_told_not_to_and_never_when_emulated(monkeypatch):
    blocked = []
    monkeypatch.setattr(emulation, "block", lambda x: blocked.append(x) or x)
    double = jax.jit(lambda x: 2 * x)
    x = np.ones(4, np.float32)
    timed_call(double, x)
    timed_call(double, x, sync=False)
    assert len(blocked) == 1
    timed_call(double, x, sync=False, slowdown=2.0)  # an emulated device blocks regardless
    assert len(blocked) == 2


class HostWaits:
    """Counts, from every thread, the host's waits on device values: ``jax.block_until_ready``
    and ``jax.device_get`` calls (one each, whatever the tree) and a ``jax.Array`` read as a
    Python value outside them (``float(x)``, ``x.item()``, ...)."""

    READS = ("__float__", "__int__", "__bool__", "__index__", "item", "tolist", "__array__")

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        from jax._src.array import ArrayImpl

        self.calls: list[str] = []
        self._inside = threading.local()
        for name in ("block_until_ready", "device_get"):
            monkeypatch.setattr(jax, name, self._counted(name, getattr(jax, name)))
        for name in self.READS:
            monkeypatch.setattr(ArrayImpl, name, self._counted(name, ArrayImpl.__dict__[name]))

    def _counted(self, name: str, fn):
        def counted(*args, **kwargs):
            outer = not getattr(self._inside, "active", False)
            if outer:
                self.calls.append(name)
            self._inside.active = True
            try:
                return fn(*args, **kwargs)
            finally:
                self._inside.active = not outer

        return counted

    def take(self) -> list[str]:
        out, self.calls = self.calls, []
        return out


def _set_sync(ex, on: bool) -> None:
    for stage in ex.stages:
        stage.sync_actions = on


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_dispatch_only_gives_the_same_floats_and_one_wait_per_step(schedule, monkeypatch):
    """Two stages, 8 micro-batches, clipping on: with ``sync_actions`` off the losses, gradient
    norms and parameters equal the blocking run's bit for bit; a step waits on the device three
    times (the last stage's losses, each stage's gradient norm), where blocking waits on every
    call; a measured step blocks again and says so."""
    m, clip = 8, 0.5
    blocks = [(0, 2), (2, 5)]
    runs = {}
    for on in (True, False):
        ex = executor(fresh_chain(), blocks, schedule, m, optax.adamw(1e-3), max_grad_norm=clip)
        _set_sync(ex, on)
        metrics = [ex.train_step(0, make_batch(0))]  # compiles
        waits = HostWaits(monkeypatch)
        metrics.append(ex.train_step(1, make_batch(1)))
        per_step = waits.take()
        metrics.append(ex.train_step(2, make_batch(2), measure=True))
        measured_waits = waits.take()
        monkeypatch.undo()
        runs[on] = (metrics, per_step, measured_waits,
                    jax.tree.map(np.asarray, ex.unit_params()))
        ex.close()
    (blocking, block_waits, _, params_on), (dispatched, waits, measured, params_off) = (
        runs[True], runs[False])
    assert [r.loss for r in dispatched] == [r.loss for r in blocking]
    assert [r.accuracy for r in dispatched] == [r.accuracy for r in blocking]
    assert [r.grad_norm for r in dispatched] == [r.grad_norm for r in blocking]
    jax.tree.map(np.testing.assert_array_equal, params_off, params_on)
    # dispatch only: the last stage's one transfer of its scalars and each stage's norm
    assert sorted(waits) == ["device_get"] * 3, waits
    assert not dispatched[1].measured and blocking[1].measured
    # blocking waits on every forward and backward of both stages (and their updates)
    assert block_waits.count("block_until_ready") >= 2 * 2 * m, block_waits
    assert dispatched[2].measured  # a measured step blocks
    assert measured.count("block_until_ready") >= 2 * 2 * m, measured
    assert len(dispatched[2].spans) == 2 * 2 * m


def test_measured_steps_are_those_whose_spans_are_read():
    """Log steps, the run's last MEASURED_TAIL steps and the steps the re-planner observes
    block; the others only dispatch (where the stages do not block anyway)."""
    from skyjax.config import defaults
    from skyjax.runtime.replanner import Replanner
    from skyjax.train import MEASURED_TAIL, measured_step

    config = defaults.base_config()
    config.train.steps, config.train.log_every = 100, 25
    measured = [s for s in range(100) if measured_step(config, s)]
    tail = list(range(100 - MEASURED_TAIL, 100))
    assert measured == [0, 24, 49, 74] + tail
    calibrating = Replanner(0, None, None, calibrate_steps=4, strategy="optimal")
    measured = [s for s in range(100) if measured_step(config, s, calibrating)]
    assert measured == [0, 1, 2, 3, 24, 49, 74] + tail  # step 0 compiles: never observed
