"""What a run leaves in its workdir (formats in docs/design.md): ``summary.json``,
``metrics.jsonl`` (and the same records as TensorBoard scalars under ``tensorboard/``),
``trace.json``, ``plan.json``, ``config.json``. Only process 0 writes."""

from __future__ import annotations

import os
import statistics
from typing import Any, Sequence

import jax
import ml_collections
from absl import logging

from skyjax import plan as plan_lib
from skyjax.jsonio import append_jsonl, read_jsonl, write_json_atomic, write_jsonl_atomic
from skyjax.plan.replay import simulate
from skyjax.plan.model.extension import ExtraCost
from skyjax.profile.format import Profile
from skyjax.report.tensorboard import EventWriter
from skyjax.spans import stage_events, step_event, trace_json as trace_file
from skyjax.workdir import aside_dir, set_aside

TENSORBOARD_DIR = "tensorboard"  # event files: tensorboard --logdir WORKDIR/tensorboard
SIMULATED_PID_OFFSET = 10  # simulated rows sit below the measured ones in the trace viewer


class Outputs:
    """The workdir of one run, written by process 0 only (``is_chief``); JSON atomically."""

    def __init__(self, workdir: str, is_chief: bool, resumed_from_step: int = 0):
        """Made once the run's checks, profile and plan have succeeded: the previous run's
        outputs move to ``workdir/previous/`` (``previous.incomplete/`` if that run did not
        finish; :func:`skyjax.workdir.set_aside`). A fresh run starts ``metrics.jsonl`` anew; a
        resumed one keeps its records up to the checkpoint's step (those after it are re-run,
        so they are dropped)."""
        self.workdir, self.is_chief = workdir, is_chief
        self.metrics_path = os.path.join(workdir, "metrics.jsonl")
        self.board: EventWriter | None = None  # TensorBoard: what metrics.jsonl gets, as scalars
        if is_chief:
            os.makedirs(workdir, exist_ok=True)
            aside = aside_dir(workdir)
            moved = set_aside(workdir, resumed=bool(resumed_from_step))
            if moved:
                logging.info("the previous run's %s moved to %s/", ", ".join(moved), aside)
            if os.path.exists(self.metrics_path):
                kept = [r for r in read_jsonl(self.metrics_path)
                        if resumed_from_step and r.get("step", 0) <= resumed_from_step]
                write_jsonl_atomic(kept, self.metrics_path)
            self.board = EventWriter(os.path.join(workdir, TENSORBOARD_DIR))

    def write_json(self, name: str, obj: Any) -> None:
        if self.is_chief:
            write_json_atomic(obj, os.path.join(self.workdir, name), indent=2)

    def log_metrics(self, record: dict) -> None:
        """One line of metrics.jsonl (a log step or one evaluated split)."""
        if self.is_chief:
            append_jsonl(self.metrics_path, record)
            self.board.write_record(record)


def trace_json(plan: plan_lib.Plan, profile: Profile, last_step: Any,
               comparison: dict, extra: ExtraCost | None = None) -> dict:
    """A measured step's per-stage spans, its exchange's phases and outer steps included (pid
    0), beside the simulator's trace of the plan, and ``comparison`` (:func:`stage_report`'s, as
    in summary.json). Each has a row "step" as long as its step (measured: the executor's
    ``StepMetrics.window``; simulated: its step, the synchronisation included)."""
    spans = last_step.timeline_spans if last_step else []
    window = getattr(last_step, "window", None)
    origin = window[0] if window else min((s.start for s in spans), default=0.0)
    events = stage_events(spans, pid=0, name="measured step", origin=origin)
    if window:
        events += step_event(*window, pid=0, origin=origin)
    sim = simulate.simulate_plan(plan, profile, extra=extra)
    simulated = sim.trace["traceEvents"] + step_event(0.0, sim.step_time_s, pid=0)
    for e in simulated:
        e["pid"] = SIMULATED_PID_OFFSET + e.get("pid", 0)
        if e.get("name") == "process_name":
            e["args"] = {"name": f"simulated: {e['args']['name']}"}
    out = trace_file(events + simulated)
    out["stage_comparison"] = comparison  # viewers ignore it
    return out


def stage_report(plan: plan_lib.Plan, profile: Profile, last_step: Any,
                 boundaries: Sequence[float] = (), steps: Sequence[Any] = (),
                 extra: ExtraCost | None = None) -> dict:
    """Per stage, predicted vs measured compute, comm and idle of the last step, and the step
    boundary (:func:`skyjax.report.compare.stage_comparison`; ``steps``: the plan's recent steps'
    spans, for ``extra``'s own report): ``stage_comparison`` in summary.json and trace.json."""
    from skyjax.report.compare import stage_comparison

    spans = last_step.spans if last_step else []
    return stage_comparison(plan, profile, spans, boundaries, steps, extra)


def make_summary(config: ml_collections.ConfigDict, plan: dict, result: dict,
                 final_evals: dict[str, dict], num_units: int, num_params: int,
                 wall_s: float) -> dict:
    """The summary.json record of a finished run. ``final_evals``: split -> eval metrics; the
    first split's are the top-level ``eval_*`` keys."""
    times = result["step_times"]
    # The plan in the summary is the one in use at the end: time the steps it ran, without the
    # first (it compiles; so does the first after a switch of plans).
    switches = [r["step"] for r in result.get("replans", []) if r.get("switch")]
    skip = switches[-1] - result.get("resumed_from_step", 0) + 1 if switches else 1
    steady = times[skip:] or times[1:] or times
    median = statistics.median(steady)
    predicted = plan["step_time_s"]
    first = next(iter(final_evals.values()), {})
    return {
        "steps": config.train.steps,
        "resumed_from_step": result.get("resumed_from_step", 0),  # 0 = a fresh run
        "final_loss": result["metrics"].get("loss"),
        "final_train_accuracy": result["metrics"].get("accuracy"),
        "eval_accuracy": first.get("eval_accuracy"),
        "eval_loss": first.get("eval_loss"),
        "eval_examples": first.get("eval_examples", 0),
        # a language model's (skyjax.scores.perplexity): exp(eval_loss) and its target tokens
        **({k: first[k] for k in ("eval_perplexity", "eval_tokens")} if "eval_perplexity" in first
           else {}),
        # every figure of the metric (skyjax.scores): accuracy, matthews, f1, pearson, spearman
        "metric": result.get("metric", "accuracy"),
        "eval_scores": {k[len("eval_"):]: v for k, v in first.items()
                        if k not in ("eval_loss", "eval_examples")},
        "eval_by_split": {split: {"examples": r.get("eval_examples", 0), "loss": r.get("eval_loss"),
                                  **{k[len("eval_"):]: v for k, v in r.items()
                                     if k not in ("eval_loss", "eval_examples")}}
                          for split, r in final_evals.items()},
        "evals": result["evals"],
        "step_time_s": median,
        "predicted_step_time_s": predicted,
        "prediction_error": (median - predicted) / median if predicted else None,
        "first_step_s": times[0],
        "train_time_s": result["train_time_s"],
        "wall_time_s": wall_s,
        "examples_per_s": config.data.batch_size / median,
        "num_params": num_params,
        "num_units": num_units,
        "num_stages": len(plan["stages"]),
        "mode": config.cluster.mode,
        "processes": jax.process_count(),
        "plan": plan,
        "replans": result.get("replans", []),
        "recoveries": result.get("recoveries", []),  # lost processes the run went on without
        "calibration": calibration_report(result),
        "devices": [str(d) for d in jax.devices()],
        "jax_version": jax.__version__,
    }


def calibration_report(result: dict) -> dict | None:
    """What calibration measured (``config.allocation.calibrate_steps``; None without it): the
    mean step time of the calibration steps (the even split, ``strategy``) and of the plan
    chosen after them, up to any later switch, each without its compiling step (the run's
    first, the first after the switch), and their ratio, ``speedup``. ``steps``: the first and
    last step timed (1-based); ``switched``: False when the measured times kept the plan."""
    replans = result.get("replans", [])
    decision = next((r for r in replans if r.get("calibration")), None)
    if decision is None:
        return None
    times, start = result["step_times"], result.get("resumed_from_step", 0)
    at = decision["step"] - start  # steps of this run before the decision
    switched = bool(decision.get("switch"))
    later = [r["step"] - start for r in replans if r.get("switch") and r["step"] > decision["step"]]
    end = min(later, default=len(times))
    first = at + 1 if switched else at  # times[i] is step start + i + 1

    def timed(lo: int, hi: int) -> tuple[list[int] | None, float | None]:
        steps = times[lo:hi]
        return ([start + lo + 1, start + hi] if steps else None,
                statistics.fmean(steps) if steps else None)

    even_steps, even_s = timed(1, at)
    chosen_steps, chosen_s = timed(first, end)
    return {"strategy": result.get("calibration_strategy", "even"), "steps": even_steps,
            "step_time_s": even_s, "switched": switched, "chosen_steps": chosen_steps,
            "chosen_step_time_s": chosen_s,
            "speedup": even_s / chosen_s if even_s and chosen_s else None}


def calibration_line(record: dict | None) -> str:
    """``even split 412 ms/step -> chosen plan 151 ms/step: 2.73x faster`` ("" without
    calibration)."""
    if not record or record["step_time_s"] is None:
        return ""
    name = "even split" if record["strategy"] == "even" else f"{record['strategy']} plan"
    first = f"{name} {1e3 * record['step_time_s']:.0f} ms/step"
    if not record["switched"]:
        return f"{first}, kept (no faster plan measured)"
    if record["chosen_step_time_s"] is None:
        return f"{first} -> chosen plan (no step timed after its compiling one)"
    return (f"{first} -> chosen plan {1e3 * record['chosen_step_time_s']:.0f} ms/step: "
            f"{record['speedup']:.2f}x faster")


def log_plan(plan: plan_lib.Plan) -> None:
    """One line: every stage's device and units (per pipeline, with its share of micro-batches
    and the gradient exchange, when there are several) and the predicted step."""
    def stages(ids):
        return ", ".join(f"device {plan.stages[k].device}: units [{plan.stages[k].units[0]}, "
                         f"{plan.stages[k].units[1]})" for k in ids)

    if plan.num_pipelines == 1:
        text = stages(range(len(plan.stages)))
    else:
        text = "; ".join(f"pipeline {i} ({m} micro-batches): {stages(plan.stage_ids(i))}"
                         for i, m in enumerate(plan.pipeline_shares()))
        text += f"; gradient exchange {plan.allreduce_s:.4f} s"
    logging.info("plan (%s, %s, m=%d): %s; predicted step %.4f s", plan.strategy, plan.schedule,
                 plan.microbatches, text, plan.step_time_s)


def log_summary(summary: dict) -> None:
    """The run's last line; with calibration, it ends with the measured speed-up
    (:func:`calibration_line`)."""
    measured = calibration_line(summary.get("calibration"))
    scores = ", ".join(f"eval_{k} {v:.4f}" for k, v in summary.get("eval_scores", {}).items())
    logging.info("summary: %s, final_loss %.4f, median step %.4f s (predicted "
                 "%.4f s), wall %.1f s%s", scores or "no eval", summary["final_loss"],
                 summary["step_time_s"], summary["predicted_step_time_s"],
                 summary["wall_time_s"], f"; {measured}" if measured else "")


def log_rehearsal(record: dict) -> None:
    """The rehearsal's line: measured against simulated step, and what this host added."""
    calls = record.get("calls") or {}
    logging.info(
        "rehearsal: %d of %d declared devices, %d pipeline(s), median step %.4f s against "
        "simulated %.4f s (%+.1f%%; cost model %.4f s; time scale %g); per call %.2f ms real "
        "compute, %.2f ms host overhead, %d overrun(s) (largest %.2f ms)",
        record["devices_used"], record["devices"], record["pipelines"],
        record["measured_step_s"], record["simulated_step_s"], 100 * (record["error"] or 0.0),
        record["model_step_s"], record["time_scale"], 1e3 * calls.get("real_mean_s", 0.0),
        1e3 * calls.get("overhead_mean_s", 0.0), calls.get("overruns", 0),
        1e3 * calls.get("overrun_max_s", 0.0))
