"""What a training run does before JAX starts, and after it ends: the config and every file it
names checked (so that a bad input is one line and the workdir stays untouched), the rehearsal's
devices fitted, then ``jax.distributed`` joined or the local devices asked for. No JAX at import:
:func:`before_jax` must run before anything is compiled.
"""

from __future__ import annotations

import os
from typing import Any

from skyjax import env_vars, failures, workdir as workdir_lib
from skyjax.config import validate_config

# Processes start at different times (imports, a busy host): a peer that has not connected after
# config.cluster.peer_timeout_s, but no less than this, is named as missing.
STARTUP_FLOOR_S = 30.0


def before_jax(config: Any, workdir: str) -> Any:
    """Checks ``config`` and ``workdir`` (``failures.BadInput`` for a bad config), makes the
    run's rehearsal (None without one), starts JAX's devices and turns SIGTERM into an
    interrupt: everything :func:`skyjax.train.train_and_evaluate` needs done first. Returns the
    rehearsal, for ``train_and_evaluate``."""
    try:
        validate_config(config)
    except ValueError as e:  # before JAX starts: one line, and the workdir untouched
        raise failures.BadInput(f"Invalid config: {e}") from e
    check_launch(config)
    check_profile_path(config)
    rehearsal = make_rehearsal(config)
    workdir_lib.check_writable(workdir)
    start_jax(config)
    failures.interrupt_on_sigterm()
    return rehearsal


def after_training(config: Any) -> None:
    """Leaves ``jax.distributed`` (a distributed run), so that its peers end cleanly."""
    if config.cluster.mode == "distributed":
        from skyjax.transport import group as distributed

        distributed.shutdown()


def check_launch(config: Any) -> None:
    """A run started as one of several processes (``skyjax.launch``, ``srun``) must be a
    distributed one: otherwise each process would train the whole model into one workdir."""
    n = os.environ.get(env_vars.NUM_PROCESSES) or os.environ.get("SLURM_STEP_NUM_TASKS") or "1"
    if n.isdigit() and int(n) > 1 and config.cluster.mode != "distributed":
        raise ValueError(f"config.cluster.mode={config.cluster.mode!r} but this process is one "
                         f"of {n} started together: set --config.cluster.mode=distributed, or "
                         f"start one process")


def check_profile_path(config: Any) -> None:
    """``config.profile.path``, read and checked against the cluster and, when it records them,
    the model and micro-batch it was measured for, before anything starts (its unit count, and
    an ``auto`` compute dtype, are checked once JAX knows the model's chain and devices)."""
    if not config.profile.path:
        return
    from skyjax.models import hf_config  # JSON only, no JAX
    from skyjax.profile import format as profile_format

    profile = profile_format.load_profile(config.profile.path)
    if profile.num_devices != config.cluster.num_devices:
        raise ValueError(f"config.profile.path={config.profile.path!r} has "
                         f"{profile.num_devices} devices; config.cluster.num_devices="
                         f"{config.cluster.num_devices}")
    m, dtype = config.model, config.train.compute_dtype
    shape = hf_config.read(m.pretrained, model_types=hf_config.MODEL_TYPES) if m.pretrained else m
    record = profile_format.model_record(shape, attention=m.attention, compute_dtype=dtype,
                                         granularity=config.allocation.granularity)
    if dtype == "auto":  # resolved from the devices, once JAX starts (train.profile_phase)
        del record["compute_dtype"]
    profile_format.check_measured_for(profile, record, profile_format.run_microbatch(config),
                                      f"config.profile.path={config.profile.path!r}",
                                      profile_format.config_keys(config))


def make_rehearsal(config: Any) -> Any:
    """The run's rehearsal (``config.rehearse.profile``; None without one), made once, before
    JAX starts: its profile read and checked, and the run given its devices and unit count
    (:meth:`skyjax.runtime.rehearsal.Rehearsal.from_config`)."""
    if not config.rehearse.profile:
        return None
    from skyjax.runtime.rehearsal import Rehearsal  # JSON and numpy, no JAX

    try:
        rehearsal = Rehearsal.from_config(config)
        validate_config(config)
    except ValueError as e:
        raise failures.BadInput(f"Invalid config: {e}") from e
    return rehearsal


def start_jax(config: Any) -> None:
    """Before JAX starts: join ``jax.distributed`` (one process per stage; coordinator from the
    config, our launcher's environment, or SLURM / TPU auto-detection), or ask for
    ``config.cluster.num_devices`` CPU devices when a local run has too few."""
    if config.cluster.mode == "distributed":
        from skyjax.transport import group as distributed

        distributed.initialize(coordinator_address=config.cluster.coordinator_address or None,
                               timeout_s=max(STARTUP_FLOOR_S, config.cluster.peer_timeout_s))
    else:
        from skyjax import cluster

        cluster.ensure_host_device_count(config.cluster.num_devices)
