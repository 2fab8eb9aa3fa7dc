"""The value rules every config check is built from: one line each, and each raises
``ValueError`` with a message that starts with the key it checks.

Reason: a check reads as the rule it enforces (``at_least("config.train.steps", t.steps, 1)``),
and every failure names its key in the same words, whichever check found it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NoReturn

NUMBER = (int, float)


def fail(msg: str) -> NoReturn:
    """Raises the config error ``msg`` (which names the offending key)."""
    raise ValueError(msg)


def one_of(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        fail(f"{name}={value!r} is not one of {', '.join(map(repr, allowed))}")


def at_least(name: str, value: float, low: float) -> None:
    if not value >= low:
        fail(f"{name}={value!r} must be >= {low}")


def positive(name: str, value: float) -> None:
    if not value > 0:
        fail(f"{name}={value!r} must be > 0")


def probability(name: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        fail(f"{name}={value!r} must be in [0, 1)")


def per_device(name: str, values: Sequence[Any], num_devices: int, kind: type | tuple) -> None:
    """A tuple with one entry per device (or none), each of type ``kind`` and finite."""
    if kind is not str and len(values) == 1 and isinstance(values[0], str):
        _unparsed(name, values[0])
    if len(values) not in (0, num_devices):
        fail(f"{name} has {len(values)} entries but config.cluster.num_devices={num_devices} "
             "(give one per device, or () for none)")
    for i, v in enumerate(values):
        if not isinstance(v, kind) or isinstance(v, bool):
            fail(f"{name}[{i}]={v!r} has type {type(v).__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            fail(f"{name}[{i}]={v!r} must be a finite number")


def _unparsed(name: str, text: str) -> NoReturn:
    """A numeric tuple flag that is no Python literal (``(1,nan)``: ``nan`` is a name, not a
    number) reaches the config as one string: name the entry that is not a number, not the
    count of one."""
    for item in text.strip("()[] ").split(","):
        try:
            ok = math.isfinite(float(item))
        except ValueError:
            ok = False
        if not ok:
            fail(f"{name}: {item.strip()!r} in {text!r} is not a finite number")
    fail(f"{name}={text!r} is not a tuple of numbers")
