"""Lower bounds on the step time, cheap enough to run on every plan (the tighter certificates
live in :mod:`skyjax.plan.certificates` and run on request).

* ``step``: lower bounds on the step time and the bottleneck;
* ``group_bound``: a bound counting region crossings, whole blocks, 1F1B's in-flight levels;
* ``group_terms``: its terms per set of link groups visited (``GroupBound``), shared with
  the certificates.
"""
