"""``jax.distributed`` set-up for one-process-per-stage runs.

Where the coordinator comes from, first match wins:

1. explicit arguments (e.g. from the config);
2. ``SKYJAX_COORDINATOR`` / ``SKYJAX_NUM_PROCESSES`` / ``SKYJAX_PROCESS_ID``, set by
   ``python -m skyjax.launch``;
3. JAX's own cluster auto-detection (SLURM, Cloud TPU pods, Open MPI, ...): plain
   ``jax.distributed.initialize()``.

Timeouts are shorter than JAX's defaults (300 s shutdown barrier, 100 s heartbeat) so that a dead
peer does not hold the survivors for five minutes. A lost peer is noticed by skyjax's own
heartbeats (:func:`start_watchdog`, ``config.cluster.peer_timeout_s``): JAX's coordination service
runs with recoverability on, so it does not abort every process on its own, and every wait here
(:func:`kv_get`, :func:`broadcast_json`, the transports) is cut short by the watchdog.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
import time
from typing import Any

import jax

from skyjax import env_vars
from skyjax.names import EXIT_PEER_LOST
from skyjax.transport.watchdog import PeerWatchdog


log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DistributedInfo:
    process_id: int
    num_processes: int
    coordinator_address: str | None  # None when JAX auto-detected the cluster


_info: DistributedInfo | None = None
_shutdown_barrier_s: float = 120.0
_watchdog: PeerWatchdog | None = None
_POLL_MS = 500  # key-value waits look at the watchdog this often


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else None


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, timeout_s: float = 120.0, *,
               heartbeat_timeout_s: float = 60.0, shutdown_timeout_s: float = 15.0,
               local_device_ids: int | list[int] | None = None,
               cpu_collectives: str | None = "gloo") -> DistributedInfo:
    """Join (or start, as process 0) the ``jax.distributed`` coordination service.

    Must run before anything touches a JAX backend; it does not start the backends itself.
    ``timeout_s``: how long to wait for every process to connect. ``heartbeat_timeout_s``: a
    process silent this long is declared dead (JAX then aborts the others; default 100 s).
    ``shutdown_timeout_s``: JAX's own barrier in :func:`shutdown` (default 300 s), kept short
    because :func:`shutdown` first waits at a barrier of its own. ``cpu_collectives``: CPU
    collectives implementation (gloo), so CPU processes can run cross-process computations.
    Idempotent: a second call returns the first call's result.
    """
    global _info
    if _info is not None:
        return _info
    coordinator_address = coordinator_address or os.environ.get(env_vars.COORDINATOR) or None
    if num_processes is None:
        num_processes = _env_int(env_vars.NUM_PROCESSES)
    if process_id is None:
        process_id = _env_int(env_vars.PROCESS_ID)
    kwargs = dict(initialization_timeout=int(max(1, timeout_s)),
                  heartbeat_timeout_seconds=int(max(1, heartbeat_timeout_s)),
                  shutdown_timeout_seconds=int(max(1, shutdown_timeout_s)))
    if local_device_ids is not None:
        kwargs["local_device_ids"] = local_device_ids
    explicit = (coordinator_address, num_processes, process_id)
    if any(v is not None for v in explicit) and not all(v is not None for v in explicit):
        raise ValueError(
            "give all of coordinator address, number of processes and process id, or none of "
            f"them (got coordinator={coordinator_address!r}, num_processes={num_processes!r}, "
            f"process_id={process_id!r}; env {env_vars.COORDINATOR}/{env_vars.NUM_PROCESSES}/"
            f"{env_vars.PROCESS_ID})")
    if process_id is not None and not 0 <= process_id < num_processes:
        raise ValueError(f"process_id {process_id} not in [0, {num_processes})")
    if cpu_collectives:
        try:
            jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
        except (AttributeError, KeyError, ValueError) as e:  # option renamed in some version
            log.warning("could not set jax_cpu_collectives_implementation=%s: %s",
                        cpu_collectives, e)
    try:  # a dead peer is skyjax's watchdog's to report, not a fatal error in every process
        jax.config.update("jax_enable_recoverability", True)
    except (AttributeError, KeyError, ValueError) as e:
        log.warning("could not enable jax_enable_recoverability: %s", e)
    if process_id not in (None, 0) and (num_processes or 0) > 1:
        _quiet_coordinator_loss(process_id)
    # JAX aborts the process (a C++ fatal error and a stack dump) when a peer never connects;
    # this timer ends it first with one line naming what is missing.
    kwargs["initialization_timeout"] = int(max(1, timeout_s)) + 30
    timer = threading.Timer(max(1.0, timeout_s), _missing_peers,
                            (coordinator_address, num_processes, process_id, timeout_s))
    timer.daemon = True
    timer.start()
    try:
        if all(v is not None for v in explicit):
            log.info("jax.distributed: process %d/%d, coordinator %s", process_id,
                     num_processes, coordinator_address)
            jax.distributed.initialize(coordinator_address, num_processes, process_id,
                                       **kwargs)
        else:
            log.info("jax.distributed: auto-detecting the cluster (SLURM, TPU, ...)")
            jax.distributed.initialize(**kwargs)
    finally:
        timer.cancel()
    global _shutdown_barrier_s
    _shutdown_barrier_s = max(timeout_s, 120.0)
    # From the coordination state, not jax.process_index(): that would start the backends, and
    # some options (e.g. jax_cross_host_transfer_socket_address) must be set between the two.
    from jax._src import distributed as _dist

    state = _dist.global_state
    _info = DistributedInfo(int(state.process_id), int(state.num_processes),
                            state.coordinator_address)
    return _info


# A process other than 0 when process 0 (the coordination service) dies: JAX's error poll logs
# a C++ fatal error with a stack dump and aborts (Python's faulthandler adds every thread's
# stack), ~140 lines, before skyjax's watchdog can say which process went. So this process's
# stderr goes through a filter process that, from JAX's first line about the lost service,
# passes only skyjax's own lines ("skyjax..."), and at the end, if none came, says in one line
# what happened. A separate process, not a thread: it drains everything written before any
# exit, os._exit, abort and SIGKILL included. The status stays JAX's abort (134), which the
# launcher reads as a report of a lost peer, as 75.
_COORDINATOR_GONE = (b"Polled an error from coordination service",
                     b"Terminating process because the JAX distributed service",
                     b"Failed to retrieve preemption notice from coordination service")
_FILTER = r"""
import signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # drain until the process it serves has ended
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signs, out, quiet, said = {signs!r}, sys.stdout.buffer, False, False
for line in sys.stdin.buffer:
    quiet = quiet or any(s in line for s in signs)
    if not quiet or line.startswith(b"skyjax"):
        said = said or quiet
        out.write(line)
        out.flush()
if quiet and not said:
    out.write(("skyjax: process %s: process 0 lost: the coordination service is gone (JAX's "
               "abort that followed is left out)\n" % sys.argv[1]).encode())
""".format(signs=_COORDINATOR_GONE)


def _quiet_coordinator_loss(process_id: int) -> None:
    """This process's stderr through :data:`_FILTER` (the comment above)."""
    if os.environ.get("SKYJAX_DEBUG", "") not in ("", "0"):
        return  # --debug shows everything
    import subprocess

    try:
        sys.stderr.flush()
        read, write = os.pipe()
        subprocess.Popen([sys.executable, "-S", "-c", _FILTER, str(process_id)], stdin=read,
                         stdout=2, stderr=subprocess.DEVNULL, close_fds=True)
        os.close(read)
        os.dup2(write, 2)
        os.close(write)
    except OSError as e:  # e.g. no process left to start: the abort's output as before
        log.warning("no stderr filter for a lost coordinator: %s", e)


def _missing_peers(coordinator: str | None, n: int | None, me: int | None,
                   timeout_s: float) -> None:
    """Ends a process whose peers did not all connect within ``timeout_s``, in one line."""
    who = f"process {me}" if me is not None else "this process"
    if me == 0 or me is None:
        what = (f"not every one of the {n or '?'} processes connected to the coordinator "
                f"{coordinator or '(auto-detected)'} within {timeout_s:g} s "
                f"(config.cluster.peer_timeout_s): one did not start, or cannot reach it")
    else:
        what = (f"could not register with the coordinator (process 0) at {coordinator} within "
                f"{timeout_s:g} s (config.cluster.peer_timeout_s): process 0 is not running, "
                f"or this host cannot reach that address, or another process is missing")
    print(f"skyjax: {who}: {what}", file=sys.stderr, flush=True)
    os._exit(EXIT_PEER_LOST)


def is_initialized() -> bool:
    return _info is not None


def info() -> DistributedInfo:
    if _info is None:
        raise RuntimeError("skyjax.transport.group.initialize() has not been called")
    return _info


def key_value_client():
    """The coordination service client (``key_value_set``, ``blocking_key_value_get``,
    ``wait_at_barrier``, ...) of this process."""
    from jax._src import distributed as _dist  # no public accessor in jax 0.10/0.11
    client = _dist.global_state.client
    if client is None:
        raise RuntimeError("jax.distributed is not initialized; call "
                           "skyjax.transport.group.initialize() first")
    return client


def start_watchdog(peer_timeout_s: float) -> PeerWatchdog | None:
    """Start (once) this process's heartbeat watchdog; None in a single process."""
    global _watchdog
    if _info is None or _info.num_processes <= 1:
        return None
    if _watchdog is None:
        _watchdog = PeerWatchdog(key_value_client(), _info.process_id, _info.num_processes,
                                 peer_timeout_s).start()
    return _watchdog


def watchdog() -> PeerWatchdog | None:
    """The running watchdog, if any."""
    return _watchdog


def gone_processes() -> set[int]:
    """The lost processes the run went on without (``PeerWatchdog.forgive``): every wait for
    all processes (collectives, the checkpoint commit, the shutdown barrier) leaves them out."""
    return set(_watchdog.gone) if _watchdog is not None else set()


def check_peers(what: str = "") -> None:
    """Raise ``PeerLost`` if the watchdog has declared a peer lost."""
    if _watchdog is not None:
        _watchdog.check(what)


def confirm_loss(what: str) -> None:
    """After a link to a peer broke (a closed connection): wait for the watchdog to declare the
    loss, raising ``PeerLost`` (at most twice its timeout); return if it does not. A closed
    socket is seen at once, the missing heartbeats only ``peer_timeout_s`` later, and a loss is
    what the trainer can act on (``runtime.recovery``)."""
    if _watchdog is None:
        return
    deadline = time.monotonic() + 2 * _watchdog.timeout_s + 1.0
    while time.monotonic() < deadline:
        _watchdog.check(what)
        time.sleep(0.05)


def kv_get(key: str, timeout_s: float, what: str, client: Any = None,
           as_bytes: bool = False) -> Any:
    """``blocking_key_value_get`` in slices of 0.5 s, so a lost peer (the watchdog) ends the
    wait at once; ``TimeoutError`` naming ``what`` after ``timeout_s``."""
    client = client if client is not None else key_value_client()
    get = client.blocking_key_value_get_bytes if as_bytes else client.blocking_key_value_get
    deadline = time.monotonic() + timeout_s
    while True:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            raise TimeoutError(f"{what}: nothing after {timeout_s:g} s (key {key})")
        try:  # a key that is there is returned even after a loss: every process that reads a
            # collective's keys then sees the same outcome (runtime.recovery relies on it)
            return get(key, max(1, min(_POLL_MS, left_ms)))
        except Exception as e:  # jax raises JaxRuntimeError(DEADLINE_EXCEEDED: ...)
            check_peers(what)
            if "DEADLINE_EXCEEDED" not in str(e) and "timed out" not in str(e):
                raise


def broadcast_json(obj: Any, key: str, timeout_s: float = 600.0) -> Any:
    """Process 0's JSON-able ``obj`` on every process, through the key-value store under ``key``
    (use a key unique to this call). Other processes' ``obj`` is ignored."""
    if jax.process_count() == 1:
        return obj
    client = key_value_client()
    if jax.process_index() == 0:
        client.key_value_set(key, json.dumps(obj))
        return obj
    return json.loads(kv_get(key, timeout_s, f"process {jax.process_index()}: waiting for "
                                              f"process 0's {key}", client))


def shutdown(barrier_timeout_s: float | None = None) -> None:
    """Leave the coordination service.

    First waits (up to ``barrier_timeout_s``, default max(init timeout, 120 s)) until every process
    has arrived here, since processes finish at different times (the last stage evaluates, ...)
    and JAX's own shutdown barrier is kept short. If that barrier fails (a peer died), shuts down
    anyway. Safe to call when not initialized.
    """
    global _info
    if _info is None:
        return
    timeout = _shutdown_barrier_s if barrier_timeout_s is None else barrier_timeout_s
    global _watchdog
    gone = sorted(gone_processes())
    if _info.num_processes > 1:
        try:  # the processes a run went on without (several pipelines) never arrive
            live = [p for p in range(_info.num_processes) if p not in gone]
            key_value_client().wait_at_barrier("skyjax/shutdown", int(timeout * 1000),
                                               live if gone else None)
        except Exception as e:  # noqa: BLE001 - a dead peer must not stop us shutting down
            log.warning("shutdown barrier failed (%s); shutting down anyway", e)
    if _watchdog is not None:  # everyone is here: leaving is not a loss
        _watchdog.stop()
        _watchdog = None
    if _info.num_processes > 1 and _info.process_id == 0:
        # With recoverability on, JAX's own shutdown barrier no longer holds process 0 (the
        # coordination service) until the others have disconnected: a process still
        # disconnecting when it goes would die with a fatal error. get_live_nodes returns once
        # every other process has disconnected (or, dead, missed its heartbeats).
        try:
            key_value_client().get_live_nodes([p for p in range(_info.num_processes)
                                               if p not in gone])
        except Exception as e:  # noqa: BLE001
            log.warning("waiting for the other processes to disconnect failed (%s)", e)
    try:
        jax.distributed.shutdown()
    finally:
        _info = None
