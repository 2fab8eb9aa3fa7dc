"""One pipeline against several in data parallel, at the paper's scale (prints a comparison).

The setting of ``plan_scale.paper_case`` with a smaller model: 64 nodes of 16 GiB in four regions
(nodes 16 r .. 16 r + 15 form region r: 100 Gbit/s and 10 us inside, 10 Gbit/s and 20 ms across),
slow-downs ``numpy.random.default_rng(35).integers(1, 7, 64)``, BERT-large (24 layers) at layer
granularity: embeddings, 24 layers, the head (pooler + classifier) = 26 units, with the FLOP
model of ``paper_reproduction.py``; ``param_bytes`` (fp32) prices the gradient exchange.

A single pipeline can use at most 26 devices (one unit each); several pipelines in data parallel
can use more, at the price of exchanging replicated gradients (docs/design.md, "Several
pipelines"). Printed per schedule: the best single pipeline (devices used, T, examples/s =
global batch / T), the plan with up to ``--pipelines`` pipelines (its pipelines with devices,
units, share and T_i, the exchange AR, T, examples/s), its lower bound and gap, planning time.

Run: ``python experiments/plan_pipelines.py`` (``--microbatches 32 --pipelines 8``, defaults).

Findings (m = 32, both schedules alike): one pipeline, 9 devices of one region, T 0.650 s (394
examples/s); two pipelines, one per region (r0: 10 devices, r2: 9), 16 micro-batches each,
T 0.601 s of which AR 0.201 s (426 examples/s, 1.08x), planned in about 6 s. Exchanging
gradients across regions (10 Gbit/s) costs about a third of T, which keeps the split at two
pipelines; the fractional lower bound (0.108 s) ignores comm and exchange, hence its wide gap.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from experiments.paper_reproduction import BertShape, bert_units, synth_profile
from skyjax import plan as plan_lib
from skyjax.profile.format import Profile

GIB = 1 << 30


def layer_units(shape: BertShape) -> list[dict]:
    """BERT's sublayer units (``bert_units``) merged per layer, the pooler and classifier into
    one head: 2 + layers units."""
    sub = bert_units(shape)
    out = [sub[0]]
    for i in range(shape.layers):
        parts = sub[1 + 3 * i: 4 + 3 * i]
        out.append(dict(name=f"layer{i}", flops=sum(p["flops"] for p in parts),
                        params=sum(p["params"] for p in parts),
                        act=sum(p["act"] for p in parts), out=parts[-1]["out"]))
    pool, cls = sub[-2:]
    out.append(dict(name="head", flops=pool["flops"] + cls["flops"],
                    params=pool["params"] + cls["params"], act=pool["act"] + cls["act"],
                    out=cls["out"]))
    return out


def paper_profile(layers: int = 24) -> Profile:
    units = layer_units(BertShape(layers=layers))
    slow = np.random.default_rng(35).integers(1, 7, 64)
    region = np.arange(64) // 16
    same = region[:, None] == region[None, :]
    lat = np.where(same, 10e-6, 20e-3)
    np.fill_diagonal(lat, 0.0)
    bw = np.where(same, 100e9 / 8, 10e9 / 8)
    extra = [{"region": f"r{r}", "kind": f"x{s}"} for r, s in zip(region, slow)]
    prof = synth_profile(units, slow, np.full(64, 16 * GIB), lat, bw, extra_devices=extra)
    for rec, u in zip(prof.units, units):
        rec["param_bytes"] = 4 * u["params"]  # fp32 gradients
    return prof


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
    ap.add_argument("--microbatches", type=int, default=32)
    ap.add_argument("--pipelines", type=int, default=8)
    ap.add_argument("--schedules", nargs="*", default=["1f1b", "gpipe"])
    args = ap.parse_args(argv)
    prof = paper_profile()
    m, size = args.microbatches, prof.microbatch["size"]
    batch = m * size
    print(f"64 devices in 4 regions, {prof.num_units} units (BERT-large, 24 layers), m = {m} "
          f"micro-batches of {size} examples (global batch {batch}); max {args.pipelines} "
          f"pipelines")
    for schedule in args.schedules:
        t0 = time.perf_counter()
        one = plan_lib.plan(prof, "optimal", schedule, m)
        t_one = time.perf_counter() - t0
        t0 = time.perf_counter()
        several = plan_lib.plan(prof, "optimal", schedule, m, max_pipelines=args.pipelines)
        t_sev = time.perf_counter() - t0
        lb = several.lower_bound_s
        print(f"\n{schedule}:")
        print(f"  single pipeline: {len(one.stages)} devices, T {one.step_time_s:.4f} s, "
              f"{batch / one.step_time_s:7.1f} examples/s  (planned in {t_one:.2f} s)")
        print(f"  up to {args.pipelines} pipelines: {several.num_pipelines} pipelines, "
              f"{len(several.stages)} devices, shares {several.pipeline_shares()}, "
              f"T {several.step_time_s:.4f} s (AR {several.allreduce_s:.4f} s), "
              f"{batch / several.step_time_s:7.1f} examples/s  (planned in {t_sev:.2f} s)")
        print("\n".join(describe(several, prof)))
        if several.exact:
            print("  optimal (exact)")
        else:
            print(f"  lower bound {lb:.4f} s (gap {several.step_time_s / lb - 1:.1%}); "
                  f"speed-up over one pipeline {one.step_time_s / several.step_time_s:.2f}x")


if __name__ == "__main__":
    main()
