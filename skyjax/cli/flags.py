"""Argument parsing the commands share, failures in one line: absl's flags for the commands
that take ``--config`` (``skyjax.main``, ``skyjax.profile``), where an unknown ``--config.*`` key,
or a config file that is missing, does not parse or has no working ``get_config``, is one line
and the exit status ``EXIT_BAD_INPUT``, not a traceback; and :class:`OneLineParser`, ``argparse``
for the others."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Callable

from absl import app, flags
from absl import logging as absl_logging

from skyjax import failures
from skyjax.config import defaults as config_defaults
from skyjax.names import EXIT_BAD_INPUT

FLAGS = flags.FLAGS


class OneLineParser(argparse.ArgumentParser):
    """``argparse`` whose usage errors are one line (``prog: error: ...``), status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help for usage)\n")


def _replica(value: str) -> str | int:
    if value in ("average", "anchor"):
        return value
    if value.isdigit():
        return int(value)
    raise argparse.ArgumentTypeError(f"{value!r}: choose average, a pipeline's index (0, 1, "
                                     f"...) or anchor")


def add_replica_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """``--replica`` (``skyjax.export``, ``skyjax.predict --workdir``): which of a checkpoint's
    replicas ``what`` is, where they differ (:mod:`skyjax.export.trained`)."""
    parser.add_argument("--replica", type=_replica, default="average",
                        metavar="{average,N,anchor}",
                        help=f"where the checkpoint's replicas differ (DiLoCo averaging): "
                             f"{what} their float32 average (the default), pipeline N's, or "
                             f"DiLoCo's anchor (the last outer step's model)")


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


def _what(value: object) -> str:
    name = type(value).__name__
    return "None" if value is None else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


class _NoNoneWarning(logging.Filter):
    """Drops config_flags' own warning about a ``get_config`` that returned None: our line says
    it (and names the fix), and a failure is one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "did you forget a return statement" not in record.getMessage()


_NO_NONE_WARNING = _NoNoneWarning()


def _not_a_config(argv: list[str]) -> str | None:
    """The line for a config file whose ``get_config`` returns no ``ConfigDict`` (None, a dict):
    absl and config_flags would report it as a flag without a value or a missing attribute.
    Runs the file's ``get_config`` again, so only once parsing failed; None when it does
    return a ``ConfigDict`` (or fails on its own, which the caller reports)."""
    import importlib.util

    import ml_collections

    path, *args = _config_path(argv).split(":", 1)
    if not os.path.isfile(path):
        return None
    try:
        spec = importlib.util.spec_from_file_location("_skyjax_config_check", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        value = module.get_config(*args)
    except Exception:  # noqa: BLE001 - the caller's message names the file's own failure
        return None
    return None if isinstance(value, ml_collections.ConfigDict) else _returned(path, value)


def _returned(path: str, value: object) -> str:
    return (f"Invalid config: --config {path}: get_config() returned {_what(value)}, not an "
            "ml_collections.ConfigDict (return skyjax.config.base_config() with your changes)")


def parse_flags(argv: list[str]) -> list[str]:
    """absl's ``FLAGS(argv)`` (an ``app.run`` ``flags_parser``), failures in one line."""
    import ml_collections

    absl_logging.get_absl_logger().addFilter(_NO_NONE_WARNING)  # once, however many calls
    try:
        rest = FLAGS(argv)
        if "config" in FLAGS and FLAGS["config"].present:
            FLAGS.config.keys()  # a file that failed to load raises at its first use: here
            if not isinstance(FLAGS.config, ml_collections.ConfigDict):  # a dict
                print(_returned(_config_path(argv).split(":", 1)[0], FLAGS.config),
                      file=sys.stderr)
                sys.exit(EXIT_BAD_INPUT)
        return rest
    except flags.Error as e:
        if (line := _not_a_config(argv)) is not None:  # get_config() returned None
            print(line, file=sys.stderr)
            sys.exit(EXIT_BAD_INPUT)
        print(f"FATAL Flags parsing error: {failures.describe(e)} (--helpshort for help)",
              file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except Exception as e:  # noqa: BLE001 - the config file runs user code
        bad = _unknown_override(argv) if isinstance(e, (AttributeError, KeyError)) else None
        line = _not_a_config(argv) if isinstance(e, (AttributeError, KeyError)) else None
        if line is not None:  # overrides of a None or an int: no such attribute
            print(line, file=sys.stderr)
        elif bad is not None:
            key = bad.split("=", 1)[0][2:]
            print(f"Invalid config: {key}: unknown config key (from {bad})", file=sys.stderr)
        else:
            path = _config_path(argv).split(":", 1)[0]  # config_flags' "file.py:override"
            why = "file not found" if not os.path.isfile(path) else failures.describe(e)
            print(f"Invalid config: --config {path}: {why}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def run_absl(main: Callable[[list[str]], None], command: str, parse: bool = True) -> None:
    """``app.run(main)`` for the absl command module ``command`` (``parse``: through
    :func:`parse_flags`), its docstring and flags the ``--help`` / ``--helpshort`` of whichever
    module runs as ``__main__`` (the ``python -m`` name, a console script): absl shows
    ``__main__``'s."""
    for flag in FLAGS.get_key_flags_for_module(command):
        FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    main_module = sys.modules.get("__main__")
    if main_module is not None and main_module is not sys.modules[command]:
        main_module.__doc__ = sys.modules[command].__doc__
    app.run(main, flags_parser=parse_flags if parse else app.parse_flags_with_usage)
