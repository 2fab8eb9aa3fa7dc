"""Test session set-up: several CPU devices in this process (for local pipelines), set before JAX
starts, and the repository on the import path."""

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
