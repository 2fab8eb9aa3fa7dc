"""How a command ends when something fails: one line on stderr and an exit status, no traceback.

Every command (``skyjax.main``, ``skyjax.profile``, ``skyjax.plan``, ``skyjax.launch``) runs its
body through :func:`one_line_errors`. The line names what failed (the key, file, tensor, device
or process, which the exception's message carries) and the exit status says which kind of
failure it was, so that a launcher or a job script can tell a bad input (do not retry) from a
lost process (retry on the survivors). ``SKYJAX_DEBUG=1`` (or a command's ``--debug``) lets the
exception through with its traceback.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from typing import Any, Iterator

from skyjax.names import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_NON_FINITE

DEBUG_ENV = "SKYJAX_DEBUG"


class BadInput(ValueError):
    """A config, flag, file or workdir that a command refuses before doing any work."""


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


# Stopping (SIGTERM, Ctrl-C). The handler raises KeyboardInterrupt in the main thread, which
# interrupts whatever the thread waits on, and notes the signal. Python runs the handler at the
# next bytecode boundary of the main thread, and that can be inside code whose exceptions Python
# discards: a gc callback (JAX registers one, called at every collection), a __del__, a weakref
# callback ("Exception ignored in ..."). The KeyboardInterrupt is then lost and the run would go
# on training. So a discarded one is delivered again (SIGALRM after REDELIVER_S, its report
# silenced), and the train loop calls check_stop() between steps.
REDELIVER_S = 0.05
# After the "interrupted" line, the interpreter's exit (joining threads, atexit hooks) gets this
# long; then the threads' stacks go to stderr and the process ends with EXIT_INTERRUPTED anyway.
EXIT_GRACE_S = 20.0
_STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGINT") if hasattr(signal, n))
_stop_signal: int | None = None  # the first stop signal received; None until one comes
_installed = False
_redelivers = False  # SIGALRM is ours (it was at its default when the handlers were installed)
_ending: int | None = None  # the status of a failure whose one line is printed (one_line_errors)


def ending_status() -> int | None:
    """The exit status this process is ending with, once its one line is printed (None before):
    a later loss of process 0 (which ends the JAX runtime) exits with it, silently."""
    return _ending


def check_stop() -> None:
    """Raises ``KeyboardInterrupt`` once a stop signal has come (the training loop calls it
    between steps: a stop is honoured even where the handler's exception was swallowed)."""
    if _stop_signal is not None:
        _cancel_redelivery()
        raise KeyboardInterrupt(f"signal {_stop_signal}")


def _cancel_redelivery() -> None:
    if _redelivers:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _on_stop_signal(signum: int, frame: Any) -> None:
    global _stop_signal
    if signum in _STOP_SIGNALS and _stop_signal is None:
        _stop_signal = signum
    if _stop_signal is not None:  # a stop signal, or our redelivery's SIGALRM
        check_stop()


def _unraisable(previous: Any) -> Any:
    def hook(unraisable: Any) -> None:
        if _stop_signal is not None and isinstance(unraisable.exc_value, KeyboardInterrupt):
            # the handler ran where exceptions are discarded: deliver it again, shortly (a
            # timer: os.kill would run the handler here, inside this hook); else check_stop()
            # raises it between steps
            if _redelivers:
                signal.setitimer(signal.ITIMER_REAL, REDELIVER_S)
            return
        previous(unraisable)
    return hook


def interrupt_on_sigterm() -> None:
    """SIGTERM (and Ctrl-C's SIGINT, unless ignored) raises ``KeyboardInterrupt`` in the main
    thread, so a stopped run unwinds (an unfinished checkpoint is abandoned, never committed
    half-written) and ends with one line and status 130 (:func:`one_line_errors`); a
    ``KeyboardInterrupt`` that Python discarded is raised again (the comment above). Called after
    ``jax.distributed`` starts: JAX's preemption notifier installs its own SIGTERM handler there,
    which would keep the process training until it is killed."""
    global _installed, _redelivers
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    for sig in _STOP_SIGNALS:
        if sig == getattr(signal, "SIGINT", None) and \
                signal.getsignal(sig) is not signal.default_int_handler:
            continue  # ignored (nohup, a background job) or someone else's
        signal.signal(sig, _on_stop_signal)
    if hasattr(signal, "setitimer") and signal.getsignal(signal.SIGALRM) == signal.SIG_DFL:
        signal.signal(signal.SIGALRM, _on_stop_signal)  # the redelivery
        _redelivers = True
    sys.unraisablehook = _unraisable(sys.unraisablehook)
    _installed = True


def _exit_at_once(signum: int, frame: Any) -> None:
    os._exit(EXIT_INTERRUPTED)


def _stopping(command: str) -> None:
    """Once a stop is being reported: a further stop signal ends the process at once, no
    redelivery is pending, and the exit is bounded by :data:`EXIT_GRACE_S`."""
    if not _installed or threading.current_thread() is not threading.main_thread():
        return
    for sig in _STOP_SIGNALS:
        if signal.getsignal(sig) is _on_stop_signal:
            signal.signal(sig, _exit_at_once)
    _cancel_redelivery()

    def watchdog() -> None:
        time.sleep(EXIT_GRACE_S)
        print(f"{command}: still exiting {EXIT_GRACE_S:g} s after the interrupt; the threads' "
              f"stacks:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(EXIT_INTERRUPTED)

    threading.Thread(target=watchdog, name="skyjax-exit-watchdog", daemon=True).start()


@contextlib.contextmanager
def one_line_errors(command: str, debug: bool = False) -> Iterator[None]:
    """Runs the block; any exception ends the process with one line on stderr
    (``<command>: Type: message``) and :func:`exit_status`'s status; Ctrl-C / SIGTERM with
    ``<command>: interrupted`` and status 130. ``SystemExit`` passes through."""
    global _ending
    if debug or debugging():
        yield
        return
    try:
        yield
    except KeyboardInterrupt:
        _ending = EXIT_INTERRUPTED
        _stopping(command)
        print(f"{command}: interrupted; stopped (committed checkpoints are kept)",
              file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as e:  # noqa: BLE001 - the one place that turns failures into a line
        print(f"{command}: {describe(e)}", file=sys.stderr, flush=True)
        _ending = exit_status(e)
        sys.exit(_ending)
