"""Progress lines with an ETA (skyjax.report.progress): the training line, the live bar only on a
terminal, and the profiler's "device d/D, ETA" suffix, also on a real (tiny) profile."""

from __future__ import annotations

import io

import pytest

from skyjax.profile.eta import ProfileProgress, format_duration
from skyjax.report.progress import Progress, eta_s


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("s, text", [(None, "--"), (-1.0, "--"), (float("nan"), "--"),
                                     (4.56, "4.6s"), (185, "3m05s"), (7620, "2h07m")])
def test_format_duration(s, text):
    assert format_duration(s) == text


def test_eta_is_robust_to_compiling_steps():
    assert eta_s(1, 10, []) is None  # only the compiling step so far
    assert eta_s(3, 10, [2.0, 2.0]) == pytest.approx(14.0)  # 7 left at 2 s
    assert eta_s(5, 10, [9.0, 1.0, 1.0, 1.0]) == pytest.approx(5.0)  # step 2 compiled again
    assert eta_s(10, 10, [1.0]) == 0.0
    clock = FakeClock()
    p = Progress(10, batch_size=1, stream=io.StringIO(), clock=clock)
    for step, t in enumerate([30.0, 39.0, 40.0, 41.0, 42.0], start=1):
        clock.t = t
        p.update(step)
    assert p.eta() == pytest.approx(5.0)  # 5 left at the median 1 s, not the mean 3 s


def test_training_lines_and_no_bar_when_not_a_terminal():
    clock, stream = FakeClock(), io.StringIO()
    p = Progress(10, batch_size=32, stream=stream, clock=clock)
    assert not p.live
    clock.t = 30.0  # step 1: compilation
    p.update(1, loss=1.1)
    first = p.line({"step": 1, "loss": 1.1, "accuracy": 0.25, "learning_rate": 0.0,
                    "step_time_s": 30.0, "examples_per_s": p.examples_per_s()})
    assert first.startswith("step 1/10 (10%)") and "ETA --" in first
    for step in range(2, 6):
        clock.t += 0.5
        p.update(step, loss=0.9)
    record = {"step": 5, "loss": 0.9, "accuracy": 0.5, "learning_rate": 1e-3,
              "step_time_s": 0.5, "examples_per_s": p.examples_per_s()}
    assert record["examples_per_s"] == pytest.approx(4 * 32 / 2.0)
    line = p.line(record)
    for part in ("step 5/10 (50%)", "loss 0.9000", "accuracy 0.500", "lr 1.00e-03",
                 "64 examples/s", "0.500 s/step", "ETA 2.5s"):
        assert part in line, (part, line)
    p.close()
    assert stream.getvalue() == ""  # nothing but the log lines (which go to logging)


def test_live_bar_on_a_terminal():
    clock, stream = FakeClock(), Tty()
    p = Progress(4, batch_size=8, stream=stream, clock=clock)
    assert p.live
    for step in range(1, 5):
        clock.t += 1.0
        p.update(step, loss=0.5)
    text = stream.getvalue()
    assert "\r[" in text and "step 4/4" in text and "#" * 24 in text
    p.line({"step": 4, "loss": 0.5})
    assert stream.getvalue().endswith("\r\033[K")  # the bar is erased before the log line


def test_profile_progress_appends_device_and_eta():
    clock, seen = FakeClock(), []
    log = ProfileProgress(seen.append, ["proc0:cpu0", "proc0:cpu1"], clock=clock)
    clock.t = 10.0
    log("[profile] unit 1/5 embeddings             on proc0:cpu1     (x2): forward 1 ms")
    log("[profile] unit layer_1: same shapes as layer_0, reused")
    assert seen[0].endswith("| device 2/2, ETA 40.0s")  # 4 units left at 10 s each
    assert seen[1] == "[profile] unit layer_1: same shapes as layer_0, reused"


@pytest.mark.slow
def test_real_profile_lines_carry_the_eta():
    from tests.helpers import measure, tiny_config

    seen: list[str] = []
    measure(tiny_config(2, layers=1, slowdowns=(1, 2)), log=seen.append)
    timed = [m for m in seen if m.startswith("[profile] unit ") and "forward" in m]
    assert timed, seen
    assert all("ETA" in m and "device " in m for m in timed), timed
    assert any("device 2/2" in m for m in timed)
