"""The config and its checks. Imports no JAX: a bad config is reported before anything starts.

* ``defaults``: the schema, every key with its type and default (:func:`base_config`);
* ``validation``: the checks, each failure naming its key (:func:`validate_config`); the
  model, training, pipeline, allocation, relaxation and rehearsal keys checked there;
* ``keys``: unknown, missing and mistyped keys against the schema, checked first;
* ``rules``: the one-line value rules the checks are built from;
* ``data_checks``: ``config.data`` against the model and the dataset it names;
* ``cluster_checks``: ``config.cluster``: devices, emulation, links, the transfer server.
"""

from skyjax.config.defaults import base_config
from skyjax.config.validation import validate_config

__all__ = ["base_config", "validate_config"]
