"""The config's keys against the schema (:mod:`skyjax.config.defaults`): no unknown key, no
missing one, and each value of its default's type and range.

Reason: this runs before any other check, so the rest may read every key of the schema without
asking whether it is there or what type it has.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import ml_collections

from skyjax.config.rules import NUMBER, fail


def check_keys(config: Mapping[str, Any], schema: Mapping[str, Any], prefix: str) -> None:
    """Unknown and missing keys and value types, recursively (``prefix``: the group's name,
    ``config`` at the top)."""
    for key in config.keys():
        if key not in schema:
            known = ", ".join(sorted(schema.keys()))
            fail(f"{prefix}.{key}: unknown config key (known keys of {prefix}: {known})")
    for key, default in schema.items():
        name = f"{prefix}.{key}"
        if key not in config:
            fail(f"{name}: missing config key")
        value = config[key]
        if isinstance(default, (ml_collections.ConfigDict, dict)):
            if not isinstance(value, (ml_collections.ConfigDict, dict)):
                fail(f"{name}={value!r} must be a group of keys, got {type(value).__name__}")
            check_keys(value, default, name)
        else:
            _check_type(name, value, default)


def _check_type(name: str, value: Any, default: Any) -> None:
    """``value`` has the type of ``default`` (an int passes for a float, a list for a tuple),
    is finite if a float, and fits what the device code takes if an int."""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, NUMBER) and not isinstance(value, bool)
    elif isinstance(default, tuple):
        ok = isinstance(value, (tuple, list))
    else:
        ok = isinstance(value, type(default))
    if not ok:
        fail(f"{name}={value!r} has type {type(value).__name__}, "
             f"expected {type(default).__name__}")
    if isinstance(default, float) and not math.isfinite(value):
        fail(f"{name}={value!r} must be a finite number")
    if isinstance(default, int) and not isinstance(default, bool):
        limit = 2**32 - 1 if name.endswith(".seed") else 2**31 - 1  # what the device code takes
        if abs(value) > limit:
            fail(f"{name}={value} is out of range (at most {limit})")
