"""Profiling: what the planner needs, measured on the devices that will run the plan.

``format``: profile.json (:class:`Profile`, load / save; no JAX). The measuring modules import
JAX and are imported by name, so that the planner can read a profile without importing JAX:

* ``chain``: what is measured (:class:`~skyjax.profile.chain.Workload`, the units, a sample
  micro-batch); ``options``: how hard (:class:`~skyjax.profile.options.Options`);
* ``units``: unit times and bytes on devices; ``links``: link latency and bandwidth by ping-pong;
  ``wake``: what a call costs after idle; ``messages``: what a message costs the stages computing
  beside it (across processes);
* ``measure``: a profile measured in this process; ``distributed``: by one process per device;
* ``cache``: the cache key and load-or-measure; ``profiler``: :func:`profile_or_load`, the
  entry point of a run; ``report``: the text table; ``cli``: ``python -m skyjax.profile``.
"""

from skyjax.profile.format import Profile, ProfileError, load_profile, save_profile

__all__ = ["Profile", "ProfileError", "load_profile", "save_profile"]
