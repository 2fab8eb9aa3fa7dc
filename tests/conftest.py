"""Test session set-up: several CPU devices in this process (for local pipelines), set before JAX
starts; one profile cache and one XLA compilation cache for every run of the session."""

import atexit
import os
import shutil
import tempfile

import pytest

# XLA's CPU backend at LLVM optimization level 1 (the default is 2): the suite's programs are tiny
# and compiled once or twice each, so their compile time, not their run time, is most of the
# suite's (tests/test_bert.py and tests/test_precision.py took 117 s at level 1, about 140 s at
# level 2); every run of a session, and every process it starts, uses the same level, so results
# compare bit for bit as before.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4 "
                      "--xla_backend_optimization_level=1")

# JAX's persistent compilation cache, shared by this process and every process it starts: the
# suite's runs compile the same small stage programs again and again (a 2-layer run's wall time
# falls from ~18 s to ~5 s once they are cached). Results are the same: an entry is keyed by the
# program, the compile options and the backend.
_COMPILATION_CACHE = tempfile.mkdtemp(prefix="skyjax-tests-xla-cache-")
atexit.register(shutil.rmtree, _COMPILATION_CACHE, ignore_errors=True)
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _COMPILATION_CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


@pytest.fixture(autouse=True, scope="session")
def _temporary_files_under_pytest(tmp_path_factory):
    """Temporary files of this process and the processes it starts (``TMPDIR``) under pytest's
    own base directory, which it prunes: TFDS's mocked builders make an empty
    ``tempfile.mkdtemp("tfds")`` each (DatasetInfo's ``initialize_from_bucket``) and never
    remove it, ~60 per run in /tmp otherwise."""
    before, env = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("tempfile"))
    yield
    tempfile.tempdir = before
    if env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = env


@pytest.fixture(autouse=True, scope="session")
def _one_profile_cache(tmp_path_factory):
    """Runs of the same model on the same emulated devices profile once per session
    (``SKYJAX_PROFILE_CACHE``, inherited by the processes tests start), as runs of one cluster in
    several workdirs do. Tests of the cache itself take it away (``monkeypatch.delenv``)."""
    from skyjax import env_vars

    before = os.environ.get(env_vars.PROFILE_CACHE)
    os.environ[env_vars.PROFILE_CACHE] = str(tmp_path_factory.mktemp("profile_cache"))
    yield
    if before is None:
        os.environ.pop(env_vars.PROFILE_CACHE, None)
    else:
        os.environ[env_vars.PROFILE_CACHE] = before
