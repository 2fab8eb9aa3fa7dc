"""A profile as text: :func:`summary_table` (what ``python -m skyjax.profile`` prints at the end)
and the number formats of the profiler's progress lines. No JAX.

The table has three parts: the devices (time for one micro-batch through every unit, forward and
backward, relative to the fastest; memory), the distinct units (count, bytes, time on the
fastest device, share of the model's time), and the links' range. The slowest device and the
unit kind that takes most of the time are marked, with totals under each part.
"""

from __future__ import annotations

import numpy as np

from skyjax.profile.format import Profile
from skyjax.report.text_table import fmt_bytes, fmt_time, render, time_unit


fmt_b = fmt_bytes


def device_table(prof: Profile) -> str:
    fwd, bwd = prof.forward_s.sum(axis=0), prof.backward_s.sum(axis=0)
    total = fwd + bwd
    fastest = float(np.nanmin(total)) if total.size else 1.0
    unit = time_unit(float(np.nanmax(total)) if total.size else 1.0)
    slowest = int(np.nanargmax(total)) if total.size else -1
    rows, notes = [], []
    for d, dev in enumerate(prof.devices):
        rows.append((str(d), dev["name"], str(dev.get("kind", "")), f"{dev.get('slowdown', 1):g}",
                     fmt_time(float(fwd[d]), unit), fmt_time(float(bwd[d]), unit),
                     fmt_time(float(total[d]), unit), f"{float(total[d]) / fastest:.2f}x",
                     fmt_bytes(float(dev["memory_bytes"]))))
        notes.append("slowest" if d == slowest and prof.num_devices > 1 else "")
    # No memory total: devices of one host may report the same shared RAM.
    tot = ("total", f"{prof.num_devices} devices", "", "", "", "", "", "", "")
    return render(("#", "device", "kind", "slow-down", "forward", "backward", "fwd+bwd",
                   "relative", "memory"), rows,
                  right=(True, False, False, True, True, True, True, True, True), total=tot,
                  notes=notes)


def unit_table(prof: Profile) -> str:
    """One row per unit kind (identical units counted), on the fastest device."""
    total = (prof.forward_s + prof.backward_s)
    best = int(np.nanargmin(total.sum(axis=0))) if total.size else 0
    per_unit = total[:, best] if total.size else np.zeros(0)
    kinds: dict[str, list[int]] = {}
    for u, rec in enumerate(prof.units):
        kinds.setdefault(rec.get("kind", rec["name"]), []).append(u)
    whole = float(per_unit.sum()) or 1.0
    unit = time_unit(float(per_unit.max()) if per_unit.size else 1.0)
    rows, notes, shares = [], [], []
    for kind, us in kinds.items():
        first = prof.units[us[0]]
        t = float(per_unit[us].sum())
        shares.append(t)
        rows.append((first["name"] + (" (and alike)" if len(us) > 1 else ""), str(len(us)),
                     fmt_bytes(first["state_bytes"]), fmt_bytes(first["activation_bytes"]),
                     fmt_bytes(first["output_bytes"]), fmt_time(float(per_unit[us[0]]), unit),
                     f"{t / whole:.0%}"))
    top = int(np.argmax(shares)) if shares else -1
    if shares and sum(1 for x in shares if x >= shares[top] * 0.999) > 1:
        top = -1  # a tie: nothing stands out
    notes = ["most of the time" if k == top and len(rows) > 1 else "" for k in range(len(rows))]
    tot = ("total", str(prof.num_units),
           fmt_bytes(sum(float(u["state_bytes"]) for u in prof.units)),
           fmt_bytes(sum(float(u["activation_bytes"]) for u in prof.units)), "",
           fmt_time(whole), "100%")
    return render(("unit", "count", "state", "activations", "output",
                   f"fwd+bwd on {prof.devices[best]['name']}", "share"), rows,
                  right=(False, True, True, True, True, True, True), total=tot, notes=notes)


def summary_table(prof: Profile) -> str:
    """The devices, the distinct units and the links (module doc); times per micro-batch of
    ``prof.microbatch``."""
    mb = prof.microbatch or {}
    shape = f" of {mb['size']} x {mb['seq_len']}" if {"size", "seq_len"} <= set(mb) else ""
    lines = [f"devices: one micro-batch{shape} through all {prof.num_units} units",
             device_table(prof), "", "units (state = params + grads + optimizer state; "
             "activations kept per micro-batch in flight)", unit_table(prof)]
    n = prof.num_devices
    if n > 1:
        off = [(i, j) for i in range(n) for j in range(n) if i != j]
        lat = [prof.latency_s[i, j] for i, j in off]
        bw = [prof.bandwidth_Bps[i, j] for i, j in off]
        lines += ["", f"links: latency {min(lat) * 1e6:.1f} - {max(lat) * 1e6:.1f} us, "
                      f"bandwidth {min(bw) / 1e9:.3g} - {max(bw) / 1e9:.3g} GB/s"]
    return "\n".join(lines)
