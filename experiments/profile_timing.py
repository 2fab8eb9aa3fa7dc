"""How long profiling takes on this machine: the demo model and BERT-base shapes.

    python experiments/profile_timing.py            # all cases (a few minutes on 2 CPU cores)
    python experiments/profile_timing.py --quick    # demo model only

Each case measures a fresh profile (no cache) with the config's default repeats and prints the
wall time split into compilation, unit timing and link probes, the per-device total of forward +
backward over all units and the measured ratio to the fastest device (with emulated slow-downs
those ratios should follow the slow-down factors).
"""

from __future__ import annotations

import argparse
import time

from skyjax import cluster as cluster_lib  # noqa: E402  (no jax import yet)

cluster_lib.ensure_host_device_count(4)

from skyjax.config import defaults as config_defaults  # noqa: E402
from skyjax.optim import make_optimizer  # noqa: E402
from skyjax.profile.chain import Workload  # noqa: E402
from skyjax.profile.measure import profile  # noqa: E402
from skyjax.profile.options import Options  # noqa: E402


def demo(devices=1, slowdowns=()):
    c = config_defaults.base_config()  # configs/local_demo.py on one device
    c.cluster.num_devices = devices
    c.cluster.slowdowns = slowdowns
    return c


def bert_base(granularity="layer", microbatches=4, devices=1, slowdowns=()):
    c = config_defaults.base_config()
    m = c.model
    m.vocab_size, m.hidden_size, m.num_hidden_layers = 30522, 768, 12
    m.num_attention_heads, m.intermediate_size, m.max_position_embeddings = 12, 3072, 512
    m.hidden_dropout_prob = m.attention_probs_dropout_prob = 0.1
    c.data.seq_len, c.data.batch_size = 128, 32
    c.pipeline.microbatches = microbatches
    c.allocation.granularity = granularity
    c.cluster.num_devices = devices
    c.cluster.slowdowns = slowdowns
    return c


def measure(config, **options):
    """A fresh profile of ``config`` (no cache), quietly."""
    return profile(Workload.from_config(config), cluster_lib.cluster_from_config(config),
                   make_optimizer(config.train), Options.from_config(config, **options),
                   log=lambda msg: None)


def run(name, config, **options):
    tic = time.perf_counter()
    prof = measure(config, **options)
    wall = time.perf_counter() - tic
    meta = prof.extra["profiler"]
    total = (prof.forward_s + prof.backward_s).sum(axis=0)
    per_dev = " ".join(f"{t * 1e3:.1f}" for t in total)
    ratios = " ".join(f"{t / total.min():.2f}" for t in total)
    repeats = sorted({u["repeats"] for u in prof.units})
    print(f"{name:<44} {prof.num_units:>5} {prof.num_devices:>3} {str(repeats):>8} "
          f"{meta['compile_s']:>8.1f} {wall:>8.1f}   {per_dev}  (ratios {ratios})", flush=True)
    return prof


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="demo model only")
    args = ap.parse_args()
    tiny = demo()
    tiny.model.hidden_size, tiny.model.intermediate_size, tiny.model.num_hidden_layers = 32, 64, 1
    measure(tiny)  # JAX start-up, not part of any case
    print(f"{'case':<44} {'units':>5} {'dev':>3} {'repeats':>8} {'compile':>8} {'total s':>8}"
          "   fwd+bwd per device (ms, all units)")
    run("demo (4x128, mb 32x32), 1 device", demo())
    run("demo, 1 device, every layer measured", demo(), dedup_units=False)
    run("demo, 4 devices, slow-downs (1,2,3,6)", demo(4, (1, 2, 3, 6)))
    if args.quick:
        return
    run("BERT-base layer, mb 8x128, 1 device", bert_base("layer"))
    run("BERT-base sublayer, mb 8x128, 1 device", bert_base("sublayer"))
    run("BERT-base layer, mb 32x128, 1 device", bert_base("layer", microbatches=1))
    run("BERT-base layer, mb 8x128, 4 dev (1,2,3,6)", bert_base("layer", 4, 4, (1, 2, 3, 6)))


if __name__ == "__main__":
    main()
