"""The config schema (:mod:`~skyjax.config.defaults`) and its checks
(:mod:`~skyjax.config.validation`). Imports no JAX: a bad config is reported before anything
starts."""

from skyjax.config.defaults import base_config
from skyjax.config.validation import validate_config

__all__ = ["base_config", "validate_config"]
