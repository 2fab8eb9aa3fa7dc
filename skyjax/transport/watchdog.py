"""Noticing a lost peer: heartbeats through the ``jax.distributed`` key-value store.

Every process runs a :class:`PeerWatchdog` thread that bumps its own counter under
``<namespace>/<process>`` every ``timeout_s / 8`` and reads everyone else's. A peer whose counter
has not moved for ``timeout_s`` (``config.cluster.peer_timeout_s``), by this process's own clock,
is lost. Then:

* it publishes the loss under ``<namespace>/lost``, and every other process adopts it at its next
  look (or at its exit): a survivor that learns of the loss second-hand, e.g. from process 0's
  failed checkpoint commit, before its own clock runs out, still exits as a survivor;
* every bounded wait of this process (``check()`` in the transports' receive loops, key-value
  gets, the checkpoint commit) raises :class:`PeerLost` naming the process and its stage;
* a process that ends after that exits with ``EXIT_PEER_LOST`` (75; an exit handler), which
  tells the launcher that this process survived and another one was lost;
* a survivor posts ``LEFT`` under its key just before it exits, and process 0 (which hosts the
  coordination service) exits last: it waits for every peer it has not seen lost to post
  ``LEFT`` or ``DONE``, for at most ``timeout_s + grace_s`` plus a margin (:meth:`_leave`). Were
  process 0 to go first, JAX's error poll in a survivor would see the service's socket close and
  abort it (SIGABRT) before its own exit with ``EXIT_PEER_LOST``;
* if the process has not exited ``grace_s`` later (stuck in a call that cannot be interrupted,
  e.g. a barrier inside ``jax.distributed.shutdown``), the watchdog ends it with
  ``os._exit(EXIT_PEER_LOST)``. Checkpoints are committed by an atomic rename, so no exit
  corrupts one.

With several pipelines (``recoverable``), losing a process other than 0 need not end the run: the
trainer drops the lost process's pipeline and retries the step on the others
(``skyjax.runtime.recovery``). The watchdog then holds its exit (for at most ``4 grace_s``) until
the trainer either :meth:`forgive` s the loss, after which the process is left out of every
check and the watching goes on, or ends, exiting with ``EXIT_PEER_LOST`` as above.

Heartbeats come from a thread, so a long compile or a slow step of a live peer is not a loss.
Losing process 0 takes the coordination service with it: the key-value store fails, which is
reported as process 0 lost (JAX itself may abort the survivors first, which is as good).
Why not a pull's ``timeout=``: it does not fire in jax 0.10 (see ``transfer.py``); and JAX's own
coordination heartbeats either abort every process with a fatal error or, with recoverability on
(``distributed.initialize``), leave the survivors waiting.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
import time
from typing import Any, Callable

from skyjax import failures
from skyjax.names import EXIT_PEER_LOST
from skyjax.transport.base import TransportError

log = logging.getLogger(__name__)
DONE = "done"  # a peer that left cleanly (after the shutdown barrier) is not lost
LEFT = "left"  # a survivor of a lost peer, about to exit with EXIT_PEER_LOST: not lost either
_LAST_MARGIN_S = 2.0  # process 0 waits this long beyond a survivor's own deadline to exit
_AFTER_LAST_S = 0.3  # ... and this long after the last LEFT, for that survivor's os._exit


class PeerLost(TransportError):
    """A peer process stopped sending heartbeats (or the coordinator is gone)."""


class PeerWatchdog:
    """Heartbeats of ``num_processes`` processes; this one is ``process_index``.

    ``describe(p)`` names process ``p`` in messages (e.g. ``"process 2 (stage 1)"``);
    ``set_roles`` updates it when the plan changes. ``exit`` is called after ``grace_s`` (tests
    replace it); ``client`` is the key-value client.
    """

    def __init__(self, client: Any, process_index: int, num_processes: int, timeout_s: float, *,
                 namespace: str = "skyjax/alive", grace_s: float | None = None,
                 exit: Callable[[int], None] = os._exit):
        self.client = client
        self.me, self.n = process_index, num_processes
        self.timeout_s = float(timeout_s)
        self.interval_s = max(0.05, min(1.0, self.timeout_s / 8))
        self.grace_s = self.timeout_s if grace_s is None else grace_s
        # A peer that has not beaten yet may still be starting up: it gets longer.
        self.first_s = max(4 * self.timeout_s, 60.0)
        self.ns = namespace
        self._exit = exit
        self.roles: dict[int, str] = {}
        self.lost: str | None = None
        self.lost_at: float | None = None
        self.lost_process: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._count = 0
        self._declaring = threading.Lock()  # the thread, and the exit handler adopting a loss
        self._leaving = threading.Lock()  # the exit handler and the thread may both leave
        self._left = False
        self.recoverable = False  # several pipelines: the trainer may go on without the lost one
        self.gone: set[int] = set()  # lost processes the run went on without (forgive)

    def forgive(self, process: int) -> None:
        """The run goes on without ``process``: it is left out of every later check, and the
        loss no longer raises."""
        with self._declaring:
            self.gone.add(process)
            if self.lost_process == process:
                self.lost, self.lost_at, self.lost_process = None, None, None

    def describe(self, p: int) -> str:
        role = self.roles.get(p)
        return f"process {p}" + (f" ({role})" if role else "")

    def set_roles(self, roles: dict[int, str]) -> None:
        self.roles = dict(roles)

    def start(self) -> "PeerWatchdog":
        # Registered after jax.distributed's own exit handler, so it runs first: a process that
        # ends (e.g. on an uncaught PeerLost) once a peer is lost exits with EXIT_PEER_LOST at
        # once, instead of status 1 after JAX's shutdown barrier waited for the dead peer.
        atexit.register(self.exit_if_lost)
        self._beat()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"skyjax-watchdog-{self.me}")
        self._thread.start()
        return self

    def stop(self, left_cleanly: bool = True) -> None:
        """Stop watching (after the shutdown barrier); tell the others this one left."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if left_cleanly and self.lost is None:
            try:
                self.client.key_value_set(f"{self.ns}/{self.me}", DONE, allow_overwrite=True)
            except Exception:  # noqa: BLE001 - the service may already be gone
                pass

    def exit_if_lost(self) -> None:
        """The exit handler: a process ending while a peer is lost (seen here or published by
        another) leaves with ``EXIT_PEER_LOST``."""
        if self._stop.is_set():
            return
        if self.lost is None:  # ending on an error: was it a loss another process saw first?
            self._adopt_published()
        if self.lost is not None:
            self._leave()

    def _adopt_published(self) -> None:
        try:
            value = self.client.key_value_try_get(f"{self.ns}/lost")
        except Exception:  # noqa: BLE001 - NOT_FOUND: nobody lost a peer (or no service)
            return
        try:
            record = json.loads(value)
            process, message = record["process"], str(record["message"])
        except (ValueError, TypeError, KeyError):
            return
        if process != self.me and process not in self.gone:
            self.declare(message, process, publish=False)

    def _leave(self) -> None:
        """Exit with ``EXIT_PEER_LOST``: a survivor says so first; process 0 goes last."""
        with self._leaving:
            if not self._left:
                self._left = True
                self._leave_once()

    def _leave_once(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        if self.me != 0:
            try:
                self.client.key_value_set(f"{self.ns}/{self.me}", LEFT, allow_overwrite=True)
            except Exception:  # noqa: BLE001 - the service (process 0) is already gone
                pass
        else:
            self._wait_for_survivors()
        self._exit(EXIT_PEER_LOST)

    def _wait_for_survivors(self) -> None:
        """Until every peer not seen lost has posted ``LEFT`` or ``DONE`` (bounded: a peer that
        died unseen never posts; each survivor ends itself within ``timeout_s + grace_s`` of the
        loss, by its own watchdog)."""
        start = self.lost_at if self.lost_at is not None else time.monotonic()
        deadline = start + self.timeout_s + self.grace_s + _LAST_MARGIN_S
        waiting = {p for p in range(self.n)
                   if p not in (self.me, self.lost_process) and p not in self.gone}
        while waiting and time.monotonic() < deadline:
            for p in sorted(waiting):
                try:
                    if self.client.key_value_try_get(f"{self.ns}/{p}") in (LEFT, DONE):
                        waiting.discard(p)
                except Exception:  # noqa: BLE001 - no beat yet
                    pass
            if waiting:
                time.sleep(0.05)
        if waiting:
            log.error("process 0 exits without word from process(es) %s", sorted(waiting))
        else:
            time.sleep(_AFTER_LAST_S)

    def check(self, what: str = "") -> None:
        """Raise :class:`PeerLost` if a peer is lost."""
        if self.lost is not None:
            raise PeerLost(f"{what + ': ' if what else ''}{self.lost}")

    # -- the thread
    def _beat(self) -> None:
        self._count += 1
        self.client.key_value_set(f"{self.ns}/{self.me}", str(self._count), allow_overwrite=True)

    def _held(self) -> bool:
        """Whether a declared loss waits for the trainer (several pipelines, not process 0),
        for at most 4 ``grace_s``."""
        return (self.recoverable and self.lost_process not in (None, 0)
                and time.monotonic() - self.lost_at < 4 * self.grace_s)

    def _run(self) -> None:
        seen: dict[int, tuple[str | None, float]] = {}
        while not self._stop.wait(self.interval_s):
            if self.lost is not None:
                if self._held():
                    continue
                break
            self._adopt_published()
            if self.lost is not None:
                continue  # held or not: the check above
            try:
                self._beat()
            except Exception as e:  # noqa: BLE001 - the service (process 0) is gone
                self.declare(f"{self.describe(0)} lost: the coordination service is "
                              f"unreachable ({str(e).splitlines()[0][:200]})", 0)
                break
            now = time.monotonic()
            for p in range(self.n):
                if p == self.me or p in self.gone:
                    continue
                try:
                    value = self.client.key_value_try_get(f"{self.ns}/{p}")
                except Exception:  # noqa: BLE001 - NOT_FOUND: no first beat yet
                    value = None
                last = seen.get(p)
                if value in (DONE, LEFT) or last is None or last[0] != value:
                    seen[p] = (value, now)
                elif now - last[1] > (self.timeout_s if value is not None else self.first_s):
                    self.declare(f"{self.describe(p)} lost: no heartbeat for "
                                  f"{now - last[1]:.1f} s (config.cluster.peer_timeout_s="
                                  f"{self.timeout_s:g})", p)
                    break
        if self.lost is not None and not self._stop.is_set():
            if self.lost_process == 0 and self.me != 0:
                self._coordinator_gone()
            if not self._stop.wait(self.grace_s):
                log.error("exiting: %s", self.lost)
                self._leave()

    def _coordinator_gone(self) -> None:
        """Process 0, and the coordination service with it, is gone: nothing here can go on,
        and JAX's own error poll aborts the process (its output filtered by ``group``) if
        this does not come first: exit now, with one line (none when this process was
        already ending with its own one line, whose status it keeps)."""
        ending = failures.ending_status()
        sys.stdout.flush()
        if ending is None:
            print(f"skyjax: process {self.me}: {self.lost}", file=sys.stderr, flush=True)
        self._exit(EXIT_PEER_LOST if ending is None else ending)

    def declare(self, message: str, process: int, publish: bool = True) -> None:
        """Records ``process`` as lost (the first loss only) and, with ``publish``, tells the
        other processes through the key-value store."""
        with self._declaring:
            if self.lost is not None:
                return
            self.lost, self.lost_at, self.lost_process = message, time.monotonic(), process
            if process != 0 or self.me == 0:  # (process 0 lost: _coordinator_gone's line)
                log.error("process %d: %s", self.me, message)
            if publish and process != 0:  # (process 0 lost: no service to publish through)
                try:
                    self.client.key_value_set(
                        f"{self.ns}/lost", json.dumps({"process": process, "message": message}),
                        allow_overwrite=True)
                except Exception:  # noqa: BLE001 - the service may be gone too
                    pass
