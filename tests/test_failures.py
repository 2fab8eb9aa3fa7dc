"""Hostile input to every command ends in one line and an exit status that says what kind of
failure it was, before anything is profiled, and loses nothing (skyjax.failures,
skyjax.workdir): bad config files and values, bad profiles and pretrained directories, unusable
workdirs and output paths, a workdir in use, launcher arguments out of range, a config error
under --max_restarts, a missing peer."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

from skyjax import workdir as workdir_lib
from skyjax.cli import launch
from skyjax.checkpoint import committed_steps, find_resume
from skyjax.names import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_PEER_LOST
from skyjax.profile.format import save_profile
from tests.helpers import DEMO, REPO, TINY, make_profile, run_module

TINY_BERT = os.path.join(REPO, "tests", "fixtures", "tiny_bert")
FAST_TIMEOUT = 120
_run = functools.partial(run_module, timeout=FAST_TIMEOUT)


def _message(proc: subprocess.CompletedProcess) -> str:
    """stderr without absl's log lines (``I1126 ...``) and the config dump: the failure's line."""
    lines = [line for line in proc.stderr.splitlines()
             if line.strip() and not (line[:1] in "IWE" and line[1:5].isdigit())
             and line.startswith(("skyjax", "Invalid", "FATAL", "error"))]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> dict[str, str]:
    """Files for the hostile cases: config files, profiles and pretrained directories."""
    d = tmp_path_factory.mktemp("bad")
    files = {}

    def write(name: str, text: str) -> str:
        path = d / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        files[name] = str(path)
        return str(path)

    write("syntax.py", "def get_config(:\n")
    write("raises.py", "def get_config():\n    raise RuntimeError('boom in get_config')\n")
    write("no_get_config.py", "X = 1\n")
    files["good_profile.json"] = str(d / "good_profile.json")  # 4 units, 4 devices (the demo)
    save_profile(make_profile(np.full((4, 4), 1e-3)), files["good_profile.json"])
    text = (d / "good_profile.json").read_text()
    files["three_devices_profile.json"] = str(d / "three_devices_profile.json")
    save_profile(make_profile(np.full((4, 3), 1e-3)), files["three_devices_profile.json"])
    write("truncated_profile.json", text[:len(text) // 2])
    write("v99_profile.json", json.dumps(dict(json.loads(text), version=99)))
    nan = json.loads(text)
    nan["forward_s"][1][2] = float("nan")
    write("nan_profile.json", json.dumps(nan))
    hf = json.loads(open(os.path.join(TINY_BERT, "config.json")).read())
    write("gpt2/config.json", json.dumps(dict(hf, model_type="gpt2")))
    write("truncated_config/config.json", json.dumps(hf)[:40])
    write("a_file", "not a directory\n")
    return files


MAIN_CASES = [  # (name, args, the line's expected text)
    ("missing config", ["--config=nope.py"], "--config nope.py: file not found"),
    ("syntax error", ["--config={syntax.py}"], "SyntaxError"),
    ("get_config raises", ["--config={raises.py}"], "RuntimeError: boom in get_config"),
    ("no get_config", ["--config={no_get_config.py}"], "get_config"),
    ("unknown key", ["--config.train.stepz=3"], "config.train.stepz: unknown config key"),
    ("inf", ["--config.train.learning_rate=inf"], "config.train.learning_rate=inf must be a "
                                                   "finite number"),
    ("inf slowdown", ['--config.cluster.slowdowns=(1,1e999,1,1)'],
     "config.cluster.slowdowns[1]=inf must be a finite number"),
    ("huge steps", ["--config.train.steps=10000000000000000000000"],
     "config.train.steps=10000000000000000000000 is out of range"),
    ("workdir a file", ["--workdir={a_file}"], "is a file, not a directory"),
    ("workdir not creatable", ["--workdir={a_file}/sub"], "cannot be created"),
    ("truncated profile", ["--config.profile.path={truncated_profile.json}"], "not valid JSON"),
    ("profile version 99", ["--config.profile.path={v99_profile.json}"], "version"),
    ("NaN profile", ["--config.profile.path={nan_profile.json}"], "forward_s"),
    ("profile of fewer devices", ["--config.profile.path={three_devices_profile.json}"],
     "has 3 devices; config.cluster.num_devices=4"),
    ("gpt2 config.json on the synthetic task", ["--config.model.pretrained={gpt2/config.json}/.."],
     "config.data.name='synthetic': a gpt2 language model trains on text"),
    ("truncated config.json", ["--config.model.pretrained={truncated_config/config.json}/.."],
     "config.json: not valid JSON"),
]


@pytest.mark.parametrize("name,args,expected", MAIN_CASES, ids=[c[0] for c in MAIN_CASES])
def test_main_refuses_in_one_line_before_anything_starts(tmp_path, bad_files, name, args,
                                                         expected):
    for key, path in bad_files.items():
        args = [a.replace("{" + key + "}", path) for a in args]
    if not any(a.startswith("--config=") for a in args):
        args.insert(0, f"--config={DEMO}")
    if not any(a.startswith("--workdir=") for a in args):
        args.append(f"--workdir={tmp_path / 'run'}")
    proc = _run("skyjax.main", *[os.path.normpath(a) if "/.." in a else a for a in args])
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr[-3000:]
    assert expected in _message(proc), proc.stderr[-3000:]
    run = tmp_path / "run"
    assert not run.exists() or set(os.listdir(run)) <= {workdir_lib.LOCK}


@pytest.mark.parametrize("damage,expected", [
    pytest.param("nan", "tensor bert.encoder.layer.0.output.dense.weight holds 1 NaN or "
                        "infinite value(s)", marks=pytest.mark.slow),  # read after profiling
    ("truncate", "cannot be read"),
])
def test_a_damaged_pretrained_checkpoint_is_named_in_one_line(tmp_path, damage, expected):
    from safetensors.numpy import load_file, save_file

    bert = tmp_path / "bert"
    shutil.copytree(TINY_BERT, bert)
    weights = bert / "model.safetensors"
    if damage == "nan":
        tensors = load_file(str(weights))
        tensors["bert.encoder.layer.0.output.dense.weight"][3, 5] = np.nan
        save_file(tensors, str(weights))
    else:
        os.truncate(weights, os.path.getsize(weights) // 2)
    proc = _run("skyjax.main", f"--config={DEMO}", f"--workdir={tmp_path / 'run'}", *TINY,
                f"--config.model.pretrained={bert}")
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr[-3000:]
    assert expected in _message(proc) and str(weights) in _message(proc)


def test_several_processes_of_a_local_config_are_refused(tmp_path):
    """Two processes of a ``local`` config would each train the whole model into one workdir."""
    proc = _run("skyjax.main", f"--config={DEMO}", f"--workdir={tmp_path}",
                env={"SKYJAX_NUM_PROCESSES": "2"})
    assert proc.returncode == EXIT_BAD_INPUT
    assert "config.cluster.mode='local' but this process is one of 2" in _message(proc)


def test_a_workdir_in_use_is_refused(tmp_path):
    claim = workdir_lib.Claim(str(tmp_path))
    try:
        proc = _run("skyjax.main", f"--config={DEMO}", f"--workdir={tmp_path}", *TINY)
    finally:
        claim.release()
    assert proc.returncode == EXIT_BAD_INPUT
    assert f"is in use by another run (pid {os.getpid()})" in _message(proc)
    assert sorted(os.listdir(tmp_path)) == [workdir_lib.LOCK]


def test_set_aside_keeps_one_whole_previous_run(tmp_path):
    for name, text in [("summary.json", "1"), ("plan.json", "1"), ("metrics.jsonl", "1")]:
        (tmp_path / name).write_text(text)
    (tmp_path / "checkpoints").mkdir()
    assert workdir_lib.set_aside(str(tmp_path), resumed=False) == [
        "summary.json", "plan.json", "metrics.jsonl"]
    assert sorted(os.listdir(tmp_path / "previous")) == ["metrics.jsonl", "plan.json",
                                                          "summary.json"]
    (tmp_path / "summary.json").write_text("2")
    (tmp_path / "metrics.jsonl").write_text("2")
    assert workdir_lib.set_aside(str(tmp_path), resumed=True) == ["summary.json"]
    assert sorted(os.listdir(tmp_path / "previous")) == ["summary.json"]  # one whole run
    assert (tmp_path / "metrics.jsonl").read_text() == "2"  # a resumed run continues it
    assert sorted(os.listdir(tmp_path)) == ["checkpoints", "metrics.jsonl", "previous"]


def test_profile_cli_checks_out_before_profiling(tmp_path):
    proc = _run("skyjax.profile", f"--config={DEMO}", f"--out={tmp_path}")
    assert proc.returncode == EXIT_BAD_INPUT
    assert f"--out {tmp_path} is a directory" in _message(proc)
    proc = _run("skyjax.profile", f"--config={DEMO}", f"--out={tmp_path}/p.json",
                "--config.nope=1")
    assert proc.returncode == EXIT_BAD_INPUT
    assert "config.nope: unknown config key" in _message(proc)


def test_plan_cli_checks_out_before_planning(tmp_path, bad_files):
    proc = _run("skyjax.plan", "--profile", bad_files["good_profile.json"], "--out",
                str(tmp_path))
    assert proc.returncode == 2
    assert f"--out {tmp_path} is a directory" in _message(proc)
    proc = _run("skyjax.plan", "--profile", bad_files["truncated_profile.json"])
    assert proc.returncode == 2 and "not valid JSON" in _message(proc)


@pytest.mark.parametrize("args,expected", [
    (["--num_processes", "0"], "--num_processes 0: must be at least 1"),
    (["--num_processes", "-1"], "--num_processes -1: must be at least 1"),
    (["--num_processes", "100000"], "at most"),
    (["--num_processes", "1", "--max_restarts", "-1"], "--max_restarts -1: must be 0 or more"),
    (["--num_processes", "1", "--timeout", "-5"], "--timeout -5.0: must be a positive"),
    (["--num_processes", "1", "--grace", "-1"], "--grace -1.0: must be 0 or more"),
])
def test_launcher_arguments_are_checked(capsys, args, expected):
    with pytest.raises(SystemExit) as end:
        launch.main([*args, "--", "--config", DEMO])
    assert end.value.code == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err


def test_a_config_error_is_not_restarted_as_a_lost_process(tmp_path):
    proc = _run("skyjax.launch", "--num_processes", "2", "--max_restarts", "2", "--",
                f"--config={DEMO}", f"--workdir={tmp_path}", "--config.cluster.mode=distributed",
                "--config.train.learning_rate=inf")
    assert proc.returncode == EXIT_BAD_INPUT, proc.stdout[-3000:]
    assert "restart" not in proc.stdout and "Traceback" not in proc.stdout
    assert "config.train.learning_rate=inf must be a finite number" in proc.stdout


def test_a_missing_peer_is_named():
    """Process 1 of 2 whose process 0 never starts: named when the startup wait ends, in one
    line, with ``EXIT_PEER_LOST`` (a launcher may restart on the survivors), before JAX's own
    abort (a C++ fatal error) would end it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("from skyjax.transport import group; "
            f"group.initialize('127.0.0.1:{port}', 2, 1, timeout_s=1)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=FAST_TIMEOUT, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"))
    assert proc.returncode == EXIT_PEER_LOST, proc.stderr[-3000:]
    assert "process 1: could not register with the coordinator (process 0) at 127.0.0.1:" \
        in _message(proc)


_LOSES_PROCESS_0 = """
import os, sys, time
from skyjax import failures
from skyjax.transport import group
k, port = int(sys.argv[1]), sys.argv[2]
with failures.one_line_errors("loss-test"):
    group.initialize(f"127.0.0.1:{port}", 2, k, timeout_s=60)
    group.start_watchdog(10)
    print("up", flush=True)
    if k == 0:
        sys.stdin.read()  # until the test has seen process 1 up
        os.kill(os.getpid(), 9)
    time.sleep(60)
    print("process 1 went on", flush=True)
"""


def test_losing_process_0_ends_another_process_in_one_line():
    """Process 0, which hosts JAX's coordination service, SIGKILLed: process 1 ends with one
    line naming the loss, not JAX's C++ fatal error, stack dump and Python's thread dumps."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
    env.pop("SKYJAX_DEBUG", None)
    procs = [subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", _LOSES_PROCESS_0,
                               str(k), str(port)], cwd=REPO, env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(2)]
    try:
        assert procs[1].stdout.readline() == "up\n"
        procs[0].stdin.close()  # process 0 kills itself now
        out, err = procs[1].communicate(timeout=FAST_TIMEOUT)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            for f in (p.stdin, p.stdout, p.stderr):
                f.close()
    assert "went on" not in out
    assert procs[1].returncode in (EXIT_PEER_LOST, 128 + signal.SIGABRT, -signal.SIGABRT), err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("skyjax: process 1: process 0") and "lost" in err, err


@pytest.mark.slow
def test_a_stopped_run_ends_in_one_line_and_keeps_its_checkpoints(tmp_path):
    """SIGTERM (what the launcher and SLURM send; Ctrl-C's SIGINT takes the same path) mid-
    training: the run unwinds within seconds with one line and status 130; every committed
    checkpoint still verifies."""
    env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
    proc = subprocess.Popen(  # -X faulthandler: SIGABRT prints every thread's stack
        [sys.executable, "-X", "faulthandler", "-m", "skyjax.main", f"--config={DEMO}",
         f"--workdir={tmp_path}", *TINY, "--config.train.steps=100000",
         "--config.checkpoint.every=1"],
        cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    lines = []
    # a run stuck before its second checkpoint: SIGABRT, whose stack dump (-X faulthandler)
    # ends the loop below and the test's message
    stuck = threading.Timer(FAST_TIMEOUT * 2, proc.send_signal, (signal.SIGABRT,))
    stuck.start()
    try:
        for line in proc.stderr:  # until the second checkpoint is committed
            lines.append(line)
            if "checkpoint 2 committed" in line:
                break
    finally:
        stuck.cancel()
    proc.send_signal(signal.SIGTERM)
    try:
        _, rest = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # where it is stuck, for the failure's message
        try:
            _, rest = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, rest = proc.communicate()
        pytest.fail("no exit within 60 s of SIGTERM; its stderr ends:\n"
                    + ("".join(lines) + rest)[-6000:])
    stderr = "".join(lines) + rest
    assert proc.returncode == EXIT_INTERRUPTED, stderr[-3000:]
    assert "Traceback" not in stderr
    assert stderr.rstrip().splitlines()[-1].startswith("skyjax.main: interrupted")
    checkpoints = str(tmp_path / "checkpoints")
    assert committed_steps(checkpoints)[-1] >= 2
    assert find_resume(checkpoints).meta["verified"]


_SWALLOWED_STOP = '''
import faulthandler, gc, os, signal, time
from skyjax import failures
faulthandler.dump_traceback_later(60, exit=True)  # a hang leaves its stacks in the message

class Signals:  # sends SIGTERM from a finalizer: the handler runs there, Python discards its raise
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)

with failures.one_line_errors("stop-test"):
    failures.interrupt_on_sigterm()
    stop = time.monotonic() + 30
    a = Signals(); a.cycle = a; del a; gc.collect()
    while time.monotonic() < stop:  # the training loop of a run that missed its stop
        pass
    print("still running after 30 s")
'''


def test_a_stop_whose_interrupt_python_discards_still_stops_the_run():
    """A SIGTERM whose handler runs inside code whose exceptions Python discards (a ``__del__``,
    a gc callback such as JAX's, called at every collection: the run would train on) is
    delivered again: the process stops at once, with one line and status 130."""
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", _SWALLOWED_STOP], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=FAST_TIMEOUT,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == EXIT_INTERRUPTED, proc.stderr[-3000:]
    assert "still running" not in proc.stdout
    assert proc.stderr.strip().splitlines() == [
        "stop-test: interrupted; stopped (committed checkpoints are kept)"], proc.stderr
