"""Planning: from a profile to stages on devices, and what the chosen schedule does with them.

One job per module, dependencies pointing one way (types <- cost <- classes, bounds <- exact,
heuristic <- planner):

* ``types``: Plan, Stage, InfeasibleError; plan.json to and from;
* ``cost``: the cost model (docs/design.md): tables of a profile, stage costs, step time, evaluate;
* ``extension``: the extra cost terms a caller may hand in (``ExtraCost``);
* ``even``: the ``even`` strategy's split;
* ``classes``: interchangeable devices and link groups;
* ``bounds``: lower bounds on the step time and the bottleneck;
* ``group_bound``: a lower bound counting region crossings, whole blocks, 1F1B's in-flight levels;
* ``certificates``: tighter lower bounds, computed only on request (``certify=True``);
* ``exact``: the exact search (a DP over device-class counts) for the ``optimal`` strategy;
* ``heuristic``: the search where the exact one does not fit;
* ``chain_dp``: the heuristic's DP over cuts for one device order and a batch of caps;
* ``order_search``: the heuristic's device orders and its local search over them;
* ``refine``: GPipe refinement at the incumbent's bottleneck;
* ``planner``: ``plan()``, which picks the strategy and search;
* ``pipelines``: several pipelines in data parallel: their cost (the gradient exchange), one
  pipeline's chain on a device subset;
* ``exchange``: the gradient exchange's routing through link groups, and its cost;
* ``pipeline_split``: the search over splits and shares (``plan(max_pipelines=N)``);
* ``split_candidates``: the larger instances' candidate splits and the order they are tried in;
* ``every_chain``: on small instances, that search exact over every chain of every pipeline;
* ``schedules``: GPipe / 1F1B as per-stage action lists;
* ``warmup``: 1F1B's deeper warm-ups before slow links, priced by the window model;
* ``stage_times``: per-stage action times and link delays, what the simulators replay;
* ``simulate``: an event simulation of a schedule;
* ``measured``: each message's delay read from a measured step's spans;
* ``declared``: every action's time a profile declares, for a rehearsal (``config.rehearse``);
* ``replan``: the re-planning policy and calibration from measured steps;
* ``cli``: ``python -m skyjax.plan`` (``__main__`` only calls it).

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
