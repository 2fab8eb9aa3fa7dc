"""A profile from a FLOP model: BERT's units (or a decoder's, :func:`decoder_units`) priced by
their FLOPs on a device of a given speed, for clusters nobody has profiled yet (a device kind at
its peak, or the paper's nodes).

Per unit: forward FLOPs (matmuls, attention scores and the element-wise work), parameters,
the activations kept for backward and the output carry, for a BERT of the given shape at layer
(embeddings, L layers, the head: L + 2 units) or sub-layer granularity (attention,
intermediate, output per layer: 3L + 2); with ``split_head`` the head is the paper's two units,
pooler and classifier. A device of ``flops_per_s`` takes ``flops / flops_per_s + overhead_s``
forward and twice the FLOPs backward; ``bytes_per_value`` 4 (float32) or 2 (bfloat16) sizes
what is kept and sent; the state is 16 bytes per parameter (float32 parameters, gradients and
Adam's two moments). Pure numpy.

Sky Computing (arXiv 2202.11836) emulated heterogeneous nodes differently: one fast node's
times multiplied by each node's seeded slow-down (:func:`slowdown_profile`,
:func:`paper_slowdowns`); its setting is :data:`PAPER_SHAPE` on 64 nodes of 16 GiB, here also
spread over four regions (:func:`paper_profile`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from skyjax.profile.format import Profile


@dataclasses.dataclass(frozen=True)
class BertShape:
    """A BERT's shape and the micro-batch it is priced at (BERT-large, 8 x 128, by default)."""

    layers: int = 24
    hidden: int = 1024
    heads: int = 16
    ffn: int = 4096
    seq: int = 128
    batch: int = 8
    vocab: int = 30522
    positions: int = 512
    labels: int = 3


def _merged(name: str, parts: list[dict]) -> dict:
    """One unit of consecutive ``parts``: their sums, the last one's carry."""
    return dict(name=name, flops=sum(p["flops"] for p in parts),
                params=sum(p["params"] for p in parts), act=sum(p["act"] for p in parts),
                out=parts[-1]["out"])


# the paper's model: 160 BERT-large layers (483 units at sub-layer granularity, split head)
PAPER_SHAPE = BertShape(layers=160)


def bert_units(s: BertShape, granularity: str = "layer", bytes_per_value: int = 4,
               split_head: bool = False) -> list[dict]:
    """Units with ``flops`` (forward), ``params``, ``act`` (bytes kept per micro-batch) and
    ``out`` (bytes of the carry a stage ending there sends); ``split_head``: the head as two
    units, ``pooler`` and ``classifier`` (the paper's), else one."""
    tok, h, f, v = s.batch * s.seq, s.hidden, s.ffn, bytes_per_value
    scores = s.batch * s.heads * s.seq * s.seq
    embeddings = dict(name="embeddings", flops=10 * tok * h,
                      params=(s.vocab + s.positions + 2) * h + 2 * h, act=3 * tok * h * v,
                      out=tok * h * v)
    pooler = dict(name="pooler", flops=2 * s.batch * h * h, params=h * h + h,
                  act=2 * s.batch * h * v, out=s.batch * h * v)
    classifier = dict(name="classifier", flops=2 * s.batch * h * s.labels,
                      params=h * s.labels + s.labels, act=s.batch * h * v,
                      out=s.batch * s.labels * 4)
    head = [pooler, classifier] if split_head else [_merged("head", [pooler, classifier])]
    units = [embeddings]
    for i in range(s.layers):
        parts = [
            dict(name=f"layer{i}.attention", flops=tok * (8 * h * h + 4 * s.seq * h),
                 params=4 * h * h + 6 * h, act=(6 * tok * h + 2 * scores) * v, out=tok * h * v),
            dict(name=f"layer{i}.intermediate", flops=tok * (2 * h * f + 8 * f),
                 params=h * f + f, act=(tok * h + tok * f) * v, out=tok * f * v),
            dict(name=f"layer{i}.output", flops=tok * (2 * f * h + 10 * h),
                 params=f * h + 3 * h, act=(tok * f + 2 * tok * h) * v, out=tok * h * v)]
        if granularity == "layer":
            parts = [_merged(f"layer{i}", parts)]
        units += parts
    return units + head


@dataclasses.dataclass(frozen=True)
class DecoderShape:
    """A decoder language model's shape (``family`` ``"llama"``: RMSNorm, rotary, SwiGLU;
    ``"gpt2"``: LayerNorm, learned positions, GELU, biases) and the micro-batch it is priced at
    (Llama-2-7B's shape, 1 x 2048, by default). ``kv_heads`` 0: as many as ``heads``;
    ``head_dim`` 0: ``hidden // heads``; ``bias``: biases on the attention and MLP projections
    (GPT-2's always)."""

    family: str = "llama"
    layers: int = 32
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 0
    head_dim: int = 0
    ffn: int = 11008
    seq: int = 2048
    batch: int = 1
    vocab: int = 32000
    positions: int = 2048
    tied: bool = False
    bias: bool = False


def decoder_units(s: DecoderShape, granularity: str = "layer", bytes_per_value: int = 4
                  ) -> list[dict]:
    """A decoder's units as :func:`bert_units` gives BERT's: embeddings, per layer ``attention``
    and ``mlp`` (merged at ``"layer"`` granularity), head (final norm, LM head; its ``out`` the
    float32 logits). A tied head holds its own copy of the token embedding: counted in its
    ``params`` and named by ``tied_params`` (the tensor the first and last stages share)."""
    gpt2 = s.family == "gpt2"
    tok, h, f, v = s.batch * s.seq, s.hidden, s.ffn, bytes_per_value
    d = s.head_dim or h // s.heads
    qd, kvd = s.heads * d, (s.kv_heads or s.heads) * d
    bias = gpt2 or s.bias
    norm = 2 * h if gpt2 else h  # LayerNorm's scale and bias, RMSNorm's weight
    scores = s.batch * s.heads * s.seq * s.seq
    embeddings = dict(name="embeddings", flops=2 * tok * h,
                      params=(s.vocab + (s.positions if gpt2 else 0)) * h,
                      act=tok * h * v if gpt2 else 0, out=tok * h * v)
    head = dict(name="head", flops=2 * tok * h * s.vocab + 6 * tok * h,
                params=norm + s.vocab * h, act=2 * tok * h * v + tok * s.vocab * 4,
                out=tok * s.vocab * 4, tied_params=s.vocab * h if s.tied else 0)
    rope = 0 if gpt2 else 6 * tok * (qd + kvd)
    units = [embeddings]
    for i in range(s.layers):
        attention = dict(
            name=f"layer{i}.attention",
            flops=tok * (2 * h * (qd + 2 * kvd) + 2 * qd * h + 6 * h) + 4 * scores * d
            + 5 * scores + rope,
            params=norm + h * (qd + 2 * kvd) + qd * h + ((qd + 2 * kvd + h) if bias else 0),
            act=(2 * tok * h + tok * (qd + 2 * kvd) + tok * qd) * v + 4 * scores,
            out=tok * h * v)
        mats = 2 if gpt2 else 3  # c_fc, c_proj; gate, up, down
        mlp = dict(name=f"layer{i}.mlp", flops=tok * (2 * mats * h * f + 8 * f + 6 * h),
                   params=norm + mats * h * f + ((f * (mats - 1) + h) if bias else 0),
                   act=(2 * tok * h + (mats - 1) * tok * f) * v, out=tok * h * v)
        parts = [attention, mlp]
        units += [_merged(f"layer{i}", parts)] if granularity == "layer" else parts
    return units + [head]


# bytes on the wire per value of each hand-off codec (skyjax.codecs: blocks of 64 values with
# a float32 scale each)
CODEC_BYTES_PER_VALUE = {"bf16": 2.0, "int8": 1 + 4 / 64, "int4": 0.5 + 4 / 64}


def flop_profile(units: list[dict], devices: list[dict], latency_s: np.ndarray,
                 bandwidth_Bps: np.ndarray, shape: BertShape | DecoderShape = BertShape(),
                 overhead_s: float = 20e-6, bytes_per_value: int = 4,
                 coding_Bps: float = 2.5e11) -> Profile:
    """A profile of ``units`` (:func:`bert_units`) on ``devices``, each a record with
    ``flops_per_s`` and ``memory_bytes`` (other keys, e.g. ``name``, ``kind``, ``region``, are
    kept); links as given ([D, D]). The hand-off codecs' bytes follow their formats; their
    coding costs one pass at ``coding_Bps`` per uncoded byte (a memory-bound kernel). A unit
    with ``tied_params`` (:func:`decoder_units`' tied head) records ``tied_bytes``: the fp32
    gradient the first and last stages exchange each step."""
    flops = np.array([float(u["flops"]) for u in units])
    speed = np.array([float(d["flops_per_s"]) for d in devices])
    fwd = flops[:, None] / speed[None, :] + overhead_s
    bwd = 2 * flops[:, None] / speed[None, :] + overhead_s
    records = []
    for i, d in enumerate(devices):
        rec = {"name": f"device{i}", **d}
        rec["memory_bytes"] = int(rec["memory_bytes"])
        records.append(rec)
    codecs = {name: {"output_bytes": [int(np.ceil(u["out"] / bytes_per_value * per))
                                      for u in units],
                     "seconds_per_byte": [1.0 / coding_Bps] * len(devices)}
              for name, per in CODEC_BYTES_PER_VALUE.items() if per < bytes_per_value}
    return Profile.from_json({
        "version": 2, "microbatch": {"size": shape.batch, "seq_len": shape.seq},
        "codecs": codecs,
        "units": [dict(name=u["name"], state_bytes=16 * u["params"], param_bytes=4 * u["params"],
                       activation_bytes=u["act"], output_bytes=u["out"],
                       **({"tied_bytes": 4 * u["tied_params"]} if u.get("tied_params") else {}))
                  for u in units],
        "devices": records, "forward_s": fwd.tolist(), "backward_s": bwd.tolist(),
        "links": {"latency_s": np.asarray(latency_s, float).tolist(),
                  "bandwidth_Bps": np.asarray(bandwidth_Bps, float).tolist()}})


def paper_slowdowns(n: int = 64) -> np.ndarray:
    """The paper's emulated heterogeneity: node ``d`` is ``default_rng(35).integers(1, 7, n)[d]``
    times slower than the fastest."""
    return np.random.default_rng(35).integers(1, 7, n)


def slowdown_profile(units: list[dict], slowdowns: np.ndarray, memory: np.ndarray,
                     latency: np.ndarray, bandwidth: np.ndarray, flops_per_s: float = 20e12,
                     overhead_s: float = 20e-6, extra_devices: list[dict] | None = None
                     ) -> Profile:
    """A profile from unit FLOPs and per-device slow-downs, as the paper emulated its nodes:
    forward FLOPs / ``flops_per_s`` + ``overhead_s`` on the fastest device, backward twice the
    FLOPs, both times a device's slow-down; ``extra_devices[d]`` adds keys to device ``d``'s
    record."""
    fwd = np.array([u["flops"] / flops_per_s + overhead_s for u in units])
    bwd = np.array([2 * u["flops"] / flops_per_s + overhead_s for u in units])
    devices = [dict(name=f"node{d}", memory_bytes=int(memory[d]), slowdown=int(slowdowns[d]))
               for d in range(len(slowdowns))]
    for d, extra in enumerate(extra_devices or []):
        devices[d].update(extra)
    return Profile.from_json({
        "version": 1, "microbatch": {"size": 8, "seq_len": 128},
        "units": [dict(name=u["name"], state_bytes=16 * u["params"], activation_bytes=u["act"],
                       output_bytes=u["out"]) for u in units],
        "devices": devices,
        "forward_s": (fwd[:, None] * slowdowns[None, :]).tolist(),
        "backward_s": (bwd[:, None] * slowdowns[None, :]).tolist(),
        "links": {"latency_s": latency.tolist(), "bandwidth_Bps": bandwidth.tolist()}})


def uniform_links(n: int, bandwidth: float, latency: float) -> tuple[np.ndarray, np.ndarray]:
    """[n, n] latency and bandwidth of ``n`` devices with one link speed (no latency to self)."""
    lat = np.full((n, n), latency)
    bw = np.full((n, n), bandwidth)
    np.fill_diagonal(lat, 0.0)
    return lat, bw


def paper_profile(units: list[dict] | None = None, cross_latency_s: float = 20e-3,
                  cross_Bps: float = 10e9 / 8) -> Profile:
    """The paper's setting in four regions: ``units`` (default :data:`PAPER_SHAPE`'s 483 at
    sub-layer granularity, split head) on 64 nodes of 16 GiB with :func:`paper_slowdowns`; nodes
    16 r .. 16 r + 15 form region r (100 Gbit/s, 10 us inside; ``cross_*`` across)."""
    if units is None:
        units = bert_units(PAPER_SHAPE, "sublayer", split_head=True)
    slow = paper_slowdowns(64)
    region = np.arange(64) // 16
    same = region[:, None] == region[None, :]
    lat = np.where(same, 10e-6, cross_latency_s)
    np.fill_diagonal(lat, 0.0)
    bw = np.where(same, 100e9 / 8, cross_Bps)
    extra = [{"region": f"r{r}", "kind": f"x{s}"} for r, s in zip(region, slow)]
    return slowdown_profile(units, slow, np.full(64, 16 << 30), lat, bw, extra_devices=extra)
