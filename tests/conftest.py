"""Test session set-up: several CPU devices in this process (for local pipelines), set before JAX
starts."""

import os
import tempfile

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")


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
