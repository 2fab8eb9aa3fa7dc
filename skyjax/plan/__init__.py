"""Planning: the cost model, even / optimal allocation, schedules and their simulation.

Pure Python + numpy: nothing here imports JAX (``tests/test_layout.py`` checks it), so plans can
be made and inspected on any machine from a profile.json.
"""

from skyjax.plan.allocator import InfeasibleError, Plan, Stage, evaluate, plan

__all__ = ["InfeasibleError", "Plan", "Stage", "evaluate", "plan"]
