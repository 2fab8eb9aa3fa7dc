"""A profile from a FLOP model: BERT's units priced by their FLOPs on a device of a given speed,
for clusters nobody has profiled yet (a device kind at its peak, or the paper's nodes).

Per unit: forward FLOPs (matmuls, attention scores and the element-wise work), parameters,
the activations kept for backward and the output carry, for a BERT of the given shape at layer
(embeddings, L layers, the head: L + 2 units) or sub-layer granularity (attention,
intermediate, output per layer: 3L + 2). A device of ``flops_per_s`` takes
``flops / flops_per_s + overhead_s`` forward and twice the FLOPs backward; ``bytes_per_value``
4 (float32) or 2 (bfloat16) sizes what is kept and sent; the state is 16 bytes per parameter
(float32 parameters, gradients and Adam's two moments). Pure numpy.
"""

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


def bert_units(s: BertShape, granularity: str = "layer", bytes_per_value: int = 4) -> list[dict]:
    """Units with ``flops`` (forward), ``params``, ``act`` (bytes kept per micro-batch) and
    ``out`` (bytes of the carry a stage ending there sends)."""
    tok, h, f, v = s.batch * s.seq, s.hidden, s.ffn, bytes_per_value
    scores = s.batch * s.heads * s.seq * s.seq
    embeddings = dict(name="embeddings", flops=10 * tok * h,
                      params=(s.vocab + s.positions + 2) * h + 2 * h, act=3 * tok * h * v,
                      out=tok * h * v)
    head = dict(name="head", flops=2 * s.batch * h * h + 2 * s.batch * h * s.labels,
                params=h * h + h + h * s.labels + s.labels, act=3 * s.batch * h * v,
                out=s.batch * s.labels * 4)
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
            parts = [dict(name=f"layer{i}", flops=sum(p["flops"] for p in parts),
                          params=sum(p["params"] for p in parts),
                          act=sum(p["act"] for p in parts), out=parts[-1]["out"])]
        units += parts
    return units + [head]


# bytes on the wire per value of each hand-off codec (skyjax.codecs: blocks of 64 values with
# a float32 scale each)
CODEC_BYTES_PER_VALUE = {"bf16": 2.0, "int8": 1 + 4 / 64, "int4": 0.5 + 4 / 64}


def flop_profile(units: list[dict], devices: list[dict], latency_s: np.ndarray,
                 bandwidth_Bps: np.ndarray, shape: BertShape = BertShape(),
                 overhead_s: float = 20e-6, bytes_per_value: int = 4,
                 coding_Bps: float = 2.5e11) -> Profile:
    """A profile of ``units`` (:func:`bert_units`) on ``devices``, each a record with
    ``flops_per_s`` and ``memory_bytes`` (other keys, e.g. ``name``, ``kind``, ``region``, are
    kept); links as given ([D, D]). The hand-off codecs' bytes follow their formats; their
    coding costs one pass at ``coding_Bps`` per uncoded byte (a memory-bound kernel)."""
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
                       activation_bytes=u["act"], output_bytes=u["out"]) for u in units],
        "devices": records, "forward_s": fwd.tolist(), "backward_s": bwd.tolist(),
        "links": {"latency_s": np.asarray(latency_s, float).tolist(),
                  "bandwidth_Bps": np.asarray(bandwidth_Bps, float).tolist()}})
