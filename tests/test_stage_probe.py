"""experiments/stage_probe.py: the idle gaps it reads off measured spans, and its table."""

import pytest

from experiments import stage_probe



def test_idle_before_adds_the_previous_actions_emulated_sleep():
    # stage 1 slowed 2x: F0 [0, 4), idle 1, F1 [5, 7), idle 3, B0 [10, 14); stage 0 ignored
    step = [(1, "F", 0, 0.0, 4.0), (1, "F", 1, 5.0, 7.0), (1, "B", 0, 10.0, 14.0),
            (0, "F", 0, 0.0, 100.0)]
    f, b = stage_probe.idle_before([step], 1, 2.0)
    assert f == pytest.approx(1.0 + 2.0)  # the wait, plus half of F0 (its emulated sleep)
    assert b == pytest.approx(3.0 + 1.0)
    assert stage_probe.idle_before([step], 1, 1.0) == pytest.approx((1.0, 3.0))
    # a step's first action has no gap before it in the step; no backward: 0
    assert stage_probe.idle_before([[(0, "F", 0, 0.0, 1.0)]], 0, 1.0) == (0.0, 0.0)


def test_report_ratios_compose_to_the_error():
    rounds = [{"block_now": [0.010, 0.020], "idle_now": [0.011, 0.022],
               "pipeline": [0.012, 0.024], "idle_s": [0.001, 0.030]}] * 3
    probes = {"even": [{"stage": 0, "device": 1, "profile": [0.008, 0.016],
                        "units_now": [0.009, 0.018], "rounds": rounds}]}
    header, row = stage_probe.report(probes, ["a", "dev1"])
    assert "drift" in header and "rest" in header
    cells = row.split("|")[1].split()
    drift, fusion, idle, rest = (float(x) for x in cells[:4])
    assert (drift, fusion, idle, rest) == pytest.approx((27 / 24, 30 / 27, 1.1, 36 / 33),
                                                        abs=1e-3)
    assert drift * fusion * idle * rest == pytest.approx(36 / 24, abs=2e-3)
    assert cells[4] == "+33.3%"  # (36 - 24) / 36
    assert "dev1" in row and "1.0/30.0" in row
