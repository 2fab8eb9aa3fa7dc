"""Transports: LocalTransport (threads) in-process; TransferServerTransport with 3 processes.

The multi-process tests run this very file as a module (``test_transport``, tests/ on PYTHONPATH)
under ``skyjax.launcher.launch``; the ``__main__`` block at the end is the worker.
"""

from __future__ import annotations

import io
import os
import socket
import sys
import threading
import time

import numpy as np
import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS_DIR)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from skyjax.cluster import LinkEmulation  # noqa: E402
from skyjax.transport import (  # noqa: E402
    LocalTransport, TransferServerTransport, Transport, TransportError, TransportTimeout)
from skyjax.tree import tree_nbytes  # noqa: E402

LATENCY_S, BANDWIDTH_BPS, EMU_FLOATS = 0.05, 1e6, 5000  # 20 kB -> 20 ms on the wire


def _tree(k: int, step: int = 0) -> dict:
    return {"x": jnp.arange(6, dtype=jnp.float32).reshape(2, 3) + 10 * k + step,
            "y": (jnp.full((4,), k, jnp.int32), jnp.asarray(1.5 * k, jnp.bfloat16))}


def _like(tree):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)


def _assert_tree_equal(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def _emulation(p: int) -> LinkEmulation:
    lat = np.full((p, p), LATENCY_S)
    np.fill_diagonal(lat, 0.0)
    return LinkEmulation(lat, np.full((p, p), BANDWIDTH_BPS))


def _run_threads(fns, timeout=60):
    """Run one function per stage in threads; re-raise the first exception."""
    results, errors = [None] * len(fns), []

    def wrap(i, fn):
        try:
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(i, f), daemon=True) for i, f in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "stage thread hung"
    if errors:
        raise errors[0]
    return results


# ------------------------------------------------------------------------------ LocalTransport

@pytest.fixture
def devices():
    devs = jax.local_devices()
    return [devs[i % len(devs)] for i in range(3)]


def test_local_ring_out_of_order_and_collectives(devices):
    t = LocalTransport(devices, timeout_s=20)
    assert isinstance(t.for_stage(0), Transport)

    def stage(k):
        s = t.for_stage(k)
        nxt, prv = (k + 1) % 3, (k - 1) % 3
        s.send(7, _tree(k), nxt)
        got = s.recv(7, _like(_tree(prv)), prv)
        _assert_tree_equal(got, _tree(prv))
        assert all(leaf.devices() == {devices[k]} for leaf in jax.tree.leaves(got))
        for tag in (1, 2, 3):  # sent in order, received out of order
            s.send(tag, _tree(k, tag), nxt)
        for tag in (3, 1, 2):
            _assert_tree_equal(s.recv(tag, _like(_tree(prv)), prv), _tree(prv, tag))
        s.send(5, _tree(k, 1), nxt)  # a tag reused: received in sending order
        s.send(5, _tree(k, 2), nxt)
        _assert_tree_equal(s.recv(5, None, prv), _tree(prv, 1))
        _assert_tree_equal(s.recv(5, None, prv), _tree(prv, 2))
        sums = [s.allreduce_sum(k + 0.25, tag=0) for _ in range(3)]
        gathered = s.gather_to_first({"stage": k, "v": [k] * k}, tag=1)
        s.barrier(2)
        return sums, gathered

    res = _run_threads([lambda k=k: stage(k) for k in range(3)])
    for sums, _ in res:
        assert sums == [3.75] * 3
    assert res[0][1] == [{"stage": k, "v": [k] * k} for k in range(3)]
    assert res[1][1] is None and res[2][1] is None
    assert t.idle()  # nothing left over


def test_local_recv_timeout_names_stages_and_tag(devices):
    t = LocalTransport(devices, timeout_s=0.3)
    start = time.monotonic()
    with pytest.raises(TransportTimeout, match=r"stage 2 receiving tag 42 from stage 1"):
        t.for_stage(2).recv(42, None, 1)
    assert time.monotonic() - start < 5
    with pytest.raises(TransportTimeout, match="allreduce tag 3"):
        t.for_stage(0).allreduce_sum(1.0, tag=3)


def test_local_shape_mismatch_and_abort(devices):
    t = LocalTransport(devices, timeout_s=20)
    t.for_stage(0).send(1, {"a": jnp.zeros((2,))}, 1)
    with pytest.raises(TransportError, match="expected"):
        t.for_stage(1).recv(1, {"a": jax.ShapeDtypeStruct((3,), jnp.float32)}, 0)
    threading.Timer(0.2, t.abort, args=("stage 0 failed",)).start()
    start = time.monotonic()
    with pytest.raises(TransportError, match="stage 0 failed"):
        t.for_stage(1).recv(9, None, 0)
    assert time.monotonic() - start < 5


def test_local_link_emulation_delays(devices, monkeypatch):
    """Messages are held back latency + bytes / bandwidth from their send, one at a time per
    link (lower bounds on the wall clock: a loaded host only adds to them); one received after
    its due time is not held back again (the sleep asked for is recorded)."""
    from skyjax.transport import base

    waits, real_sleep = [], base.precise_sleep

    def recorded(seconds, stop=None):
        waits.append(seconds)
        return real_sleep(seconds, stop)

    monkeypatch.setattr(base, "precise_sleep", recorded)
    t = LocalTransport(devices, _emulation(3), timeout_s=20)
    payload = {"w": jnp.ones((EMU_FLOATS,), jnp.float32)}
    nbytes = tree_nbytes(payload)
    one = LATENCY_S + nbytes / BANDWIDTH_BPS
    s0, s1 = t.for_stage(0), t.for_stage(1)
    jax.block_until_ready(jax.device_put(payload, devices[1]))  # warm up the copy
    start = time.monotonic()
    s0.send(1, payload, 1)
    s0.send(2, payload, 1)  # queued behind the first: bandwidth serialises
    s1.recv(1, _like(payload), 0)
    first = time.monotonic() - start
    s1.recv(2, _like(payload), 0)
    second = time.monotonic() - start
    assert one <= first, first
    assert one + nbytes / BANDWIDTH_BPS <= second, second
    # A message received late is not delayed again: the delay counts from the send.
    s0.send(3, payload, 1)
    time.sleep(one + 0.02)
    del waits[:]
    s1.recv(3, _like(payload), 0)
    assert len(waits) == 1 and waits[0] <= 0, waits


# ------------------------------------------------------------------ distributed.initialize checks

def test_initialize_rejects_partial_coordinates(monkeypatch):
    from skyjax.transport import group as distributed

    for var in ("SKYJAX_COORDINATOR", "SKYJAX_NUM_PROCESSES", "SKYJAX_PROCESS_ID"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="all of coordinator address"):
        distributed.initialize("127.0.0.1:1", num_processes=2)
    monkeypatch.setenv("SKYJAX_COORDINATOR", "127.0.0.1:1")
    monkeypatch.setenv("SKYJAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("SKYJAX_PROCESS_ID", "2")
    with pytest.raises(ValueError, match=r"process_id 2 not in \[0, 2\)"):
        distributed.initialize()
    assert not distributed.is_initialized()
    with pytest.raises(RuntimeError, match="not initialized"):
        distributed.key_value_client()
    distributed.shutdown()  # a no-op when not initialized


# --------------------------------------------------------------- TransferServerTransport (3 procs)

@pytest.mark.slow
@pytest.mark.timeout(240)
def test_transfer_server_transport_three_processes():
    from skyjax.launcher import launch

    out = io.BytesIO()
    start = time.monotonic()
    env = {"PYTHONPATH": os.pathsep.join([TESTS_DIR, REPO]), "XLA_FLAGS": "",
           "JAX_PLATFORMS": "cpu"}
    first = _free_run(8)  # the servers take their control ports from a range (the variable)
    env["SKYJAX_TRANSFER_PORTS"] = f"{first}-{first + 7}"
    rc = launch([], 3, timeout_s=180, env=env, module="test_transport", stdout=out, grace_s=2)
    text = out.getvalue().decode(errors="replace")
    print(text[-6000:])
    assert rc == 0, text[-6000:]
    for k in range(3):
        for check in ("ring", "out-of-order", "prefetch", "allreduce", "gather", "emulation", "timeout",
                      "cleanup", "done"):
            assert f"[p{k}] OK {check}" in text, (k, check)
    assert time.monotonic() - start < 180


def _worker() -> None:
    from skyjax.transport import group as distributed

    info = distributed.initialize(timeout_s=60)
    k, p = info.process_id, info.num_processes
    assert p == 3
    device = jax.local_devices()[0]
    t = TransferServerTransport(k, p, device, timeout_s=60)
    nxt, prv = (k + 1) % p, (k - 1) % p
    first, last = map(int, os.environ["SKYJAX_TRANSFER_PORTS"].split("-"))
    port = int(t.address.rpartition(":")[2])
    assert first <= port <= last and t.address.startswith("127.0.0.1:"), t.address

    # Ring of pytrees.
    t.send(7, _tree(k), nxt)
    got = t.recv(7, _like(_tree(prv)), prv)
    _assert_tree_equal(got, _tree(prv))
    assert all(leaf.devices() == {device} for leaf in jax.tree.leaves(got))
    print("OK ring", flush=True)

    # Out of order (the sender offers tags 1, 2, 3 with pauses; the receiver asks for 3, 1, 2),
    # a reused tag, and an empty tree.
    for tag in (1, 2, 3):
        t.send(tag, _tree(k, tag), nxt)
        time.sleep(0.05)
    for tag in (3, 1, 2):
        _assert_tree_equal(t.recv(tag, _like(_tree(prv)), prv), _tree(prv, tag))
    t.send(5, _tree(k, 1), nxt)
    t.send(5, _tree(k, 2), nxt)
    _assert_tree_equal(t.recv(5, _like(_tree(prv)), prv), _tree(prv, 1))
    _assert_tree_equal(t.recv(5, _like(_tree(prv)), prv), _tree(prv, 2))
    # Receives posted ahead (the pipeline's pull-ahead), before the sender offers, and a reused
    # tag: the first prefetch pairs with the first message, a later plain recv with the next.
    t.prefetch(8, _like(_tree(prv)), prv)
    t.prefetch(9, _like(_tree(prv)), prv)
    time.sleep(0.05)
    for tag, step in ((9, 0), (8, 1), (8, 2)):
        t.send(tag, _tree(k, step), nxt)
    _assert_tree_equal(t.recv(8, _like(_tree(prv)), prv), _tree(prv, 1))
    _assert_tree_equal(t.recv(9, _like(_tree(prv)), prv), _tree(prv, 0))
    _assert_tree_equal(t.recv(8, _like(_tree(prv)), prv), _tree(prv, 2))
    print("OK prefetch", flush=True)
    t.send(6, {}, nxt)
    assert t.recv(6, {}, prv) == {}
    for tag, wrong in ((8, jax.ShapeDtypeStruct((3,), jnp.float32)),  # shape: the pull fails
                       (9, jax.ShapeDtypeStruct((2,), jnp.int32))):  # dtype: caught by checksum
        try:
            t.send(tag, {"a": jnp.zeros((2,))}, nxt)
            t.recv(tag, {"a": wrong}, prv)
            raise AssertionError(f"mismatch not detected: {wrong}")
        except TransportError as e:
            assert "expected" in str(e), e
    print("OK out-of-order", flush=True)

    # Host-scalar collectives.
    for _ in range(3):
        assert t.allreduce_sum(k + 0.25, tag=0) == 3.75
    gathered = t.gather_to_first({"stage": k, "v": [k] * k}, tag=1)
    if k == 0:
        assert gathered == [{"stage": j, "v": [j] * j} for j in range(p)], gathered
    else:
        assert gathered is None
    print("OK allreduce", flush=True)
    t.barrier(2)
    print("OK gather", flush=True)

    # Link emulation: stage 0 -> 1, two messages back to back.
    emu = TransferServerTransport(k, p, device, _emulation(p), namespace="emu", timeout_s=60)
    payload = {"w": jnp.ones((EMU_FLOATS,), jnp.float32)}
    one = LATENCY_S + tree_nbytes(payload) / BANDWIDTH_BPS
    emu.barrier(0)
    times = {}
    if k == 0:
        times["send"] = time.time()
        emu.send(1, payload, 1)
        emu.send(2, payload, 1)
    elif k == 1:
        emu.recv(1, _like(payload), 0)
        times["first"] = time.time()
        emu.recv(2, _like(payload), 0)
        times["second"] = time.time()
    allt = emu.gather_to_first(times, tag=1)
    if k == 0:
        sent, first, second = allt[0]["send"], allt[1]["first"], allt[1]["second"]
        print(f"emulated delays: {first - sent:.4f} s, {second - sent:.4f} s "
              f"(expected >= {one:.4f}, {one + one - LATENCY_S:.4f})", flush=True)
        assert one <= first - sent  # lower bounds: a loaded host only adds to them
        assert one + (one - LATENCY_S) <= second - sent
    print("OK emulation", flush=True)

    # A receive that nobody answers times out with the stage and tag in the message.
    short = TransferServerTransport(k, p, device, namespace="short", timeout_s=1.0)
    if k == 2:
        start = time.monotonic()
        try:
            short.recv(99, {"a": jax.ShapeDtypeStruct((1,), jnp.float32)}, 1)
            raise AssertionError("no timeout")
        except TransportTimeout as e:
            assert "stage 2 receiving tag 99 from stage 1" in str(e), e
        assert time.monotonic() - start < 10
    print("OK timeout", flush=True)
    t.barrier(3)
    for tr in (t, emu, short):
        tr.close()
    # The key-value store is cleaned up: nothing left of the collectives but the last barrier's.
    client = distributed.key_value_client()
    client.wait_at_barrier("test/cleanup", 30000)
    left = [key for key, _ in client.key_value_dir_get("skyjax/")]
    assert sorted(left) == sorted([f"skyjax/addr/{j}" for j in range(p)]
                                  + [f"skyjax/barrier/3/0/{j}" for j in range(p)]), left
    print("OK cleanup", flush=True)
    distributed.shutdown()
    print("OK done", flush=True)


# A tree of many arrays (each its own chunk through the server's 8 staging slots; 26 MB, more
# than the socket buffers take at once), and how soon after starting to pull it process 2 is
# SIGKILLed: while process 0's server is sending it.
RENEW_ARRAYS, RENEW_FLOATS, RENEW_KILL_S = 400, 16384, 0.005


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_renewed_transport_sends_after_a_peer_died_pulling():
    """Process 2 is SIGKILLed a few milliseconds into its pull of a 400-array tree from process
    0, which can leave process 0's transfer server unable to send again (jaxlib 0.10; see
    ``server.replace_server``): its next offer is never sent, and the receiver waits forever.
    After both survivors renew their transports (a new server each, ``runtime.recovery``),
    process 0's next message reaches process 1. With the old server kept, process 1 waited in
    vain in about half the runs (5 of 9)."""
    from skyjax.launcher import launch

    out = io.BytesIO()
    env = {"PYTHONPATH": os.pathsep.join([TESTS_DIR, REPO]), "XLA_FLAGS": "",
           "JAX_PLATFORMS": "cpu", "SKYJAX_TEST_WORKER": "renew"}
    rc = launch([], 3, timeout_s=150, env=env, module="test_transport", stdout=out, grace_s=2,
                survive_losses=True)
    text = out.getvalue().decode(errors="replace")
    print(text[-4000:])
    assert rc == 0, text[-4000:]
    assert "[p2] OK pulling" in text, text[-4000:]
    for k in (0, 1):
        assert f"[p{k}] OK renewed" in text, (k, text[-4000:])


def _renew_worker() -> None:
    import signal

    from skyjax.transport import group as distributed

    info = distributed.initialize(timeout_s=60)
    k = info.process_id
    assert info.num_processes == 3
    t = TransferServerTransport(k, 3, jax.local_devices()[0], namespace="renew", timeout_s=30)
    client = distributed.key_value_client()
    small = {"a": jnp.arange(4, dtype=jnp.float32)}
    tree = [jnp.full((RENEW_FLOATS,), i, jnp.float32) for i in range(RENEW_ARRAYS)]
    if k == 0:
        t.send(1, small, 1)  # the link 0 -> 1 in use before the loss
        distributed.kv_get("renew/used", 60, "waiting for process 1", client)
        t.send(2, tree, 2)
        client.key_value_set("renew/offered", "1")
    elif k == 1:
        _assert_tree_equal(t.recv(1, _like(small), 0), small)
        client.key_value_set("renew/used", "1")
    distributed.kv_get("renew/offered", 60, "waiting for the offer", client)
    if k == 2:
        threading.Timer(RENEW_KILL_S, os.kill, (os.getpid(), signal.SIGKILL)).start()
        print("OK pulling", flush=True)
        t.recv(2, _like(tree), 0)
        print("OK whole", flush=True)  # the kill came too late to test anything (a fast host)
        time.sleep(60)
    time.sleep(1.0)  # process 2 is gone
    t.renew(1, [0, 1])
    if k == 0:
        t.send(3, small, 1)
        distributed.kv_get("renew/received", 60, "waiting for process 1", client)
        print("OK renewed", flush=True)
        time.sleep(1.0)  # process 1 ends first: process 0 hosts the coordination service
    else:
        _assert_tree_equal(t.recv(3, _like(small), 0), small)
        print("OK renewed", flush=True)
        client.key_value_set("renew/received", "1")
    sys.stdout.flush()
    os._exit(0)  # no shutdown barrier with process 2 gone


# ------------------------------------------------ the transfer server's ports; hand-off speed

def _free_run(n: int) -> int:
    """The first of ``n`` consecutive ports free on loopback a moment ago."""
    from skyjax.cluster import network

    for _ in range(100):
        p = network.free_port()
        if p + n <= 65536 and all(network.bindable("127.0.0.1", q) for q in range(p, p + n)):
            return p
    pytest.skip(f"no {n} consecutive free ports")


def test_a_broken_link_is_told_from_a_mismatch():
    """A pull whose sender was killed fails with the socket's words, which vary with the moment
    of the kill; each asks the watchdog (a lost peer the trainer recovers from) before the error
    is raised. A shape mismatch does not wait for it."""
    from skyjax.transport.transfer import link_broke

    for message in ("INTERNAL: -1 = recv() failed errno: 107 err: Transport endpoint is not "
                    "connected", "UNAVAILABLE: Connection reset by peer",
                    "INTERNAL: Socket closed", "send() failed: Broken pipe",
                    "INTERNAL: unexpected EOF"):
        assert link_broke(RuntimeError(message)), message
    assert not link_broke(RuntimeError("INVALID_ARGUMENT: buffer size 512 does not match 1024"))


def test_transfer_server_takes_the_next_free_port_of_the_range():
    """A port in use (a plain listener) and one another server of this process holds are
    skipped: the transfer server sets SO_REUSEPORT, so only skyjax's lock keeps two processes
    of a node off one port. Then the range is exhausted: one line naming the key."""
    from skyjax.transport.server import ServerOptions, start_server

    p = _free_run(3)
    options = ServerOptions(host="127.0.0.1", ports=f"{p}-{p + 2}", chunk_bytes=1 << 20,
                            parallel_copies=2)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", p))
        busy.listen()
        device = jax.local_devices()[0]
        first = start_server(device, options)
        second = start_server(device, options)
        assert (first.address(), second.address()) == (f"127.0.0.1:{p + 1}", f"127.0.0.1:{p + 2}")
        with pytest.raises(RuntimeError) as info:
            start_server(device, options)
    assert str(info.value).startswith(f"config.cluster.transfer_ports='{p}-{p + 2}': no free "
                                      "port left")


def test_transfer_server_address_is_the_route_to_the_coordinator(monkeypatch):
    """Without key or variable, the server binds the address of the route to the coordinator
    (loopback here); the variable overrides it."""
    from skyjax.transport import server as server_lib

    monkeypatch.delenv("SKYJAX_TRANSFER_HOST", raising=False)
    monkeypatch.setattr(server_lib, "coordinator_address", lambda: "localhost:1")
    srv = server_lib.start_server(jax.local_devices()[0], server_lib.ServerOptions())
    assert srv.address().rpartition(":")[0] in ("127.0.0.1", "[::1]")
    monkeypatch.setenv("SKYJAX_TRANSFER_HOST", "127.0.0.1")
    monkeypatch.setattr(server_lib, "coordinator_address", lambda: "no-such-host.invalid:1")
    srv = server_lib.start_server(jax.local_devices()[0], server_lib.ServerOptions())
    assert srv.address().startswith("127.0.0.1:")


@pytest.mark.timeout(240)
def test_handoff_speed_between_two_processes_on_a_port_range():
    """Two fresh processes under jax.distributed on loopback, their servers on a port range:
    one positive GB/s per size. (What the speed is depends on the host; nothing is asserted.)"""
    from skyjax.transport.handoff_timing import measure_handoff_gbps

    p = _free_run(4)
    got = measure_handoff_gbps([1 << 16, 1 << 20], repeats=2, ports=f"{p}-{p + 3}",
                               chunk_bytes=1 << 20, parallel_copies=2, timeout_s=200)
    assert sorted(got) == [1 << 16, 1 << 20] and all(v > 0 for v in got.values()), got
    with pytest.raises(ValueError, match="multiples of 4"):
        measure_handoff_gbps([6], 1)


def test_poll_pause_backs_off_with_the_wait_on_a_cpu_device():
    """A receive whose device computes on the host's cores spins 0.5 ms, then looks at most
    ~10 % of its wait late (200 us to 2 ms between looks), so a long wait wakes the host rarely;
    one for another device (a GPU) spins 2 ms, then looks every 200 us."""
    from skyjax.transport.transfer import poll_pause

    def wait(cpu_device: bool, seconds: float = 1.0):
        waited, pause, looks, late = 0.0, 0.0, 0, []
        while waited < seconds:
            pause = poll_pause(pause, waited, cpu_device)
            if waited > 0.002:
                late.append(pause / waited)
                assert 0.0 < pause <= 2e-3
            waited += pause + 20e-6  # a look and the sleep's slack
            looks += 1
        return looks, late, pause

    assert poll_pause(0.0, 0.0004, True) == 0.0 and poll_pause(0.0, 0.001, True) > 0.0
    assert poll_pause(0.0, 0.0019, False) == 0.0
    looks, late, pause = wait(True)
    assert max(r for r in late[10:]) <= 0.1 + 1e-9 and pause == pytest.approx(2e-3)
    assert looks < 0.0005 / 20e-6 + 600
    gpu_looks, _, gpu_pause = wait(False)
    assert gpu_pause == pytest.approx(200e-6) and gpu_looks > 4000 > 5 * looks

if __name__ == "__main__":
    _renew_worker() if os.environ.get("SKYJAX_TEST_WORKER") == "renew" else _worker()

