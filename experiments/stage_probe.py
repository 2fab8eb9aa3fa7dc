"""Where a stage's from-profile compute error comes from: host drift, fusion or the pipeline.

``experiments/hetero_benchmark.py`` runs this in every process, one process at a time
(processes that share cores would otherwise time each other's load). Each process times its own
stage of every plan more ways: right after each block of that plan's measured steps (so that
each comparison with the pipeline is paired in time on a host whose speed drifts), the block
back to back and after idle gaps; once after all steps, the units:

- **units now**: each of the stage's units as a one-unit stage through the profiler's own path
  (``skyjax.profile.units``), summed as the cost model sums them (call cost once per action);
- **block now**: the stage's own jitted forward and backward, back to back (each timed call
  after an untimed one, as the profiler times);
- **idle now**: the same, with the core idle before each timed call for as long as it was, by
  the median, before that kind of action in the pipeline (the wait since the stage's previous
  action, plus that action's emulated sleep);

and sets them beside the profile's prediction (taken before the steps) and the stage's actions
in the pipeline (median over the measured steps). Per forward + backward of one micro-batch:

- drift = units now / profile: how much the host's speed (or the load on it while profiling)
  changed since it was profiled;
- fusion = block now / units now: the fused stage against the model's sum of its units;
- idle = idle now / block now: what the idle time before an action costs it (here a gap spent
  busy-waiting costs as much as one asleep: caches refilled after other work used them, not
  the core's sleep states);
- rest = in the pipeline / idle now: what else running amid the other stages adds (transfers
  in flight, the order of the actions).

Their product is, up to taking medians over rounds, the stage's compute in the pipeline over
its prediction. The model has a term for idle (calls after idle, ``skyjax.plan.wake_cost``;
the profile column leaves it out, as it is the per-action figure); calibration from measured
steps (``allocation.calibrate_steps``) absorbs the others.
"""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

KEYS = ("profile", "units_now", "block_now", "idle_now", "pipeline")


def block_times(stage: Any, idle: tuple[float, float], repeats: int = 5) -> list[list[float]]:
    """[back to back, after ``idle`` seconds before a forward / a backward]: each the stage's
    [forward, backward] seconds (mean of the fastest half of ``repeats``, as profiled; the two
    settings interleaved, ``skyjax.profile.wake.time_after_idle``)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from skyjax.profile.options import robust_time
    from skyjax.profile.wake import time_after_idle
    from skyjax.runtime.stage import float_entries

    prog, dev = stage.program, stage.device
    x = jax.device_put({k: np.ones(v.shape, v.dtype) for k, v in stage.in_like.items()}, dev)
    key = jax.device_put(jax.random.PRNGKey(0), dev)
    lab = jax.device_put(np.zeros(x["attention_mask"].shape[:1], np.int32), dev) \
        if stage.is_last else None
    params = stage.state.params
    grads = jax.tree.map(jnp.zeros_like, params)  # backward donates them: not the stage's
    ct = None if stage.is_last else {k: jnp.ones(v.shape, v.dtype)
                                     for k, v in float_entries(stage.out_like).items()}
    times = time_after_idle(prog, params, x, key, lab, ct, grads, stage.slowdown,
                            [(0.0, 0.0), idle], repeats)
    return [[robust_time([f for f, _ in ts]), robust_time([b for _, b in ts])] for ts in times]


def idle_before(spans: list, stage: int, slowdown: float) -> tuple[float, float]:
    """Median seconds the stage's core had no work of its own before a forward / a backward in
    the pipeline: the wait since its previous action of the step ended, plus that action's
    emulated sleep (the last (k - 1) / k of a device slowed k times)."""
    gaps: dict[str, list[float]] = {"F": [], "B": []}
    for step in spans:
        own = sorted((s for s in step if s[0] == stage), key=lambda s: s[3])
        for prev, cur in zip(own, own[1:]):
            sleep = (prev[4] - prev[3]) * (1 - 1 / max(slowdown, 1.0))
            gaps[cur[1]].append(max(cur[3] - prev[4], 0.0) + sleep)
    return tuple(statistics.median(gaps[k]) if gaps[k] else 0.0 for k in "FB")


def after_block(stage: Any, spans: list) -> dict:
    """One round: the stage's actions in this block of steps (``spans``: per step, ``(stage,
    kind, microbatch, start, end)`` of every stage) and the block timed now, back to back and
    after the idle gaps it had; [forward, backward] seconds each."""
    mine = [s for step in spans for s in step if s[0] == stage.index]
    pipe = [statistics.median([e - s for _, kind, _, s, e in mine if kind == k]) for k in "FB"]
    idle = idle_before(spans, stage.index, stage.slowdown)
    block, after_idle = block_times(stage, idle)
    return {"pipeline": pipe, "block_now": block, "idle_now": after_idle, "idle_s": list(idle)}


def units_times(stage: Any, units: tuple[int, int], chain: list, profile: Any, sample: tuple,
                device: int, repeats: int = 10) -> dict:
    """The profile's [forward, backward] of the stage's units on ``device`` (call costs once)
    and the same timed again now through the profiler's own path (``sample``: the first unit's
    carry and labels of one micro-batch; ``chain``: the units with parameters)."""
    import numpy as np

    from skyjax.profile.options import Options
    from skyjax.profile.units import _measure_unit

    a, b = units
    calls = tuple(0.0 if c is None else float(c[device])
                  for c in (profile.forward_call_s, profile.backward_call_s))
    prof = [float(np.sum(profile.forward_s[a:b, device])) + calls[0],
            float(np.sum(profile.backward_s[a:b, device])) + calls[1]]
    carry, labels = sample
    if a > 0:  # the stage's input: its receive shapes (values do not change a unit's time)
        carry = {k: np.ones(v.shape, v.dtype) for k, v in stage.in_like.items()}
    options = Options(repeats=repeats, min_repeats=min(3, repeats))
    now = list(calls)
    for u in range(a, b):
        res = _measure_unit(chain[u], u == len(chain) - 1, carry, labels,
                            [(stage.device, stage.slowdown)], options)
        now[0] += max(res.forward_s[0] - calls[0], 0.0)
        now[1] += max(res.backward_s[0] - calls[1], 0.0)
        carry = res.out_carry
    return {"stage": stage.index, "device": device, "profile": prof, "units_now": now}


def probe_round(stage: Any, spans: list, transport: Any, rounds: list) -> None:
    """:func:`after_block` of this process's stage (if the plan has one) appended to
    ``rounds``, one process at a time (the others wait at a barrier: processes that share cores
    must not time each other's load). Every process calls it."""
    import jax

    for k in range(jax.process_count()):
        if k == jax.process_index() and stage is not None:
            rounds.append(after_block(stage, spans))
        transport.barrier(0)


def probe_units(executors: dict, plans: dict, chain: list, profile: Any, config: Any,
                probes: dict, transport: Any, workdir: str) -> None:
    """:func:`units_times` of this process's stage of every plan, one process at a time; saved
    with the plan's rounds (``probes``) to ``workdir/probe_<process>.json``."""
    import jax

    from skyjax.models.build import model_config
    from skyjax.profile.chain import sample_microbatch

    m = config.pipeline.microbatches
    sample = sample_microbatch(model_config(config.model), config.data.batch_size // m,
                               config.data.seq_len)
    out = {}
    for k in range(jax.process_count()):
        if k == jax.process_index():
            for s, ex in executors.items():
                if ex.stage is not None:
                    st = plans[s].stages[ex.stage.index]
                    out[s] = units_times(ex.stage, tuple(st.units), chain, profile, sample,
                                         st.device)
                    out[s]["rounds"] = probes[s]
        transport.barrier(0)
    save(workdir, jax.process_index(), out)


def save(workdir: str, process: int, probes: dict) -> None:
    with open(os.path.join(workdir, f"probe_{process}.json"), "w") as f:
        json.dump(probes, f)


def load(workdir: str, processes: int) -> dict[str, list[dict]]:
    """Per plan, the probes of its stages (ordered by stage)."""
    out: dict[str, list[dict]] = {}
    for p in range(processes):
        path = os.path.join(workdir, f"probe_{p}.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for plan, probe in json.load(f).items():
                out.setdefault(plan, []).append(probe)
    return {plan: sorted(v, key=lambda r: r["stage"]) for plan, v in out.items()}


def report(probes: dict[str, list[dict]], names: list[str]) -> list[str]:
    """The table's lines: per plan and stage, forward + backward ms five ways (the per-round
    ones: their medians over rounds) and each one's ratio to the one before (idle and rest:
    medians of the rounds' own ratios, paired in time)."""
    lines = [f"{'plan':10s} {'stage':>12s} {'profile':>8s} {'units':>8s} {'block':>8s} "
             f"{'idle':>8s} {'pipeline':>8s} {'gap F/B':>11s} | {'drift':>6s} {'fusion':>6s} "
             f"{'idle':>6s} {'rest':>6s} {'error':>6s}"]
    med = statistics.median
    for plan, rows in probes.items():
        for r in rows:
            rounds = r["rounds"]
            t = {k: sum(r[k]) for k in KEYS[:2]}
            t.update({k: med(sum(x[k]) for x in rounds) for k in KEYS[2:]})
            ratio = [t["units_now"] / t["profile"],
                     med(sum(x["block_now"]) / t["units_now"] for x in rounds)]
            ratio += [med(sum(x[b]) / sum(x[a]) for x in rounds)
                      for a, b in (("block_now", "idle_now"), ("idle_now", "pipeline"))]
            gaps = "/".join(f"{med(x['idle_s'][i] for x in rounds) * 1e3:.1f}" for i in (0, 1))
            lines.append(f"{plan:10s} {names[r['device']]:>12s} "
                         + " ".join(f"{t[k] * 1e3:8.2f}" for k in KEYS) + f" {gaps:>11s} | "
                         + " ".join(f"{x:6.3f}" for x in ratio)
                         + f" {(t['pipeline'] - t['profile']) / t['pipeline']:+6.1%}")
    return lines


def print_report(workdir: str, processes: int, names: list[str]) -> None:
    print("\nper stage, forward + backward of one micro-batch, ms: the profile's prediction; "
          "after the steps, the units again (profiler path); after each block of steps, the "
          "stage's block back to back, the block after the idle gaps it had in the pipeline "
          "(gap F/B: their medians), its actions in the pipeline (median). Ratios of each to "
          "the one before: drift, fusion, idle, rest (experiments/stage_probe.py); "
          "error = (pipeline - profile) / pipeline")
    for line in report(load(workdir, processes), names):
        print("  " + line)
