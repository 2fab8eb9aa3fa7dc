"""Tables a person reads at a glance (``python -m skyjax.profile`` / ``python -m skyjax.plan``):
aligned columns, numbers right-aligned in one unit per column, a totals row, a marked row.

The number formats live here once, for the tables, the pictures (:mod:`skyjax.report.plots`) and the
progress lines. Pure Python.
"""

from __future__ import annotations

from typing import Sequence

MARK = "<- "  # before the note of a marked row (plain ASCII: logs and terminals alike)


def fmt_bytes(b: float) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1 (``"2.7 MiB"``)."""
    if b != b:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{int(b)} B"


def time_unit(seconds: float) -> tuple[float, str]:
    """``(scale, name)`` of the unit that shows ``seconds`` with 1-3 digits before the point."""
    if seconds >= 1:
        return 1.0, "s"
    if seconds >= 1e-3:
        return 1e3, "ms"
    return 1e6, "us"


def fmt_time(seconds: float, unit: tuple[float, str] | None = None) -> str:
    """``"12.345 ms"``; in ``unit`` when given (so that a column shares one unit)."""
    scale, name = unit or time_unit(seconds)
    return f"{seconds * scale:.3f} {name}"


def render(header: Sequence[str], rows: Sequence[Sequence[str]], *,
           right: Sequence[bool] | None = None, total: Sequence[str] | None = None,
           notes: Sequence[str] | None = None, indent: str = "") -> str:
    """Aligned columns separated by two spaces; ``right[i]``: right-align column i (numbers);
    ``total``: a last row under a rule; ``notes[r]``: text after row r (e.g. the bottleneck
    mark)."""
    body = [list(header)] + [list(r) for r in rows] + ([list(total)] if total else [])
    n = len(header)
    right = list(right) if right is not None else [False] * n
    widths = [max(len(r[i]) for r in body) for i in range(n)]

    def line(r: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if right[i] else c.ljust(w)
                         for i, (c, w) in enumerate(zip(r, widths)))

    out = [indent + line(header).rstrip(), indent + "  ".join("-" * w for w in widths)]
    for k, r in enumerate(rows):
        note = notes[k] if notes and k < len(notes) and notes[k] else ""
        out.append((indent + line(r) + (f"  {MARK}{note}" if note else "")).rstrip())
    if total:
        out.append(indent + "  ".join("-" * w for w in widths))
        out.append((indent + line(total)).rstrip())
    return "\n".join(out)
