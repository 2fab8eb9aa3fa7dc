"""A profile as text: :func:`summary_table` (what ``python -m skyjax.profile`` prints at the end)
and the number formats of the profiler's progress lines. No JAX."""

from __future__ import annotations

from skyjax.profile.format import Profile


def fmt_s(s: float) -> str:
    """Seconds, aligned for a column: ms below 10 s."""
    return f"{s * 1e3:8.2f} ms" if s < 10 else f"{s:8.2f} s "


def fmt_b(b: float) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{int(b)} B"


def summary_table(prof: Profile) -> str:
    """A short text table: per device its total forward+backward time over all units, memory,
    and its speed relative to the fastest; then per unit kind its bytes; then the links' range."""
    total = (prof.forward_s + prof.backward_s).sum(axis=0)
    fastest = float(total.min()) if total.size else 1.0
    lines = [f"{'device':<16} {'kind':<10} {'slowdown':>8} {'fwd+bwd (all units)':>20} "
             f"{'rel':>6} {'memory':>10}"]
    for d, dev in enumerate(prof.devices):
        lines.append(f"{dev['name']:<16} {str(dev.get('kind', '')):<10} "
                     f"{dev.get('slowdown', 1):>8g} {fmt_s(float(total[d])):>20} "
                     f"{float(total[d]) / fastest:>6.2f} {fmt_b(dev['memory_bytes']):>10}")
    seen = set()
    lines.append(f"{'unit':<22} {'count':>5} {'state':>10} {'activations':>12} {'output':>10}")
    for u in prof.units:
        kind = u.get("kind", u["name"])
        if kind in seen:
            continue
        seen.add(kind)
        count = sum(1 for v in prof.units if v.get("kind", v["name"]) == kind)
        lines.append(f"{u['name']:<22} {count:>5} {fmt_b(u['state_bytes']):>10} "
                     f"{fmt_b(u['activation_bytes']):>12} {fmt_b(u['output_bytes']):>10}")
    n = prof.num_devices
    if n > 1:
        off = [(i, j) for i in range(n) for j in range(n) if i != j]
        lat = [prof.latency_s[i, j] for i, j in off]
        bw = [prof.bandwidth_Bps[i, j] for i, j in off]
        lines.append(f"links: latency {min(lat) * 1e6:.1f}-{max(lat) * 1e6:.1f} us, bandwidth "
                     f"{min(bw) / 1e9:.3g}-{max(bw) / 1e9:.3g} GB/s")
    return "\n".join(lines)
