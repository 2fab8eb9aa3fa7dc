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
 "model": {"layers": 24, "granularity": "layer"},           # FLOP kinds only (flops.BertShape)
 "regions": {"us": {"h100": 8}, "eu": {"v100": 8}},          # in this order, kinds in order
 "links": {"inside": {"latency_s": 1e-5, "bandwidth_Bps": 1.25e10},
           "between": [{"regions": ["us", "eu"], "latency_s": 0.04, "bandwidth_Bps": 1.25e9}],
           "default": {"latency_s": 0.05, "bandwidth_Bps": 1.25e8}}}
```

Each device takes its kind's column of every per-device term (unit times, updates, call and
message costs, inputs, memory, codec rates); a pair of regions not listed in ``between`` takes
``default`` (absent: refused by name), and links are symmetric. Measured kinds must have
profiled the same units and micro-batch (refused, naming both files, otherwise); FLOP kinds take
the measured kinds' units where there are any (their unit count must match). The codecs offered
are those every kind has timings of. ``sync_s`` is the largest of the kinds'. Pure JSON and numpy.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from skyjax.profile.flops import BertShape, bert_units, flop_profile
from skyjax.profile.format import OVERHEAD_KEYS, Profile, load_profile


class ClusterError(ValueError):
    """A malformed cluster file; the message names the key."""


def _get(obj: Any, key: str, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise ClusterError(f"{where}: missing key {key!r}")
    return obj[key]


def _link(x: Any, where: str) -> tuple[float, float]:
    lat, bw = _get(x, "latency_s", where), _get(x, "bandwidth_Bps", where)
    if not isinstance(lat, (int, float)) or not lat >= 0:
        raise ClusterError(f"{where}.latency_s={lat!r}: expected seconds >= 0")
    if not isinstance(bw, (int, float)) or not bw > 0:
        raise ClusterError(f"{where}.bandwidth_Bps={bw!r}: expected bytes per second > 0")
    return float(lat), float(bw)


def _kind_profiles(spec: dict, base: str) -> dict[str, tuple[Profile, int] | dict]:
    """Per kind: (its measured profile, the device index) or its FLOP-model record."""
    out: dict[str, Any] = {}
    kinds = _get(spec, "kinds", "cluster")
    if not isinstance(kinds, dict) or not kinds:
        raise ClusterError("cluster.kinds: expected an object of kinds")
    for name, k in kinds.items():
        where = f"cluster.kinds.{name}"
        if isinstance(k, dict) and "profile" in k:
            path = os.path.join(base, str(k["profile"]))
            prof = load_profile(path)
            d = int(k.get("device", 0))
            if not 0 <= d < prof.num_devices:
                raise ClusterError(f"{where}.device={d}: {path} has {prof.num_devices} devices")
            out[name] = (prof, d, path)
        elif isinstance(k, dict) and "flops_per_s" in k:
            for key in ("flops_per_s", "memory_bytes"):
                v = _get(k, key, where)
                if not isinstance(v, (int, float)) or not v > 0:
                    raise ClusterError(f"{where}.{key}={v!r}: expected a positive number")
            out[name] = dict(k)
        else:
            raise ClusterError(f"{where}: expected {{'profile': FILE}} or {{'flops_per_s': ..., "
                               "'memory_bytes': ...}}")
    return out


def compose(spec: dict, base: str = ".") -> Profile:
    """The cluster's profile (device order: regions in the file's order, each region's kinds in
    its order); relative profile paths are read from ``base``."""
    kinds = _kind_profiles(spec, base)
    regions = _get(spec, "regions", "cluster")
    if not isinstance(regions, dict) or not regions:
        raise ClusterError("cluster.regions: expected an object of regions")
    devices: list[tuple[str, str]] = []  # (region, kind)
    for region, counts in regions.items():
        if not isinstance(counts, dict):
            raise ClusterError(f"cluster.regions.{region}: expected {{kind: count}}")
        for kind, count in counts.items():
            if kind not in kinds:
                raise ClusterError(f"cluster.regions.{region}.{kind}: no such kind in "
                                   f"cluster.kinds ({', '.join(kinds)})")
            if not isinstance(count, int) or count < 0:
                raise ClusterError(f"cluster.regions.{region}.{kind}={count!r}: expected a "
                                   "count >= 0")
            devices += [(region, kind)] * count
    if not devices:
        raise ClusterError("cluster.regions: no devices")
    measured = [v for v in kinds.values() if isinstance(v, tuple)]
    ref = measured[0] if measured else None
    for prof, _, path in measured[1:]:
        if prof.num_units != ref[0].num_units or prof.microbatch != ref[0].microbatch:
            raise ClusterError(f"{path} profiled {prof.num_units} units at {prof.microbatch}; "
                               f"{ref[2]} {ref[0].num_units} at {ref[0].microbatch}: profile "
                               "every kind with one model and micro-batch")
    flop_kinds = {n: v for n, v in kinds.items() if isinstance(v, dict)}
    flop_cols = {}
    if flop_kinds:
        m = dict(spec.get("model", {}))
        granularity = str(m.pop("granularity", "layer"))
        bytes_per_value = int(m.pop("bytes_per_value", 4))
        try:
            shape = BertShape(**m)
        except TypeError as e:
            raise ClusterError(f"cluster.model: {e}") from None
        units = bert_units(shape, granularity, bytes_per_value)
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
    if all(p.backward_weight_s is not None for p, _ in cols):  # W where every kind measured it
        out["backward_weight_s"] = np.stack([p.backward_weight_s[:, d] for p, d in cols],
                                            axis=1).tolist()
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
    and ``links.default``."""
    links = _get(spec, "links", "cluster")
    inside = _link(_get(links, "inside", "cluster.links"), "cluster.links.inside")
    pairs: dict[frozenset, tuple[float, float]] = {}
    for i, b in enumerate(links.get("between", [])):
        where = f"cluster.links.between[{i}]"
        rs = _get(b, "regions", where)
        if not (isinstance(rs, list) and len(rs) == 2 and rs[0] != rs[1]
                and all(r in regions for r in rs)):
            raise ClusterError(f"{where}.regions={rs!r}: expected two distinct regions of "
                               f"cluster.regions ({', '.join(regions)})")
        pairs[frozenset(rs)] = _link(b, where)
    default = _link(links["default"], "cluster.links.default") if "default" in links else None
    n = len(device_regions)
    lat, bw = np.zeros((n, n)), np.full((n, n), inside[1])
    for a in range(n):
        for b in range(n):
            ra, rb = device_regions[a], device_regions[b]
            if a == b:
                continue
            if ra == rb:
                lat[a, b], bw[a, b] = inside
                continue
            link = pairs.get(frozenset((ra, rb)), default)
            if link is None:
                raise ClusterError(f"cluster.links: no link between regions {ra!r} and {rb!r} "
                                   "(add it to 'between', or a 'default')")
            lat[a, b], bw[a, b] = link
    return lat, bw


def compose_file(path: str) -> Profile:
    """The profile of the cluster file ``path`` (relative profile paths read from its
    directory); ``ValueError`` (``ClusterError``, ``ProfileError``) naming the file, key or
    field."""
    try:
        with open(path) as f:
            spec = json.load(f)
    except OSError as e:
        raise ClusterError(f"cannot read {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ClusterError(f"{path} is not valid JSON: {e.msg} at line {e.lineno}") from None
    return compose(spec, os.path.dirname(os.path.abspath(path)))


def summary(prof: Profile) -> str:
    """``D devices, U units; region: n x kind, ...``: what a composed profile holds."""
    counts: dict[tuple[str, str], int] = {}
    for d in prof.devices:
        counts[d["region"], d["kind"]] = counts.get((d["region"], d["kind"]), 0) + 1
    return (f"{prof.num_devices} devices, {prof.num_units} units; "
            + ", ".join(f"{r}: {n} x {k}" for (r, k), n in counts.items()))
