"""The localhost launcher: prefixed output, fail-fast, timeouts, no process left behind.

The children run this very file as a module (``test_launch``, with tests/ on PYTHONPATH); the
``__main__`` block at the end is their code. No JAX in the children: these tests take seconds.
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS_DIR)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _env() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([TESTS_DIR, REPO])}


def _launch(mode: str, n: int, timeout_s: float | None = 60, **kw) -> tuple[int, str, float]:
    from skyjax.launch import launch

    out = io.BytesIO()
    t = time.monotonic()
    rc = launch([mode], n, timeout_s, env=_env(), module="test_launch", stdout=out, **kw)
    return rc, out.getvalue().decode(), time.monotonic() - t


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (no psutil)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return False


def _pids(output: str) -> list[int]:
    return [int(p) for p in re.findall(r"pid=(\d+)", output)]


def _assert_all_gone(pids: list[int], within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)], f"left behind: {[p for p in pids if _alive(p)]}"


def test_output_is_prefixed_and_env_set():
    rc, out, _ = _launch("echo", 3)
    assert rc == 0, out
    for k in range(3):
        assert f"[p{k}] hello from {k} of 3 coordinator=" in out
        assert f"[p{k}] no newline at end\n" in out  # last line without "\n" still gets one
        assert f"[p{k}] stderr {k}\n" in out  # stderr merged, prefixed too
    coord = set(re.findall(r"coordinator=(\S+)", out))
    assert len(coord) == 1 and re.fullmatch(r"127\.0\.0\.1:\d+", coord.pop())


def test_one_failing_child_stops_everyone_quickly():
    rc, out, wall = _launch("fail", 3, grace_s=2)
    assert rc == 3, out
    assert wall < 20, f"took {wall:.1f} s"
    assert "process 1 exited with 3" in out
    pids = _pids(out)
    assert len(pids) == 4, out  # two sleeping children + one grandchild + the failing child
    _assert_all_gone(pids)


def test_timeout_kills_children_that_ignore_sigterm():
    rc, out, wall = _launch("stubborn", 2, timeout_s=2, grace_s=1)
    assert rc == 124, out
    assert wall < 15, f"took {wall:.1f} s"
    assert "timeout" in out
    pids = _pids(out)
    assert len(pids) == 2, out
    _assert_all_gone(pids)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_launcher_killed_leaves_nothing_behind(sig):
    proc = subprocess.Popen(
        [sys.executable, "-m", "skyjax.launch", "--num_processes", "2", "--timeout", "60",
         "--module", "test_launch", "--", "sleep"],
        cwd=REPO, env=dict(os.environ, **_env()), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True)
    lines = []
    try:
        while len(_pids("".join(lines))) < 2:  # both children up
            line = proc.stdout.readline().decode()
            assert line, "".join(lines)
            lines.append(line)
        os.kill(proc.pid, sig)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert rc != 0
    _assert_all_gone(_pids("".join(lines)), within_s=10)


def test_cli_exit_code():
    r = subprocess.run(
        [sys.executable, "-m", "skyjax.launch", "--num_processes", "2", "--timeout", "60",
         "--module", "test_launch", "--", "exit7"],
        cwd=REPO, env=dict(os.environ, **_env()), capture_output=True, timeout=60)
    assert r.returncode == 7, r.stdout.decode()
    assert b"[p1] exiting with 7" in r.stdout


# ------------------------------------------------------------------------- the children's code

def _child(mode: str) -> None:
    k = int(os.environ["SKYJAX_PROCESS_ID"])
    n = int(os.environ["SKYJAX_NUM_PROCESSES"])
    print(f"pid={os.getpid()}", flush=True)
    if mode == "echo":
        print(f"hello from {k} of {n} coordinator={os.environ['SKYJAX_COORDINATOR']}", flush=True)
        print(f"stderr {k}", file=sys.stderr, flush=True)
        sys.stdout.write("no newline at end")
    elif mode == "fail":
        if k == 1:
            time.sleep(0.5)
            sys.exit(3)
        if k == 0:
            grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            print(f"grandchild pid={grandchild.pid}", flush=True)
        time.sleep(60)
    elif mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(60)
    elif mode == "sleep":
        time.sleep(60)
    elif mode == "exit7":
        if k == 1:
            print("exiting with 7", flush=True)
            sys.exit(7)
        time.sleep(60)
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    _child(sys.argv[1])
