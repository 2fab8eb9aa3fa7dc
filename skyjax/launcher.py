"""Localhost launcher: start N processes of a module under ``jax.distributed`` (:func:`launch`; the
command is ``python -m skyjax.launch``, :mod:`skyjax.cli.launch`).

``launch(args, 4)`` runs ``python -m skyjax.main *args`` four times, with a coordinator on
127.0.0.1 at a free port, announced to each child through ``SKYJAX_COORDINATOR``,
``SKYJAX_NUM_PROCESSES`` and ``SKYJAX_PROCESS_ID`` (read by
:func:`skyjax.transport.group.initialize`). Each child's output lines are prefixed with ``[pK] ``.
As soon as one child fails, or the timeout passes, every child is stopped (SIGTERM to its process
group, SIGKILL after a grace period) and the launcher exits non-zero. No child outlives the
launcher: on Ctrl-C / SIGTERM it stops them first, and each child also asks the kernel to kill it
when the launcher dies (Linux ``PR_SET_PDEATHSIG``), so even a SIGKILLed launcher leaves nothing
behind.

``max_restarts=K`` (``--max_restarts K``): when a process dies, the others notice (they exit with
status 75, ``EXIT_PEER_LOST``, naming it) or are stopped, and the job starts again on the survivors
only, at most K times: ``--config.cluster.num_devices`` and the per-device emulation (slow-downs,
memory caps, regions) follow the surviving processes, their rows of the profile are re-used
(``skyjax.survivors``), the job re-plans, and training resumes from the last committed checkpoint
(``config.checkpoint.every``).

``survive_losses`` (``--survive_losses``): when a process other than 0 dies on its own, the others
keep running instead of being stopped: with several pipelines (``config.allocation.max_pipelines``)
they drop the lost process's pipeline and finish the run without it (``skyjax.runtime.recovery``);
where they cannot, they exit with 75 and the launcher stops (and restarts, with ``--max_restarts``)
as above.

``bind_cores`` (``--bind_cores``): each child is bound to its own disjoint slice of the host's
cores (set in the child before JAX starts), so that the processes stop sharing cores, as tasks
bound by SLURM's ``--cpu-bind=cores`` do; the profile records each process's cores
(``devices[d]["cpus"]``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Mapping, Sequence

from skyjax import env_vars, failures
from skyjax.cluster.network import free_port
from skyjax.names import EXIT_BAD_INPUT, EXIT_NON_FINITE, EXIT_PEER_LOST


EXIT_TIMEOUT = 124
GRACE_S = 5.0
# After a process exits reporting a lost peer (75, or JAX's abort when the coordinator goes),
# the process that failed on its own (e.g. process 0 with a config error, 64) may still be
# exiting: the launcher waits this long for it, so that its status, not the report's, is the
# launcher's (and a bad input is not restarted as a lost process).
SETTLE_S = 5.0
MAX_PROCESSES_PER_CORE = 4  # more would only time-slice: the emulation needs some core time each
# a rehearsal's processes (--config.rehearse.profile=...) mostly wait out declared times
REHEARSAL_PROCESSES_PER_CORE = 8
# Exit statuses of a failure that is not a lost process: bad input or a diverged run would fail
# the same way on the survivors, so --max_restarts does not restart them.
NOT_RESTARTED = (EXIT_BAD_INPUT, EXIT_NON_FINITE)

# Run in each child before the module: die with the launcher, then behave like ``python -m module``.
_BOOTSTRAP = r"""
import os, runpy, signal, sys
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except Exception:
    pass
if os.getppid() != int(os.environ[{launcher_pid!r}]):
    sys.exit("[launch] launcher died before this child started")
if os.environ.get({cpus!r}):  # --bind_cores: before JAX starts (XLA sizes its threads by it)
    os.sched_setaffinity(0, {{int(c) for c in os.environ[{cpus!r}].split(",")}})
module = sys.argv[1]
sys.argv = [module] + sys.argv[2:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
""".format(launcher_pid=env_vars.LAUNCHER_PID, cpus=env_vars.CPUS)


def core_slices(num_processes: int, cores: Sequence[int] | None = None) -> list[list[int]]:
    """Disjoint, contiguous, near-equal slices of ``cores`` (default: the cores this process may
    run on), one per process: what ``--bind_cores`` binds each child to, as SLURM's
    ``--cpu-bind=cores`` would, so that local processes stop sharing cores (the profile records
    each one's cores; ``skyjax.hostmodel.sharing`` then models no contention between them)."""
    cores = sorted(os.sched_getaffinity(0) if cores is None else cores)
    if len(cores) < num_processes:
        raise ValueError(f"--bind_cores: {num_processes} processes but only {len(cores)} "
                         f"core(s) to bind them to ({cores})")
    q, r = divmod(len(cores), num_processes)
    bounds = [k * q + min(k, r) for k in range(num_processes + 1)]
    return [cores[bounds[k]:bounds[k + 1]] for k in range(num_processes)]


class _TextOut:
    """A binary-stream face for a text stream."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, data: bytes) -> None:
        self.stream.write(data.decode(errors="replace"))

    def flush(self) -> None:
        self.stream.flush()


class _Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


def _pump(stream: IO[bytes], prefix: bytes, out, lock: threading.Lock) -> None:
    """Copy a child's output to ``out`` line by line, each line prefixed."""
    for line in iter(stream.readline, b""):
        if not line.endswith(b"\n"):
            line += b"\n"
        with lock:
            try:
                out.write(prefix + line)
                out.flush()
            except (ValueError, OSError):  # our own stdout is gone; keep draining
                pass
    stream.close()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the child leads its own process group
    except (ProcessLookupError, PermissionError):
        pass


def _stop_all(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM every still-running child's process group, SIGKILL what remains after ``grace_s``."""
    for p in procs:
        if p.poll() is None:
            _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        # Also the group of a child that already exited: kills any grandchild it left behind.
        _signal_group(p, signal.SIGKILL)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - unkillable process
            pass


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _lost(codes: list[int | None]) -> list[int]:
    """The processes to give up after the first failure seen: those that failed on their own
    (not with ``EXIT_PEER_LOST`` or JAX's abort when the coordinator goes); if only peers'
    reports are in, the processes still running (hung, not beating)."""
    own = _own_failures(codes)
    return own or [k for k, c in enumerate(codes) if c is None]


def _own_failures(codes: list[int | None], gone: set[int] = frozenset()) -> list[int]:
    """The processes that failed on their own: not running, not ended with 0, not a report of a
    lost peer (``EXIT_PEER_LOST``, or JAX's abort when the coordinator goes)."""
    return [k for k, c in enumerate(codes) if c not in (None, 0, EXIT_PEER_LOST, -signal.SIGABRT)
            and k not in gone]


def check_args(num_processes: int, timeout_s: float | None, max_restarts: int,
               grace_s: float, rehearsal: bool = False) -> str | None:
    """What is wrong with the launcher's arguments, in one line (None: nothing).
    ``rehearsal``: the children rehearse (``config.rehearse``), so more of them share a core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    per_core = REHEARSAL_PROCESSES_PER_CORE if rehearsal else MAX_PROCESSES_PER_CORE
    most = per_core * max(1, cores or 1)
    if num_processes < 1:
        return f"--num_processes {num_processes}: must be at least 1"
    if num_processes > most:
        return (f"--num_processes {num_processes}: this host has {cores} core(s); at most "
                f"{most} processes ({per_core} per core"
                + ("" if per_core == REHEARSAL_PROCESSES_PER_CORE else
                   f"; {REHEARSAL_PROCESSES_PER_CORE} for a rehearsal, whose processes mostly "
                   "wait") + ") are started on it")
    if timeout_s is not None and not timeout_s > 0:
        return f"--timeout {timeout_s}: must be a positive number of seconds"
    if max_restarts < 0:
        return f"--max_restarts {max_restarts}: must be 0 or more"
    if not grace_s >= 0:
        return f"--grace {grace_s}: must be 0 or more seconds"
    return None


_FIND_MODULE = r"""
import importlib.util, sys
try:
    found = importlib.util.find_spec(sys.argv[1]) is not None
except ImportError:  # a parent package that does not exist
    found = False
sys.exit(0 if found else 3)
"""


def check_module(module: str, env: Mapping[str, str] | None = None) -> str | None:
    """What is wrong with ``--module``, in one line (None: the children can import it): looked
    up by a Python with the children's path (their ``PYTHONPATH`` and working directory), so a
    missing module is one line of the launcher's, not a traceback from every child."""
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    child_env = dict(os.environ, **(env or {}))
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (repo_root, child_env.get("PYTHONPATH", "")) if p)
    r = subprocess.run([sys.executable, "-c", _FIND_MODULE, module], env=child_env,
                       stdin=subprocess.DEVNULL, capture_output=True)
    if r.returncode == 3:
        return f"--module {module}: no module named {module!r} on the children's path"
    return None  # found, or it fails when imported: the child says why


def launch(module_args: Sequence[str], num_processes: int, timeout_s: float | None = None,
           env: Mapping[str, str] | None = None, module: str = "skyjax.main", *,
           grace_s: float = GRACE_S, stdout=None, coordinator_host: str = "127.0.0.1",
           log=None, max_restarts: int = 0, bind_cores: bool = False,
           survive_losses: bool = False, rehearsal: bool = False) -> int:
    """Run ``python -m module *module_args`` in ``num_processes`` local processes.

    Returns 0 when every child exits with 0; otherwise the exit code of the first child to fail
    (128 + signal number for a child killed by a signal), or 124 when ``timeout_s`` passes first.
    ``env`` entries are added to (or override) this process's environment. ``stdout``: a binary
    stream for the prefixed output (default: this process's stdout). ``max_restarts``: start the
    job again on the surviving processes up to this many times (module docstring); ``timeout_s``
    covers all attempts. ``bind_cores``: each child runs on its own slice of this process's
    cores (:func:`core_slices`; fewer cores than processes is an error before any starts).
    ``survive_losses``: a process other than 0 that fails on its own does not stop the others
    (module docstring); the job succeeds when every other process ends with 0. ``rehearsal``:
    the children rehearse another cluster (``config.rehearse``; the command reads it from
    their flags): their processes mostly wait, so up to
    :data:`REHEARSAL_PROCESSES_PER_CORE` share a core.
    """
    if bind_cores:
        core_slices(num_processes)  # one clear line now, not from inside an attempt
    problem = check_args(num_processes, timeout_s, max_restarts, grace_s, rehearsal)
    if problem:
        raise failures.BadInput(problem)
    out = stdout if stdout is not None else getattr(sys.stdout, "buffer", None)
    if out is None:  # a text-only stdout (e.g. some notebook front ends)
        out = _TextOut(sys.stdout)
    log = log or (lambda msg: (out.write(f"[launch] {msg}\n".encode()), out.flush()))
    deadline = None if not timeout_s else time.monotonic() + timeout_s
    args, n = list(module_args), num_processes
    for attempt in range(max_restarts + 1):
        left = None if deadline is None else max(0.01, deadline - time.monotonic())
        rc, lost = _launch_once(args, n, left, env, module, grace_s=grace_s, out=out,
                                coordinator_host=coordinator_host, log=log,
                                bind_cores=bind_cores, survive_losses=survive_losses)
        if rc in (0, EXIT_TIMEOUT) or rc in NOT_RESTARTED or lost is None:
            return rc  # done, out of time, interrupted, or a failure a restart would repeat
        survivors = [k for k in range(n) if k not in lost]
        if attempt == max_restarts or not survivors:
            return rc
        from skyjax import survivors as survivors_lib  # absl + ml_collections; no JAX

        log(f"restart {attempt + 1}/{max_restarts}: lost process(es) {lost}; restarting on "
            f"{len(survivors)} survivor(s) {survivors} (renumbered 0..{len(survivors) - 1})")
        args = survivors_lib.survivor_args(args, survivors, attempt + 1, log=log)
        n = len(survivors)
    return rc


def _launch_once(module_args: Sequence[str], num_processes: int, timeout_s: float | None,
                 env: Mapping[str, str] | None, module: str, *, grace_s: float, out,
                 coordinator_host: str, log, bind_cores: bool = False,
                 survive_losses: bool = False) -> tuple[int, list[int] | None]:
    """One attempt of :func:`launch`: its exit code and the processes lost (None when the
    launcher itself was interrupted)."""
    slices = core_slices(num_processes) if bind_cores else None
    port = free_port(coordinator_host)
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base_env = dict(os.environ)
    base_env.update(env or {})
    base_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (repo_root, base_env.get("PYTHONPATH", "")) if p)
    base_env.setdefault("PYTHONUNBUFFERED", "1")
    base_env[env_vars.COORDINATOR] = f"{coordinator_host}:{port}"
    base_env[env_vars.NUM_PROCESSES] = str(num_processes)
    base_env[env_vars.LAUNCHER_PID] = str(os.getpid())

    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    lock = threading.Lock()
    old_handlers = {}
    received: list[int] = []  # signals to stop on, noted by the handler, acted on by the loop
    if threading.current_thread() is threading.main_thread():
        # The handler only takes note: an exception raised asynchronously could land inside
        # Popen.poll between its lock's acquire and release, and every later wait of that child
        # would then time out (a launcher that needs ~30 s to stop).
        def _note(signum, frame):
            received.append(signum)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            old_handlers[sig] = signal.signal(sig, _note)
    rc, lost = 0, []
    gone: set[int] = set()  # survive_losses: processes the others went on without
    settle: float | None = None  # until when reports of a lost peer wait for their cause
    try:
        for k in range(num_processes):
            child_env = dict(base_env, **{env_vars.PROCESS_ID: str(k)})
            if slices is not None:
                child_env[env_vars.CPUS] = ",".join(map(str, slices[k]))
            procs.append(subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, module, *module_args], env=child_env,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True))
        for k, p in enumerate(procs):
            t = threading.Thread(target=_pump, args=(p.stdout, f"[p{k}] ".encode(), out, lock),
                                 daemon=True)
            t.start()
            pumps.append(t)
        log(f"started {num_processes} process(es), pids " +
            " ".join(f"p{k}:{p.pid}" for k, p in enumerate(procs)))
        deadline = None if not timeout_s else time.monotonic() + timeout_s
        while True:
            if received:
                raise _Interrupted(received[0])
            codes = [p.poll() for p in procs]
            failed = [(k, c) for k, c in enumerate(codes) if c not in (None, 0) and k not in gone]
            for k, c in failed if survive_losses else []:
                if k != 0 and c != EXIT_PEER_LOST:  # failed on its own: the others go on
                    gone.add(k)
                    log(f"process {k} exited with {c}; the others go on without it")
            failed = [(k, c) for k, c in failed if k not in gone]
            if failed and not _own_failures(codes, gone) and None in codes:
                # only reports of a lost peer so far: wait a little for the cause
                settle = settle if settle is not None else time.monotonic() + SETTLE_S
                if time.monotonic() < settle:
                    time.sleep(0.05)
                    continue
            if failed:
                lost = _lost(codes)
                k, c = next(((k, c) for k, c in failed if k in lost), failed[0])
                rc = _exit_code(c)
                log(f"process {k} exited with {c}; stopping the others")
                break
            if all(c == 0 for k, c in enumerate(codes) if k not in gone):
                break
            if deadline is not None and time.monotonic() > deadline:
                rc = EXIT_TIMEOUT
                log(f"timeout after {timeout_s} s; stopping all processes")
                break
            time.sleep(0.05)
    except (KeyboardInterrupt, _Interrupted) as e:
        signum = getattr(e, "signum", signal.SIGINT)
        rc, lost = 128 + signum, None
        log(f"interrupted (signal {signum}); stopping all processes")
    finally:
        _stop_all(procs, grace_s)
        for t in pumps:
            t.join(timeout=5)
        for sig, h in old_handlers.items():
            signal.signal(sig, h)
    return rc, lost
