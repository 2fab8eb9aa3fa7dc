"""Profiling: what the planner needs, measured on the devices that will run the plan.

``format``, ``flops``, ``cluster_file`` and ``cluster_profile`` need no JAX; the measuring modules
import JAX and are imported by name, so that the planner can read a profile without importing
JAX:

* ``format``: profile.json (:class:`Profile`, load / save; no JAX);
* ``flops``: a profile from a FLOP model of BERT's units (no JAX);
* ``cluster_profile``: a whole cluster's profile from one profile per device kind, regions and
  the links between them (no JAX);
* ``cluster_file``: the cluster file read and checked: unknown or repeated keys, counts,
  bounds, ``--out`` (no JAX);
* ``chain``: what is measured (:class:`~skyjax.profile.chain.Workload`, the units, a sample
  micro-batch);
* ``options``: how hard (:class:`~skyjax.profile.options.Options`), robust times, cache eviction;
* ``extension``: the extra probes a caller may hand in (``Options.host``; ``ExtraProbes``);
* ``units``: every unit's times and bytes on the devices, the profile's unit records;
* ``unit_timing``: one unit timed on each device, and its memory;
* ``stage_calls``: a stage call's fixed cost, and the time of a stage's update;
* ``inputs``: what putting a step's inputs on a device costs;
* ``codec_times``: each hand-off codec's bytes and coding time;
* ``links``: link latency and bandwidth by ping-pong;
* ``measure``: a profile measured in this process, and its assembly from parts;
* ``distributed``: a profile measured by one process per device;
* ``cache``: the cache key and load-or-measure;
* ``profiler``: :func:`profile_or_load`, the entry point of a run, and a config's profile;
* ``eta``: the progress lines' device count and ETA;
* ``compose``: ``python -m skyjax.profile.compose``, only naming :mod:`skyjax.cli.compose`
  (``__main__`` names :mod:`skyjax.cli.profile` alike).
"""

from skyjax.profile.format import Profile, ProfileError, load_profile, save_profile

__all__ = ["Profile", "ProfileError", "load_profile", "save_profile"]
