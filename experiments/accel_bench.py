"""What skyjax's stages get out of the accelerator in this process, printed side by side in one run.

Parts (``--parts``, default all):

* ``stage``: a block of encoder layers of BERT-base and BERT-large as one pipeline stage
  (``skyjax.programs.stage.StageProgram``: a forward and a backward per micro-batch, the AdamW
  update once per step), float32 vs bfloat16 (``config.train.compute_dtype``) and the two attention
  paths (``config.model.attention`` exact / fused), at seq 128 and 512: time per micro-batch,
  model TFLOP/s and MFU (model FLOPs, 6 per parameter per token plus attention's 12 b s^2 h per
  layer, over the device's dense bf16 peak; recomputation is not counted).
* ``pipeline``: a training step of the whole model (BERT-large width) as a plain jitted step
  (``skyjax.baseline.make_train_step``: one jit, the micro-batches in a scan) against skyjax's
  pipeline of one stage and of two stages on this device (``LocalExecutor``, 1F1B).
* ``memory``: peak device memory of a stage (in a fresh process: device memory on accelerators,
  resident memory above the process's start on CPU) against what the planner's memory model
  charges it (``skyjax.plan.pricing.cost``: state + in-flight x activation bytes, from the same shapes).
* ``handoff``: hand-off GB/s between two processes through skyjax's transport
  (``skyjax.transport.handoff_speed``).

On CPU the shapes are small (and it says so): the figures then only show that every path runs.
``python experiments/accel_bench.py`` (add ``--parts stage,pipeline``; ``--small`` forces the
CPU shapes anywhere; ``--trace DIR`` traces one step of the headline stage and prints the device's
busy time, its time by kernel kind and the top kernels).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from typing import Any

from absl import app, flags

_FLAGS = flags.FLAGS
flags.DEFINE_list("parts", ["stage", "pipeline", "memory", "handoff"], "parts to run")
flags.DEFINE_bool("small", False, "CPU shapes on any device")
flags.DEFINE_integer("stage_layers", 4, "encoder layers in the timed stage")
flags.DEFINE_list("stage_models", ["base", "large"], "stage part: the models timed (GPU/TPU)")
flags.DEFINE_list("stage_seqs", ["128", "512"], "stage part: the sequence lengths timed (GPU/TPU; "
                  "seq 128 at micro-batch 32, seq 512 at 8)")
flags.DEFINE_integer("pipeline_layers", 8, "encoder layers of the pipeline part's model")
flags.DEFINE_integer("repeats", 5, "timed steps per measurement (median)")
flags.DEFINE_string("memory_child", "", "internal: run one memory measurement (JSON args)")
flags.DEFINE_string("trace", "", "stage part: also trace one step of the headline case (BERT-"
                    "large, bf16, seq 128, micro-batch 32) into this directory and print where the "
                    "device's time goes")

# Dense bf16 tensor-core peak, FLOP/s, by device kind (the MFU denominator).
PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12, "L4": 121e12, "A10": 125e12,
             "V100": 125e12, "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5": 459e12}

MODELS = {"base": dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072),
          "large": dict(hidden_size=1024, num_attention_heads=16, intermediate_size=4096),
          "small": dict(hidden_size=128, num_attention_heads=4, intermediate_size=512)}


def _jax():
    import jax
    return jax


def peak_flops(device: Any) -> float | None:
    kind = getattr(device, "device_kind", "")
    return next((v for k, v in PEAK_BF16.items() if k in kind), None)


def is_small() -> bool:
    return _FLAGS.small or _jax().default_backend() == "cpu"


def bert_config(model: str, layers: int, dtype: str, attention: str, seq: int):
    from skyjax.models import bert
    # HF's hidden dropout; no dropout on the attention probabilities, so both attention paths
    # compute the same math (the fused kernels have none)
    return bert.BertConfig(num_hidden_layers=layers, max_position_embeddings=max(512, seq),
                           hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.0,
                           compute_dtype=dtype, attention=attention, **MODELS[model])


def layer_flops(cfg, batch: int, seq: int) -> float:
    """Training FLOPs of one encoder layer on a micro-batch: 3x the forward's matmuls."""
    h, f = cfg.hidden_size, cfg.intermediate_size
    forward = 2 * batch * seq * (4 * h * h + 2 * h * f) + 4 * batch * seq * seq * h
    return 3.0 * forward


def chain_of(cfg, seed: int = 0):
    from flax import nnx
    from skyjax.models import bert
    return bert.units(bert.BertForSequenceClassification(cfg, nnx.Rngs(seed)), "layer")


def stage_inputs(cfg, batch: int, seq: int, device: Any):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from skyjax.models.bert import example_keys
    mask = np.ones((batch, seq), np.int32)
    mask[:, seq - seq // 8:] = 0  # some padding, as real batches have
    hidden = jax.random.normal(jax.random.PRNGKey(1), (batch, seq, cfg.hidden_size),
                               jnp.dtype(cfg.compute_dtype))
    return jax.device_put(({"hidden": hidden, "attention_mask": jnp.asarray(mask)},
                           example_keys(0, 0, 0, batch)), device)


def time_stage(cfg, batch: int, seq: int, microbatches: int = 4,
               trace_dir: str | None = None) -> dict:
    """Median seconds per micro-batch (forward + backward, the update's share included) of a
    stage of ``cfg``'s encoder layers, dispatched back to back and waited for once a step; with
    XLA's own count of the forward's and backward's FLOPs and bytes per micro-batch (its cost
    analysis of the compiled programs: FLOPs above the model's are recomputation or waste) and
    the bytes of the residuals it keeps per micro-batch. ``trace_dir``: one more step under
    ``jax.profiler.trace``."""
    import jax
    import jax.numpy as jnp
    import optax
    from skyjax.programs.stage import StageProgram
    from skyjax.tree import tree_nbytes
    device = jax.devices()[0]
    chain = chain_of(cfg)[1:-1]
    prog = StageProgram(chain, is_last=False, microbatches=microbatches,
                        optimizer=optax.adamw(1e-4))
    state = prog.init_state(jax.device_put([u.params for u in chain], device))
    carry, keys = stage_inputs(cfg, batch, seq, device)
    cot = {"hidden": jnp.ones_like(carry["hidden"])}

    def step():
        for _ in range(microbatches):
            out, res = prog.forward(state.params, carry, keys)
            state.grads, _ = prog.backward(state.params, res, cot, state.grads)
        state.params, state.opt_state, state.grads = prog.update(
            state.params, state.opt_state, state.grads, jnp.float32(1.0))
        jax.block_until_ready(state.params)

    step()  # compiles
    step()
    times = []
    for _ in range(_FLAGS.repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    _, res = jax.eval_shape(prog.forward, state.params, carry, keys)
    costs = [xla_cost(prog.forward.lower(state.params, carry, keys)),
             xla_cost(prog.backward.lower(state.params, res, cot, state.grads))]
    if trace_dir:
        with jax.profiler.trace(trace_dir):
            step()
    return {"s_per_microbatch": sorted(times)[len(times) // 2] / microbatches,
            "xla_flops": sum(c[0] for c in costs), "xla_bytes": sum(c[1] for c in costs),
            "residual_bytes": tree_nbytes(res)}


def xla_cost(lowered) -> tuple[float, float]:
    """(FLOPs, bytes accessed) of a lowered program by XLA's cost analysis of its compiled
    form (0 where the backend reports none)."""
    analysis = lowered.compile().cost_analysis()
    if isinstance(analysis, list):  # older jax: one dict per computation
        analysis = analysis[0] if analysis else {}
    analysis = analysis or {}
    return float(analysis.get("flops", 0.0)), float(analysis.get("bytes accessed", 0.0))


# Kernel names by what they compute (substrings, lower case), for the trace's summary.
KERNEL_KINDS = (("matmul", ("gemm", "xmma", "nvjet", "cutlass", "cublas", "dot", "wgmma")),
                ("attention", ("fmha", "flash", "cudnn", "sdpa")),
                ("random bits", ("threefry", "philox", "rng")),
                ("copy / transpose", ("copy", "transpose", "memcpy", "memset")))


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(k in low for k in keys)),
                "other fusions")


def device_time_summary(trace_dir: str, top: int = 12) -> list[str]:
    """Where the device's time went in the newest ``jax.profiler`` trace under ``trace_dir``:
    busy time of its kernel streams against the traced span (the rest is the device waiting,
    e.g. on the host's dispatch), the busy time by kernel kind and by compiled program (where
    the trace names it), and the ``top`` kernels. Lines
    to print; one saying so where the trace has no device streams (CPU)."""
    import collections
    import glob
    import gzip
    import os
    files = sorted(glob.glob(os.path.join(trace_dir, "plugins", "profile", "*",
                                          "*.trace.json.gz")), key=os.path.getmtime)
    if not files:
        return [f"no trace under {trace_dir}"]
    with gzip.open(files[-1], "rt") as f:
        events = json.load(f).get("traceEvents", [])
    processes, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            processes[e["pid"]] = e.get("args", {}).get("name", "")
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[e["pid"], e.get("tid")] = e.get("args", {}).get("name", "")
    kernels = [e for e in events if e.get("ph") == "X" and "dur" in e
               and "/device:" in processes.get(e.get("pid"), "")
               and threads.get((e["pid"], e.get("tid")), "").lower().startswith("stream")]
    if not kernels:
        return [f"no device kernel streams in {files[-1]} (a CPU trace: open it in Perfetto)"]
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in kernels)
    busy, end = 0.0, spans[0][0]
    for a, b in spans:  # the union of the streams' kernel intervals
        busy += max(0.0, b - max(a, end))
        end = max(end, b)
    span = spans[-1][1] - spans[0][0]
    by_name, by_kind, by_program = (collections.Counter() for _ in range(3))
    for e in kernels:
        by_name[e["name"]] += float(e["dur"])
        by_kind[kernel_kind(e["name"])] += float(e["dur"])
        if "hlo_module" in e.get("args", {}):  # XLA names the kernel's compiled program
            by_program[e["args"]["hlo_module"]] += float(e["dur"])
    total = sum(by_name.values())
    lines = [f"device busy {busy / 1e3:.2f} ms of a {span / 1e3:.2f} ms span "
             f"({100 * busy / span:.0f} %; the rest waits, e.g. on the host's dispatch); "
             f"{len(kernels)} kernels",
             "by kind: " + ", ".join(f"{k} {100 * v / total:.0f} %"
                                     for k, v in by_kind.most_common())]
    if by_program:
        lines.append("by program: " + ", ".join(f"{k} {100 * v / total:.0f} %"
                                                for k, v in by_program.most_common()))
    lines += [f"  {100 * v / total:5.1f} %  {v / 1e3:8.3f} ms  {name[:100]}"
              for name, v in by_name.most_common(top)]
    return lines


def part_stage() -> None:
    import jax
    from skyjax.models.modeling import attention_path
    device = jax.devices()[0]
    peak = peak_flops(device)
    if is_small():
        models, shapes, headline = ["small"], [(32, 4), (64, 2)], ("small", 32, 4)
    else:
        shapes = [(seq, batch) for seq, batch in [(128, 32), (512, 8)]
                  if str(seq) in _FLAGS.stage_seqs]
        models, headline = _FLAGS.stage_models, ("large", 128, 32)
    cases = [("float32", "exact"), ("bfloat16", "exact"), ("bfloat16", "fused")]
    layers = _FLAGS.stage_layers
    print(f"\n== stage: {layers} encoder layers, 4 micro-batches + AdamW update per step "
          f"({device.device_kind}; MFU over {'n/a' if peak is None else f'{peak / 1e12:.0f}'} "
          "TFLOP/s dense bf16)")
    print("(xla/model: the compiled forward's and backward's FLOPs by XLA's cost analysis over "
          "the model's; GB/mb: the bytes they access per micro-batch; res MiB: the residuals "
          "the stage keeps per micro-batch)")
    print(f"{'model':<6} {'seq':>4} {'mb':>3} {'dtype':<9} {'attention':<14} {'ms/mb':>8} "
          f"{'TFLOP/s':>8} {'MFU':>6} {'xla/model':>9} {'GB/mb':>6} {'res MiB':>8}")
    for model in models:
        for seq, batch in shapes:
            for dtype, attention in cases:
                cfg = bert_config(model, layers, dtype, attention, seq)
                path = attention_path(cfg, True, cfg.compute_dtype)
                traced = (_FLAGS.trace and (model, seq, batch) == headline
                          and dtype == "bfloat16" and attention == "exact")
                try:
                    got = time_stage(cfg, batch, seq, trace_dir=_FLAGS.trace if traced else None)
                except Exception as e:  # noqa: BLE001 - one failing case is reported, not fatal
                    print(f"{model:<6} {seq:>4} {batch:>3} {dtype:<9} {attention + '/' + path:<14} "
                          f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    continue
                s = got["s_per_microbatch"]
                model_flops = layers * layer_flops(cfg, batch, seq)
                mfu = "n/a" if peak is None else f"{100 * model_flops / s / peak:5.1f}%"
                print(f"{model:<6} {seq:>4} {batch:>3} {dtype:<9} {attention + '/' + path:<14} "
                      f"{1e3 * s:8.3f} {model_flops / s / 1e12:8.2f} {mfu:>6} "
                      f"{got['xla_flops'] / model_flops:9.2f} {got['xla_bytes'] / 1e9:6.2f} "
                      f"{got['residual_bytes'] / 2**20:8.1f}", flush=True)
                if traced:
                    print(f"-- one step of {model} s{seq} mb{batch} {dtype} {attention}/{path} "
                          f"traced into {_FLAGS.trace}:")
                    print("\n".join("   " + line for line in device_time_summary(_FLAGS.trace)),
                          flush=True)


def part_pipeline() -> None:
    import jax
    import numpy as np
    import optax
    from skyjax import baseline
    from skyjax.models.bert import example_keys
    from skyjax.plan.model import types as plan_lib
    from skyjax.runtime.local_executor import LocalExecutor
    small = is_small()
    model, seq, batch, m = ("small", 32, 16, 4) if small else ("large", 128, 128, 4)
    layers = 2 if small else _FLAGS.pipeline_layers
    devices = jax.devices()
    print(f"\n== pipeline: BERT-{model} width, {layers} layers, batch {batch} x seq {seq}, "
          f"{m} micro-batches, AdamW ({devices[0].device_kind})")
    print("(stages dispatch without waiting, as on GPU/TPU; 'waiting': every call waits for its "
          "result, as on CPU)")
    print(f"{'dtype':<9} {'attention':<9} {'plain jit ms':>12} {'1 stage ms':>11} {'ratio':>6} "
          f"{'2 stages ms':>12} {'ratio':>6} {'1 stage waiting':>16} {'ratio':>6}")
    rng = np.random.default_rng(0)
    batches = [{"input_ids": rng.integers(1, 30000, (batch, seq)).astype(np.int32),
                "token_type_ids": np.zeros((batch, seq), np.int32),
                "attention_mask": np.ones((batch, seq), np.int32),
                "labels": rng.integers(0, 2, batch).astype(np.int32)} for _ in range(2)]
    keys = lambda step, first, count: example_keys(0, step, first, count)  # noqa: E731
    for dtype, attention in [("float32", "exact"), ("bfloat16", "exact"), ("bfloat16", "fused")]:
        if small and dtype == "float32":
            continue
        cfg = dataclasses.replace(bert_config(model, layers, dtype, attention, seq), num_labels=2)
        chain = chain_of(cfg)
        n = len(chain)
        optimizer = optax.adamw(1e-4)
        step_fn = baseline.make_train_step(chain, optimizer, 0, m)
        params = jax.device_put([u.params for u in chain], devices[0], may_alias=False)
        state = optimizer.init(params)

        def plain(step):
            nonlocal params, state
            params, state, metrics = step_fn(params, state, batches[step % 2], step)
            jax.block_until_ready(metrics["loss"])

        def piped(blocks, wait):
            stages = [plan_lib.Stage(0, b, 0.0, 0.0, 0) for b in blocks]
            plan = plan_lib.Plan("manual", "1f1b", m, stages, step_time_s=0.0, bottleneck_s=0.0,
                                 exact=False)
            ex = LocalExecutor(chain, plan, [devices[0]], batch_size=batch, seq_len=seq,
                               optimizer=optimizer, max_grad_norm=None, rng=keys,
                               sync_actions=[wait])
            return ex, lambda step: ex.train_step(step, batches[step % 2])

        try:
            row = [_median_step(plain)]
            for blocks, wait in (([(0, n)], False), ([(0, n // 2), (n // 2, n)], False),
                                 ([(0, n)], True)):
                ex, run = piped(blocks, wait)
                try:
                    row.append(_median_step(run))
                finally:
                    ex.close()
        except Exception as e:  # noqa: BLE001 - one failing case is reported, not fatal
            print(f"{dtype:<9} {attention:<9} failed: {type(e).__name__}: "
                  f"{str(e).splitlines()[0][:120]}")
            continue
        print(f"{dtype:<9} {attention:<9} {1e3 * row[0]:12.2f} {1e3 * row[1]:11.2f} "
              f"{row[1] / row[0]:6.3f} {1e3 * row[2]:12.2f} {row[2] / row[0]:6.3f} "
              f"{1e3 * row[3]:16.2f} {row[3] / row[0]:6.3f}", flush=True)


def _median_step(run) -> float:
    run(0)  # compiles
    run(1)  # a second entry where the first step's outputs are committed differently
    times = []
    for step in range(2, _FLAGS.repeats + 2):
        t0 = time.perf_counter()
        run(step)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def memory_child(args: dict) -> dict:
    """In a fresh process: peak memory of one stage training ``microbatches`` micro-batches
    GPipe-style (all forwards, then all backwards: every micro-batch's residuals held at once),
    and the planner's charge for it."""
    import jax
    import jax.numpy as jnp
    import optax
    from skyjax.profile.unit_timing import temp_bytes
    from skyjax.programs.stage import StageProgram
    from skyjax.runtime import memory
    from skyjax.tree import tree_nbytes
    rss0 = memory.current_rss_bytes()
    device = jax.devices()[0]
    cfg = bert_config(args["model"], args["layers"], args["dtype"], args["attention"], args["seq"])
    chain = chain_of(cfg)[1:-1]
    m, batch, seq = args["microbatches"], args["batch"], args["seq"]
    optimizer = optax.adamw(1e-4)
    prog = StageProgram(chain, is_last=False, microbatches=m, optimizer=optimizer)
    params = [u.params for u in chain]
    carry, keys = stage_inputs(cfg, batch, seq, device)
    _, res_like = jax.eval_shape(prog.forward, params, carry, keys)
    param_bytes = tree_nbytes(params)
    opt_bytes = tree_nbytes(jax.eval_shape(lambda p: [optimizer.init(x) for x in p], params))
    state_bytes = 2 * param_bytes + opt_bytes  # params + gradient sums + optimizer state
    act_bytes = tree_nbytes(res_like)
    # the profile's scratch per unit (the most one call of a layer needs), charged per unit
    layer = StageProgram(chain[:1], is_last=False, microbatches=1, optimizer=optimizer)
    one = [chain[0].params]
    _, one_res = jax.eval_shape(layer.forward, one, carry, keys)
    one_opt = jax.eval_shape(lambda p: [optimizer.init(x) for x in p], one)
    analyses = [layer.forward.lower(one, carry, keys).compile(),
                layer.backward.lower(one, one_res, {"hidden": carry["hidden"]}, one).compile(),
                layer.update.lower(one, one_opt, one, jnp.float32(1.0)).compile()]
    temp = temp_bytes({f"{call}_temp_size_in_bytes":
                       getattr(c.memory_analysis(), "temp_size_in_bytes", 0) or 0
                       for call, c in zip(("forward", "backward", "update"), analyses)})
    state_bytes += len(chain) * temp
    state = prog.init_state(jax.device_put(params, device))
    del params, chain, layer, one, analyses
    cot = {"hidden": jnp.ones_like(carry["hidden"])}
    for _ in range(2):
        residuals = [prog.forward(state.params, carry, keys)[1] for _ in range(m)]
        for res in residuals:
            state.grads, _ = prog.backward(state.params, res, cot, state.grads)
        del residuals, res
        state.params, state.opt_state, state.grads = prog.update(
            state.params, state.opt_state, state.grads, jnp.float32(1.0))
        jax.block_until_ready(state.params)
    stats = device.memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        peak, what = int(stats["peak_bytes_in_use"]), "device peak"
    else:
        # includes JAX's runtime and the compiled programs: on CPU only the trend compares
        peak, what = memory.peak_rss_bytes() - rss0, "resident peak above start"
    return {"peak": peak, "what": what, "charge": state_bytes + m * act_bytes,
            "state": state_bytes, "activations": m * act_bytes}  # state: scratch included


def part_memory() -> None:
    small = is_small()
    print("\n== memory: one stage, GPipe (every micro-batch's activations held at once)")
    print(f"{'stage':<28} {'dtype':<9} {'measured':>10} {'charged':>10} {'ratio':>6} "
          f"{'(state':>8} {'+ act)':>8}")
    cases = ([dict(model="small", layers=2, seq=32, batch=8, microbatches=4)] if small else
             [dict(model="large", layers=_FLAGS.stage_layers, seq=128, batch=32, microbatches=4)])
    without_peak = False
    for case in cases:
        for dtype, attention in [("float32", "exact"), ("bfloat16", "exact"),
                                 ("bfloat16", "fused")]:
            args = dict(case, dtype=dtype, attention=attention)
            proc = subprocess.run([sys.executable, __file__, f"--memory_child={json.dumps(args)}"],
                                  capture_output=True, text=True, timeout=600)
            lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
            name = (f"{case['model']} {case['layers']}L s{case['seq']} b{case['batch']} "
                    f"m{case['microbatches']} {attention}")
            if proc.returncode or not lines:
                print(f"{name:<28} {dtype:<9} failed: {proc.stderr.strip().splitlines()[-1:]}")
                continue
            got = json.loads(lines[-1])
            mib = lambda b: f"{b / 2**20:8.1f}M"  # noqa: E731
            device_peak = got["what"] == "device peak"
            without_peak = without_peak or not device_peak
            ratio = f"{got['peak'] / got['charge']:6.2f}" if device_peak else f"{'n/a':>6}"
            print(f"{name:<28} {dtype:<9} {mib(got['peak']):>10} {mib(got['charge']):>10} "
                  f"{ratio} {mib(got['state']):>8} "
                  f"{mib(got['activations']):>8}  ({got['what']})", flush=True)
    if without_peak:
        print("(without a device peak the measured figure holds JAX's runtime and compiler too, "
              "so no ratio: experiments/memory_check.py compares host memory against a tiny "
              "run's baseline)")


def part_handoff() -> None:
    try:
        from skyjax.transport.handoff_timing import measure_handoff_gbps
    except ImportError:
        print("\n== handoff: skyjax.transport.handoff_speed is not in this tree")
        return
    sizes = [2**20, 2**24, 2**26]
    print("\n== handoff: one array between two processes on this node (skyjax's transport)")
    import jax
    platform = {"gpu": "cuda"}.get(jax.default_backend(), jax.default_backend())
    got = measure_handoff_gbps(sizes, repeats=5, platform=platform)
    print("  ".join(f"{s / 2**20:.0f} MiB: {g:.2f} GB/s" for s, g in got.items()))


def main(argv: list[str]) -> None:
    del argv
    if _FLAGS.memory_child:
        print(json.dumps(memory_child(json.loads(_FLAGS.memory_child))))
        return
    import jax
    dev = jax.devices()[0]
    note = "  [small shapes: the figures only show that every path runs]" if is_small() else ""
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, "
          f"{len(jax.devices())} device(s): {dev.device_kind}{note}")
    parts = {"stage": part_stage, "pipeline": part_pipeline, "memory": part_memory,
             "handoff": part_handoff}
    for name in _FLAGS.parts:
        t0 = time.perf_counter()
        parts[name]()
        print(f"({name}: {time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    from experiments import results_doc

    results_doc.run(lambda: app.run(main), [(
        None, "accel_bench", "On an accelerator",
        "On the device present: a stage's ms per micro-batch and model-FLOPs utilisation "
        "(BERT-base and -large, seq 128 and 512, float32 and bf16, exact and cuDNN attention), a "
        "pipeline of one and two stages against the plain jitted step, a stage's peak memory "
        "against the planner's charge, hand-off GB/s between two processes.")])
