"""Noticing a lost peer: heartbeats through the ``jax.distributed`` key-value store.

Every process runs a :class:`PeerWatchdog` thread that bumps its own counter under
``<namespace>/<process>`` every ``timeout_s / 8`` and reads everyone else's. A peer whose counter
has not moved for ``timeout_s`` (``config.cluster.peer_timeout_s``), by this process's own clock,
is lost. Then:

* every bounded wait of this process (``check()`` in the transports' receive loops, key-value
  gets, the checkpoint commit) raises :class:`PeerLost` naming the process and its stage;
* a process that ends after that exits with ``EXIT_PEER_LOST`` (75; an exit handler), which
  tells the launcher that this process survived and another one was lost;
* if the process has not exited ``grace_s`` later (stuck in a call that cannot be interrupted,
  e.g. a barrier inside ``jax.distributed.shutdown``), the watchdog ends it with
  ``os._exit(EXIT_PEER_LOST)``. Checkpoints are committed by an atomic rename, so no exit
  corrupts one.

Heartbeats come from a thread, so a long compile or a slow step of a live peer is not a loss.
Losing process 0 takes the coordination service with it: the key-value store fails, which is
reported as process 0 lost (JAX itself may abort the survivors first, which is as good).
Why not a pull's ``timeout=``: it does not fire in jax 0.10 (see ``transfer.py``); and JAX's own
coordination heartbeats either abort every process with a fatal error or, with recoverability on
(``distributed.initialize``), leave the survivors waiting.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from typing import Any, Callable

from skyjax.names import EXIT_PEER_LOST
from skyjax.runtime.transport.base import TransportError

log = logging.getLogger(__name__)
DONE = "done"  # a peer that left cleanly (after the shutdown barrier) is not lost


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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._count = 0

    def describe(self, p: int) -> str:
        role = self.roles.get(p)
        return f"process {p}" + (f" ({role})" if role else "")

    def set_roles(self, roles: dict[int, str]) -> None:
        self.roles = dict(roles)

    def start(self) -> "PeerWatchdog":
        # Registered after jax.distributed's own exit handler, so it runs first: a process that
        # ends (e.g. on an uncaught PeerLost) once a peer is lost exits with EXIT_PEER_LOST at
        # once, instead of status 1 after JAX's shutdown barrier waited for the dead peer.
        atexit.register(self._exit_if_lost)
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

    def _exit_if_lost(self) -> None:
        if self.lost is not None and not self._stop.is_set():
            sys.stdout.flush()
            sys.stderr.flush()
            self._exit(EXIT_PEER_LOST)

    def check(self, what: str = "") -> None:
        """Raise :class:`PeerLost` if a peer is lost."""
        if self.lost is not None:
            raise PeerLost(f"{what + ': ' if what else ''}{self.lost}")

    # -- the thread
    def _beat(self) -> None:
        self._count += 1
        self.client.key_value_set(f"{self.ns}/{self.me}", str(self._count), allow_overwrite=True)

    def _run(self) -> None:
        seen: dict[int, tuple[str | None, float]] = {}
        while self.lost is None and not self._stop.wait(self.interval_s):
            try:
                self._beat()
            except Exception as e:  # noqa: BLE001 - the service (process 0) is gone
                self._declare(f"{self.describe(0)} lost: the coordination service is "
                              f"unreachable ({str(e).splitlines()[0][:200]})")
                break
            now = time.monotonic()
            for p in range(self.n):
                if p == self.me:
                    continue
                try:
                    value = self.client.key_value_try_get(f"{self.ns}/{p}")
                except Exception:  # noqa: BLE001 - NOT_FOUND: no first beat yet
                    value = None
                last = seen.get(p)
                if value == DONE or last is None or last[0] != value:
                    seen[p] = (value, now)
                elif now - last[1] > (self.timeout_s if value is not None else self.first_s):
                    self._declare(f"{self.describe(p)} lost: no heartbeat for "
                                  f"{now - last[1]:.1f} s (config.cluster.peer_timeout_s="
                                  f"{self.timeout_s:g})")
                    break
        if self.lost is not None and not self._stop.is_set():
            if not self._stop.wait(self.grace_s):
                log.error("exiting: %s", self.lost)
                sys.stderr.flush()
                self._exit(EXIT_PEER_LOST)

    def _declare(self, message: str) -> None:
        if self.lost is None:
            self.lost, self.lost_at = message, time.monotonic()
            log.error("process %d: %s", self.me, message)
