"""What a job keeps of its cluster when processes are lost (``python -m skyjax.launch
--max_restarts K``): the surviving processes' per-device config (emulated slow-downs, memory caps,
regions follow the devices they describe) and their rows of the profile, so the restarted job
re-plans on the survivors without profiling again. No JAX: the launcher imports this.

Distributed mode has one process per logical device, so "process ``k``" and "device ``k``" of
``config.cluster`` and of profile.json are the same index; the survivors are renumbered
``0..n-1`` in their old order.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Sequence

import numpy as np

PER_DEVICE_KEYS = ("slowdowns", "memory_caps_bytes", "regions")
# [U, D] fields of a Profile
_UNIT_BY_DEVICE = ("forward_s", "backward_s", "update_s", "backward_weight_s",
                   "backward_input_s")
_DEVICE_BY_DEVICE = ("latency_s", "bandwidth_Bps")  # [D, D]


def parse_main_args(args: Sequence[str]) -> tuple[Any, str | None]:
    """The effective config (file + ``--config.*`` overrides) and ``--workdir`` of
    ``python -m skyjax.main`` arguments; (None, None) when there is no ``--config``."""
    from absl import flags
    from ml_collections import config_flags

    fv = flags.FlagValues()
    argv = ["main", *args]
    config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=False,
                                    sys_argv=argv)
    flags.DEFINE_string("workdir", None, "", flag_values=fv)
    fv(argv, known_only=True)
    if fv["config"].value is None:
        return None, fv["workdir"].value
    return fv["config"].value, fv["workdir"].value


def _without(args: Sequence[str], keys: Sequence[str]) -> list[str]:
    """``args`` minus ``--key=value`` and ``--key value`` occurrences of ``keys``."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in keys:
            skip = "=" not in a
            continue
        out.append(a)
    return out


def survivor_args(args: Sequence[str], survivors: Sequence[int], attempt: int,
                  log=print) -> list[str]:
    """``skyjax.main`` arguments for a job on ``survivors`` (old process indices): per-device
    config entries and (when reusable) profile rows of the survivors only."""
    config, workdir = parse_main_args(args)
    if config is None:
        return list(args)
    c = config.cluster
    keys = ["--config.cluster.num_devices"]
    new = [f"--config.cluster.num_devices={len(survivors)}"]
    for k in PER_DEVICE_KEYS:
        # Always restated, an empty tuple too: the original override is dropped with the others,
        # and an empty one must not let the config file's value (one entry per old device) back.
        values = list(c[k] or ())
        if values and len(values) <= max(survivors):
            continue  # not one entry per device: the job would have refused it; leave it as is
        keys.append(f"--config.cluster.{k}")
        new.append(f"--config.cluster.{k}={tuple(values[i] for i in survivors) if values else ()!r}")
    profile = config.profile.path or (os.path.join(workdir, "profile.json") if workdir else "")
    if workdir and profile and os.path.isfile(profile):
        out = os.path.join(workdir, f"profile_survivors_{attempt}.json")
        try:
            write_survivor_profile(profile, survivors, int(c.num_devices), out)
            keys.append("--config.profile.path")
            new.append(f"--config.profile.path={out}")
            log(f"re-using the survivors' rows of {profile} ({out})")
        except (ValueError, OSError) as e:  # e.g. a profile of another cluster: profile again
            log(f"not re-using {profile} ({e}); the restarted job profiles again")
            if config.profile.path:
                keys.append("--config.profile.path")
                new.append("--config.profile.path=")
    return _without(args, keys) + new


def write_survivor_profile(path: str, survivors: Sequence[int], num_devices: int,
                           out: str) -> None:
    """profile.json restricted to the ``survivors``' devices (renumbered), written to ``out``."""
    from skyjax.profile.format import load_profile, save_profile

    profile = load_profile(path)
    if profile.num_devices != num_devices:
        raise ValueError(f"{path} has {profile.num_devices} devices, the job had {num_devices}")
    keep = list(survivors)
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(profile):
        value = getattr(profile, f.name)
        if f.name in _UNIT_BY_DEVICE and value is not None:
            changes[f.name] = np.asarray(value)[:, keep]
        elif f.name in _DEVICE_BY_DEVICE:
            changes[f.name] = np.asarray(value)[np.ix_(keep, keep)]
        elif isinstance(value, np.ndarray) and value.shape == (num_devices,):
            changes[f.name] = value[keep]
        elif f.name == "codecs":
            changes[f.name] = {name: {**c, "seconds_per_byte": np.asarray(
                c["seconds_per_byte"])[keep]} for name, c in value.items()}

    devices = []
    for new, old in enumerate(keep):
        d = dict(profile.devices[old])
        d["name"] = re.sub(r"^proc\d+", f"proc{new}", str(d.get("name", "")))
        if "process_index" in d:
            d["process_index"] = new
        devices.append(d)
    changes["devices"] = devices
    subset = dataclasses.replace(profile, **changes)
    type(profile).from_json(subset.to_json())  # validates
    save_profile(subset, out)
