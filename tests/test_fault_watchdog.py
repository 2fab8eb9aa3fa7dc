"""The peer watchdog with a fake key-value store (no processes): a silent peer is declared lost
after the timeout, by name and stage; a peer that left cleanly is not; waits raise PeerLost and
the process is ended with EXIT_PEER_LOST after the grace period."""

from __future__ import annotations

import threading
import time

import pytest

from skyjax.names import EXIT_PEER_LOST
from skyjax.transport.watchdog import DONE, LEFT, PeerLost, PeerWatchdog


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


def _wait_for(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def test_a_survivor_posts_left_before_it_exits():
    kv, stop, exits = FakeKV(), threading.Event(), []
    threading.Thread(target=_beating, args=(kv, 0, stop), daemon=True).start()
    kv.key_value_set("skyjax/alive/2", "3")  # then silence
    dog = PeerWatchdog(kv, 1, 3, 0.3, grace_s=0.2, exit=exits.append).start()
    assert _wait_for(lambda: exits)
    stop.set()
    assert exits == [EXIT_PEER_LOST] and dog.lost_process == 2
    assert kv.data["skyjax/alive/1"] == LEFT


def test_process_0_exits_after_the_other_survivors():
    """Process 0 hosts the coordination service: exiting first would let JAX abort the survivors
    (SIGABRT) before they exit with EXIT_PEER_LOST. It waits for their LEFT, then exits."""
    kv, stop, events = FakeKV(), threading.Event(), []
    threading.Thread(target=_beating, args=(kv, 1, stop), daemon=True).start()
    kv.key_value_set("skyjax/alive/2", "3")  # then silence: process 2 is lost
    dog = PeerWatchdog(kv, 0, 3, 0.3, grace_s=0.2,
                       exit=lambda code: events.append(("exit", code))).start()
    assert _wait_for(lambda: dog.lost is not None)
    time.sleep(0.2 + 0.4)  # past process 0's own grace period: it is waiting for process 1
    assert events == [] and dog.lost_process == 2
    stop.set()
    events.append(("left", 1))
    kv.key_value_set("skyjax/alive/1", LEFT)
    assert _wait_for(lambda: len(events) == 2)
    assert events == [("left", 1), ("exit", EXIT_PEER_LOST)]


def test_process_0_waits_for_a_silent_survivor_only_so_long():
    kv, exits = FakeKV(), []
    kv.key_value_set("skyjax/alive/1", "5")  # both peers beat once, then nothing
    kv.key_value_set("skyjax/alive/2", "3")
    dog = PeerWatchdog(kv, 0, 3, 0.3, grace_s=0.2, exit=exits.append).start()
    assert _wait_for(lambda: dog.lost is not None)
    lost_at = dog.lost_at
    assert _wait_for(lambda: exits, 10)  # not for ever
    waited = time.monotonic() - lost_at
    assert exits == [EXIT_PEER_LOST]
    assert waited >= 0.3 + 0.2 + 2.0, waited  # until its deadline: timeout + grace + margin


def test_a_survivor_that_left_is_not_blamed():
    kv, exits = FakeKV(), []
    kv.key_value_set("skyjax/alive/1", LEFT)
    dog = PeerWatchdog(kv, 0, 2, 0.2, exit=exits.append).start()
    time.sleep(0.8)
    dog.stop()
    assert dog.lost is None and not exits


def test_a_loss_seen_by_one_process_is_adopted_by_the_others():
    """Process 0 saw process 2 go; process 1, told second-hand (e.g. by a failed commit) and
    ending on that error before its own clock ran out, still exits as a survivor."""
    kv, exits = FakeKV(), []
    for p in (0, 2):
        kv.key_value_set(f"skyjax/alive/{p}", "1")
    seer = PeerWatchdog(kv, 0, 3, 60.0, exit=exits.append)
    seer.declare("process 2 (stage 1) lost: no heartbeat for 61.0 s", 2)
    late = PeerWatchdog(kv, 1, 3, 60.0, exit=exits.append)  # never started: its clock is far
    late.exit_if_lost()  # the exit handler of a process ending on an error
    assert late.lost == "process 2 (stage 1) lost: no heartbeat for 61.0 s"
    assert late.lost_process == 2 and exits == [EXIT_PEER_LOST]
    assert kv.data["skyjax/alive/1"] == LEFT
    with pytest.raises(PeerLost, match=r"process 2 \(stage 1\) lost"):
        late.check()


def test_a_running_watchdog_adopts_a_published_loss_at_its_next_look():
    kv, stop, exits = FakeKV(), threading.Event(), []
    threading.Thread(target=_beating, args=(kv, 0, stop), daemon=True).start()
    threading.Thread(target=_beating, args=(kv, 2, stop), daemon=True).start()
    dog = PeerWatchdog(kv, 1, 3, 30.0, grace_s=0.2, exit=exits.append).start()
    time.sleep(0.2)
    assert dog.lost is None
    PeerWatchdog(kv, 0, 3, 30.0).declare("process 2 lost: no heartbeat for 31.0 s", 2)
    assert _wait_for(lambda: exits, 10)
    stop.set()
    assert dog.lost == "process 2 lost: no heartbeat for 31.0 s" and exits == [EXIT_PEER_LOST]


def test_no_published_loss_no_exit_code():
    kv, exits = FakeKV(), []
    dog = PeerWatchdog(kv, 1, 2, 60.0, exit=exits.append)
    dog.exit_if_lost()
    assert dog.lost is None and exits == []
