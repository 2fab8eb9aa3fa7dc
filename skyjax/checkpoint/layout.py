"""Where checkpoints live and what makes one count (file operations only).

``WORKDIR/checkpoints/<step>/`` is a committed checkpoint: ``meta.json`` plus one
``process_<k>.safetensors`` (and ``process_<k>.json``, its manifest) per process that owned units.
Processes write into ``<step>.partial-<attempt>/``; process 0 renames that directory to ``<step>``
only after every process has written and fsynced its files and the union of their tensors covers
every unit (orbax's commit protocol: a temporary directory, a barrier, an atomic rename by the
primary host). A directory whose name is not a plain step number is never restored: a save
killed half-way leaves the previous checkpoint the latest. A ``<step>/`` without ``meta.json`` is
damaged (a commit renames it into place with one), never restored and never silently overwritten.
``meta.json`` carries the size and CRC-32 of every other file and its own checksum
(:func:`meta_checksum`); ``restore.find_resume`` skips a checkpoint that fails them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zlib

from skyjax.jsonio import write_json_atomic

CHECKPOINTS = "checkpoints"
META = "meta.json"
FORMAT_VERSION = 1
_PARTIAL = re.compile(r"^(\d+)\.partial-[0-9a-z]+$")


def checkpoints_dir(workdir: str) -> str:
    return os.path.join(workdir, CHECKPOINTS)


def step_dir(directory: str, step: int) -> str:
    return os.path.join(directory, str(int(step)))


def partial_dir(directory: str, step: int, attempt: str) -> str:
    return os.path.join(directory, f"{int(step)}.partial-{attempt}")


def tensors_file(step_path: str, process: int) -> str:
    return os.path.join(step_path, f"process_{int(process)}.safetensors")


def manifest_file(step_path: str, process: int) -> str:
    return os.path.join(step_path, f"process_{int(process)}.json")


def committed_steps(directory: str) -> list[int]:
    """Steps with a committed checkpoint (a ``<step>/meta.json``), ascending."""
    if not os.path.isdir(directory):
        return []
    steps = [int(name) for name in os.listdir(directory)
             if name.isdigit() and os.path.isfile(os.path.join(directory, name, META))]
    return sorted(steps)


def step_dirs(directory: str) -> list[int]:
    """Steps with a checkpoint directory (``<step>/``, committed or not), ascending. A committed
    directory always has ``meta.json`` (it is renamed into place with it), so one without is a
    damaged checkpoint: counted here, so that it is refused or replaced by name rather than
    silently overwritten."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(name) for name in os.listdir(directory)
                  if name.isdigit() and os.path.isdir(os.path.join(directory, name)))


def check_directory(directory: str) -> None:
    """Raises ``NotADirectoryError`` naming ``directory`` when something other than a directory
    holds its name (a file called ``checkpoints``): neither resumed from nor written into."""
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise NotADirectoryError(f"{directory} is a file, not a directory of checkpoints: move it "
                                 f"aside or use another --workdir")


def latest_step(directory: str) -> int | None:
    steps = committed_steps(directory)
    return steps[-1] if steps else None


def read_meta(step_path: str) -> dict:
    with open(os.path.join(step_path, META)) as f:
        meta = json.load(f)
    if meta.get("format") != FORMAT_VERSION:
        raise ValueError(f"checkpoint {step_path}: format {meta.get('format')!r}, this skyjax "
                         f"reads format {FORMAT_VERSION}")
    return meta


def crc_text(crc: int) -> str:
    """A CRC-32 as written in manifests and ``meta.json``: 8 hex digits."""
    return f"{crc & 0xFFFFFFFF:08x}"


def meta_checksum(meta: dict) -> str:
    """CRC-32 of ``meta`` without its ``checksum`` key, as canonical JSON (sorted keys)."""
    body = {k: v for k, v in meta.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return crc_text(zlib.crc32(text.encode()))


def fsync_path(path: str) -> None:
    """Flush a file's (or a directory's entries') data to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(directory: str, step: int, partial: str, meta: dict) -> str:
    """Writes ``meta.json`` into ``partial`` and renames it to ``<step>`` (atomic on POSIX);
    an existing ``<step>`` (from an earlier attempt of the same run) is replaced."""
    write_json_atomic(meta, os.path.join(partial, META), indent=1)
    for name in os.listdir(partial):
        fsync_path(os.path.join(partial, name))
    final = step_dir(directory, step)
    if os.path.exists(final):
        stale = f"{final}.replaced-{os.getpid()}"
        os.rename(final, stale)
        shutil.rmtree(stale, ignore_errors=True)
    os.rename(partial, final)
    fsync_path(directory)
    return final


def prune(directory: str, keep: int, newest: int | None = None) -> list[int]:
    """Deletes all but the last ``keep`` committed checkpoints up to ``newest`` (0 = keep all;
    call it only once ``newest`` is committed); returns the deleted steps. ``newest`` and the
    ``keep - 1`` steps before it are kept, and so are steps after it (a later checkpoint that
    failed verification when this run resumed: kept for inspection, and replaced when this run
    commits that step). The oldest is deleted first."""
    if keep <= 0:
        return []
    steps = committed_steps(directory)
    if newest is not None:
        steps = [s for s in steps if s <= newest]
    old = steps[:-keep]
    for step in old:
        delete_step(directory, step)
    return old


def delete_step(directory: str, step: int) -> None:
    """Deletes one committed checkpoint: renamed first, so that it is no longer a checkpoint
    even if the deletion is interrupted."""
    path = step_dir(directory, step)
    tmp = f"{path}.deleting"
    os.rename(path, tmp)
    shutil.rmtree(tmp, ignore_errors=True)


def remove_stale(directory: str, attempt: str) -> list[str]:
    """Removes half-written directories of earlier attempts (killed saves); call from process 0
    before this attempt writes anything."""
    removed = []
    if not os.path.isdir(directory):
        return removed
    for name in os.listdir(directory):
        m = _PARTIAL.match(name)
        if (m and not name.endswith(f"-{attempt}")) or name.endswith((".deleting",)) \
                or ".replaced-" in name:
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
            removed.append(name)
    return removed
