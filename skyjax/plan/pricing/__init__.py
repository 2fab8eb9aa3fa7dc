"""The price of a plan: the cost model of docs/design.md ("The cost model"), one home for every
term the searches, bounds and replays charge.

* ``passes``: what a profile says each pass (B and W apart) and hand-off codec costs;
* ``cost``: tables of a profile, stage costs, step time, evaluate;
* ``classes``: interchangeable devices and link groups;
* ``stage_times``: per-stage action times and link delays, what the replays run;
* ``exchange``: the gradient exchange's routing through link groups, and its cost;
* ``topk``: the top-k compression's bytes and coding on the exchange (``relax.outer_compression``);
* ``peers``: decentralized averaging's peer schedule, and the peer modes' prices;
* ``buckets``: the exchange behind the backward: buckets, the pieces messages travel in, when
  each bucket is ready.
"""
