"""skyjax.profile.messages: what a message costs the stages that exchange it while computing."""

from __future__ import annotations

import threading
import time

import pytest

from skyjax import cluster as cl
from skyjax.config import defaults as config_defaults
from skyjax.profile import messages
from skyjax.runtime.transport import LocalTransport


def test_extras_keep_what_stands_out_of_the_noise():
    alone = [0.0100, 0.0101, 0.0102, 0.0104]
    # a send adds 1 ms (10 %): kept; a receive adds 0.1 ms (1 %, under the 2 % floor): 0
    got = messages.extras({"alone": alone, "send": [t + 0.001 for t in alone],
                           "recv": [t + 0.0001 for t in alone]})
    assert got["send_s"] == pytest.approx(0.001, rel=1e-6)
    assert got["recv_s"] == 0.0
    assert got["message_s"] == pytest.approx(0.0005, rel=1e-6)  # per call: half a send's
    # noisy alone samples (median - fastest = 5 %) hide a 4 % extra, not a 10 % one
    noisy = [0.0100, 0.0105, 0.0105, 0.0110]
    got = messages.extras({"alone": noisy, "send": [t + 0.0004 for t in noisy],
                           "recv": [t + 0.001 for t in noisy]})
    assert got["send_s"] == 0.0 and got["recv_s"] == pytest.approx(0.001, rel=1e-6)


class _CostlySends:
    """A stage's transport handle whose every ``send`` keeps this thread busy ``cost_s`` (a
    host cost per message, such as serving the transfer on the stage's own core)."""

    def __init__(self, link, cost_s: float):
        self._link, self.cost_s = link, cost_s

    def send(self, tag, tree, dst):
        self._link.send(tag, tree, dst)
        end = time.perf_counter() + self.cost_s
        while time.perf_counter() < end:
            pass

    def __getattr__(self, name):
        return getattr(self._link, name)


def test_probe_finds_each_devices_cost_per_message():
    """Two stages as threads over LocalTransport: device 0's sends cost 4 ms of its thread,
    device 1's nothing. The probe finds the send cost on device 0 only. (Device 1's receive
    cost is not checked: device 0's busy send runs during it, on the same process's cores.)"""
    c = config_defaults.base_config()
    c.cluster.num_devices = 2
    clu = cl.cluster_from_config(c)
    transport = LocalTransport(clu.jax_devices[:2], timeout_s=120)
    handles = [_CostlySends(transport.for_stage(0), 0.004), transport.for_stage(1)]
    results, errors = [None, None], []

    def rank(r):
        try:
            results[r] = messages.probe_message_costs(handles[r], r, clu, 1 << 16, 6, 10)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            transport.abort(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    (costly, tag0), (free, tag1) = results
    assert tag0 == tag1 > 10  # both walked the same tags
    # 4 ms busy after each send; the host's noise (2 shared cores) only ever adds time
    assert 0.003 < costly["send_s"] < 0.008, costly
    assert costly["message_s"] == pytest.approx((costly["send_s"] + costly["recv_s"]) / 2)
    assert free["send_s"] < 0.0015, free


def test_one_device_has_no_message_cost():
    c = config_defaults.base_config()
    c.cluster.num_devices = 1
    clu = cl.cluster_from_config(c)
    assert messages.probe_message_costs(None, 0, clu, 1024, 3, 7) == (None, 7)
