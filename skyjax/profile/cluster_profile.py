"""A whole cluster's profile from its parts: one profiled device per kind, how many of each kind
sit in which region, and the links inside and between regions (a latency and bandwidth per pair
of regions); ``python -m skyjax.profile.compose --cluster cluster.json --out profile.json``
(:mod:`skyjax.cli.compose`) writes it.

Users profile one device of each kind on real hardware (``python -m skyjax.profile``) and plan
(``python -m skyjax.plan``) or rehearse (``config.rehearse.profile``) the cluster they would
rent. A kind may also be a FLOP model (:mod:`skyjax.profile.flops`) for hardware at hand
nowhere. The cluster file (JSON):

```
{"kinds": {"h100": {"profile": "h100.json"},                 # its device 0 ("device": i)
           "v100": {"flops_per_s": 3e13, "memory_bytes": 3.4e10}},
 "model": {"layers": 24, "granularity": "layer"},           # FLOP kinds only (flops.BertShape;
                                                            #  "family": "gpt2" | "llama": DecoderShape)
 "regions": {"us": {"h100": 8}, "eu": {"v100": 8}},          # in this order, kinds in order
 "links": {"inside": {"latency_s": 1e-5, "bandwidth_Bps": 1.25e10},
           "between": [{"regions": ["us", "eu"], "latency_s": 0.04, "bandwidth_Bps": 1.25e9}],
           "default": {"latency_s": 0.05, "bandwidth_Bps": 1.25e8}}}
```

Each device takes its kind's column of every per-device term (unit times, updates, call and
message costs, inputs, memory, codec rates); a pair of regions not listed in ``between`` takes
``default`` (absent: refused by name), and links are symmetric. Measured kinds must have
profiled the same model (their profiles' model records), units and micro-batch (refused, naming
both files, otherwise); FLOP kinds take the measured kinds' units where there are any (their unit
count must match, and the model's sizes written must be the ones the measured kinds recorded).
The codecs offered are those every kind has timings of. ``sync_s`` is the largest of the kinds'.

The file is checked before anything is read or allocated (:mod:`skyjax.profile.cluster_file`):
a key written twice, an unknown key, a count that is no integer, a number out of its bounds and
more than 1024 devices are refused by name, so a cluster is composed as written or not at all.
Pure JSON and numpy.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from skyjax.profile.cluster_file import ClusterError, check, check_out, read_cluster
from skyjax.profile.flops import (BertShape, DecoderShape, bert_units, decoder_units,
                                  flop_profile)
from skyjax.profile.format import (OVERHEAD_KEYS, Profile, ProfileError, load_profile,
                                   save_profile)

__all__ = ["ClusterError", "compose", "compose_file", "summary", "write_profile"]


# a FLOP model's key (flops.BertShape) -> the model record's (format.MODEL_KEYS)
_RECORD_KEYS = {"layers": "num_hidden_layers", "hidden": "hidden_size",
                "heads": "num_attention_heads", "ffn": "intermediate_size", "vocab": "vocab_size",
                "positions": "max_position_embeddings", "granularity": "granularity"}


def _kind_profiles(spec: dict, base: str) -> dict[str, tuple[Profile, int, str] | dict]:
    """Per kind: (its measured profile, the device index, its path) or its FLOP-model record."""
    out: dict[str, Any] = {}
    for name, k in spec["kinds"].items():
        where = f"cluster.kinds.{name}"
        if "profile" in k:
            path = os.path.join(base, k["profile"])
            try:
                prof = load_profile(path)
            except ProfileError as e:
                text = str(e) if path in str(e) else f"{path}: {e}"
                raise ClusterError(f"{where}.profile: {text}") from None
            d = k.get("device", 0)
            if not 0 <= d < prof.num_devices:
                raise ClusterError(f"{where}.device={d}: {path} has {prof.num_devices} devices")
            out[name] = (prof, d, path)
        else:
            out[name] = dict(k)
    return out


def _same_model(kinds: dict, spec: dict) -> None:
    """Refuses measured kinds profiled for different models or micro-batches (their model
    records, where both have one, and their units' names and sizes), and a FLOP ``model`` whose
    written keys differ from the measured kinds' record."""
    measured = [(n, v) for n, v in kinds.items() if isinstance(v, tuple)]
    if not measured:
        return
    ref_name, (ref, _, ref_path) = measured[0]
    fix = "profile every kind with one model and micro-batch"
    for name, (prof, _, path) in measured[1:]:
        where = f"cluster.kinds.{name}.profile"
        if prof.num_units != ref.num_units or prof.microbatch != ref.microbatch:
            raise ClusterError(f"{where}: {path} profiled {prof.num_units} units at "
                               f"{prof.microbatch}; {ref_path} {ref.num_units} at "
                               f"{ref.microbatch}: {fix}")
        for key in sorted(set(prof.model or {}) & set(ref.model or {})):
            if prof.model[key] != ref.model[key]:
                raise ClusterError(f"{where}: {path} was measured for {key}="
                                   f"{prof.model[key]!r}, {ref_path} (cluster.kinds.{ref_name})"
                                   f" for {key}={ref.model[key]!r}: {fix}")
        for u, (a, b) in enumerate(zip(prof.units, ref.units)):
            if a["name"] != b["name"] or a["state_bytes"] != b["state_bytes"]:
                raise ClusterError(f"{where}: {path}'s unit {u} is {a['name']} of "
                                   f"{a['state_bytes']} state bytes, {ref_path}'s {b['name']} "
                                   f"of {b['state_bytes']}: {fix}")
    model = spec.get("model", {})
    record = ref.model or {}
    for key, rkey in _RECORD_KEYS.items():
        if key in model and rkey in record and model[key] != record[rkey]:
            raise ClusterError(f"cluster.model.{key}={model[key]!r}: {ref_path} "
                               f"(cluster.kinds.{ref_name}) was measured for {rkey}="
                               f"{record[rkey]!r}: set cluster.model to the profiled model")
    for key, mkey in (("batch", "size"), ("seq", "seq_len")):
        if key in model and model[key] != ref.microbatch[mkey]:
            raise ClusterError(f"cluster.model.{key}={model[key]!r}: {ref_path} "
                               f"(cluster.kinds.{ref_name}) was measured at micro-batch {mkey} "
                               f"{ref.microbatch[mkey]}: set cluster.model to the profiled model")


def compose(spec: dict, base: str = ".") -> Profile:
    """The cluster's profile (device order: regions in the file's order, each region's kinds in
    its order); relative profile paths are read from ``base``. The file is checked first
    (:func:`skyjax.profile.cluster_file.check`): ``ClusterError`` naming the key."""
    check(spec)  # before anything is read or allocated
    kinds = _kind_profiles(spec, base)
    _same_model(kinds, spec)
    regions = spec["regions"]
    devices: list[tuple[str, str]] = []  # (region, kind)
    for region, counts in regions.items():
        for kind, count in counts.items():
            devices += [(region, kind)] * count
    measured = [v for v in kinds.values() if isinstance(v, tuple)]
    ref = measured[0] if measured else None
    flop_kinds = {n: v for n, v in kinds.items() if isinstance(v, dict)}
    flop_cols = {}
    if flop_kinds:
        m = dict(spec.get("model", {}))
        granularity = str(m.pop("granularity", "layer"))
        bytes_per_value = int(m.pop("bytes_per_value", 4))
        family = str(m.get("family", "bert"))
        if family == "bert":
            m.pop("family", None)
            shape = BertShape(**m)
            units = bert_units(shape, granularity, bytes_per_value)
        else:  # a decoder language model (flops.DecoderShape)
            shape = DecoderShape(**m)
            units = decoder_units(shape, granularity, bytes_per_value)
        if ref is not None and len(units) != ref[0].num_units:
            raise ClusterError(f"cluster.model gives {len(units)} units; {ref[2]} has "
                               f"{ref[0].num_units}: set cluster.model to the profiled model")
        fp = flop_profile(units, [dict(flops_per_s=k["flops_per_s"],
                                       memory_bytes=k["memory_bytes"]) for k in
                                  flop_kinds.values()], np.zeros((len(flop_kinds),) * 2),
                          np.full((len(flop_kinds),) * 2, 1e12), shape,
                          bytes_per_value=bytes_per_value)
        flop_cols = {n: i for i, n in enumerate(flop_kinds)}
        if ref is None:
            ref = (fp, None, "cluster.model")

    def column(kind: str) -> tuple[Profile, int]:
        v = kinds[kind]
        return (v[0], v[1]) if isinstance(v, tuple) else (fp, flop_cols[kind])

    base_prof = ref[0]
    cols = [column(k) for _, k in devices]
    fwd = np.stack([p.forward_s[:, d] for p, d in cols], axis=1)
    bwd = np.stack([p.backward_s[:, d] for p, d in cols], axis=1)
    upd = np.stack([p.update_s[:, d] for p, d in cols], axis=1)
    records = []
    for i, ((region, kind), (p, d)) in enumerate(zip(devices, cols)):
        rec = {k: v for k, v in p.devices[d].items()
               if k not in ("name", "region", "process_index", "slowdown")}
        rec.update(name=f"{region}:{kind}:{i}", kind=kind, region=region, process_index=i)
        records.append(rec)
    lat, bw = _links(spec, [r for r, _ in devices], list(regions))
    out = {"version": 2, "microbatch": dict(base_prof.microbatch),
           "units": [dict(u) for u in base_prof.units], "devices": records,
           "forward_s": fwd.tolist(), "backward_s": bwd.tolist(), "update_s": upd.tolist(),
           "links": {"latency_s": lat.tolist(), "bandwidth_Bps": bw.tolist()},
           "overheads": {**{k: [float(getattr(p, k)[d]) for p, d in cols]
                            for k in OVERHEAD_KEYS},
                         "sync_s": max(float(v[0].sync_s) for v in measured) if measured
                         else 0.0},
           "composed": {"kinds": sorted(kinds), "regions": list(regions)}}
    for key in ("backward_weight_s", "backward_input_s"):  # B, W where every kind measured it
        if all(getattr(p, key) is not None for p, _ in cols):
            out[key] = np.stack([getattr(p, key)[:, d] for p, d in cols], axis=1).tolist()
    names = set.intersection(*(set(p.codecs) for p in
                               [v[0] for v in measured] + ([fp] if flop_kinds else [])))
    if names:
        out["codecs"] = {c: {"output_bytes": list(ref[0].codecs[c]["output_bytes"]),
                             "seconds_per_byte": [float(p.codecs[c]["seconds_per_byte"][d])
                                                  for p, d in cols]}
                         for c in sorted(names)}
    return Profile.from_json(out)


def _links(spec: dict, device_regions: list[str], regions: list[str]
           ) -> tuple[np.ndarray, np.ndarray]:
    """[D, D] latency and bandwidth from ``links.inside``, ``links.between`` per region pair
    and ``links.default`` (built per pair of regions, then spread to their devices)."""
    links = spec["links"]

    def link(x: dict) -> tuple[float, float]:
        return float(x["latency_s"]), float(x["bandwidth_Bps"])

    inside = link(links["inside"])
    pairs = {frozenset(b["regions"]): link(b) for b in links.get("between", [])}
    default = link(links["default"]) if "default" in links else None
    present = set(device_regions)
    used = [r for r in regions if r in present]  # in device order
    lat_r, bw_r = np.zeros((len(used),) * 2), np.zeros((len(used),) * 2)
    for i, ra in enumerate(used):
        for j, rb in enumerate(used):
            pair = inside if i == j else pairs.get(frozenset((ra, rb)), default)
            if pair is None:
                raise ClusterError(f"cluster.links: no link between regions {ra!r} and {rb!r} "
                                   "(add it to 'between', or a 'default')")
            lat_r[i, j], bw_r[i, j] = pair
    number = {r: i for i, r in enumerate(used)}
    index = np.array([number[r] for r in device_regions])
    lat, bw = lat_r[np.ix_(index, index)], bw_r[np.ix_(index, index)]
    np.fill_diagonal(lat, 0.0)
    return lat, bw


def compose_file(path: str) -> Profile:
    """The profile of the cluster file ``path`` (relative profile paths read from its
    directory); ``ClusterError`` naming the file and the key (and a measured kind's profile and
    its field)."""
    spec = read_cluster(path)
    try:
        return compose(spec, os.path.dirname(os.path.abspath(path)))
    except (ClusterError, ProfileError) as e:
        raise ClusterError(f"{path}: {e}") from None


def write_profile(cluster: str, out: str) -> Profile:
    """Composes the cluster file ``cluster`` and writes its profile to ``out``, which is checked
    first (:func:`skyjax.profile.cluster_file.check_out`); returns the profile."""
    check_out(out, cluster)
    prof = compose_file(cluster)
    try:
        save_profile(prof, out)
    except OSError as e:
        raise ClusterError(f"--out {out}: cannot write: {e.strerror or e}") from None
    return prof


def summary(prof: Profile) -> str:
    """``D devices, U units; region: n x kind, ...``: what a composed profile holds."""
    counts: dict[tuple[str, str], int] = {}
    for d in prof.devices:
        counts[d["region"], d["kind"]] = counts.get((d["region"], d["kind"]), 0) + 1
    return (f"{prof.num_devices} devices, {prof.num_units} units; "
            + ", ".join(f"{r}: {n} x {k}" for (r, k), n in counts.items()))
