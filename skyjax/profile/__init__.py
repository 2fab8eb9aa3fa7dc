"""Profiling: what the planner needs, measured on the devices that will run the plan.

``format``: profile.json (:class:`Profile`, load / save; no JAX). The measuring modules import
JAX and are imported by name (``skyjax.profile.measure``), so that the planner can read a profile
without importing JAX.
"""

from skyjax.profile.format import Profile, ProfileError, load_profile, save_profile

__all__ = ["Profile", "ProfileError", "load_profile", "save_profile"]
