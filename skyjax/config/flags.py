"""absl flag parsing for the commands that take ``--config`` (``skyjax.main``, ``skyjax.profile``):
an unknown ``--config.*`` key, or a config file that is missing, does not parse or has no working
``get_config``, is one line and the exit status ``EXIT_BAD_INPUT``, not a traceback."""

from __future__ import annotations

import os
import sys

from absl import flags

from skyjax import failures
from skyjax.config import defaults as config_defaults
from skyjax.names import EXIT_BAD_INPUT

FLAGS = flags.FLAGS


def _unknown_override(argv: list[str]) -> str | None:
    """The first ``--config.a.b=...`` argument whose key is not in the schema, if any."""
    schema = config_defaults.base_config()
    for arg in argv[1:]:
        if not arg.startswith("--config."):
            continue
        node = schema
        for part in arg[len("--config."):].split("=", 1)[0].split("."):
            if not hasattr(node, "keys") or part not in node:
                return arg
            node = node[part]
    return None


def _config_path(argv: list[str]) -> str:
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return "?"


def parse_flags(argv: list[str]) -> list[str]:
    """absl's ``FLAGS(argv)`` (an ``app.run`` ``flags_parser``), failures in one line."""
    try:
        rest = FLAGS(argv)
        if "config" in FLAGS and FLAGS["config"].present:
            FLAGS.config.keys()  # a file that failed to load raises at its first use: here
        return rest
    except flags.Error as e:
        print(f"FATAL Flags parsing error: {failures.describe(e)} (--helpshort for help)",
              file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except Exception as e:  # noqa: BLE001 - the config file runs user code
        bad = _unknown_override(argv) if isinstance(e, (AttributeError, KeyError)) else None
        if bad is not None:
            key = bad.split("=", 1)[0][2:]
            print(f"Invalid config: {key}: unknown config key (from {bad})", file=sys.stderr)
        else:
            path = _config_path(argv).split(":", 1)[0]  # config_flags' "file.py:override"
            why = "file not found" if not os.path.isfile(path) else failures.describe(e)
            print(f"Invalid config: --config {path}: {why}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
