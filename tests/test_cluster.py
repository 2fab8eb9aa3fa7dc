"""skyjax.cluster: devices from the config, slow-down emulation, link emulation."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from skyjax import cluster as cl
from skyjax.config import defaults as config_defaults

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def config(n=3, **cluster):
    c = config_defaults.base_config()
    c.cluster.num_devices = n
    c.cluster.update(cluster)
    return c


needs3 = pytest.mark.skipif(len(jax.local_devices()) < 3, reason="needs 3 local devices "
                            "(XLA_FLAGS=--xla_force_host_platform_device_count, tests/conftest.py)")


@needs3
def test_cluster_from_config_devices_caps_regions_links():
    c = config(3, slowdowns=(1, 2, 4), memory_caps_bytes=(0, 1 << 20, 0),
               regions=("eu", "eu", "us"), link_latency_s=0.01, link_bandwidth_Bps=1e8)
    clu = cl.cluster_from_config(c)
    assert clu.num_devices == 3 and clu.mode == "local"
    assert clu.jax_devices == jax.local_devices()[:3]
    assert [d.name for d in clu.devices] == ["proc0:cpu0", "proc0:cpu1", "proc0:cpu2"]
    assert [d.kind for d in clu.devices] == ["cpu"] * 3
    assert [d.slowdown for d in clu.devices] == [1.0, 2.0, 4.0]
    assert [d.memory_bytes for d in clu.devices] == [None, 1 << 20, None]
    assert clu.memory_bytes(1) == (1 << 20, "emulated")
    mem, source = clu.memory_bytes(0)
    assert mem > 0 and source == "host"
    assert clu.emulate_links
    # Same region: nothing emulated; across regions: the configured link.
    assert clu.link_latency_s[0, 1] == 0 and np.isinf(clu.link_bandwidth_Bps[0, 1])
    assert clu.link_latency_s[0, 2] == clu.link_latency_s[2, 1] == 0.01
    assert clu.link_bandwidth_Bps[1, 2] == 1e8
    assert clu.links.delay(0, 2, 1_000_000) == pytest.approx(0.01 + 0.01)
    assert clu.links.delay(0, 1, 1_000_000) == 0.0


def test_cluster_defaults_and_errors():
    clu = cl.cluster_from_config(config(1))
    assert clu.num_devices == 1 and not clu.emulate_links
    assert clu.devices[0].slowdown == 1.0 and clu.devices[0].region == "r0"
    too_many = len(jax.local_devices()) + 1
    with pytest.raises(ValueError, match="xla_force_host_platform_device_count"):
        cl.cluster_from_config(config(too_many))
    with pytest.raises(ValueError, match="slowdowns has 2 entries"):
        cl.cluster_from_config(config(1, slowdowns=(1, 2)))


def test_distributed_config_in_one_process_reuses_local_devices():
    n = len(jax.local_devices()) + 2
    clu = cl.cluster_from_config(config(n, mode="distributed", slowdowns=tuple(range(1, n + 1))))
    assert clu.num_devices == n and clu.mode == "distributed"
    assert len({d.name for d in clu.devices}) == n  # stand-ins get distinct names
    assert clu.jax_devices[-1] == jax.local_devices()[(n - 1) % len(jax.local_devices())]


def test_timed_call_sleeps_slowdown_minus_one_times_fastest_elapsed(monkeypatch):
    """A k-times slower device sleeps (k - 1) x the fastest run of the same program seen so far:
    not after the program's first call (it compiles), and not (k - 1) x a contended run's own
    time. The sleeps asked for are recorded; the wall clock gives lower bounds only (a loaded
    host adds to it)."""
    from skyjax.cluster import emulation

    delay, slept, real_sleep = [0.02], [], emulation.precise_sleep

    def recorded(seconds):
        slept.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(emulation, "precise_sleep", recorded)

    def work(x):
        time.sleep(delay[0])
        return x + 1

    work(jnp.ones(3))  # compiles x + 1
    result, fast = cl.timed_call(work, jnp.ones(3), slowdown=1)
    assert float(result[0]) == 2.0 and fast >= 0.02 and slept == []
    _, first = cl.timed_call(work, jnp.ones(3), slowdown=3)
    assert first >= 0.02 and slept == []  # a program's first call is not slowed down
    _, slow = cl.timed_call(work, jnp.ones(3), slowdown=3)
    assert len(slept) == 1 and 2 * 0.02 <= slept[0] <= 2 * first  # 2 x the fastest so far
    assert slow >= 0.02 + slept[0]
    delay[0] = 0.05  # contention: this run is slower, the sleep still uses the fastest run
    _, contended = cl.timed_call(work, jnp.ones(3), slowdown=3)
    assert len(slept) == 2 and 2 * 0.02 <= slept[1] <= slept[0]  # not 2 x 0.05
    assert contended >= 0.05 + slept[1]
    # Blocks until the (asynchronously dispatched) result is ready.
    f = jax.jit(lambda x: (x @ x).sum())
    out, _ = cl.timed_call(f, jnp.ones((64, 64)), slowdown=2.5)
    assert out.is_fully_replicated and float(out) == 64.0 ** 3


def test_link_emulation_delay_and_wait():
    lat = np.array([[0, 0.002], [0.004, 0]])
    bw = np.array([[np.inf, 1e6], [0, np.inf]])
    emu = cl.LinkEmulation(lat, bw)
    assert emu.active
    assert emu.delay(0, 1, 1000) == pytest.approx(0.003)
    assert emu.delay(1, 0, 10**9) == pytest.approx(0.004)  # bandwidth 0 = not emulated
    assert emu.delay(0, 0, 10**9) == 0.0
    tic = time.perf_counter()
    assert emu.wait(0, 1, 1000) == pytest.approx(0.003)
    assert time.perf_counter() - tic >= 0.003  # it sleeps them (a loaded host may add more)
    assert not cl.LinkEmulation(np.zeros((2, 2)), np.full((2, 2), np.inf)).active


def test_precise_sleep_sleeps_at_least_the_time_asked():
    errors = []
    for target in (1e-4, 5e-4, 3e-3):
        tic = time.perf_counter()
        cl.precise_sleep(target)
        errors.append(time.perf_counter() - tic - target)
    assert min(errors) >= 0, errors


def test_ensure_host_device_count_sets_flag_before_jax_starts():
    code = ("import os; from skyjax import cluster; print(cluster.ensure_host_device_count(3)); "
            "import jax; print(len(jax.devices())); print(cluster.ensure_host_device_count(5))")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["True", "3", "False"]


def test_region_links_give_each_pair_of_regions_its_own_link():
    from skyjax.config import validate_config
    from tests.helpers import tiny_config

    c = tiny_config(n=4, regions=("eu", "eu", "us", "asia"), link_latency_s=0.05,
                    link_bandwidth_Bps=1e8, region_links=(("us", "eu", 0.02, 1e9),))
    validate_config(c)
    got = cl.cluster_from_config(c)
    assert got.link_latency_s[0, 2] == got.link_latency_s[2, 1] == 0.02  # eu-us, both ways
    assert got.link_bandwidth_Bps[2, 0] == 1e9
    assert got.link_latency_s[0, 3] == 0.05 and got.link_bandwidth_Bps[3, 2] == 1e8  # the rest
    assert got.link_latency_s[0, 1] == 0.0 and got.emulate_links
    c.cluster.region_links = (("us", "mars", 0.02, 1e9),)
    with pytest.raises(ValueError, match=r"config.cluster.region_links\[0\]=.*two distinct "
                                         r"regions of config.cluster.regions \(asia, eu, us\)"):
        validate_config(c)
