"""Pictures (skyjax.report.plots): the plan and the timeline for 4 and for 64 devices (a synthetic
64-node profile from the FLOP model of skyjax/profile/flops.py), the measured
per-stage numbers, and that drawing stays out of the import path (no matplotlib, no JAX until a
picture is asked)."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from skyjax import plan as plan_lib
from skyjax.plan.replay.simulate import simulate_plan
from skyjax.profile import flops
from skyjax.spans import Span
from tests.helpers import make_profile

plots = pytest.importorskip("skyjax.report.plots")
pytest.importorskip("matplotlib")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def png_size(path) -> tuple[int, int]:
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def four_devices():
    fwd = np.array([[1.0, 2.0, 3.0, 6.0]] * 6) * 1e-3
    prof = make_profile(fwd, state=[1e6] * 6, act=[1e5] * 6, out=[1e5] * 6, memory=[8e9] * 4,
                        latency=np.full((4, 4), 1e-4), bandwidth=np.full((4, 4), 1e9))
    return prof, plan_lib.plan(prof, "even", "1f1b", 4)


def sixty_four_devices():
    lat, bw = flops.uniform_links(64, 10e9 / 8, 50e-6)
    units = flops.bert_units(flops.BertShape(layers=40), "sublayer", split_head=True)
    prof = flops.slowdown_profile(units, flops.paper_slowdowns(), np.full(64, 16 << 30), lat, bw)
    return prof, plan_lib.plan(prof, "even", "1f1b", 32)


def measured_like(plan, profile, stretch=1.2):
    """A 'measured' step: the simulated one, stretched (as if every action ran slower)."""
    return [dataclasses.replace(s, start=100 + s.start * stretch, end=100 + s.end * stretch)
            for s in simulate_plan(plan, profile).spans]


def test_measure_stages():
    spans = [Span(0, "F", 0, 0.0, 1.0), Span(1, "F", 0, 1.5, 2.5), Span(1, "B", 0, 2.5, 4.5),
             Span(0, "B", 0, 4.75, 6.75)]
    m = plots.measure_stages(spans, 2, 1)
    assert m.compute_s == [3.0, 3.0]
    assert m.comm_s == [0.5 + 0.25, 0.0]  # forward hand-off 0.5 s, backward 0.25 s
    assert m.step_s == 6.75


@pytest.mark.parametrize("devices", [four_devices, sixty_four_devices])
def test_plan_and_timeline_pictures(tmp_path, devices):
    prof, plan = devices()
    p = len(plan.stages)
    spans = measured_like(plan, prof)
    measured = plots.measure_stages(spans, p, plan.microbatches)
    assert measured.compute_s[0] == pytest.approx(1.2 * plan.stages[0].compute_s, rel=1e-6)
    plan_png = plots.save(plots.plan_figure(plan, prof, measured), str(tmp_path / "plan.png"))
    timeline_png = plots.save(plots.timeline_figure(plan, prof, spans),
                              str(tmp_path / "timeline.png"))
    (pw, ph), (tw, th) = png_size(plan_png), png_size(timeline_png)
    # One row per stage: the pictures grow with the stages so that 64 rows stay legible.
    assert pw >= 1200 and ph >= 300 and tw >= 1000
    if p == 64:
        assert ph >= 64 * 15 and th >= 2 * 64 * 15
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]


def test_timeline_without_measured_step(tmp_path):
    prof, plan = four_devices()
    path = plots.save(plots.timeline_figure(plan, prof), str(tmp_path / "t.png"))
    assert png_size(path)[1] < png_size(plots.save(plots.timeline_figure(
        plan, prof, measured_like(plan, prof)), str(tmp_path / "t2.png")))[1]


def test_timeline_draws_w_in_its_own_colour(tmp_path):
    """Zero bubble: every W span of both rows (measured, simulated) is a bar in ``WEIGHT``, so
    the W passes are not drawn as waiting; the legend names them."""
    from matplotlib.colors import to_rgba

    prof, _ = four_devices()
    plan = plan_lib.plan(prof, "even", "zb-h1", 4)
    fig = plots.timeline_figure(plan, prof, measured_like(plan, prof))
    per_axis = [sum(len(c.get_paths()) for c in ax.collections
                    if tuple(c.get_facecolor()[0]) == to_rgba(plots.WEIGHT))
                for ax in fig.axes if ax.collections]
    assert per_axis == [4 * 4, 4 * 4]  # 4 stages x 4 micro-batches, in each of the two rows
    assert "weight gradient (W)" in [t.get_text() for t in fig.legends[0].get_texts()]
    plots.save(fig, str(tmp_path / "zb.png"))


def test_drawing_is_not_on_the_import_path():
    code = ("import sys, skyjax.report.plots, skyjax.cli.plan; "
            "print('matplotlib' in sys.modules, 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def two_pipelines():
    """Two pipelines of two stages on ``four_devices``' profile, each device a link group of
    its own (the exchange's phase 2), and a synchronisation at the step's end (the simulated
    step is longer than its last span)."""
    prof, _ = four_devices()
    prof = dataclasses.replace(prof, sync_s=0.02)
    stages = [plan_lib.Stage(d, block, 0.0, 0.0, 0, pipeline=i) for i, chain in enumerate(
        [[(0, (0, 3)), (1, (3, 6))], [(2, (0, 3)), (3, (3, 6))]]) for d, block in chain]
    return prof, plan_lib.Plan("manual", "1f1b", 4, stages, 0.0, 0.0, False, shares=[2, 2])


def test_timeline_draws_the_whole_step_and_the_exchange_in_its_own_colour(tmp_path):
    """Two pipelines: each panel is as long as its step (measured: the window the executor ran,
    past the last span; simulated: the simulator's step, its sync_s after the last span), the
    exchange's phase is a bar in its colour on every stage's row with a legend entry (absent
    kinds get none), and a stage is idle where it neither computes nor exchanges."""
    from matplotlib.colors import to_rgba
    from skyjax.spans import EXCHANGE_KINDS

    prof, plan = two_pipelines()
    sim = simulate_plan(plan, prof)
    last_end = max(s.end for s in sim.spans)
    assert sim.step_time_s == pytest.approx(last_end + prof.sync_s)
    spans = measured_like(plan, prof, stretch=1.0)
    assert {s.kind for s in spans if not s.is_pass} == {"X2"}
    window = (100.0, 100.0 + 2.0 * sim.step_time_s)  # e.g. the updates after the exchange
    fig = plots.timeline_figure(plan, prof, spans, window)
    measured_ax, simulated_ax = [ax for ax in fig.axes if ax.collections]
    # both in ms (steps of 0.1-0.3 s)
    assert measured_ax.get_xlim()[1] == pytest.approx(2e3 * sim.step_time_s)
    assert simulated_ax.get_xlim()[1] == pytest.approx(1e3 * sim.step_time_s)
    drawn = re.search(r"measured step: ([0-9.]+) ms", measured_ax.get_title())
    assert drawn and float(drawn.group(1)) == pytest.approx(2e3 * sim.step_time_s, abs=1)
    for ax in (measured_ax, simulated_ax):
        bars = sum(len(c.get_paths()) for c in ax.collections
                   if tuple(c.get_facecolor()[0]) == to_rgba(plots.EXCHANGE["X2"]))
        assert bars == len(plan.stages)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert EXCHANGE_KINDS["X2"] in legend and EXCHANGE_KINDS["X1"] not in legend
    # stage 0's idle share of the measured step: its passes and its exchange are busy
    mine = [s for s in spans if s.stage == 0]
    idle = 1 - sum(s.end - s.start for s in mine) / (2.0 * sim.step_time_s)
    label = measured_ax.get_yticklabels()[0].get_text()
    assert label.endswith(f"idle {idle:.0%}"), label
    plots.save(fig, str(tmp_path / "two.png"))


def test_busy_time_counts_overlaps_once_and_only_inside_the_step():
    spans = [Span(0, "B", 0, 0.0, 2.0), Span(0, "X1", -1, 1.0, 3.0), Span(0, "X2", -1, 3.5, 9.0)]
    assert plots.busy_s(spans, 0.0, 5.0) == pytest.approx(3.0 + 1.5)
    assert plots.measure_stages(spans, 1, 1, window=(0.0, 7.0)).step_s == 7.0
    assert plots.measure_stages(spans, 1, 1).compute_s == [2.0]  # the passes only
