"""Pictures of a plan and of a pipeline step (matplotlib, imported only when drawing).

* :func:`plan_figure` (``WORKDIR/plan.png``, ``python -m skyjax.plan --plot``): one row per
  stage across three panels: the block of units the stage's device holds, along the model; its
  time per micro-batch, predicted (compute + comm) beside measured (compute + the smallest
  hand-off gap seen, when a measured step is given), with the bottleneck marked; its memory as a
  share of the device's capacity.
* :func:`timeline_figure` (``WORKDIR/timeline.png``, ``python -m skyjax.plan --timeline``): the
  measured step's forward / backward (zero bubble: also W, in its own colour) spans per stage
  above the simulated schedule of the same plan; with several pipelines also each stage's
  gradient exchange, phase by phase, and a relaxed averaging's outer steps, each kind in its own
  colour. A panel is as long as its step (measured: the step as the executor ran it; simulated:
  the simulator's step, its synchronisation included); the grey is where a stage neither
  computes nor exchanges (the bubbles, and the wait for the slowest pipeline).

Both size themselves by the number of stages (4 to 64 rows stay readable). Figures are built
with ``matplotlib.figure.Figure`` (no pyplot, no global state), so they work under any backend,
in a notebook and in threads. No JAX.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from skyjax.names import ZERO_BUBBLE
from skyjax.plan.replay.simulate import simulate_plan
from skyjax.plan.model.types import Plan
from skyjax.profile.format import Profile
from skyjax.spans import EXCHANGE_KINDS, KIND_NAMES, OUTER as OUTER_KIND, Span, passes

FORWARD, BACKWARD, IDLE = "#4c78a8", "#f58518", "#e8e8e8"
WEIGHT = "#b279a2"  # zero bubble's W passes (weight gradients; B is BACKWARD)
# several pipelines: the exchange's phases (skyjax.spans.EXCHANGE_KINDS) and the outer step
EXCHANGE = {"X1": "#72b7b2", "X2": "#e45756", "X3": "#54a24b"}
OUTER = "#eeca3b"
KIND_COLORS = {"F": FORWARD, "B": BACKWARD, "W": WEIGHT, **EXCHANGE, OUTER_KIND: OUTER}
PREDICTED, MEASURED, COMM, MARK = "#4c78a8", "#54a24b", "#9ecae9", "#d62728"


@dataclasses.dataclass
class Measured:
    """Per stage, what a measured step shows (:func:`measure_stages`): compute per micro-batch
    (its forward and backward spans / m) and the hand-off time to and from the next stage (the
    smallest gap between a stage's action ending and the next stage's matching one starting, in
    each direction: transfer plus receive, without queueing; 0 for the last stage)."""

    compute_s: list[float]
    comm_s: list[float]
    step_s: float
    memory_bytes: list[float | None] | None = None


def measure_stages(spans: Sequence[Span], num_stages: int, microbatches: int,
                   window: tuple[float, float] | None = None) -> Measured:
    """:class:`Measured` from one step's spans (``StepMetrics.results[*].spans``; only the
    passes count); the step is ``window``'s length where given (``StepMetrics.window``), else
    the spans'."""
    spans = passes(spans)
    busy = [0.0] * num_stages
    ends: dict[tuple[str, int, int], tuple[float, float]] = {}
    for s in spans:
        busy[s.stage] += s.end - s.start
        ends[(s.kind, s.stage, s.microbatch)] = (s.start, s.end)
    comm = []
    for k in range(num_stages - 1):
        fwd = [ends[("F", k + 1, i)][0] - ends[("F", k, i)][1] for i in range(microbatches)
               if ("F", k, i) in ends and ("F", k + 1, i) in ends]
        bwd = [ends[("B", k, i)][0] - ends[("B", k + 1, i)][1] for i in range(microbatches)
               if ("B", k, i) in ends and ("B", k + 1, i) in ends]
        comm.append(max(min(fwd, default=0.0), 0.0) + max(min(bwd, default=0.0), 0.0))
    comm.append(0.0)
    step = max((s.end for s in spans), default=0.0) - min((s.start for s in spans), default=0.0)
    if window is not None:
        step = window[1] - window[0]
    return Measured([b / max(microbatches, 1) for b in busy], comm[:num_stages], step)


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _sizes(rows: int) -> tuple[float, float]:
    """(inches per row, font size) so that 4 rows are roomy and 64 still legible."""
    return min(0.45, max(0.17, 10.0 / max(rows, 1))), max(5.5, min(9.0, 10.0 - rows / 12))


def _time_scale(seconds: float) -> tuple[float, str]:
    return (1.0, "s") if seconds >= 1 else (1e3, "ms") if seconds >= 1e-3 else (1e6, "us")


def _fmt_bytes(b: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{int(b)} B"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "es" if noun.endswith("h") else "s")


def stage_labels(plan: Plan, profile: Profile) -> list[str]:
    """``"0: proc0:cpu0"`` per stage: stage index and its device's name (with several
    pipelines ``"2: P1 proc0:cpu2"``: pipeline 1's stage, whose id is 2)."""
    several = plan.num_pipelines > 1
    return [f"{k}: " + (f"P{s.pipeline} " if several else "") + profile.devices[s.device]["name"]
            for k, s in enumerate(plan.stages)]


def _style_rows(ax, labels: Sequence[str], font: float, marked: int | None = None) -> None:
    """Stage rows, stage 0 on top; the ``marked`` stage's label in bold red."""
    ax.set_yticks(range(len(labels)), labels, fontsize=font)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.tick_params(axis="x", labelsize=font)
    ticks = ax.get_yticklabels()
    if marked is not None and marked < len(ticks):
        ticks[marked].set_color(MARK)
        ticks[marked].set_fontweight("bold")


def plan_figure(plan: Plan, profile: Profile, measured: Measured | None = None,
                title: str | None = None):
    """The plan picture (module doc); returns a matplotlib ``Figure``."""
    p, units = len(plan.stages), profile.num_units
    row_h, font = _sizes(p)
    fig = _figure(15.0, max(3.6, 1.6 + row_h * p) + (0.8 if units <= 32 else 0.0))
    axes = fig.subplots(1, 3, sharey=True, gridspec_kw={"width_ratios": [2.0, 1.6, 1.1]})
    times = [s.time_s for s in plan.stages]
    bottleneck = max(range(p), key=times.__getitem__) if p else None
    labels = stage_labels(plan, profile)
    colors = _stage_colors(p)

    ax = axes[0]
    for k, s in enumerate(plan.stages):
        a, b = s.units
        ax.barh(k, b - a, left=a, height=0.8, color=colors[k], edgecolor="white", linewidth=0.5)
        if (b - a) / units >= 0.04 or p <= 8:
            ax.text((a + b) / 2, k, f"{b - a}", ha="center", va="center", fontsize=font,
                    color="black")
    ax.set_xlim(0, units)
    if units <= 32:
        ax.set_xticks([u + 0.5 for u in range(units)],
                      [u["name"] for u in profile.units], rotation=90, fontsize=font)
    ax.set_xlabel(f"units along the model (0..{units}); bar label: units in the stage",
                  fontsize=font + 1)
    ax.set_title("which device holds which units", fontsize=font + 2)
    _style_rows(ax, labels, font, bottleneck)

    ax = axes[1]
    peak = max(times + ([c + h for c, h in zip(measured.compute_s, measured.comm_s)]
                        if measured else []) + [1e-12])
    scale, unit = _time_scale(peak)
    ys = list(range(p))
    h = 0.38 if measured else 0.7
    off = h / 2 if measured else 0.0
    comp = [s.compute_s * scale for s in plan.stages]
    ax.barh([y - off for y in ys], comp, height=h, color=PREDICTED, label="predicted compute")
    ax.barh([y - off for y in ys], [s.comm_s * scale for s in plan.stages], left=comp, height=h,
            color=COMM, label="predicted comm")
    if measured:
        mc = [c * scale for c in measured.compute_s[:p]]
        ax.barh([y + off for y in ys], mc, height=h, color=MEASURED, label="measured compute")
        ax.barh([y + off for y in ys], [c * scale for c in measured.comm_s[:p]], left=mc,
                height=h, color=MEASURED, alpha=0.45, label="measured hand-off")
    if bottleneck is not None:
        ax.axvline(plan.bottleneck_s * scale, color=MARK, linestyle="--", linewidth=1,
                   label=f"bottleneck {plan.bottleneck_s * scale:.3g} {unit}")
    ax.set_xlim(0, peak * scale * 1.06)
    ax.set_xlabel(f"time per micro-batch ({unit})", fontsize=font + 1)
    ax.set_title("stage time (forward + backward + comm)", fontsize=font + 2)
    handles, names = ax.get_legend_handles_labels()
    ax.tick_params(axis="x", labelsize=font)

    ax = axes[2]
    caps = [float(profile.devices[s.device]["memory_bytes"]) or float("nan")
            for s in plan.stages]
    share = [100.0 * s.memory_bytes / c if c == c and c > 0 else 0.0
             for s, c in zip(plan.stages, caps)]
    ax.barh(ys, share, height=0.7, color=PREDICTED, label="predicted")
    top = max(share + [0.0])
    if measured and measured.memory_bytes:
        pts = [(y, 100.0 * m / c) for y, m, c in zip(ys, measured.memory_bytes, caps)
               if m is not None and c == c and c > 0]
        if pts:
            ax.plot([x for _, x in pts], [y for y, _ in pts], "D", color=MEASURED,
                    markersize=4, label="measured peak")
            top = max([top] + [x for _, x in pts])
    full = top > 40  # near capacity: show the whole axis and the 100% line
    limit = 110.0 if full else max(top * (1.9 if p <= 24 else 1.15), 1e-3)
    ax.set_xlim(0, limit)
    if full:
        ax.axvline(100.0, color=MARK, linewidth=1)
    if p <= 24:
        for y, x, s, c in zip(ys, share, plan.stages, caps):
            ax.text(x + limit * 0.01, y, f"{_fmt_bytes(s.memory_bytes)} of {_fmt_bytes(c)}"
                    if c == c else _fmt_bytes(s.memory_bytes), ha="left", va="center",
                    fontsize=font - 0.5)
    ax.set_xlabel("% of device memory" + ("" if full else " (zoomed)"),
                  fontsize=font + 1)
    ax.set_title("memory against capacity", fontsize=font + 2)
    extra = [(h, n) for h, n in zip(*ax.get_legend_handles_labels()) if n != "predicted"]
    fig.legend(handles + [h for h, _ in extra], names + [n for _, n in extra],
               loc="outside lower center", ncols=6, fontsize=font + 0.5)
    ax.tick_params(axis="x", labelsize=font)

    scale, unit = _time_scale(plan.step_time_s)
    head = (f"{plan.strategy} plan, {plan.schedule}, {_count(plan.microbatches, 'micro-batch')}: "
            f"{p} of {profile.num_devices} devices, {units} units; predicted step "
            f"{plan.step_time_s * scale:.3g} {unit}")
    if plan.num_pipelines > 1:
        head += (f" ({plan.num_pipelines} pipelines, shares {plan.pipeline_shares()}, gradient "
                 f"exchange {plan.allreduce_s * scale:.3g} {unit})")
    if measured and measured.step_s:
        head += f", measured {measured.step_s * scale:.3g} {unit}"
    fig.suptitle(title or head + f"; bottleneck (red) stage {bottleneck}", fontsize=font + 3)
    return fig


def _stage_colors(p: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    return [cmap((2 * k) % 20 + (k // 10) % 2) for k in range(p)]


def busy_s(spans: Sequence[Span], lo: float, hi: float) -> float:
    """Seconds of ``[lo, hi]`` that ``spans`` cover (overlaps counted once)."""
    total, reach = 0.0, lo
    for a, b in sorted((max(s.start, lo), min(s.end, hi)) for s in spans):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def _draw_spans(ax, spans: Sequence[Span], p: int, origin: float, length: float, scale: float,
                font: float, label_mb: bool) -> list[float]:
    """Per stage row its exchange and outer-step bars, then its passes over them, each kind in
    its colour (:data:`KIND_COLORS`), on ``[0, length]`` (wider where a span ends later); returns
    each stage's idle share of the step: neither computing nor exchanging."""
    end = max([origin + length] + [s.end for s in spans])
    idle = [1.0] * p
    for k in range(p):
        mine = [s for s in spans if s.stage == k]
        for kind, color in list(EXCHANGE.items()) + [(OUTER_KIND, OUTER), ("F", FORWARD),
                                                     ("B", BACKWARD), ("W", WEIGHT)]:
            bars = [((s.start - origin) * scale, (s.end - s.start) * scale) for s in mine
                    if s.kind == kind]
            if bars:
                ax.broken_barh(bars, (k - 0.4, 0.8), facecolors=color, edgecolor="white",
                               linewidth=0.3 if p <= 16 else 0.0)
        if length > 0:
            idle[k] = max(0.0, 1.0 - busy_s(mine, origin, origin + length) / length)
        if label_mb:
            for s in passes(mine):
                if (s.end - s.start) >= 0.025 * (end - origin):
                    ax.text((s.start + s.end - 2 * origin) / 2 * scale, k, str(s.microbatch),
                            ha="center", va="center", fontsize=font - 1, color="white")
    ax.set_facecolor(IDLE)
    ax.set_xlim(0, (end - origin) * scale)
    if end > origin + length:  # a span past the step's end (another stage's next step)
        ax.axvline(length * scale, color=MARK, linestyle="--", linewidth=1)
    return idle


def timeline_figure(plan: Plan, profile: Profile, measured_spans: Sequence[Span] | None = None,
                    measured_window: tuple[float, float] | None = None):
    """The timeline picture (module doc); returns a matplotlib ``Figure``. ``measured_spans``:
    a step's passes and exchange spans (``StepMetrics.timeline_spans``); ``measured_window``:
    that step's (start, end) (``StepMetrics.window``; None: from its first span's start to its
    last span's end)."""
    from matplotlib.patches import Patch

    p = len(plan.stages)
    row_h, font = _sizes(p)
    sim = simulate_plan(plan, profile)
    panels = [("simulated", list(sim.spans), 0.0, sim.step_time_s)]
    if measured_spans:
        spans = list(measured_spans)
        lo, hi = measured_window or (min(s.start for s in spans), max(s.end for s in spans))
        panels.insert(0, ("measured", spans, lo, hi - lo))
    fig = _figure(13.0, 1.2 + len(panels) * max(1.8, 0.9 + row_h * p))
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    names = stage_labels(plan, profile)
    kinds: set[str] = set()
    for ax, (what, spans, origin, length) in zip(axes, panels):
        kinds.update(s.kind for s in spans)
        scale, unit = _time_scale(length)
        idle = _draw_spans(ax, spans, p, origin, length, scale, font, label_mb=p <= 16)
        _style_rows(ax, [f"{n}  idle {i:.0%}" for n, i in zip(names, idle)], font)
        ax.set_xlabel(f"time in the step ({unit})", fontsize=font + 1)
        mean_idle = sum(idle) / max(p, 1)
        ax.set_title(f"{what} step: {length * scale:.3g} {unit}, stages idle (neither computing "
                     f"nor exchanging) {mean_idle:.0%} on average"
                     + (" (last training step)" if what == "measured" else
                        f" ({plan.schedule}, m = {plan.microbatches})"), fontsize=font + 2)
    zb = plan.schedule in ZERO_BUBBLE
    handles = [Patch(color=FORWARD, label="forward"),
               Patch(color=BACKWARD, label="backward (input gradient)" if zb else "backward")]
    handles += [Patch(color=WEIGHT, label="weight gradient (W)")] if zb else []
    handles += [Patch(color=KIND_COLORS[k], label=KIND_NAMES[k])
                for k in [*EXCHANGE_KINDS, OUTER_KIND] if k in kinds]
    fig.legend(handles=handles + [Patch(color=IDLE, label="waiting (bubble)")],
               fontsize=font + 0.5, loc="outside lower center", ncols=len(handles) + 1)
    fig.suptitle(f"pipeline timeline: {_count(p, 'stage')}, "
                 + (f"{plan.num_pipelines} pipelines (P0 ..), " if plan.num_pipelines > 1
                    else "")
                 + f"{_count(plan.microbatches, 'micro-batch')}"
                 + ("; bar label: micro-batch" if p <= 16 else ""), fontsize=font + 3)
    return fig


def save(fig: Any, path: str) -> str:
    """Writes ``fig`` as PNG to ``path`` (atomically: a partly written picture never shows)."""
    import os

    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".tmp.{os.path.basename(path)}")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path
