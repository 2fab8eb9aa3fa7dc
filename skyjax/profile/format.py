"""profile.json: reading, checking and writing (version 2; version 1 files are still read).
docs/design.md, "profile.json", specifies the format; this module is its one reader and writer.

``Profile.from_json`` checks every field and raises :class:`ProfileError` naming the offending
one (``profile.forward_s[3][1]: negative time -0.2``); unknown keys are kept in
``Profile.extra`` (unknown keys of ``links`` under ``extra["links"]``) and written back by
``to_json``. A version 1 file has no fixed costs (``overheads``) or update times (``update_s``):
they read as 0, and its unit times carry the call costs, as they were measured.

``model`` (optional, :data:`MODEL_KEYS`) records what the unit times were measured for besides
the micro-batch. :func:`check_measured_for` refuses a profile given to a run of another model or
micro-batch, since the same unit and device counts would otherwise plan from another model's
times; profiles without the record (older files, hand-built or FLOP-model ones) cannot be
checked and are read as before.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from skyjax.jsonio import write_json_atomic
from skyjax.names import CODECS, OUTER_COMPRESSIONS
from skyjax.relax import EXACT, Relaxation

VERSION = 2
READABLE_VERSIONS = (1, 2)
_TOP_KEYS = ("version", "microbatch", "units", "devices", "forward_s", "backward_s", "links",
             "update_s", "overheads", "codecs", "model", "backward_weight_s",
             "backward_input_s")
OVERHEAD_KEYS = ("forward_call_s", "backward_call_s", "update_call_s", "message_s", "input_s")
_UNIT_FIELDS = ("state_bytes", "activation_bytes", "output_bytes")
# 0 where absent (profiles made before it existed; a unit sharing no tensor)
_OPTIONAL_UNIT_FIELDS = ("temp_bytes", "tied_bytes")
_LINK_KEYS = ("latency_s", "bandwidth_Bps")
# The model record: integers (the shape, Hugging Face's names) and strings (how it computes and
# how it is cut into units). num_labels is left out: the head's size barely moves a time, and a
# profile serves every task of one model.
MODEL_INT_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "max_position_embeddings", "type_vocab_size")
MODEL_STR_KEYS = ("hidden_act", "attention", "compute_dtype", "granularity")
MODEL_KEYS = MODEL_INT_KEYS + MODEL_STR_KEYS


class ProfileError(ValueError):
    """A malformed profile; the message names the field."""


@dataclasses.dataclass
class Profile:
    """A validated profile; matrices are float64 numpy arrays."""

    version: int
    microbatch: dict
    units: list[dict]
    devices: list[dict]
    forward_s: np.ndarray  # [U, D]
    backward_s: np.ndarray  # [U, D]
    latency_s: np.ndarray  # [D, D]
    bandwidth_Bps: np.ndarray  # [D, D]
    extra: dict = dataclasses.field(default_factory=dict)
    # version 2 (zeros when absent): the optimizer update of each unit per step, [U, D]; fixed
    # seconds per call (forward / backward / update action of a stage) and per message sent or
    # received, [D] each; the step's end-of-step synchronisation (gradient-norm all-reduce).
    update_s: np.ndarray | None = None
    forward_call_s: np.ndarray | None = None
    backward_call_s: np.ndarray | None = None
    update_call_s: np.ndarray | None = None
    message_s: np.ndarray | None = None
    sync_s: float = 0.0
    # putting one micro-batch's step inputs on the device, [D] (skyjax.profile.inputs); absent in
    # files of profiler version 10 and before (read as 0)
    input_s: np.ndarray | None = None
    # hand-off codecs (skyjax.codecs) measured, by name: ``output_bytes`` [U], each unit's
    # output carry on the wire, and ``seconds_per_byte`` [D], a device's encode + decode time
    # of one message per byte of the uncoded carry (the profiler measures the codecs that the
    # run's relaxation bound allows; none by default)
    codecs: dict = dataclasses.field(default_factory=dict)
    # the relaxation the planner may choose within (skyjax.relax; not part of the file: plan()
    # sets it from its argument)
    relax: Relaxation = EXACT
    # what the times were measured for (MODEL_KEYS, :func:`model_record`); None: not recorded
    model: dict | None = None
    # [U, D] W of a zero-bubble schedule: the parameter-gradient half of each unit's backward
    # (StageProgram.backward_weight), measured where the run's schedule splits the backward;
    # None: not measured (the planner takes half of backward_s, skyjax.plan.pricing.passes.weight_s)
    backward_weight_s: np.ndarray | None = None
    # [U, D] B of a zero-bubble schedule: the input-gradient half of each unit's backward
    # (StageProgram.backward_input), measured beside backward_weight_s; None: not measured (the
    # planner takes backward_s less W, skyjax.plan.pricing.passes.input_s)
    backward_input_s: np.ndarray | None = None

    def __post_init__(self):
        u, d = np.shape(self.forward_s)
        if self.update_s is None:
            self.update_s = np.zeros((u, d))
        for k in OVERHEAD_KEYS:
            if getattr(self, k) is None:
                setattr(self, k, np.zeros(d))

    @property
    def has_overheads(self) -> bool:
        """Whether fixed costs were measured (a version 2 profile with ``overheads``)."""
        return bool(self.sync_s or self.update_s.any() or
                    any(getattr(self, k).any() for k in OVERHEAD_KEYS))

    @property
    def num_units(self) -> int:
        return len(self.units)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @classmethod
    def from_json(cls, d: Any) -> "Profile":
        """Validates a parsed profile.json object; raises ProfileError."""
        return _parse(d)

    def to_json(self) -> dict:
        """The profile as a JSON-serialisable dict (version 2)."""
        extra = dict(self.extra)
        link_extra = extra.pop("links", {})
        links = {"latency_s": self.latency_s.tolist(), "bandwidth_Bps": self.bandwidth_Bps.tolist()}
        links.update(link_extra if isinstance(link_extra, dict) else {})
        out = {
                "version": self.version,
                "microbatch": dict(self.microbatch),
                "units": [dict(u) for u in self.units],
                "devices": [dict(dv) for dv in self.devices],
                "forward_s": self.forward_s.tolist(),
                "backward_s": self.backward_s.tolist(),
                "links": links,
                "update_s": self.update_s.tolist(),
                "overheads": {**{k: getattr(self, k).tolist() for k in OVERHEAD_KEYS},
                              "sync_s": float(self.sync_s)},
        }
        if self.model is not None:
            out["model"] = dict(self.model)
        if self.backward_weight_s is not None:
            out["backward_weight_s"] = np.asarray(self.backward_weight_s, float).tolist()
        if self.backward_input_s is not None:
            out["backward_input_s"] = np.asarray(self.backward_input_s, float).tolist()
        if self.codecs:
            out["codecs"] = {name: {"output_bytes": [int(x) for x in c["output_bytes"]],
                                    "seconds_per_byte": [float(x) for x in
                                                         c["seconds_per_byte"]]}
                             for name, c in self.codecs.items()}
        out.update(extra)
        return out


def load_profile(path: str) -> Profile:
    """Reads and validates a profile file; unreadable or invalid JSON is a ProfileError."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise ProfileError(f"profile: cannot read {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ProfileError(
            f"profile: {path} is not valid JSON: {e.msg} at line {e.lineno}") from None
    return Profile.from_json(data)


def save_profile(profile: Profile, path: str) -> None:
    """Writes the profile atomically (temporary file + rename)."""
    write_json_atomic(profile.to_json(), path)


# ---------------------------------------------------------------- validation


def _fail(field: str, msg: str) -> None:
    raise ProfileError(f"profile.{field}: {msg}")


def _get(obj: dict, key: str, field: str) -> Any:
    if key not in obj:
        _fail(field, "missing")
    return obj[key]


def _number(x: Any, field: str, what: str = "value", allow_inf: bool = False) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        _fail(field, f"expected a number, got {type(x).__name__} {x!r}")
    v = float(x)
    if math.isnan(v) or (math.isinf(v) and not (allow_inf and v > 0)):
        _fail(field, f"not a finite number ({x})")
    if v < 0:
        _fail(field, f"negative {what} {x}")
    return v


def _list(x: Any, field: str, n: int | None = None, what: str = "entries") -> list:
    if not isinstance(x, list):
        _fail(field, f"expected a list, got {type(x).__name__}")
    if n is not None and len(x) != n:
        _fail(field, f"expected {n} {what}, got {len(x)}")
    return x


def _matrix(x: Any, field: str, rows: int, cols: int, row_what: str, col_what: str,
            what: str, allow_inf: bool = False) -> np.ndarray:
    _list(x, field, rows, f"rows ({row_what})")
    out = np.empty((rows, cols), dtype=np.float64)
    for i, row in enumerate(x):
        _list(row, f"{field}[{i}]", cols, f"columns ({col_what})")
        for j, v in enumerate(row):
            out[i, j] = _number(v, f"{field}[{i}][{j}]", what, allow_inf)
    return out


def _records(x: Any, field: str, fields: tuple[str, ...],
             optional: tuple[str, ...] = ()) -> list[dict]:
    _list(x, field)
    if not x:
        _fail(field, "empty")
    out = []
    for i, rec in enumerate(x):
        if not isinstance(rec, dict):
            _fail(f"{field}[{i}]", f"expected an object, got {type(rec).__name__}")
        name = _get(rec, "name", f"{field}[{i}].name")
        if not isinstance(name, str):
            _fail(f"{field}[{i}].name", f"expected a string, got {type(name).__name__}")
        for k in fields:
            _number(_get(rec, k, f"{field}[{i}].{k}"), f"{field}[{i}].{k}", "size")
        for k in optional:
            if k in rec:
                _number(rec[k], f"{field}[{i}].{k}", "size")
        out.append(dict(rec))
    return out


def _parse(d: Any) -> Profile:
    if not isinstance(d, dict):
        raise ProfileError(f"profile: expected a JSON object, got {type(d).__name__}")
    version = _get(d, "version", "version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        _fail("version", f"unsupported version {version!r} (expected one of {READABLE_VERSIONS})")
    mb = _get(d, "microbatch", "microbatch")
    if not isinstance(mb, dict):
        _fail("microbatch", f"expected an object, got {type(mb).__name__}")
    for k in ("size", "seq_len"):
        v = _get(mb, k, f"microbatch.{k}")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            _fail(f"microbatch.{k}", f"expected a positive integer, got {v!r}")
    units = _records(_get(d, "units", "units"), "units", _UNIT_FIELDS, _OPTIONAL_UNIT_FIELDS)
    devices = _records(_get(d, "devices", "devices"), "devices", ("memory_bytes",))
    n_u, n_d = len(units), len(devices)
    fwd = _matrix(_get(d, "forward_s", "forward_s"), "forward_s", n_u, n_d, "one per unit",
                  "one per device", "time")
    bwd = _matrix(_get(d, "backward_s", "backward_s"), "backward_s", n_u, n_d, "one per unit",
                  "one per device", "time")
    links = _get(d, "links", "links")
    if not isinstance(links, dict):
        _fail("links", f"expected an object, got {type(links).__name__}")
    lat = _matrix(_get(links, "latency_s", "links.latency_s"), "links.latency_s", n_d, n_d,
                  "one per device", "one per device", "latency")
    bw = _matrix(_get(links, "bandwidth_Bps", "links.bandwidth_Bps"), "links.bandwidth_Bps", n_d,
                 n_d, "one per device", "one per device", "bandwidth", allow_inf=True)
    extra = {k: v for k, v in d.items() if k not in _TOP_KEYS}
    link_extra = {k: v for k, v in links.items() if k not in _LINK_KEYS}
    if link_extra:
        extra["links"] = link_extra
    split = {k: _matrix(d[k], k, n_u, n_d, "one per unit", "one per device", "time")
             for k in ("backward_weight_s", "backward_input_s") if k in d}
    upd = None
    if "update_s" in d:
        upd = _matrix(d["update_s"], "update_s", n_u, n_d, "one per unit", "one per device",
                      "time")
    over = d.get("overheads", {})
    if not isinstance(over, dict):
        _fail("overheads", f"expected an object, got {type(over).__name__}")
    fixed = {k: np.array([_number(x, f"overheads.{k}[{i}]", "time")
                          for i, x in enumerate(_list(over[k], f"overheads.{k}", n_d,
                                                      "entries (one per device)"))])
             for k in OVERHEAD_KEYS if k in over}
    sync = _number(over["sync_s"], "overheads.sync_s", "time") if "sync_s" in over else 0.0
    return Profile(version=VERSION, microbatch=dict(mb), units=units, devices=devices,
                   forward_s=fwd, backward_s=bwd, latency_s=lat, bandwidth_Bps=bw, extra=extra,
                   update_s=upd, sync_s=sync, codecs=_codecs(d.get("codecs", {}), n_u, n_d),
                   model=_model(d["model"]) if "model" in d else None,
                   **split, **fixed)


def _model(x: Any) -> dict:
    if not isinstance(x, dict):
        _fail("model", f"expected an object, got {type(x).__name__}")
    for k in MODEL_INT_KEYS:
        if k in x and (isinstance(x[k], bool) or not isinstance(x[k], int) or x[k] < 1):
            _fail(f"model.{k}", f"expected a positive integer, got {x[k]!r}")
    for k in MODEL_STR_KEYS:
        if k in x and not isinstance(x[k], str):
            _fail(f"model.{k}", f"expected a string, got {x[k]!r}")
    return dict(x)  # unknown keys kept (a newer profiler's)


def _codecs(x: Any, n_u: int, n_d: int) -> dict:
    if not isinstance(x, dict):
        _fail("codecs", f"expected an object, got {type(x).__name__}")
    out = {}
    for name, c in x.items():
        if name not in CODECS + OUTER_COMPRESSIONS[1:] or name == "none":
            _fail(f"codecs.{name}", f"unknown codec (expected one of "
                                    f"{CODECS[1:] + OUTER_COMPRESSIONS[1:]})")
        if not isinstance(c, dict):
            _fail(f"codecs.{name}", f"expected an object, got {type(c).__name__}")
        out[name] = {
            "output_bytes": np.array([_number(v, f"codecs.{name}.output_bytes[{i}]", "size")
                                      for i, v in enumerate(_list(
                                          _get(c, "output_bytes", f"codecs.{name}.output_bytes"),
                                          f"codecs.{name}.output_bytes", n_u,
                                          "entries (one per unit)"))]),
            "seconds_per_byte": np.array([
                _number(v, f"codecs.{name}.seconds_per_byte[{i}]", "time")
                for i, v in enumerate(_list(
                    _get(c, "seconds_per_byte", f"codecs.{name}.seconds_per_byte"),
                    f"codecs.{name}.seconds_per_byte", n_d, "entries (one per device)"))])}
    return out


# ---------------------------------------------------------------- what it was measured for


def model_record(shape: Mapping[str, Any], *, attention: str, compute_dtype: str,
                 granularity: str) -> dict:
    """The ``model`` record of a workload: :data:`MODEL_INT_KEYS` and ``hidden_act`` from
    ``shape`` (a ``BertConfig`` as a dict, ``config.model`` or a pretrained ``config.json``;
    keys it lacks are left out and so not compared), and how the model computes and is cut."""
    out = {k: shape[k] for k in (*MODEL_INT_KEYS, "hidden_act") if k in shape}
    out.update(attention=attention, compute_dtype=compute_dtype, granularity=granularity)
    return out


def check_measured_for(profile: Profile, record: Mapping[str, Any], microbatch: tuple[int, int],
                       where: str, keys: Mapping[str, str]) -> bool:
    """Raises :class:`ProfileError` when ``profile`` (given as ``where``, e.g.
    ``config.profile.path='p.json'``) was measured for another model or micro-batch than the
    run's ``record`` and ``microbatch`` (size, seq_len); ``keys`` names the config key setting
    each value, for the message. Keys missing on either side are not compared (an older record,
    or a value not known yet). Returns False when the profile has no record (not checked)."""
    if profile.model is None:
        return False
    fix = "profile again (leave config.profile.path empty) or give a profile of this run's model"
    for k in MODEL_KEYS:
        if k in profile.model and k in record and profile.model[k] != record[k]:
            raise ProfileError(f"{where} was measured for {k}={profile.model[k]!r}; this run has "
                               f"{k}={record[k]!r} ({keys.get(k, k)}): {fix}")
    theirs = (profile.microbatch["size"], profile.microbatch["seq_len"])
    if theirs != tuple(microbatch):
        raise ProfileError(f"{where} was measured with micro-batches of {theirs[0]} x {theirs[1]} "
                           f"(size x seq_len); this run's are {microbatch[0]} x {microbatch[1]} "
                           f"({keys.get('microbatch', 'micro-batch')}): {fix}")
    return True


def config_keys(config: Any) -> dict[str, str]:
    """For :func:`check_measured_for`: the config key that sets each value of a run."""
    shape = (f"config.json of config.model.pretrained={config.model.pretrained!r}"
             if config.model.pretrained else None)
    out = {k: shape or f"config.model.{k}" for k in (*MODEL_INT_KEYS, "hidden_act")}
    out.update(attention="config.model.attention", compute_dtype="config.train.compute_dtype",
               granularity="config.allocation.granularity",
               microbatch="config.data.batch_size / config.pipeline.microbatches x "
                          "config.data.seq_len")
    return out


def run_microbatch(config: Any) -> tuple[int, int]:
    """A run's micro-batch (size, seq_len): ``data.batch_size / pipeline.microbatches`` x
    ``data.seq_len`` (what :class:`skyjax.profile.chain.Workload` profiles; here without JAX)."""
    size = int(config.data.batch_size) // max(int(config.pipeline.microbatches), 1)
    return max(size, 1), int(config.data.seq_len)
