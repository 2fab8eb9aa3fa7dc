"""Stage programs: what a pipeline stage runs on its device, compiled alike by the profiler and
the runtime, so that a profile times the programs that run (docs/design.md, "Layout"). Import
the submodules; this package imports nothing.

* ``stage``: one block of units' jitted forward, backward, update and evaluate (``StageProgram``);
* ``calls``: the inputs a timed stage call takes (carry, dropout keys, labels, cotangent), built
  one way for every profiler measurement.
"""
