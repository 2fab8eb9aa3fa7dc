"""The prediction goals over many saved benchmark runs, one line a run and a tally (prints a
table).

One run of ``experiments/hetero_benchmark.py`` is one draw of a noisy host: the profile and
the steps that follow it may catch the host at different speeds. This reads the ``result.json``
of any number of runs and re-prices each run's even and optimal plans on that run's own saved
profile with the cost model as it is now, so runs measured before a change of the model are
judged by the model after it, beside the measured median steps. Per run: error (measured -
predicted) / measured of both plans, the measured speed-up (even / optimal) as a share of the
predicted one, and the optimal plan's per-stage compute (all measured steps: ``busy``) against
its prediction (m x the stage's compute x the slow-down that sharing the host's cores and calls
after idle predict for it, as ``hetero_benchmark.py`` prints it). Then the tally against the
goals: |error| <= 10 %, speed-up >= 90 % of predicted, stage compute within 15 %.

Run: ``python experiments/accuracy_table.py /tmp/runs/*`` (each a benchmark ``--workdir``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Any

STEP_GOAL, SPEEDUP_GOAL, STAGE_GOAL = 0.10, 0.90, 0.15


def run_figures(result: dict[str, Any]) -> dict[str, Any]:
    """A run's errors, speed-up ratio and optimal stage-compute errors under the current model."""
    from skyjax import plan as plan_lib
    from skyjax.report.plan_report import shared_host_model
    from skyjax.plan.replay.simulate import simulate_plan
    from skyjax.profile.format import Profile

    profile = Profile.from_json(result["profile"])
    extra = shared_host_model(profile, "auto")  # on where the run profiled under it
    predicted, measured, plans = {}, {}, {}
    for name in ("even", "optimal"):
        saved = result["plans"][name]
        plans[name] = plan_lib.evaluate(profile, [(s["device"], *s["units"])
                                                  for s in saved["stages"]],
                                        saved["schedule"], saved["microbatches"], name,
                                        check=False, extra=extra)
        predicted[name] = plans[name].step_time_s
        measured[name] = statistics.median(result["times"][name])
    sim = simulate_plan(plans["optimal"], profile, extra=extra)
    m = plans["optimal"].microbatches
    stage_errors = [(busy - m * s.compute_s * slow) / busy
                    for s, slow, busy in zip(plans["optimal"].stages, sim.slowdown,
                                             result["busy"]["optimal"])]
    return {"error": {n: (measured[n] - predicted[n]) / measured[n] for n in measured},
            "speedup": (measured["even"] / measured["optimal"])
            / (predicted["even"] / predicted["optimal"]),
            "stages": stage_errors, "num_stages": len(plans["optimal"].stages)}


def describe(spec: dict[str, Any]) -> str:
    """The benchmark flags that tell runs apart (from the run's ``spec.json``)."""
    a = spec.get("args", {})
    parts = [f"{a.get('processes', '?')}p", a.get("granularity", "?"), f"m={a.get('microbatches')}"]
    if a.get("shipped"):
        parts.append("shipped")
    if a.get("bind_cores"):
        parts.append("own cores")
    return " ".join(str(p) for p in parts)


def _read_json(path: str) -> Any:
    """The file's JSON, or None where it does not exist."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdirs", nargs="+", help="hetero_benchmark.py --workdir directories")
    args = parser.parse_args(argv)
    rows = []
    for workdir in args.workdirs:
        result = _read_json(os.path.join(workdir, "result.json"))
        if result is None:
            print(f"{workdir}: no result.json (the run did not finish); skipped")
            continue
        spec = _read_json(os.path.join(workdir, "spec.json")) or {}
        rows.append((os.path.basename(os.path.normpath(workdir)), describe(spec),
                     run_figures(result)))
    print(f"{'run':10s} {'setting':30s} {'even':>7s} {'optimal':>8s} {'speed-up':>9s}  "
          f"optimal plan's stage compute")
    for name, setting, r in rows:
        stages = " ".join(f"{e:+.0%}" for e in r["stages"])
        print(f"{name:10s} {setting:30s} {r['error']['even']:+7.1%} {r['error']['optimal']:+8.1%} "
              f"{r['speedup']:9.1%}  {stages}")
    if not rows:
        return
    n = len(rows)
    within = {p: sum(abs(r["error"][p]) <= STEP_GOAL for _, _, r in rows)
              for p in ("even", "optimal")}
    both = sum(all(abs(e) <= STEP_GOAL for e in r["error"].values()) for _, _, r in rows)
    fast = sum(r["speedup"] >= SPEEDUP_GOAL for _, _, r in rows)
    stages_ok = sum(all(abs(e) <= STAGE_GOAL for e in r["stages"]) for _, _, r in rows)
    mean = {p: statistics.mean(r["error"][p] for _, _, r in rows) for p in ("even", "optimal")}
    print(f"\nof {n} runs: even within {STEP_GOAL:.0%} in {within['even']} (mean "
          f"{mean['even']:+.1%}), optimal in {within['optimal']} (mean {mean['optimal']:+.1%}), "
          f"both in {both}; speed-up >= {SPEEDUP_GOAL:.0%} of predicted in {fast}; every stage of "
          f"the optimal plan within {STAGE_GOAL:.0%} in {stages_ok}")


if __name__ == "__main__":
    from experiments import results_doc

    results_doc.run(main, [(
        None, "accuracy_table", "Prediction accuracy over saved runs",
        "Saved `hetero_benchmark.py` runs (each a `--workdir`) re-priced with the current cost "
        "model: per run the even and the optimal plan's error (measured - predicted) / "
        "measured, the measured speed-up as a share of the predicted one and the optimal "
        "plan's stage compute, then how many runs meet the goals (|error| <= 10 %, speed-up >= "
        "90 % of predicted, stage compute within 15 %).")])
