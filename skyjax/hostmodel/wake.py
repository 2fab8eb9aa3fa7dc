"""What a call costs after its device idled: the part of a stage's time the back-to-back unit
timings do not see.

A pipeline stage that waits for its neighbours starts its next action after an idle gap, and on
a CPU host that action runs slower: the data it works on left the caches while other work ran
(a gap spent busy-waiting costs as much as one asleep, so it is not the core's sleep states).
The profiler times every
unit back to back, so this module measures the difference apart: per device, one representative
unit as a one-unit stage, its forward and backward back to back and after each of ``GAPS_S``
of idle, interleaved so that drift hits all alike. The extra grows with the data a call touches:
the profile's longest unit (the largest working set) gives ``devices[d]["wake_s"]`` in
profile.json (``[[gap_s, extra_s], ...]``), the shortest ``wake_light_s``, and
``wake_work_s`` their forward + backward seconds; the cost model adds the extra per action from
the gap it predicts, between the two by the stage's work (``skyjax.hostmodel.wake_cost``). On an
accelerator the extra is ~0.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from skyjax import cluster as cluster_lib
from skyjax.models import bert
from skyjax.programs.calls import call_inputs, cotangent
from skyjax.profile.options import robust_time

GAPS_S = (0.005, 0.03)  # idle gaps measured (the extra is interpolated between, 0 at no gap)
NOISE_FLOOR = 0.02  # extras below this fraction of the back-to-back time count as 0


def wake_records(chain: list[bert.Unit], timed: list[tuple[int, Any]], inputs: dict[int, Any],
                 labels: np.ndarray, targets: list[tuple[Any, float]],
                 params_on: Callable[[Any, Any], list]) -> list[dict]:
    """Per target, its profile.json device keys for calls after idle: ``wake_s`` of the
    longest of the ``timed`` units (``(chain index, result)`` with per-target ``forward_s`` /
    ``backward_s``), and where a shorter one exists ``wake_light_s`` of the shortest and
    ``wake_work_s`` (both units' forward + backward seconds on the target). ``inputs[i]``:
    the carry into chain unit i; ``params_on(unit, dev)``: ``[its params]`` on a device."""
    def work(x):
        return [x[1].forward_s[k] + x[1].backward_s[k] for k in range(len(targets))]

    by_work = sorted(timed, key=lambda x: work(x)[0])
    ends = [by_work[-1]] + ([by_work[0]] if work(by_work[0])[0] < work(by_work[-1])[0] else [])
    tables = [measure_wake(chain[i], i == len(chain) - 1, inputs[i], labels, targets,
                           lambda dev, u=chain[i]: params_on(u, dev)) for i, _ in ends]
    out = [{"wake_s": t} for t in tables[0]]
    if len(ends) == 2:
        for k, rec in enumerate(out):
            rec["wake_light_s"] = tables[1][k]
            rec["wake_work_s"] = [float(work(ends[1])[k]), float(work(ends[0])[k])]
    return out


def measure_wake(unit: bert.Unit, is_last: bool, carry: Any, labels: np.ndarray,
                 targets: list[tuple[Any, float]], params_on: Callable[[Any], list],
                 repeats: int = 4) -> list[list[list[float]]]:
    """Per target ``(jax device, slowdown)``: ``[[gap_s, extra_s], ...]`` for ``GAPS_S``, the
    extra of one action (forward and backward averaged) after that gap over back to back;
    the fastest half of ``repeats`` of each is kept, as for the unit times. ``params_on(dev)``:
    ``[unit's params]`` on a device (``skyjax.profile.unit_timing.device_params``)."""
    from skyjax.programs.stage import StageProgram

    prog = StageProgram([unit], is_last=is_last, microbatches=1, optimizer=None, train=True)
    out = []
    for dev, slowdown in targets:
        params = params_on(dev)
        c, rng, lab = call_inputs(carry, labels, is_last, dev)
        grads = jax.tree.map(jnp.zeros_like, params)
        res_out, res = cluster_lib.block(prog.forward(params, c, rng, lab))
        ct = cotangent(res_out, is_last)
        grads, _ = cluster_lib.block(prog.backward(params, res, ct, grads))
        # Through the emulation once first: its first call of a program is not slowed down,
        # which would make the back-to-back figure of a slowed device too fast.
        (_, res), _ = cluster_lib.timed_call(prog.forward, params, c, rng, lab, slowdown=slowdown)
        (grads, _), _ = cluster_lib.timed_call(prog.backward, params, res, ct, grads,
                                               slowdown=slowdown)
        times = time_after_idle(prog, params, c, rng, lab, ct, grads, slowdown,
                                [(0.0, 0.0)] + [(g, g) for g in GAPS_S], repeats)
        out.append(wake_extras([[tf + tb for tf, tb in ts] for ts in times]))
    return out


def wake_extras(samples: list[list[float]]) -> list[list[float]]:
    """``[[gap_s, extra_s], ...]`` for ``GAPS_S`` from forward + backward seconds back to back
    (``samples[0]``) and after each gap (``samples[1:]``): the extra per action (half a pair),
    robust times as for the units, and 0 where it does not stand out of the noise: below
    ``NOISE_FLOOR`` of the action, or below the back-to-back samples' own spread (median -
    fastest). Noise-level extras would otherwise make every plan pay a replay penalty and lose
    ``exact`` on devices, such as accelerators, that have no cost after idle."""
    base_samples, *after = samples
    base = robust_time(base_samples)
    floor = noise_floor(base_samples) / 2
    extras = [(robust_time(ts) - base) / 2 for ts in after]
    return [[g, e if e > floor else 0.0] for g, e in zip(GAPS_S, extras)]


def noise_floor(base_samples: list[float]) -> float:
    """The least extra over ``base_samples`` (seconds of the undisturbed call) that counts as
    one: ``NOISE_FLOOR`` of their robust time, or their own spread (median - fastest) if larger.
    Shared by the calls-after-idle and the message-cost probes
    (``skyjax.hostmodel.messages``)."""
    return max(NOISE_FLOOR * robust_time(base_samples),
               float(np.median(base_samples)) - min(base_samples))


def time_after_idle(prog: Any, params: list, x: Any, rng: Any, labels: Any, cotangent: Any,
                    grads: list, slowdown: float, gaps: list[tuple[float, float]],
                    repeats: int) -> list[list[tuple[float, float]]]:
    """Per (forward gap, backward gap) of ``gaps``: ``repeats`` (forward s, backward s) of the
    stage program ``prog`` (``skyjax.programs.stage.StageProgram``), as the profiler times a
    unit (``skyjax.profile.unit_timing``): an untimed forward and backward, then that long idle
    before each of the timed pair; the settings interleaved so that drift hits all alike.
    ``grads`` is donated to the backward calls: pass a copy."""
    times: list[list[tuple[float, float]]] = [[] for _ in gaps]
    for _ in range(repeats):
        for i, (gap_f, gap_b) in enumerate(gaps):
            _, res = cluster_lib.block(prog.forward(params, x, rng, labels))  # warm, as profiled
            grads, _ = cluster_lib.block(prog.backward(params, res, cotangent, grads))
            del res
            time.sleep(gap_f)
            (_, res), tf = cluster_lib.timed_call(prog.forward, params, x, rng, labels,
                                                  slowdown=slowdown)
            time.sleep(gap_b)
            (grads, _), tb = cluster_lib.timed_call(prog.backward, params, res, cotangent, grads,
                                                    slowdown=slowdown)
            times[i].append((tf, tb))
    return times
