"""The searches for one pipeline: which devices, in which order, hold which blocks of units.

* ``even``: the ``even`` strategy's split;
* ``exact``: the exact search (a DP over device-class counts) for the ``optimal`` strategy;
* ``heuristic``: the search where the exact one does not fit;
* ``chain_dp``: the heuristic's DP over cuts for one device order and a batch of caps;
* ``order_search``: the heuristic's device orders and its local search over them;
* ``refine``: GPipe refinement at the incumbent's bottleneck;
* ``infeasible``: why nothing fits, in one line;
* ``warmup``: 1F1B's deeper warm-ups before slow links, priced by the window model.
"""
