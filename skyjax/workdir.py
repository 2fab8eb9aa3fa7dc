"""The workdir of a run: checked before anything starts, held by one run at a time, and never
left half old, half new.

* :func:`check_writable` runs before JAX starts: a workdir that is a file, cannot be created or
  cannot be written is one line, not a traceback after profiling.
* :class:`Claim` holds an exclusive ``flock`` on ``WORKDIR/.skyjax.lock`` for the whole run (on
  process 0): a second training into the same workdir is refused by name instead of overwriting
  the first one's files.
* :func:`set_aside` runs when a run writes its first output, i.e. only once its checks, profile
  and plan have succeeded: the previous run's outputs move aside. A *complete* run (one with
  ``summary.json``) moves into ``WORKDIR/previous/``, replacing the one there; an *incomplete*
  run (it failed or was stopped after writing its first outputs) moves into
  ``WORKDIR/previous.incomplete/`` instead, replacing only an older incomplete run there. So
  ``previous/`` always holds the last complete run, however many failures follow it (two failed
  runs in a row would otherwise push it out), and the latest failure's files stay readable. A run
  that fails before that point leaves the workdir as it was. A resumed run keeps
  ``metrics.jsonl`` and ``tensorboard/`` (it continues them) and sets aside the rest.
"""

from __future__ import annotations

import fcntl
import os
import shutil

# What a run writes at the top of its workdir (skyjax.report.outputs, skyjax.report.watch).
OUTPUT_FILES = ("summary.json", "plan.json", "trace.json", "config.json", "profile.json",
                "metrics.jsonl", "plan.png", "timeline.png")
OUTPUT_DIRS = ("tensorboard",)
CONTINUED_ON_RESUME = ("metrics.jsonl", "tensorboard")  # a resumed run appends to these
PREVIOUS = "previous"  # the last complete run (it wrote summary.json)
INCOMPLETE = "previous.incomplete"  # the latest run set aside without summary.json
COMPLETE_MARK = "summary.json"  # written last: its presence means the run finished
LOCK = ".skyjax.lock"


def check_writable(path: str | None) -> None:
    """Creates ``path`` if needed; raises ``ValueError`` naming it when it cannot hold a run."""
    if not path:
        raise ValueError("--workdir is empty")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"--workdir {path} is a file, not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--workdir {path} cannot be created: {e.strerror or e}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"--workdir {path} is not writable")


def check_output_file(flag: str, path: str) -> None:
    """A file a command will write (``--out``, ``--trace``, ...): checked before the work that
    produces it, which a bad path would otherwise lose; raises ``ValueError`` naming the flag."""
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path} is a directory; name the file to write")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"{flag} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"{flag} {path}: directory {parent} is not writable")


class Claim:
    """An exclusive, non-blocking ``flock`` on the workdir's lock file, released by
    :meth:`release` or when the process ends (the kernel drops it, even after SIGKILL)."""

    def __init__(self, workdir: str):
        check_writable(workdir)
        self.path = os.path.join(workdir, LOCK)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(self._fd)
            self._fd = None
            raise ValueError(f"--workdir {workdir} is in use by another run (pid {holder}); "
                             f"two trainings into one workdir would overwrite each other's "
                             f"files: wait for it, or use another workdir") from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, str(os.getpid()).encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def previous_outputs(workdir: str, resumed: bool) -> list[str]:
    """The names of the previous run's outputs in ``workdir`` that a new run sets aside."""
    keep = CONTINUED_ON_RESUME if resumed else ()
    return [n for n in OUTPUT_FILES + OUTPUT_DIRS
            if n not in keep and os.path.lexists(os.path.join(workdir, n))]


def aside_dir(workdir: str) -> str:
    """Where :func:`set_aside` moves the outputs now in ``workdir``: ``previous/`` if their run
    finished, else ``previous.incomplete/``."""
    complete = os.path.isfile(os.path.join(workdir, COMPLETE_MARK))
    return os.path.join(workdir, PREVIOUS if complete else INCOMPLETE)


def set_aside(workdir: str, resumed: bool) -> list[str]:
    """Moves the previous run's outputs aside (see the module docstring): into
    ``workdir/previous/`` if that run finished (wrote ``summary.json``), else into
    ``workdir/previous.incomplete/``, so that a failed run never replaces the last complete one.
    Returns the names moved. They are gathered in ``<target>.partial/`` first and that directory
    renamed, and the older run there is deleted only after the rename, so each target always
    holds one whole earlier run."""
    names = previous_outputs(workdir, resumed)
    if not names:
        return []
    final = aside_dir(workdir)
    partial = final + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    for name in names:
        os.replace(os.path.join(workdir, name), os.path.join(partial, name))
    gone = final + ".deleting"
    shutil.rmtree(gone, ignore_errors=True)
    if os.path.lexists(final):
        os.replace(final, gone)
    os.replace(partial, final)
    shutil.rmtree(gone, ignore_errors=True)
    return names
