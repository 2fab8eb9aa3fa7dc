"""What a plan is, as plain data: the types every other part of ``plan`` speaks.

* ``types``: Plan, Stage, InfeasibleError; plan.json to and from;
* ``schedules``: GPipe / 1F1B / zero bubble as per-stage action lists;
* ``extension``: the extra cost terms a caller may hand in (``ExtraCost``).
"""
