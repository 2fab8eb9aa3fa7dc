"""The config schema: every key skyjax reads, with its type and default.

Config files (``configs/*.py``) start from :func:`base_config` and change values; a key that is not
here is an error (see :mod:`skyjax.config.validation`). The defaults are those of
``configs/local_demo.py`` (a small BERT on the synthetic task) on one device: the demo changes
only ``cluster.num_devices`` and ``cluster.slowdowns`` (4 emulated devices of unequal speed),
``pipeline.microbatches`` and ``allocation.calibrate_steps``.
"""

from __future__ import annotations

import ml_collections

from skyjax.data import glue  # the task table only (no TensorFlow, transformers or JAX)


# Allowed values of the string-valued enum keys (checked by validate_config).
HIDDEN_ACTS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh")
LR_SCHEDULES = ("linear", "cosine", "constant")
# Named datasets; config.data.name may also be a .csv/.tsv/.jsonl file or hf:DIR / hf:NAME
# (skyjax/data/tables.py).
DATASETS = ("synthetic", *glue.TASKS)  # glue/mnli, glue/cola, ... (skyjax/data/glue.py)


def _model() -> ml_collections.ConfigDict:
    """BERT shape; names mirror Hugging Face's BertConfig."""
    m = ml_collections.ConfigDict()
    m.vocab_size = 128
    m.hidden_size = 128
    m.num_hidden_layers = 4
    m.num_attention_heads = 4
    m.intermediate_size = 512
    m.hidden_act = "gelu"
    m.hidden_dropout_prob = 0.0
    m.attention_probs_dropout_prob = 0.0
    m.max_position_embeddings = 64
    m.type_vocab_size = 2
    m.layer_norm_eps = 1e-12
    m.initializer_range = 0.02
    m.num_labels = 3  # 1 = a regression head (mean squared error; GLUE STS-B)
    m.pad_token_id = 0
    # "" = random init from the fields above; else a Hugging Face BERT directory (config.json +
    # model.safetensors) whose config.json then supplies the shape fields.
    m.pretrained = ""
    # Attention path: "auto" = cuDNN's fused attention on GPU where it gives the same math (bf16,
    # no dropout on the probabilities in training), the exact hand-written one elsewhere;
    # "exact"; "fused" = jax.nn.dot_product_attention everywhere (cuDNN on GPU where it applies,
    # XLA elsewhere), which in training leaves out attention_probs_dropout_prob (opt-in: it
    # changes the math when that rate is > 0)
    m.attention = "auto"
    # The family: "bert" (sequence classification) | "gpt2" | "llama" (causal language models,
    # docs/design.md "Decoder models"); a pretrained config.json's model_type takes precedence.
    # A decoder reads the fields above under its family's config.json names (num_labels,
    # type_vocab_size, pad_token_id and layer_norm_eps unused); decoder_model() sets its defaults.
    m.model_type = "bert"
    m.num_key_value_heads = 0  # Llama: grouped-query attention's key/value heads; 0 = no grouping
    m.tie_word_embeddings = False  # decoders: the LM head is the token embedding
    m.rope_theta = 10000.0  # Llama: the rotary positions' base
    return m


# Per decoder family: the config.model values its Hugging Face config defaults to.
DECODER_DEFAULTS = {"gpt2": dict(hidden_act="gelu_new", tie_word_embeddings=True),
                    "llama": dict(hidden_act="silu", tie_word_embeddings=False)}


def decoder_model(config: ml_collections.ConfigDict, family: str) -> ml_collections.ConfigDict:
    """``config`` with ``config.model`` a ``family`` decoder ("gpt2" or "llama") of that family's
    defaults (:data:`DECODER_DEFAULTS`) and ``config.data.metric`` perplexity; the shape fields
    are the config's to set."""
    config.model.model_type = family
    for key, value in DECODER_DEFAULTS[family].items():
        config.model[key] = value
    config.data.metric = "perplexity"
    return config


def _data() -> ml_collections.ConfigDict:
    d = ml_collections.ConfigDict()
    # "synthetic" (offline) | "glue/cola" | "glue/sst2" | "glue/mrpc" | "glue/qqp" | "glue/stsb" |
    # "glue/mnli" | "glue/qnli" | "glue/rte" | "glue/wnli" (TensorFlow Datasets, prepared with
    # `python -m skyjax.data.prepare`) | a training file "PATH.csv" / ".tsv" / ".jsonl" |
    # "hf:DIR" (datasets' save_to_disk) | "hf:NAME" (a Hugging Face hub dataset; "datasets" extra)
    d.name = "synthetic"
    d.seq_len = 32
    d.batch_size = 32  # global batch per optimizer step (split into pipeline.microbatches)
    # Held-out examples scored per eval split at each eval: 0 = no eval; N = the first N of each
    # split (capped at its size); -1 = every split whole (not synthetic).
    d.eval_examples = 1024
    # Text data: BertTokenizerFast directory (vocab.txt or tokenizer.json); "" = the one in
    # config.model.pretrained.
    d.tokenizer = ""
    d.data_dir = ""  # GLUE: TFDS data_dir ("" = $TFDS_DATA_DIR or ~/tensorflow_datasets)
    d.prefetch = 4  # training batches built ahead by a background thread (every source; >= 1)
    # Held-out metric (skyjax/scores.py): "" = the GLUE task's own, else accuracy, or
    # pearson_spearman for a regression | "accuracy" | "matthews" | "f1" | "pearson_spearman".
    d.metric = ""
    # Your own data (files or hf:): the text column(s), one or two, and the label column.
    d.text_columns = ("sentence",)
    d.label_column = "label"
    # String labels in id order; () = the training split's distinct labels, sorted.
    d.label_names = ()
    d.eval_files = ()  # files: held-out files, one eval split each (named after the file)
    d.hf_subset = ""  # hf:NAME: the dataset's configuration (e.g. "cola" of "nyu-mll/glue")
    d.train_split = "train"  # hf: the training split
    d.eval_splits = ("validation",)  # hf: the held-out splits
    # A language model's text (skyjax/data/lm_text.py): a .txt file or folder, or .jsonl / .csv /
    # hf: with this column; each .txt file one document ("file") or one per blank-line-separated
    # paragraph ("paragraph"); this fraction of the documents held out as "validation" (0 = none,
    # or eval_files); attention kept within each packed document (segment ids)
    d.text_column = "text"
    d.txt_documents = "file"
    d.eval_fraction = 0.0
    d.document_mask = False
    d.synthetic = ml_collections.ConfigDict()
    d.synthetic.max_markers = 4  # most marker tokens in one segment
    d.synthetic.min_segment_len = 4  # shortest segment A or B (tokens, without specials)
    return d


def _train() -> ml_collections.ConfigDict:
    t = ml_collections.ConfigDict()
    t.steps = 200
    t.seed = 0
    t.learning_rate = 1e-3
    t.lr_schedule = "linear"  # decay after warmup: "linear" | "cosine" | "constant"
    t.warmup_steps = 20
    t.weight_decay = 0.01
    t.adam_b1 = 0.9
    t.adam_b2 = 0.999
    t.adam_eps = 1e-8
    t.grad_clip_norm = 1.0  # 0 = no clipping
    t.log_every = 25
    t.eval_every = 0  # 0 = evaluate only after the last step
    # Matmuls, activations and stage hand-offs: "float32" | "bfloat16" | "auto" (bfloat16 on GPU
    # and TPU, float32 on CPU). Parameters, optimizer state, gradient sums, checkpoints,
    # LayerNorm statistics, the softmax and the loss stay float32 (docs/design.md).
    t.compute_dtype = "auto"
    return t


def _pipeline() -> ml_collections.ConfigDict:
    p = ml_collections.ConfigDict()
    # "gpipe" | "1f1b" | "zb-h1" | "zb-h2" (zero bubble: the backward split in B and W) |
    # "auto": every schedule planned, the least predicted step within memory kept
    p.schedule = "1f1b"
    # 1F1B's warm-up forwards: "auto": deeper before a slow link where the simulated step says
    # that pays, within memory (docs/design.md, "The price: the step as it runs") | "1f1b": 1F1B's
    # own, p - k - 1 on stage k
    p.warmup = "auto"
    p.microbatches = 1
    # Whether each forward/backward/update waits for its result before the next is dispatched:
    # "auto" = on CPU and on emulated devices or links (the emulation times each call), not on
    # GPU/TPU, whose queue then overlaps the next dispatch with the running call | "on" | "off"
    # (emulated devices and links block regardless). Measured steps block regardless
    # (docs/design.md, "Host waits in a step").
    p.sync_actions = "auto"
    return p


def _allocation() -> ml_collections.ConfigDict:
    a = ml_collections.ConfigDict()
    a.strategy = "optimal"
    a.granularity = "layer"
    a.replan_every = 0  # strategy "dynamic": re-plan from measured times every N steps (0 = never)
    # optimal/dynamic: run the first N steps (>= 2; the first compiles) on the even split, then
    # plan on the profile calibrated by them (measured compute, link waits, step period) and
    # move the units there; 0 = plan from the profile alone
    a.calibrate_steps = 0
    # optimal: split the devices into up to N pipelines in data parallel, each with a share of
    # every batch in whole micro-batches (the planner chooses how many; 1 = one pipeline;
    # 0 = auto: up to min(16, devices, micro-batches), and one pipeline where several are not
    # planned: strategy even/dynamic, calibrate_steps or cluster.shared_host)
    a.max_pipelines = 0
    return a


def planned_pipelines(config: ml_collections.ConfigDict) -> int:
    """``allocation.max_pipelines`` as the planner takes it: 0 (auto, the default) is 1 where
    several pipelines are not planned (strategy other than optimal, calibrate_steps,
    cluster.shared_host: each re-plans or prices one pipeline), else as given (0: the planner's
    cap, min(16, devices, micro-batches))."""
    a = config.allocation
    if a.max_pipelines == 0 and (a.strategy != "optimal" or a.calibrate_steps
                                 or config.cluster.shared_host):
        return 1
    return int(a.max_pipelines)


def _relax() -> ml_collections.ConfigDict:
    """How much the planner may relax what crosses slow links (skyjax/relax.py); the defaults
    relax nothing (the exact math)."""
    r = ml_collections.ConfigDict()
    # fewest bits per value a stage hand-off may carry: 32 exact | 16 bf16 | 8 int8 (blockwise
    # scales) | 4 int4 (Hadamard-rotated blocks); the planner picks per link where it pays
    r.handoff_bits = 32
    # the most relaxed averaging across pipelines allowed, every mode before it allowed too:
    # "exact" | "int8-across" (exact inside a region, 8-bit between regions, error feedback) |
    # "int8" (8-bit exchange with error feedback) | "diloco-across" (exact inside a region, an
    # outer Nesterov step between regions every outer_every steps) | "diloco" (an outer step
    # between all pipelines every outer_every steps)
    r.averaging = "exact"
    r.outer_every = 10  # diloco(-across): inner steps per outer step (H)
    # diloco: the outer SGD's learning rate and Nesterov momentum. DiLoCo's 0.9 is for
    # thousands of outer steps; over tens of them it overshoots (experiments/relax_bench.py)
    r.outer_lr = 0.7
    r.outer_momentum = 0.5
    # beside that bound (docs/design.md, "Relaxation on slow links"): decentralized averaging,
    # each replica averaging with one peer per step: "none" | "ring" | "exponential" (the
    # one-peer exponential graph)
    r.peers = "none"
    # 8: decentral may also send each replica's difference to the pair's last mean in int8
    # ("decentral-int8", rounding kept in the replica); 32: float32 parameters only
    r.peer_bits = 32
    # asynchronous averaging: the exact average applied this many steps late (0: not allowed)
    r.async_steps = 0
    # a relaxed plan is taken only where it predicts a step at least this fraction shorter
    r.min_gain = 0.05
    # the relaxed averagings' exchange: "none" (as each mode sends it) | "topk4" | "topk2" (the
    # top outer_topk of each chunk of 4096 values in 4 or 2 bits, error feedback per replica:
    # skyjax/compress.py)
    r.outer_compression = "none"
    r.outer_topk = 1 / 8  # the fraction of each chunk kept (skyjax/topk_wire.py, FRACTION)
    return r


def _cluster() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.mode = "local"  # "local" (one process) | "distributed" (one process per stage)
    c.num_devices = 1  # devices to plan over; in distributed mode, the number of processes
    c.slowdowns = ()  # emulated slow-down per device, e.g. (1, 2, 3, 6); () = none
    c.memory_caps_bytes = ()  # emulated memory per device; () = real memory; 0 entries = no cap
    c.regions = ()  # region name per device, e.g. ("eu", "eu", "us", "us"); () = one region
    c.link_latency_s = 0.0  # emulated one-way latency between devices in different regions
    c.link_bandwidth_Bps = 0.0  # emulated bandwidth between regions (0 = not emulated)
    # per pair of regions, ("eu", "us", latency_s, bandwidth_Bps) (both directions), in place of
    # the two figures above for that pair; () = every pair takes them
    c.region_links = ()
    c.coordinator_address = ""  # jax.distributed coordinator "host:port"; "" = auto / launcher
    # Distributed: the address this process's transfer server (stage hand-offs) binds and peers
    # reach it at; "" = $SKYJAX_TRANSFER_HOST, else the local address of the route to the
    # coordinator (skyjax/cluster/network.py).
    c.transfer_host = ""
    # Ports its control socket may bind, "FIRST-LAST" (e.g. "40000-40100"; each process on a
    # node takes its own); "" = $SKYJAX_TRANSFER_PORTS, else any free port. (Its bulk-data
    # socket's port is ephemeral: jaxlib cannot fix it.)
    c.transfer_ports = ""
    # Its host buffers: chunks of this many bytes, this many copies in flight; it allocates
    # 3 x their product once (pinned on a GPU; 768 MiB here, jax's own 8 x 256 MiB pin 6 GiB).
    c.transfer_chunk_bytes = 32 << 20
    c.transfer_parallel_copies = 8
    # Distributed: a process whose heartbeat stops this long is lost; the others exit (status 75)
    # naming it, instead of waiting (skyjax/transport/watchdog.py).
    c.peer_timeout_s = 60.0
    # Emulated devices that are processes sharing this host's CPU cores: the optional shared-host
    # model (skyjax/hostmodel/) adds their contention, calls after idle and message costs to the
    # cost model and its probes to the profiler, which then times one process at a time. Off for
    # real accelerators, where none of it applies.
    c.shared_host = False
    return c


def _profile() -> ml_collections.ConfigDict:
    p = ml_collections.ConfigDict()
    p.repeats = 5  # timed repetitions per unit and device (the mean of the fastest half is kept)
    # Shared-host model only (cluster.shared_host): times every device this many times, in turns
    # spread over the profile, keeping each unit's median pass: on a host whose speed moves one
    # pass can catch a slow period for one device alone (skyjax/hostmodel/passes.py).
    p.passes = 1
    p.reprofile = False  # measure again even if workdir/profile.json exists
    p.path = ""  # plan from this profile.json instead of measuring ("" = measure or use the cache)
    return p


def _checkpoint() -> ml_collections.ConfigDict:
    """Checkpoints in WORKDIR/checkpoints/<step>/ (skyjax/checkpoint/, docs/design.md)."""
    c = ml_collections.ConfigDict()
    c.every = 0  # save every N optimizer steps; 0 = never
    c.keep = 3  # committed checkpoints kept (the latest N); 0 = all
    c.resume = True  # continue from the latest committed checkpoint in the workdir, if any
    # with resume=False, or when no checkpoint in the workdir verifies: delete the earlier
    # checkpoints there (else the run is refused)
    c.replace = False
    return c


def _rehearse() -> ml_collections.ConfigDict:
    """Rehearse another cluster on this host (docs/design.md, "Rehearsal"): the plan of a
    profile.json of that cluster runs on this host's devices, every call and message taking the
    time the profile declares; a small model of the profile's unit count computes inside."""
    r = ml_collections.ConfigDict()
    # the target cluster's profile.json ("" = off: devices and links take what they take); the
    # run then has that profile's devices and units (cluster.num_devices and
    # model.num_hidden_layers follow it)
    r.profile = ""
    # every declared time x this factor (> 1 makes this host's own overheads small beside it;
    # summary.json's rehearsal.calls reports them per call)
    r.time_scale = 1.0
    # a rehearsal whose steps are predicted to take over 24 h of wall-clock time at that scale
    # is refused (one line with the prediction) unless this confirms it
    r.allow_long = False
    return r


def base_config() -> ml_collections.ConfigDict:
    """Returns the full schema with the local-demo defaults (unlocked)."""
    config = ml_collections.ConfigDict()
    config.model = _model()
    config.data = _data()
    config.train = _train()
    config.pipeline = _pipeline()
    config.allocation = _allocation()
    config.relax = _relax()
    config.cluster = _cluster()
    config.profile = _profile()
    config.checkpoint = _checkpoint()
    config.rehearse = _rehearse()
    return config
