"""Planning: from a profile to stages on devices, and what the chosen schedule does with them.

Sub-packages, lowest first; each imports only those before it (``tests/test_layout.py``):

* ``model``: what a plan is (types, schedules, the extra-cost hooks);
* ``pricing``: the cost model, link groups, per-stage action times, the gradient exchange;
* ``bounds``: lower bounds on the step time;
* ``search``: the one-pipeline searches (exact, heuristic, refinement, warm-ups);
* ``data_parallel``: several pipelines, their price and their search;
* ``certificates``: tighter lower bounds, computed only on request (``certify=True``);
* ``replay``: the simulator and the times it replays (priced, declared, measured);

and above them all:

* ``as_run``: the price plans are chosen by and shown with, the simulated step, and the
  candidates it judges (on small instances every plan);
* ``planner``: ``plan()``, which picks the strategy and search (``searched_plan()``: the cost
  model's plan, the first candidate);
* ``replan``: the re-planning policy and calibration from measured steps.

``python -m skyjax.plan`` (``__main__``) is the command :mod:`skyjax.cli.plan`.

Pure Python + numpy: nothing here imports JAX (``tests/test_layout.py`` checks it), so plans can
be made and inspected on any machine from a profile.json. The names below are the planner's API.
"""

from skyjax.plan.bounds.step import lower_bound, min_bottleneck
from skyjax.plan.pricing.classes import device_classes, link_groups
from skyjax.plan.pricing.cost import Tables, evaluate, stage_costs, step_time, tables
from skyjax.plan.search.even import even_assignment
from skyjax.plan.data_parallel.pipelines import evaluate_pipelines
from skyjax.plan.planner import plan, searched_plan
from skyjax.plan.model.types import InfeasibleError, Plan, Stage

__all__ = ["InfeasibleError", "Plan", "Stage", "Tables", "device_classes", "evaluate",
           "evaluate_pipelines", "even_assignment", "link_groups", "lower_bound", "min_bottleneck", "plan", "searched_plan",
           "stage_costs", "step_time", "tables"]
