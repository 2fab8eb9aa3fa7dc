"""Stage programs: what a pipeline stage runs on its device, compiled alike by the profiler and
the runtime, so that a profile times the programs that run (docs/design.md, "Layout"). Import
the submodules; this package imports nothing.

* ``stage``: one block of units' jitted forward, backward, update and evaluate (``StageProgram``);
* ``split``: a stage's backward cut in two for zero-bubble schedules, B (the input cotangent)
  and W (the parameter gradients), each equation run once;
* ``buckets``: a stage's last backward cut into buckets of units, each bucket's gradients
  final before the rest are computed (the exchange behind the backward);
* ``calls``: the inputs a timed stage call takes (carry, dropout keys, labels, cotangent), built
  one way for every profiler measurement.
"""
