"""Spans of a step beyond its passes (``skyjax.spans``): with several pipelines the runtime records
each stage's gradient exchange, phase by phase, and a DiLoCo outer step, beside its forward and
backward spans, so that trace.json and timeline.png show where the step goes; the trace names
each kind in its own category."""

from __future__ import annotations

import jax
import optax
import pytest

from skyjax import plan as plan_lib
from skyjax.runtime.local_executor import LocalExecutor
from skyjax.spans import (EXCHANGE_KINDS, OUTER, Span, link_events, passes, stage_events,
                          step_event)
from tests.helpers import BATCH, SEQ, fresh_chain, make_batch, rng_for

# three pipelines on four devices, two link groups: units 0-1 are owned by 0, 2 and 3 (groups
# {0, 2} and {3}), units 2-4 by 1, 2 and 3 (groups {2} and {1, 3}): every phase runs
PIPELINES = [[(0, (0, 2)), (1, (2, 5))], [(2, (0, 5))], [(3, (0, 5))]]
GROUPS = [[0, 2], [1, 3]]


def three_pipelines(averaging="exact", groups=GROUPS, pipelines=PIPELINES, shares=(2, 1, 1),
                    **outer):
    stages = [plan_lib.Stage(d, block, 0.0, 0.0, 0, pipeline=i)
              for i, stages in enumerate(pipelines) for d, block in stages]
    return plan_lib.Plan("manual", "1f1b", 4, stages, 0.0, 0.0, False, shares=list(shares),
                         exchange_groups=groups, averaging=averaging, **outer)


def two_one_stage_pipelines():
    """Two pipelines of one stage in one link group: phases 1 and 3 (a small, quick case)."""
    return three_pipelines(groups=[[0, 1]], pipelines=[[(0, (0, 5))], [(1, (0, 5))]],
                           shares=(2, 2))


def run(plan, steps):
    ex = LocalExecutor(fresh_chain(), plan, jax.devices(), batch_size=BATCH, seq_len=SEQ,
                       optimizer=optax.adamw(1e-3), max_grad_norm=0.5, rng=rng_for)
    try:
        return [ex.train_step(step, make_batch(step), measure=True) for step in range(steps)]
    finally:
        ex.close()


def routed_phases(plan, stage: int) -> list[str]:
    """The exchange kinds in which ``stage``'s device sends or receives, in phase order."""
    from skyjax.runtime.exchange import stage_routes

    routes = stage_routes(plan, stage, range(len(plan.stages)))
    return [f"X{p}" for p in (1, 2, 3)
            if any(m.phase == p and routes.device in (m.src, m.dst) for m in routes.messages)]


@pytest.mark.parametrize("make,kinds", [
    (two_one_stage_pipelines, {"X1", "X3"}),
    pytest.param(three_pipelines, set(EXCHANGE_KINDS), marks=pytest.mark.slow)])
def test_each_stage_records_its_exchange_phases_after_its_own_last_pass(make, kinds):
    """Every stage's measured step holds a span per exchange phase it takes part in, in phase
    order, after its own last pass and inside the step's window; the passes stay apart
    (``StepMetrics.spans``) for what reads compute."""
    plan = make()
    last = run(plan, 1)[-1]
    assert all(s.is_pass for s in last.spans)
    assert last.timeline_spans == last.spans + last.exchange_spans
    lo, hi = last.window
    for k in range(len(plan.stages)):
        mine = [s for s in last.exchange_spans if s.stage == k]
        want = routed_phases(plan, k)
        assert want, k  # every device takes part in the exchange here
        assert [s.kind for s in mine] == want, (k, mine)
        assert all(s.microbatch == -1 and s.kind in EXCHANGE_KINDS for s in mine)
        own_passes = [s for s in last.spans if s.stage == k]
        assert min(s.start for s in mine) >= max(s.end for s in own_passes)
        for a, b in zip(mine, mine[1:]):  # one phase after another
            assert a.start <= a.end <= b.start <= b.end
        assert lo <= min(s.start for s in own_passes) and max(s.end for s in mine) <= hi
    assert {s.kind for s in last.exchange_spans} == kinds


@pytest.mark.slow
def test_a_diloco_outer_step_is_recorded_after_its_direct_exchange():
    """DiLoCo every step (H = 1): no exchange of gradients, and at the outer step each stage's
    direct exchange of pseudo-gradients (phase 2) and then its own update (``OUTER``)."""
    plan = three_pipelines("diloco", groups=None, outer_every=1, outer_lr=0.7,
                           outer_momentum=0.9)
    last = run(plan, 2)[-1]
    for k in range(len(plan.stages)):
        mine = [s for s in last.exchange_spans if s.stage == k]
        assert [s.kind for s in mine] == ["X2", OUTER], (k, mine)
        assert mine[0].end <= mine[1].start
        assert mine[0].start >= max(s.end for s in last.spans if s.stage == k)


def test_trace_events_give_the_exchange_and_the_outer_step_their_own_category():
    spans = [Span(0, "F", 0, 1.0, 2.0), Span(0, "B", 0, 3.0, 4.0), Span(0, "X1", -1, 4.0, 4.5),
             Span(0, "X2", -1, 4.5, 6.0), Span(0, "X3", -1, 6.0, 6.2), Span(0, OUTER, -1, 6.2, 6.3)]
    events = [e for e in stage_events(spans, origin=1.0) if e["ph"] == "X"]
    assert [(e["name"], e["cat"]) for e in events] == [
        ("F0", "forward"), ("B0", "backward"), ("exchange in group", "exchange"),
        ("exchange between groups", "exchange"), ("exchange back", "exchange"),
        ("outer step", "outer step")]
    assert events[3]["ts"] == pytest.approx(3.5e6) and events[3]["dur"] == pytest.approx(1.5e6)
    assert events[3]["args"] == {"stage": 0, "kind": "X2"}
    assert passes(spans) == spans[:2]
    # links carry the passes' hand-offs only: an exchange span is no forward or backward
    assert len([e for e in link_events(spans, [0.5, 0.0]) if e["ph"] == "X"]) == 1
    step = [e for e in step_event(1.0, 7.5, pid=3, origin=1.0) if e["ph"] == "X"]
    assert step == [{"name": "step", "cat": "step", "ph": "X", "pid": 3, "tid": -1, "ts": 0.0,
                     "dur": pytest.approx(6.5e6), "args": {}}]


@pytest.mark.slow
def test_processes_gather_the_last_steps_exchange_spans_after_it():
    """Under ``jax.distributed`` (three processes as threads over one transport) a step's
    metrics reach process 0 before its exchange; ``gather_exchange`` after the last step gives
    process 0 every process's exchange spans of that step, after each stage's own passes."""
    from skyjax.runtime.distributed_executor import DistributedExecutor
    from skyjax.transport import LocalTransport
    from tests.helpers import run_as_processes

    stages = [plan_lib.Stage(d, block, 0.0, 0.0, 0, pipeline=i) for i, chain in enumerate(
        [[(0, (0, 2)), (1, (2, 5))], [(2, (0, 5))]]) for d, block in chain]
    plan = plan_lib.Plan("manual", "1f1b", 4, stages, 0.0, 0.0, False, shares=[2, 2])
    devices = jax.local_devices()[:3]
    transport = LocalTransport(devices, timeout_s=120)

    def process(k):
        ex = DistributedExecutor(fresh_chain(), plan, transport.for_stage(k), k, devices[k],
                                 batch_size=BATCH, seq_len=SEQ, optimizer=optax.adamw(1e-3),
                                 max_grad_norm=0.5, rng=rng_for)
        last = [ex.train_step(s, make_batch(s), measure=True) for s in range(2)][-1]
        return ex.gather_exchange(last)

    first = run_as_processes(process, 3, transport, timeout_s=300)[0]
    assert sorted({s.stage for s in first.exchange_spans}) == [0, 1, 2]
    assert {s.kind for s in first.exchange_spans} == {"X2"}  # no groups: the direct exchange
    for k in range(3):
        own = max(s.end for s in first.spans if s.stage == k)
        assert all(s.start >= own for s in first.exchange_spans if s.stage == k)
    assert first.window[1] >= max(s.end for s in first.timeline_spans if s.stage == 0)
