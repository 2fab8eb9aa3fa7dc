"""One pipeline against several in data parallel, at the paper's scale (prints a comparison).

The setting of ``skyjax.profile.flops.paper_profile`` with a smaller model: 64 nodes of 16 GiB in four regions
(nodes 16 r .. 16 r + 15 form region r: 100 Gbit/s and 10 us inside, 10 Gbit/s and 20 ms across),
slow-downs ``numpy.random.default_rng(35).integers(1, 7, 64)``, BERT-large (24 layers) at layer
granularity: embeddings, 24 layers, the head (pooler + classifier) = 26 units, with the FLOP
model of :mod:`skyjax.profile.flops`; ``param_bytes`` (fp32) prices the gradient exchange.

A single pipeline can use at most 26 devices (one unit each); several pipelines in data parallel
can use more, at the price of exchanging replicated gradients (docs/design.md, "Several
pipelines"). Printed per schedule: the best single pipeline (devices used, T, examples/s =
global batch / T), the plan with up to ``--pipelines`` pipelines (its pipelines with devices,
units, share and T_i, the exchange AR, T, examples/s), its lower bound and gap, planning time
(CPU seconds of the ``plan`` call: with relaxations allowed it plans exactly first, then relaxed
below the exact plan's T less ``min_gain``).

The bound ("step / lower bound"): ``as_run.run_bound``, a proof over every plan's simulated
step, any number of pipelines: with w_u the least time of unit u on any device and s_d =
max_u w_u / work[u][d] (device d's speed against the fastest, on its best unit), step >= m sum_u
w_u / sum_d s_d + sync_s: every device busy all step on compute alone, with no fill or drain,
no hand-offs, no exchange and no update. Its gap is what those cost, and what unit granularity
leaves idle.

Run: ``python -m experiments.plan_pipelines`` (``--microbatches 32 64 256 --pipelines 0``,
defaults); ``--results`` writes the tables into docs/results.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from skyjax import plan as plan_lib
from skyjax.plan.as_run import run_bound
from skyjax.plan.replay.simulate import simulate_plan
from skyjax.plan.data_parallel.pipelines import INT8_WIRE
from skyjax.profile import flops
from skyjax.profile.format import Profile
from skyjax.relax import Relaxation


def paper_profile(layers: int = 24) -> Profile:
    units = flops.bert_units(flops.BertShape(layers=layers))
    prof = flops.paper_profile(units)
    for rec, u in zip(prof.units, units):
        rec["param_bytes"] = 4 * u["params"]  # fp32 gradients
    return prof


def with_links(prof: Profile, cross_Bps: float, cross_latency_s: float) -> Profile:
    """``prof`` with other links between regions."""
    region = np.arange(prof.num_devices) // 16
    same = region[:, None] == region[None, :]
    lat = np.where(same, prof.latency_s, cross_latency_s)
    bw = np.where(same, prof.bandwidth_Bps, cross_Bps)
    return dataclasses.replace(prof, latency_s=lat, bandwidth_Bps=bw)


def with_int8(prof: Profile, seconds_per_byte: float = 2e-11) -> Profile:
    """``prof`` with the bf16 and int8 codecs timed (their bytes; a GPU's coding rate), so
    that a relaxed plan may use them on hand-offs and int8 on the exchange, and the top-k
    2-bit outer steps' coding (``relax.outer_compression``) at the same rate."""
    out = [float(u["output_bytes"]) for u in prof.units]
    rate = [seconds_per_byte] * prof.num_devices
    return dataclasses.replace(prof, codecs={
        "bf16": {"output_bytes": [b / 2 for b in out], "seconds_per_byte": rate},
        "int8": {"output_bytes": [b * INT8_WIRE for b in out], "seconds_per_byte": rate},
        "topk2": {"output_bytes": [b * INT8_WIRE for b in out], "seconds_per_byte": rate}})


RELAXED = Relaxation(handoff_bits=8, averaging="diloco", outer_every=10)
# and the relaxed averagings' outer steps sent as top-k 2-bit with error feedback (skyjax.compress)
COMPRESSED = dataclasses.replace(RELAXED, outer_compression="topk2")
# and the peer modes beside them: decentralized averaging on the one-peer exponential graph, in
# float32 or int8 differences, and asynchronous averaging 2 steps late
# (skyjax.runtime.decentralized)
EVERY_MODE = dataclasses.replace(COMPRESSED, peers="exponential", peer_bits=8, async_steps=2)


def table(prof: Profile, ms: list[int], pipelines: int, best_schedule: bool = True) -> list[str]:
    """Per m: the single pipeline, the plan of up to ``pipelines`` (0: auto) pipelines with
    exact math, with relaxations allowed (int8 hand-offs, averaging up to DiLoCo H = 10),
    with their outer steps compressed (top-k 2-bit), and with the peer modes allowed too;
    ``best_schedule``: also the least step over every schedule (``schedule="auto"``). Steps are
    the plans' predictions, the simulated step as it runs; T is the cost model's."""
    rows = ["| m | plan | pipelines | devices | step (s) | T (s) | examples/s | vs one pipeline | "
            "step / lower bound | exchange (s) | exchange tail (s) | planned in (s) | "
            "best schedule (step s) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    size = prof.microbatch["size"]
    for m in ms:
        one = plan_lib.plan(prof, "optimal", "1f1b", m)
        for name, kw in (("one pipeline", {}), ("exact", {"max_pipelines": pipelines}),
                         ("relaxed", {"max_pipelines": pipelines, "relax": RELAXED}),
                         ("compressed", {"max_pipelines": pipelines, "relax": COMPRESSED}),
                         ("every mode", {"max_pipelines": pipelines, "relax": EVERY_MODE})):
            t0 = time.process_time()
            p = one if not kw else plan_lib.plan(prof, "optimal", "1f1b", m, **kw)
            took = time.process_time() - t0
            lb = run_bound(prof, "1f1b", m, min(16, m))
            topk = name != "relaxed" and p.outer_compression != "none"
            what = name if name in ("one pipeline", "exact") else (
                f"{name} ({p.averaging}{', top-k 2-bit' if topk else ''}, "
                f"{sum(s.codec != 'none' for s in p.stages)} int8 links)")
            best = "-"
            if kw and best_schedule:  # every schedule (GPipe, 1F1B, ZB-H1, ZB-H2), least step
                b = plan_lib.plan(prof, "optimal", "auto", m, **kw)
                best = f"{b.schedule} ({b.step_time_s:.3f})"
            rows.append(f"| {m} | {what} | {p.num_pipelines} | {len(p.stages)} | "
                        f"{p.step_time_s:.3f} | {p.model_s:.3f} | {m * size / p.step_time_s:.0f} | "
                        f"{one.step_time_s / p.step_time_s:.2f}x | {p.step_time_s / lb:.2f} | "
                        f"{p.allreduce_s:.3f} | {exchange_tail(p, prof):.3f} | "
                        f"{took if kw else 0:.1f} | {best} |")
    return rows


def exchange_tail(p: plan_lib.Plan, prof: Profile) -> float:
    """What the simulated step spends after the last pass of any stage: the exchange between
    pipelines that the backward does not hide (and sync_s)."""
    sim = simulate_plan(p, prof)
    return sim.step_time_s - max(s.end for s in sim.spans if s.is_pass)


def describe(p: plan_lib.Plan, prof: Profile) -> list[str]:
    lines = []
    for i in range(p.num_pipelines):
        sub = p.pipeline(i)
        regions = sorted({prof.devices[s.device]["region"] for s in sub.stages})
        lines.append(f"    pipeline {i}: {len(sub.stages):2d} stages on devices "
                     f"{[s.device for s in sub.stages]} ({', '.join(regions)}), share "
                     f"{sub.microbatches}, T_i {sub.step_time_s:.4f} s")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--microbatches", type=int, nargs="*", default=[32, 64, 256])
    ap.add_argument("--pipelines", type=int, default=0, help="most pipelines (0: auto)")
    ap.add_argument("--no_best_schedule", action="store_true",
                    help="leave out the column of the best schedule (plans every schedule)")
    args = ap.parse_args(argv)
    prof = with_int8(paper_profile())
    print(f"64 devices in 4 regions of 16, {prof.num_units} units (BERT-large, 24 layers), "
          f"micro-batches of {prof.microbatch['size']} examples, 1F1B; step: the plan's "
          "prediction, its simulated step as it runs; T: the cost model's; lower bound: "
          "as_run.run_bound (compute alone, every device busy, no bubble, hand-off or "
          "exchange); exchange: the cost model's AR; planned in: CPU s")
    for title, p in (("100 Gbit/s and 10 us inside a region, 10 Gbit/s and 20 ms between", prof),
                     ("100 Mbit/s and 80 ms between regions", with_links(prof, 100e6 / 8, 80e-3))):
        print(f"\n{title}:\n")
        print("\n".join(table(p, args.microbatches, args.pipelines,
                               not args.no_best_schedule)))


if __name__ == "__main__":
    from experiments import results_doc

    results_doc.run(main, [(
        None, "plan_pipelines", "One pipeline against several, at the paper's scale",
        "64 nodes in four regions of 16, BERT-large at 26 units: the best single "
        "pipeline against up to 16 pipelines in data parallel: exact, with "
        "relaxations allowed (int8 hand-offs, averaging up to DiLoCo with H = 10), "
        "compressed (that bound with the outer steps sent as top-k 2-bit, 1/8 kept, with "
        "error feedback: `relax.outer_compression`), and every mode (that bound with the "
        "peer modes too: decentralized averaging on the one-peer exponential graph in "
        "float32 or int8, asynchronous averaging 2 steps late), for two kinds of links between "
        "regions. Step: the plan's prediction, its simulated "
        "step as it runs (docs/design.md, \"The price: the step as it runs\"); T: the "
        "cost model's. Lower bound: `as_run.run_bound`, a proof over every plan's "
        "simulated step (each device busy all step on compute alone, no fill or drain, "
        "hand-offs or exchange); exchange: the cost model's AR; exchange tail: what the "
        "simulated step spends after the last pass of any stage (the exchange the "
        "backward does not hide, and sync); planned in: CPU seconds "
        "of one `plan` call (the relaxed one plans exactly first); best schedule: the "
        "least step over every schedule.")], fenced=False)
