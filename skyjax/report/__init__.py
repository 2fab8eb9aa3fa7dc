"""What a run writes and shows: output files, pictures, TensorBoard, tables and progress lines.
Outputs are a view of the results: none of the core (docs/design.md, "Layout") imports this
package, which imports nothing itself (import the submodules).

* ``outputs``: the workdir's ``summary.json``, ``metrics.jsonl``, ``trace.json``, ``plan.json``
  and ``config.json`` (``Outputs``, ``make_summary``);
* ``compare``: predicted vs measured per stage, ``summary.json``'s ``stage_comparison``;
* ``watch``: what the trainer adds per log step (throughput, stage times) and the pictures at
  the end;
* ``plots``: ``plan.png`` and ``timeline.png`` (matplotlib, imported only when drawing);
* ``tensorboard``: TensorBoard event files, written without TensorFlow;
* ``progress``: the training log line, its ETA and the live bar on a terminal;
* ``profile_table``: a profile as text (what ``python -m skyjax.profile`` prints);
* ``plan_report``: a profile file planned, its table, plan.json, trace and pictures (what
  ``python -m skyjax.plan`` does);
* ``text_table``: aligned text tables and the number formats shared by all of the above.
"""
