"""The peer watchdog with a fake key-value store (no processes): a silent peer is declared lost
after the timeout, by name and stage; a peer that left cleanly is not; waits raise PeerLost and
the process is ended with EXIT_PEER_LOST after the grace period."""

from __future__ import annotations

import threading
import time

import pytest

from skyjax.names import EXIT_PEER_LOST
from skyjax.runtime.transport.watchdog import DONE, PeerLost, PeerWatchdog


class FakeKV:
    def __init__(self):
        self.data, self.lock = {}, threading.Lock()

    def key_value_set(self, key, value, allow_overwrite=False):
        with self.lock:
            self.data[key] = value

    def key_value_try_get(self, key):
        with self.lock:
            if key not in self.data:
                raise RuntimeError(f"NOT_FOUND: {key}")
            return self.data[key]


def _beating(kv, p, stop):
    n = 0
    while not stop.is_set():
        n += 1
        kv.key_value_set(f"skyjax/alive/{p}", str(n))
        time.sleep(0.02)


def test_silent_peer_is_lost_by_name_and_the_process_exits():
    kv, stop, exits = FakeKV(), threading.Event(), []
    alive = threading.Thread(target=_beating, args=(kv, 1, stop), daemon=True)
    alive.start()
    kv.key_value_set("skyjax/alive/2", "7")  # beat once, then silence
    dog = PeerWatchdog(kv, 0, 3, 0.4, grace_s=0.3, exit=exits.append).start()
    dog.set_roles({2: "stage 1"})
    dog.check("fine so far")
    deadline = time.monotonic() + 5
    while dog.lost is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert dog.lost and dog.lost.startswith("process 2 (stage 1) lost: no heartbeat")
    with pytest.raises(PeerLost, match=r"receiving tag 3: process 2 \(stage 1\) lost"):
        dog.check("receiving tag 3")
    deadline = time.monotonic() + 5
    while not exits and time.monotonic() < deadline:
        time.sleep(0.02)
    assert exits == [EXIT_PEER_LOST]
    stop.set()


def test_peer_that_left_cleanly_is_not_lost():
    kv, exits = FakeKV(), []
    kv.key_value_set("skyjax/alive/1", DONE)
    dog = PeerWatchdog(kv, 0, 2, 0.2, exit=exits.append).start()
    time.sleep(0.8)
    dog.stop()
    assert dog.lost is None and not exits
    assert kv.data["skyjax/alive/0"] == DONE
