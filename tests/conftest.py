"""Test session set-up: several CPU devices in this process (for local pipelines), set before JAX
starts."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
