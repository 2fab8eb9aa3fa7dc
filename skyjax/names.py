"""The names a config, a plan and the runtime agree on, each listed once.

Plain tuples, no imports: the config checks, the planner (which imports no JAX) and the model all
read them from here.
"""

SCHEDULES = ("gpipe", "1f1b", "zb-h1", "zb-h2")  # pipeline schedules (skyjax.plan.model.schedules)
ZERO_BUBBLE = ("zb-h1", "zb-h2")  # schedules whose backward is split in B and W
# config.pipeline.schedule and the planner's schedule argument: a schedule, or "auto" (every
# schedule planned, the least predicted step kept; the plan names the one chosen)
SCHEDULE_CHOICES = SCHEDULES + ("auto",)
# config.pipeline.warmup: deeper warm-ups before slow links where the simulated step says they pay
# (auto, the default: skyjax.plan.as_run), or 1F1B's own
WARMUPS = ("1f1b", "auto")
STRATEGIES = ("even", "optimal", "dynamic")  # allocation strategies (skyjax.plan)
GRANULARITIES = ("layer", "sublayer")  # how the model is cut into units (skyjax.models.units)
MODES = ("local", "distributed")  # one process for all stages, or one process per stage
# Whether a stage's calls wait for their results (skyjax.cluster.emulation.actions_block):
# "auto" = on CPU and where emulated, not on GPU/TPU
SYNC_ACTIONS = ("auto", "on", "off")
# Exit status of a process that stopped because a peer process was lost (the launcher restarts
# the job on the survivors; skyjax.transport.watchdog).
EXIT_PEER_LOST = 75
# Exit status of a run stopped because a step's loss or gradient norm was NaN or infinite
# (skyjax.guard); the last good checkpoint is kept. 65 is sysexits' EX_DATAERR.
EXIT_NON_FINITE = 65
# Exit status of a command that refused its input (a config key, flag, file or workdir): a
# launcher does not restart it (64 is sysexits' EX_USAGE); skyjax.failures.
EXIT_BAD_INPUT = 64
# Exit status of any other failure (skyjax.failures), and of a run stopped by Ctrl-C or SIGTERM
# (128 + SIGINT, the shell's convention).
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
# Hand-off codecs (skyjax.codecs), with their bits per value on the wire, and the values per
# scale of the blockwise ones; averaging modes across pipelines, least to most relaxed
# (skyjax.relax; "-across": exact inside a link group, relaxed between groups).
# "sparse": each block sign-flipped by position and rotated, its top half by magnitude as sign and
# 3 bits with a bitmask, the rest as signs (4 bits per value, allowed from handoff_bits 2)
CODECS = ("none", "bf16", "int8", "int4", "sparse")
CODEC_BITS = {"none": 32, "bf16": 16, "int8": 8, "int4": 4, "sparse": 2}
CODEC_BLOCK = 64
# config.relax.outer_compression: the relaxed averagings' exchange in top-k plus 4 or 2 bits
# with error feedback (skyjax.compress), or as each mode sends it ("none")
OUTER_COMPRESSIONS = ("none", "topk4", "topk2")
AVERAGING = ("exact", "int8-across", "int8", "diloco-across", "diloco")
# Averaging between pipeline replicas beside the ordered bound (skyjax.relax, a bound per axis):
# "decentral" (each replica averages with one peer per step, config.relax.peers),
# "decentral-int8" (the same, its differences to the pair's last mean in int8,
# config.relax.peer_bits 8) and "async" (the exact average applied relax.async_steps steps
# late); the peer schedules; the bits a decentral message may take per value
PEER_MODES = ("decentral", "decentral-int8", "async")
PEER_SCHEDULES = ("none", "ring", "exponential")
PEER_BITS = (32, 8)

# config.train.compute_dtype once resolved ("auto" is resolved per platform,
# skyjax.models.build.resolve_compute_dtype), and every value it takes
COMPUTE_DTYPES = ("float32", "bfloat16")
COMPUTE_DTYPE_CHOICES = COMPUTE_DTYPES + ("auto",)
# config.model.attention. "exact": the hand-written attention (HF's math, dropout on the
# probabilities); "fused": jax.nn.dot_product_attention (cuDNN flash attention on GPU where it
# applies, XLA elsewhere), which has no dropout on the probabilities, so in training it leaves
# that dropout out (a change of the math, opted into by name); "auto": fused where the math is
# the same and the kernel is faster (GPU with cuDNN, outside training or with
# attention_probs_dropout_prob 0), exact elsewhere.
ATTENTION_PATHS = ("auto", "exact", "fused")
