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
    from skyjax.launcher import launch

    out = io.BytesIO()
    t = time.monotonic()
    rc = launch([mode], n, timeout_s, env=kw.pop("env", _env()), module="test_launch", stdout=out,
                **kw)
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
    assert wall < 60, f"took {wall:.1f} s"  # stopped, not ended by their own 60 s sleep
    assert "process 1 exited with 3" in out
    pids = _pids(out)
    assert len(pids) == 4, out  # two sleeping children + one grandchild + the failing child
    _assert_all_gone(pids)


def test_timeout_kills_children_that_ignore_sigterm():
    rc, out, wall = _launch("stubborn", 2, timeout_s=2, grace_s=1)
    assert rc == 124, out
    assert wall < 60, f"took {wall:.1f} s"  # killed, not ended by their own 60 s sleep
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


def _profile_json(devices: int, units: int = 3) -> dict:
    return {"version": 1, "microbatch": {"size": 4, "seq_len": 8},
            "units": [{"name": f"u{u}", "kind": "layer", "state_bytes": 10, "activation_bytes": 1,
                       "output_bytes": 1} for u in range(units)],
            "devices": [{"name": f"proc{d}:cpu0", "memory_bytes": 100 + d, "kind": "cpu",
                         "slowdown": 1.0 + d, "region": ""} for d in range(devices)],
            "forward_s": [[0.1 * (d + 1) + u for d in range(devices)] for u in range(units)],
            "backward_s": [[0.2 * (d + 1) + u for d in range(devices)] for u in range(units)],
            "links": {"latency_s": [[0.0 if a == b else 0.01 * (a + 1) + b for b in range(devices)]
                                    for a in range(devices)],
                      "bandwidth_Bps": [[1e9] * devices for _ in range(devices)]}}


def test_survivor_args_keep_the_survivors_emulation_and_profile_rows(tmp_path):
    import json

    from skyjax.profile.format import load_profile
    from skyjax.survivors import parse_main_args, survivor_args

    full = _profile_json(3)
    full["backward_weight_s"] = [[u + d / 10 for d in range(3)] for u in range(3)]  # W (ZB)
    (tmp_path / "profile.json").write_text(json.dumps(full))
    args = ["--config", os.path.join(REPO, "configs", "local_demo.py"),
            "--config.cluster.mode=distributed", "--config.cluster.num_devices=3",
            "--config.cluster.slowdowns=(1, 2, 4)", "--config.cluster.regions", "('a', 'b', 'c')",
            "--workdir", str(tmp_path)]
    new = survivor_args(args, [0, 2], 1, log=lambda m: None)
    config, workdir = parse_main_args(new)
    assert workdir == str(tmp_path)
    assert config.cluster.num_devices == 2 and config.cluster.mode == "distributed"
    assert tuple(config.cluster.slowdowns) == (1, 4)
    assert tuple(config.cluster.regions) == ("a", "c")
    sub = load_profile(config.profile.path)
    assert [d["name"] for d in sub.devices] == ["proc0:cpu0", "proc1:cpu0"]
    assert [d["slowdown"] for d in sub.devices] == [1.0, 3.0]
    assert sub.forward_s[:, 1].tolist() == [0.1 * 3 + u for u in range(3)]  # old device 2's
    assert sub.latency_s.tolist() == [[0.0, 0.01 + 2], [0.03 + 0, 0.0]]
    assert sub.backward_weight_s[:, 1].tolist() == [u + 0.2 for u in range(3)]


def test_restart_on_the_survivors(tmp_path):
    """Process 1 of 3 is SIGKILLed; the others report the lost peer (status 75); the job runs
    again on 2 processes with the survivors' config, and succeeds."""
    args = ["die_once", "--config", os.path.join(REPO, "configs", "local_demo.py"),
            "--config.cluster.num_devices=3", "--config.cluster.slowdowns=(1, 2, 4)",
            "--workdir", str(tmp_path)]
    from skyjax.launcher import launch

    out = io.BytesIO()
    rc = launch(args, 3, 60, env=_env(), module="test_launch", stdout=out, grace_s=2,
                max_restarts=2)
    text = out.getvalue().decode()
    assert rc == 0, text
    assert "process 1 exited with -9" in text
    assert "restart 1/2: lost process(es) [1]; restarting on 2 survivor(s) [0, 2]" in text
    for k in range(2):
        assert f"[p{k}] attempt 2 of 2 args " in text
    restarted = [ln for ln in text.splitlines() if "attempt 2 of 2 args" in ln][0]
    assert "--config.cluster.num_devices=2" in restarted
    assert "--config.cluster.slowdowns=(1, 4)" in restarted
    _assert_all_gone(_pids(text))


def test_restarts_are_bounded():
    from skyjax.launcher import launch

    out = io.BytesIO()
    rc = launch(["die_always"], 3, 60, env=_env(), module="test_launch", stdout=out, grace_s=2,
                max_restarts=1)
    text = out.getvalue().decode()
    assert rc != 0, text
    assert text.count("restart 1/1") == 1 and "restart 2/" not in text, text


def test_the_launcher_exits_with_the_cause_not_the_report_of_a_lost_peer(tmp_path):
    """Process 1 aborts at once (as JAX aborts a survivor when the coordinator goes) and only
    then process 0 exits with 64 (its config error): the launcher's status is the cause's, 64,
    and a bad input is not restarted."""
    rc, out, _ = _launch("late_cause", 2, env=dict(_env(), TEST_LAUNCH_DIR=str(tmp_path)),
                         max_restarts=1)
    assert rc == 64, out
    assert "[p0] process 1 is gone" in out, out
    assert "restart" not in out, out


def test_a_missing_module_is_one_line():
    for module in ("no_such_module_53", "skyjax.no_such_module_53"):
        r = subprocess.run(
            [sys.executable, "-m", "skyjax.launch", "--num_processes", "2", "--module", module,
             "--", "x"], cwd=REPO, env=dict(os.environ, **_env()), capture_output=True,
            text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert r.returncode == 64, r.stderr
        assert r.stderr.splitlines() == [f"skyjax.launch: --module {module}: no module named "
                                         f"'{module}' on the children's path"], r.stderr
        assert r.stdout == "", r.stdout  # no child started
    assert _launch("echo", 1)[0] == 0  # a module on the children's path only (tests/) is found


def test_a_rehearsal_is_recognised_in_every_flag_syntax_absl_accepts(tmp_path):
    """``--config.rehearse.profile`` with ``=`` or a space, one dash or two, from a flagfile
    or set by the config file: the children rehearse, so up to 8 of them share a core."""
    from skyjax.cli.launch import rehearses

    config, profile = os.path.join(REPO, "configs", "rehearse.py"), str(tmp_path / "c.json")
    flagfile = tmp_path / "flags"
    flagfile.write_text(f"--config.rehearse.profile={profile}\n")
    own = tmp_path / "own.py"
    own.write_text("from skyjax.config import base_config\n\n\ndef get_config():\n"
                   "    config = base_config()\n"
                   f"    config.rehearse.profile = {profile!r}\n    return config\n")
    for args in ([f"--config={config}", f"--config.rehearse.profile={profile}"],
                 ["--config", config, "--workdir", "/w", "--config.rehearse.profile", profile],
                 [f"-config={config}", f"-config.rehearse.profile={profile}"],
                 ["-config", config, "-config.rehearse.profile", profile, "--x=1"],
                 [f"--config={config}", f"--flagfile={flagfile}"],
                 [f"--config={own}"]):
        assert rehearses(args), args
    for args in ([], [f"--config={config}"], [f"--config={config}", "--config.rehearse.profile="],
                 [f"--config.rehearse.profile={profile}"],  # no config: the children say so
                 [f"--config={tmp_path / 'nope.py'}", f"--config.rehearse.profile={profile}"]):
        assert not rehearses(args), args
    # the command: more processes than 4 per core pass the count check (and stop at the next)
    n = 4 * len(os.sched_getaffinity(0)) + 1
    r = subprocess.run(
        [sys.executable, "-m", "skyjax.launch", "--num_processes", str(n), "--max_restarts",
         "-1", "--", "--config", config, "--config.rehearse.profile", profile],
        cwd=REPO, env=dict(os.environ, **_env()), capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL)
    assert r.returncode == 64 and r.stderr.splitlines() == [
        "skyjax.launch: --max_restarts -1: must be 0 or more"], r.stderr


def test_bind_cores_gives_each_process_its_own_cores():
    from skyjax.launcher import core_slices

    assert core_slices(3, [4, 0, 1, 2, 3, 5, 6]) == [[0, 1, 2], [3, 4], [5, 6]]
    with pytest.raises(ValueError, match="--bind_cores: 3 processes but only 2 core"):
        core_slices(3, [0, 1])
    mine = sorted(os.sched_getaffinity(0))
    n = min(2, len(mine))
    rc, out, _ = _launch("cores", n, bind_cores=True)
    assert rc == 0, out
    got = [eval(re.search(rf"cores of {k}: (\[[\d, ]*\])", out).group(1)) for k in range(n)]
    assert got == core_slices(n, mine), out
    rc, out, _ = _launch("cores", 1)  # not bound: the launcher's own cores
    assert f"cores of 0: {mine}" in out, out


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
    elif mode in ("die_once", "die_always"):
        if n == 3 or mode == "die_always":
            if k == 1:
                time.sleep(0.3)
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(1.5)
            sys.exit(75)  # skyjax.names.EXIT_PEER_LOST: "a peer was lost"
        print(f"attempt 2 of {n} args {' '.join(sys.argv[2:])}", flush=True)
    elif mode == "late_cause":
        marker = os.path.join(os.environ["TEST_LAUNCH_DIR"], "p1.pid")
        if k == 1:
            with open(marker + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(marker + ".tmp", marker)
            os.abort()
        while not os.path.exists(marker):
            time.sleep(0.01)
        with open(marker) as f:
            pid = int(f.read())
        while os.path.exists(f"/proc/{pid}"):  # until the launcher has reaped it
            time.sleep(0.01)
        print("process 1 is gone", flush=True)
        sys.exit(64)  # skyjax.names.EXIT_BAD_INPUT
    elif mode == "cores":
        print(f"cores of {k}: {sorted(os.sched_getaffinity(0))}", flush=True)
    elif mode == "exit7":
        if k == 1:
            print("exiting with 7", flush=True)
            sys.exit(7)
        time.sleep(60)
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    _child(sys.argv[1])
