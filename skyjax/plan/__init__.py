"""Planning: from a profile to stages on devices, and what the chosen schedule does with them.

One job per module, dependencies pointing one way (types <- cost <- classes, bounds <- exact,
heuristic <- planner):

* ``types``: Plan, Stage, InfeasibleError; plan.json to and from.
* ``cost``: the cost model (docs/design.md): tables of a profile, stage costs, step time, evaluate.
* ``even``: the ``even`` strategy's split.
* ``classes``: interchangeable devices and link groups.
* ``bounds``: lower bounds on the step time and the bottleneck.
* ``exact`` / ``heuristic``: the two searches for the ``optimal`` strategy.
* ``planner``: ``plan()``, which picks the strategy and search.
* ``pipelines`` / ``pipeline_split``: several pipelines in data parallel, their cost (the
  gradient exchange) and the search over splits and shares (``plan(max_pipelines=N)``).
* ``schedules``: GPipe / 1F1B as per-stage action lists; ``simulate``: an event simulation of
  them; ``compare``: a plan's predicted vs a measured step, per stage; ``replan``: the
  re-planning policy and calibration from measured steps; ``cli``: ``python -m skyjax.plan``.

Pure Python + numpy: nothing here imports JAX (``tests/test_layout.py`` checks it), so plans can
be made and inspected on any machine from a profile.json. The names below are the planner's API.
"""

from skyjax.plan.bounds import lower_bound, min_bottleneck
from skyjax.plan.classes import device_classes, link_groups
from skyjax.plan.cost import Tables, evaluate, stage_costs, step_time, tables
from skyjax.plan.even import even_assignment
from skyjax.plan.pipelines import evaluate_pipelines
from skyjax.plan.planner import plan
from skyjax.plan.types import InfeasibleError, Plan, Stage

__all__ = ["InfeasibleError", "Plan", "Stage", "Tables", "device_classes", "evaluate",
           "evaluate_pipelines", "even_assignment", "link_groups", "lower_bound", "min_bottleneck", "plan",
           "stage_costs", "step_time", "tables"]
