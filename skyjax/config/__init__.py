"""The config and its checks. Imports no JAX: a bad config is reported before anything starts.

* ``defaults``: the schema, every key with its type and default (:func:`base_config`);
* ``validation``: the checks, each failure naming its key (:func:`validate_config`);
* ``flags``: ``--config`` flag parsing for the commands, a bad file or key in one line.
"""

from skyjax.config.defaults import base_config
from skyjax.config.validation import validate_config

__all__ = ["base_config", "validate_config"]
