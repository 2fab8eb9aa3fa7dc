"""Several pipelines in data parallel: their price and the search over splits and shares
(``plan(max_pipelines=N)``), built on the one-pipeline searches of :mod:`skyjax.plan.search`.

* ``pipelines``: their cost (the gradient exchange), one pipeline's chain on a device subset;
* ``split``: the search over splits and shares;
* ``candidates``: the larger instances' candidate splits and the order they are tried in;
* ``every_chain``: on small instances, that search exact over every chain of every pipeline.
"""
