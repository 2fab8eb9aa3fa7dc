"""Memory as planned: each pipeline stage's measured peak host memory beside the planner's charge.

    python experiments/memory_check.py                      # 8 layers, hidden 512, 4 stages
    python experiments/memory_check.py --layers 12 --hidden 1024 --schedule gpipe

1. A child process profiles the model (one repeat: only the bytes matter here) on ``--stages``
   emulated devices; the even plan's stages are priced by the cost model
   (:func:`skyjax.plan.pricing.cost.stage_costs`): ``memory_bytes``, the charge.
2. Per stage, a fresh process runs that stage as a pipeline process does
   (:class:`~skyjax.runtime.distributed_executor.DistributedExecutor`: its units built by
   ``skyjax.models.build`` as ``skyjax.train`` builds them, then ``--steps`` training steps) over a
   loopback transport: receives return zeros of the wire shapes, sends are dropped, collectives
   return the local value. The stage's own actions, residuals, update and temporaries are
   exactly a pipeline process's; what a real transport adds (messages held until the peer takes
   them) is not in it.
3. The same for a tiny model of the same structure (hidden ``--tiny-hidden``): its peak minus its
   own charge is the baseline (the JAX runtime, compiled programs of the same graph, Python).

Printed per stage: peak RSS above the baseline vs the charge, their ratio, and the median time of
the steps after the first (the only step with ``--steps 1``; what the malloc settings cost). CPU
only.

``--malloc`` picks the children's glibc malloc settings (figures: 8 layers x 512, 4 stages,
GPipe, 6 steps; measured / charged per stage, then the median step time):

* ``fixed`` (default): one arena (``MALLOC_ARENA_MAX=1``) and a fixed mmap threshold
  (``MALLOC_MMAP_THRESHOLD_=131072``), so that every large buffer is mapped when allocated and
  returned when freed and the resident peak is what the stage's buffers need: 0.96, 0.90, 0.93,
  0.97 (0.70, 1.04, 0.69, 0.38 s);
* ``glibc``: the environment's settings, glibc's own by default (what a run holds without the
  shared-host model): freed buffers stay in the heap, a step's residuals freed in one order and
  allocated again in the next leave holes, and each thread's arena grows by 64 MiB heaps, so the
  resident size creeps up over the steps while the live buffers (``jax.live_arrays``) stay
  exactly at the charge: 1.37, 1.03, 1.46, 1.71 (0.62, 0.80, 0.58, 0.28 s); with
  ``MALLOC_ARENA_MAX=1`` in the environment it stops growing after the first steps: 1.29, 1.19,
  1.26, 1.30 (0.69, 0.91, 0.56, 0.29 s);
* ``kept``: what a run under the shared-host model sets
  (:func:`skyjax.hostmodel.malloc.keep_freed_memory`: both thresholds fixed at 1 GiB): 1.41,
  1.49, 1.53, 1.61 (0.59, 0.86, 0.56, 0.29 s).

The fixed low threshold faults every large buffer in afresh, hence its 1.1-1.4x step time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

MiB = 1024 ** 2
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_config(args: argparse.Namespace, hidden: int):
    """The run's config: ``--layers`` x ``hidden``, ``--stages`` devices, the schedule."""
    from skyjax.config import defaults

    c = defaults.base_config()
    m = c.model
    m.hidden_size, m.num_hidden_layers = hidden, args.layers
    m.num_attention_heads, m.intermediate_size = max(hidden // 64, 1), 4 * hidden
    c.data.seq_len, c.data.batch_size = args.seq_len, args.batch_size
    c.pipeline.microbatches, c.pipeline.schedule = args.microbatches, args.schedule
    c.allocation.granularity = args.granularity
    c.cluster.num_devices, c.cluster.slowdowns = args.stages, ()
    c.profile.repeats = 1
    return c


def child_profile(args: argparse.Namespace, hidden: int, out: str) -> None:
    """Profiles the model (bytes; one repeat) and writes the even plan's stages."""
    from skyjax import cluster as cl
    from skyjax.optim import make_optimizer
    from skyjax.plan import even_assignment
    from skyjax.plan.pricing import cost
    from skyjax.profile.chain import Workload
    from skyjax.profile.measure import profile
    from skyjax.profile.options import Options

    c = make_config(args, hidden)
    options = Options(repeats=1, min_repeats=1, budget_s=0.0, link_repeats=1)
    prof = profile(Workload.from_config(c), cl.cluster_from_config(c), make_optimizer(c.train),
                   options, log=lambda line: None)
    t = cost.tables(prof, args.schedule, args.microbatches)
    stages = cost.stage_costs(t, even_assignment(prof.num_units, range(args.stages)))
    with open(out, "w") as f:
        json.dump({"profile": prof.to_json(),
                   "stages": [{"units": list(s.units), "memory_bytes": s.memory_bytes}
                              for s in stages]}, f)


class LoopbackTransport:
    """What a pipeline process's transport does, alone: receives are zeros of the wire shapes
    on the device, sends are dropped, collectives return this process's value."""

    def __init__(self, device):
        self.device = device

    def send(self, tag, tree, dst) -> None:
        del tag, tree, dst

    def recv(self, tag, like, src):
        import jax
        import jax.numpy as jnp

        with jax.default_device(self.device):
            return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), like)

    def allreduce_sum(self, value, tag):
        return value

    def gather_to_first(self, record, tag):
        return [record]


def child_stage(args: argparse.Namespace, hidden: int, plan_file: str, k: int) -> None:
    """Runs stage ``k`` of the plan in ``plan_file`` as its pipeline process would; prints JSON."""
    import jax
    import numpy as np

    from skyjax import optim
    from skyjax.models import bert, build
    from skyjax.plan import even_assignment
    from skyjax.plan.pricing import cost
    from skyjax.profile.format import Profile
    from skyjax.runtime import memory
    from skyjax.runtime.distributed_executor import DistributedExecutor

    if args.malloc == "kept":  # as a run under the shared-host model prepares its process
        from skyjax import hostmodel
        hostmodel.activate()
    rss_start = memory.current_rss_bytes()
    c = make_config(args, hidden)
    with open(plan_file) as f:
        saved = json.load(f)
    prof = Profile.from_json(saved["profile"])
    plan = cost.evaluate(prof, even_assignment(prof.num_units, range(args.stages)),
                         args.schedule, args.microbatches, check=False)
    init = build.UnitInitializer(c.model, c.train.seed)
    chain = build.abstract_chain(c.model, c.train.seed, c.allocation.granularity)
    mine = [u for s in plan.stages if s.device == k for u in range(*s.units)]
    device = jax.local_devices()[0]
    executor = DistributedExecutor(
        build.materialize(init, chain, mine), plan, LoopbackTransport(device), k, device,
        batch_size=c.data.batch_size, seq_len=c.data.seq_len,
        optimizer=optim.make_optimizer(c.train, clip=False),
        max_grad_norm=c.train.grad_clip_norm or None,
        rng=lambda step, first, count: bert.example_keys(0, step, first, count))
    init.release()
    rss_built = memory.current_rss_bytes()
    rng = np.random.default_rng(0)
    b, s = c.data.batch_size, c.data.seq_len
    batch = {"input_ids": rng.integers(0, c.model.vocab_size, (b, s), dtype=np.int32),
             "token_type_ids": np.zeros((b, s), np.int32),
             "attention_mask": np.ones((b, s), np.int32),
             "labels": rng.integers(0, c.model.num_labels, (b,), dtype=np.int32)}
    step_s = []
    for step in range(args.steps):
        start = time.perf_counter()
        executor.train_step(step, batch)
        step_s.append(time.perf_counter() - start)
    print(json.dumps({"stage": k, "rss_start": rss_start, "rss_built": rss_built,
                      "rss_end": memory.current_rss_bytes(), "peak": memory.peak_rss_bytes(),
                      "step_s": step_s}))


def spawn(args: argparse.Namespace, *extra: str, devices: int = 1) -> str:
    """Runs this script as a child with ``extra`` arguments; its stdout."""
    # --malloc fixed: glibc's malloc as the module doc says (the environment's own values override
    # these); otherwise the environment's
    malloc = {} if args.malloc != "fixed" else {
        "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", "1"),
        "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_", "131072")}
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", **malloc,
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = [sys.executable, os.path.abspath(__file__), *passthrough(args), *extra]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout


def passthrough(args: argparse.Namespace) -> list[str]:
    keys = ("layers", "hidden", "tiny_hidden", "seq_len", "batch_size", "microbatches",
            "schedule", "granularity", "stages", "steps", "malloc")
    return [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in keys]


def measure(args: argparse.Namespace, hidden: int, workdir: str) -> list[dict]:
    """Per stage: the charge and the child's RSS figures, for the model of width ``hidden``."""
    plan_file = os.path.join(workdir, f"plan_{hidden}.json")
    spawn(args, "--child=profile", f"--width={hidden}", f"--out={plan_file}",
          devices=args.stages)
    with open(plan_file) as f:
        stages = json.load(f)["stages"]
    for k, st in enumerate(stages):
        out = spawn(args, "--child=stage", f"--width={hidden}", f"--out={plan_file}",
                    f"--stage={k}")
        st.update(json.loads(out.strip().splitlines()[-1]))
    return stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--tiny-hidden", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--schedule", default="gpipe", choices=("gpipe", "1f1b"))
    parser.add_argument("--granularity", default="layer")
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--malloc", default="fixed", choices=("fixed", "glibc", "kept"),
                        help="the children's malloc settings (see the module doc)")
    parser.add_argument("--child", choices=("profile", "stage"), help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--stage", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "profile":
        return child_profile(args, args.width, args.out)
    if args.child == "stage":
        return child_stage(args, args.width, args.out, args.stage)

    with tempfile.TemporaryDirectory() as workdir:
        big = measure(args, args.hidden, workdir)
        tiny = measure(args, args.tiny_hidden, workdir)
    print(f"{args.layers} layers x hidden {args.hidden}, seq {args.seq_len}, batch "
          f"{args.batch_size} in {args.microbatches} micro-batches, {args.schedule}, "
          f"{args.stages} stages (even plan), {args.steps} steps; baseline: the same stage at "
          f"hidden {args.tiny_hidden}, its peak less its charge")
    print(f"{'stage':>5}  {'units':>8}  {'baseline MiB':>12}  {'peak - base MiB':>15}  "
          f"{'charged MiB':>11}  {'measured/charged':>16}  {'step s':>6}")
    for b, t in zip(big, tiny):
        base = t["peak"] - t["memory_bytes"]
        grew = b["peak"] - base
        step_s = statistics.median(b["step_s"][1:] or b["step_s"])
        print(f"{b['stage']:>5}  {str(tuple(b['units'])):>8}  {base / MiB:>12.0f}  "
              f"{grew / MiB:>15.0f}  {b['memory_bytes'] / MiB:>11.0f}  "
              f"{grew / b['memory_bytes']:>16.2f}  {step_s:>6.3f}")


if __name__ == "__main__":
    from experiments import results_doc

    results_doc.run(main, [(
        "glibc", "memory_check-glibc", "Host memory per stage: malloc's settings",
        "Per stage of the even plan, each in its own process, under glibc's default malloc "
        "thresholds (`--malloc glibc`): peak host memory against the planner's charge, beside "
        "one arena and a low mmap threshold."), (
        None, "memory_check", "Host memory per stage against the planner's charge",
        "Per stage of the even plan, each in its own process: peak host memory above a tiny run "
        "of the same structure against the planner's charge (state + scratch + in-flight "
        "activations).")])
