"""Profiling in several passes (skyjax.hostmodel.passes): each unit's median pass is kept."""

from __future__ import annotations

import math

import numpy as np
import pytest

from skyjax import cluster as cl
from skyjax.optim import make_optimizer
from skyjax.profile import measure as measure_lib
from skyjax.profile.chain import Workload
from skyjax.profile.options import Options
from skyjax.hostmodel import probes
from skyjax.hostmodel.passes import median_pass, pass_order
from tests.helpers import quiet, tiny_config

nan = math.nan


def _pass(fwd, call, compile_s, wake):
    return {"units": [{"name": "u"}], "forward_s": np.array(fwd), "backward_s": np.array(fwd),
            "update_s": np.array(fwd), "compile_s": compile_s, "cpu_cores": [1.5, nan],
            "overheads": {"forward_call_s": call, "input_s": call}, "wake": wake}


def test_median_pass_per_unit_and_device_first_pass_for_the_rest():
    """Per unit the middle pass, neither the fastest nor the mean: one pass in a slow period
    (unit 0's 9.0) is outvoted, and the run's typical speed is not the host's best."""
    a = _pass([[1.0, nan], [4.0, nan]], [0.2, nan], 1.0, [[[0.005, 1e-3]], None])
    b = _pass([[2.0, nan], [3.0, nan]], [0.1, nan], 0.5, [None, None])
    c = _pass([[9.0, nan], [3.5, nan]], [0.4, nan], 0.5, [None, None])
    out = median_pass([a, b, c])
    np.testing.assert_array_equal(out["forward_s"], [[2.0, nan], [3.5, nan]])
    np.testing.assert_array_equal(out["update_s"], [[2.0, nan], [3.5, nan]])
    np.testing.assert_array_equal(out["overheads"]["forward_call_s"], [0.2, nan])
    assert out["wake"] == a["wake"] and out["cpu_cores"] == a["cpu_cores"]
    assert out["compile_s"] == 2.0
    # device 0: 2 (1 + 4) = 2 (2 + 3), then 2 (9 + 3.5)
    assert out["pass_work_s"] == [[10.0, 10.0, 25.0], [None, None, None]]
    assert "backward_weight_s" not in out  # measured for zero-bubble runs only
    w = median_pass([{**r, "backward_weight_s": r["forward_s"] / 2} for r in (a, b, c)])
    np.testing.assert_array_equal(w["backward_weight_s"], [[1.0, nan], [1.75, nan]])
    one = median_pass([a])
    assert one["forward_s"] is a["forward_s"] and one["pass_work_s"] == [[10.0], [None]]
    assert pass_order(3, 0) == [0, 1, 2] and pass_order(3, 1) == [2, 1, 0]


@pytest.mark.slow
def test_profile_in_passes_in_one_process(monkeypatch):
    calls, measure_units = [], measure_lib.units.measure_units

    def recorded(*args, wake, **kwargs):
        out = measure_units(*args, wake=wake, **kwargs)
        calls.append((wake, out))
        return out

    monkeypatch.setattr(measure_lib.units, "measure_units", recorded)
    c = tiny_config(1)
    prof = measure_lib.profile(Workload.from_config(c), cl.cluster_from_config(c),
                               make_optimizer(c.train), Options(repeats=3, passes=2, host=probes()), log=quiet)
    assert [w for w, _ in calls] == [True, False]
    np.testing.assert_allclose(prof.forward_s, (calls[0][1]["forward_s"]
                                                + calls[1][1]["forward_s"]) / 2)
    assert prof.extra["profiler"]["passes"] == 2 and prof.devices[0]["wake_s"]
    work = [float(np.sum(r["forward_s"][:, 0] + r["backward_s"][:, 0])) for _, r in calls]
    np.testing.assert_allclose(prof.extra["profiler"]["pass_work_s"], [work])
