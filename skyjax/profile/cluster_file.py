"""The cluster file (its format: :mod:`skyjax.profile.cluster_profile`), read and checked before
anything is composed, so that a cluster is composed exactly as written or refused by name.

Refused, each in one :class:`ClusterError` naming the key (``cluster.regions.eu.fast=true``):

* a key written twice in one object (JSON would keep the last one), a region pair listed twice
  in ``links.between``;
* an unknown key at any level, with the nearest known one when there is one (``betwen``:
  ``between``); a kind that is both measured (``profile``) and a FLOP model;
* a count or device index that is not an integer (``true``, ``2.0``, ``"abc"``); a model size
  that is not a positive integer; a granularity not in :data:`skyjax.names.GRANULARITIES`;
* a number outside the bounds below (NaN and ``Infinity`` included): values past them are typos
  or units mixed up, and they would price a step at 0 s or overflow on the way;
* more than :data:`MAX_DEVICES` devices (checked before anything is allocated); ``model`` in a
  cluster without FLOP kinds (it would be ignored: a measured kind's model is its profile's).

:func:`check_out` checks where the profile goes before any work. Pure JSON.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from typing import Any

from skyjax.names import GRANULARITIES
from skyjax.profile.flops import BertShape, DecoderShape

# devices in a cluster: every device pair has a link, so the profile holds D x D matrices (1024
# devices: 2 s, 23 MB of JSON; 4096: 27 s, 2.3 GB of memory, 357 MB of JSON)
MAX_DEVICES = 1024
MAX_LAYERS = 1024  # BERT layers of a FLOP model
MAX_SIZE = 2 ** 20  # any other size of a FLOP model (hidden, heads, ffn, seq, batch, vocab, ...)
FLOPS_PER_S = (1e6, 1e18)  # a FLOP kind's rate per device
MEMORY_BYTES = (1, 2 ** 50)  # a FLOP kind's memory (1 PiB)
LATENCY_S = (0.0, 3600.0)
BANDWIDTH_BPS = (1.0, 1e15)
BYTES_PER_VALUE = (2, 4)  # bfloat16, float32

TOP_KEYS = ("kinds", "model", "regions", "links")
MEASURED_KEYS = ("profile", "device")
FLOP_KEYS = ("flops_per_s", "memory_bytes")
SHAPE_KEYS = tuple(dict.fromkeys(f.name for shape in (BertShape, DecoderShape)
                                  for f in dataclasses.fields(shape) if f.type != "str"
                                  and f.type != "bool"))
# "family": a decoder (flops.DecoderShape: "llama" or "gpt2"); absent or "bert": BERT
MODEL_KEYS = SHAPE_KEYS + ("family", "tied", "bias", "granularity", "bytes_per_value")
FAMILIES = ("bert", "llama", "gpt2")
LINKS_KEYS = ("inside", "between", "default")
LINK_KEYS = ("latency_s", "bandwidth_Bps")
PAIR_KEYS = ("regions",) + LINK_KEYS


class ClusterError(ValueError):
    """A malformed cluster file; the message names the key."""


class _Object(dict):
    """A JSON object as read, with the keys it held more than once (``repeated``)."""

    repeated: tuple[str, ...] = ()


def _pairs(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object(pairs)
    if len(obj) < len(pairs):
        seen: set[str] = set()
        obj.repeated = tuple(k for k, _ in pairs if k in seen or seen.add(k))
    return obj


def read_cluster(path: str) -> dict:
    """The cluster file ``path`` parsed, keys written twice kept for :func:`check` to refuse
    (``json.load`` alone keeps the last of them, silently)."""
    try:
        with open(path) as f:
            return json.load(f, object_pairs_hook=_pairs)
    except OSError as e:
        raise ClusterError(f"cannot read {path}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        why = f"{e.msg} at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else str(e)
        raise ClusterError(f"{path} is not valid JSON: {why}") from None


def check_out(out: str, cluster: str) -> None:
    """Where the composed profile goes: not the cluster file itself (compared by real path), not
    a directory, in a directory that exists; ``ClusterError`` naming ``--out`` otherwise."""
    real = os.path.realpath(out)
    if real == os.path.realpath(cluster) or (os.path.exists(out) and os.path.exists(cluster)
                                             and os.path.samefile(out, cluster)):
        raise ClusterError(f"--out {out} is the cluster file {cluster}: writing the profile "
                           "there would replace it; name another file")
    if os.path.isdir(out):
        raise ClusterError(f"--out {out} is a directory: name the profile's file "
                           f"({os.path.join(out, 'profile.json')})")
    parent, shown = os.path.dirname(real), os.path.dirname(out) or "."
    if not os.path.isdir(parent):
        raise ClusterError(f"--out {out}: its directory {shown} does not exist")
    if not os.access(parent, os.W_OK):
        raise ClusterError(f"--out {out}: its directory {shown} is not writable")


def _show(v: Any) -> str:
    """``v`` as the file spells it (``true``, ``2.0``, ``"abc"``, ``Infinity``)."""
    try:
        text = json.dumps(v)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"


def _object(x: Any, where: str, what: str) -> dict:
    if not isinstance(x, dict):
        raise ClusterError(f"{where}={_show(x)}: expected {what}")
    return x


def _keys(obj: dict, known: tuple[str, ...], where: str) -> None:
    for key in obj:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ClusterError(f"{where}.{key}: unknown key{hint} (known: {', '.join(known)})")


def _get(obj: dict, key: str, where: str) -> Any:
    if key not in obj:
        raise ClusterError(f"{where}: missing key {key!r}")
    return obj[key]


def _integer(v: Any, where: str, lo: int, hi: int, what: str) -> int:
    """``v`` if an integer in [lo, hi] (not a boolean, not a float such as 2.0)."""
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ClusterError(f"{where}={_show(v)}: expected {what}")
    return v


def _number(obj: dict, key: str, where: str, bounds: tuple[float, float], what: str,
            integral: bool = False) -> None:
    v = _get(obj, key, where)
    lo, hi = bounds
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and lo <= v <= hi  # NaN: no
    if ok and integral and isinstance(v, float) and not float(v).is_integer():
        ok = False
    if not ok:
        span = f"[{lo:g}, {hi:g}]" if isinstance(hi, float) else f"[{lo}, 2^{hi.bit_length() - 1}]"
        raise ClusterError(f"{where}.{key}={_show(v)}: expected {what} in {span}")


def _repeated(x: Any, where: str) -> None:
    """Refuses the first key written twice in any object of ``x``."""
    if isinstance(x, dict):
        for key in getattr(x, "repeated", ()):
            raise ClusterError(f"{where}.{key}: written twice (JSON keeps only the last one); "
                               "write each key once")
        for key, v in x.items():
            _repeated(v, f"{where}.{key}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            _repeated(v, f"{where}[{i}]")


def check(spec: Any) -> int:
    """Refuses what :func:`skyjax.profile.cluster_profile.compose` would not compose as written
    (the module's list); returns the device count."""
    _repeated(spec, "cluster")
    _keys(_object(spec, "cluster", "a JSON object"), TOP_KEYS, "cluster")
    kinds = _object(_get(spec, "kinds", "cluster"), "cluster.kinds", "an object of kinds")
    if not kinds:
        raise ClusterError("cluster.kinds: expected an object of kinds, got none")
    for name, kind in kinds.items():
        _kind(kind, f"cluster.kinds.{name}")
    flop = any("flops_per_s" in k for k in kinds.values())
    if "model" in spec:
        if not flop:
            raise ClusterError("cluster.model: only FLOP kinds (flops_per_s) use it and this "
                               "cluster has none (a measured kind's model is its profile's): "
                               "remove it")
        _model(spec["model"])
    devices = _regions(_get(spec, "regions", "cluster"), kinds)
    _links(_get(spec, "links", "cluster"), list(spec["regions"]))
    return devices


def _kind(kind: Any, where: str) -> None:
    what = "{'profile': FILE} or {'flops_per_s': ..., 'memory_bytes': ...}"
    if not _object(kind, where, what):
        raise ClusterError(f"{where}={{}}: expected {what}")
    _keys(kind, MEASURED_KEYS + FLOP_KEYS, where)
    if "profile" in kind:
        flop = [k for k in FLOP_KEYS if k in kind]
        if flop:
            raise ClusterError(f"{where}.{flop[0]}: a kind is a measured profile or a FLOP "
                               "model, not both")
        path = kind["profile"]
        if not isinstance(path, str) or not path:
            raise ClusterError(f"{where}.profile={_show(path)}: expected a profile's file name")
        if "device" in kind:
            _integer(kind["device"], f"{where}.device", 0, MAX_DEVICES - 1,
                     f"a device index (an integer in [0, {MAX_DEVICES - 1}])")
    elif "device" in kind:
        raise ClusterError(f"{where}.device: only a measured kind ('profile': FILE) has one")
    else:
        _number(kind, "flops_per_s", where, FLOPS_PER_S, "FLOP per second")
        _number(kind, "memory_bytes", where, MEMORY_BYTES, "a whole number of bytes",
                integral=True)


def _model(model: Any) -> None:
    _keys(_object(model, "cluster.model", "an object (flops.BertShape's fields)"), MODEL_KEYS,
          "cluster.model")
    family = model.get("family", "bert")
    if family not in FAMILIES:
        raise ClusterError(f"cluster.model.family={_show(family)}: expected one of "
                           f"{', '.join(FAMILIES)}")
    own = {f.name for f in dataclasses.fields(BertShape if family == "bert" else DecoderShape)}
    for key in MODEL_KEYS:
        if key in model and key not in own | {"family", "granularity", "bytes_per_value"}:
            raise ClusterError(f"cluster.model.{key}: not a field of the {family} model "
                               f"(flops.{'BertShape' if family == 'bert' else 'DecoderShape'})")
    for key in ("tied", "bias"):
        if key in model and not isinstance(model[key], bool):
            raise ClusterError(f"cluster.model.{key}={_show(model[key])}: expected true or false")
    for key in SHAPE_KEYS:
        if key in model:
            lo = 0 if key in ("kv_heads", "head_dim") else 1
            hi = MAX_LAYERS if key == "layers" else MAX_SIZE
            _integer(model[key], f"cluster.model.{key}", lo, hi, f"an integer in [{lo}, {hi}]")
    if "granularity" in model and model["granularity"] not in GRANULARITIES:
        raise ClusterError(f"cluster.model.granularity={_show(model['granularity'])}: expected "
                           f"one of {', '.join(GRANULARITIES)}")
    value = model.get("bytes_per_value", BYTES_PER_VALUE[-1])
    if isinstance(value, bool) or not isinstance(value, int) or value not in BYTES_PER_VALUE:
        raise ClusterError(f"cluster.model.bytes_per_value={_show(value)}: "
                           f"expected {' or '.join(map(str, BYTES_PER_VALUE))}")


def _regions(regions: Any, kinds: dict) -> int:
    _object(regions, "cluster.regions", "an object of regions")
    if not regions:
        raise ClusterError("cluster.regions: expected an object of regions, got none")
    total = 0
    for region, counts in regions.items():
        where = f"cluster.regions.{region}"
        _object(counts, where, "{kind: count}")
        for kind, count in counts.items():
            if kind not in kinds:
                near = difflib.get_close_matches(str(kind), list(kinds), n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise ClusterError(f"{where}.{kind}: no such kind in cluster.kinds "
                                   f"({', '.join(kinds)}){hint}")
            total += _integer(count, f"{where}.{kind}", 0, MAX_DEVICES,
                              f"a count of devices (an integer in [0, {MAX_DEVICES}])")
            if total > MAX_DEVICES:
                raise ClusterError(f"{where}.{kind}={count}: the cluster's regions hold "
                                   f"more than {MAX_DEVICES} devices, the most composed")
    if not total:
        raise ClusterError("cluster.regions: no devices")
    return total


def _link(x: Any, where: str) -> None:
    _keys(_object(x, where, "{'latency_s': ..., 'bandwidth_Bps': ...}"),
          PAIR_KEYS if where.startswith("cluster.links.between") else LINK_KEYS, where)
    _number(x, "latency_s", where, LATENCY_S, "seconds")
    _number(x, "bandwidth_Bps", where, BANDWIDTH_BPS, "bytes per second")


def _links(links: Any, regions: list[str]) -> None:
    _keys(_object(links, "cluster.links", "an object"), LINKS_KEYS, "cluster.links")
    _link(_get(links, "inside", "cluster.links"), "cluster.links.inside")
    if "default" in links:
        _link(links["default"], "cluster.links.default")
    between = links.get("between", [])
    if not isinstance(between, list):
        raise ClusterError(f"cluster.links.between={_show(between)}: expected a list of "
                           "{'regions': [A, B], 'latency_s': ..., 'bandwidth_Bps': ...}")
    seen: dict[frozenset, int] = {}
    for i, b in enumerate(between):
        where = f"cluster.links.between[{i}]"
        _link(b, where)
        rs = _get(b, "regions", where)
        if not (isinstance(rs, list) and len(rs) == 2 and all(isinstance(r, str) for r in rs)
                and rs[0] != rs[1] and all(r in regions for r in rs)):
            raise ClusterError(f"{where}.regions={_show(rs)}: expected two distinct regions of "
                               f"cluster.regions ({', '.join(regions)})")
        pair = frozenset(rs)
        if pair in seen:
            raise ClusterError(f"{where}.regions={_show(rs)}: the pair is listed already, at "
                               f"cluster.links.between[{seen[pair]}]: list each pair once")
        seen[pair] = i
