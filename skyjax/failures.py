"""How a command ends when something fails: one line on stderr and an exit status, no traceback.

Every command (``skyjax.main``, ``skyjax.profile``, ``skyjax.plan``, ``skyjax.launch``) runs its
body through :func:`one_line_errors`. The line names what failed (the key, file, tensor, device
or process, which the exception's message carries) and the exit status says which kind of
failure it was, so that a launcher or a job script can tell a bad input (do not retry) from a
lost process (retry on the survivors). ``SKYJAX_DEBUG=1`` (or a command's ``--debug``) lets the
exception through with its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from typing import Iterator

from skyjax.names import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_NON_FINITE

DEBUG_ENV = "SKYJAX_DEBUG"


class BadInput(ValueError):
    """A config, flag, file or workdir that a command refuses before doing any work."""


class OneLineParser(argparse.ArgumentParser):
    """``argparse`` whose usage errors are one line (``prog: error: ...``), status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help for usage)\n")


def debugging() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def describe(e: BaseException) -> str:
    """``Type: message`` on one line (a multi-line message keeps its first line; an exception
    without a message names its type only)."""
    text = " ".join(str(e).split("\n", 1)[0].split()) if str(e) else ""
    name = type(e).__name__
    if isinstance(e, BadInput) and text:
        return text  # its message says what is wrong already
    return f"{name}: {text}" if text else name


def exit_status(e: BaseException) -> int:
    """The exit status of a command that failed with ``e`` (``skyjax.names``)."""
    from skyjax.guard import NonFiniteError

    if isinstance(e, NonFiniteError):
        return EXIT_NON_FINITE
    if isinstance(e, (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
                      PermissionError, SyntaxError)):  # BadInput and the config checks' errors
        return EXIT_BAD_INPUT
    return EXIT_FAILED


def interrupt_on_sigterm() -> None:
    """SIGTERM raises ``KeyboardInterrupt`` in the main thread, as Ctrl-C does, so a stopped run
    unwinds (an unfinished checkpoint is abandoned, never committed half-written) and ends with
    one line. Called after ``jax.distributed`` starts: JAX's preemption notifier installs its own
    SIGTERM handler there, which would keep the process training until it is killed."""
    def _raise(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, _raise)


@contextlib.contextmanager
def one_line_errors(command: str, debug: bool = False) -> Iterator[None]:
    """Runs the block; any exception ends the process with one line on stderr
    (``<command>: Type: message``) and :func:`exit_status`'s status; Ctrl-C / SIGTERM with
    ``<command>: interrupted`` and status 130. ``SystemExit`` passes through."""
    if debug or debugging():
        yield
        return
    try:
        yield
    except KeyboardInterrupt:
        print(f"{command}: interrupted; stopped (committed checkpoints are kept)",
              file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as e:  # noqa: BLE001 - the one place that turns failures into a line
        print(f"{command}: {describe(e)}", file=sys.stderr, flush=True)
        sys.exit(exit_status(e))
