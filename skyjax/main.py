"""Entry point: ``python -m skyjax.main --config configs/local_demo.py --workdir DIR``.

Kept short on purpose: parse flags, check the config (before anything is compiled), then call
:func:`skyjax.train.train_and_evaluate`. Any key can be overridden, e.g.
``--config.train.steps=50`` or ``--config.cluster.slowdowns="(1, 2, 3, 6)"``.
"""

from __future__ import annotations

import os

from absl import app, flags, logging
from ml_collections import config_flags

from skyjax import env_vars, failures, workdir as workdir_lib
from skyjax.config import validate_config
from skyjax.config.flags import parse_flags

FLAGS = flags.FLAGS
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for summary.json, plan.json, metrics.")
config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).", lock_config=True)
# Processes start at different times (imports, a busy host): a peer that has not connected after
# config.cluster.peer_timeout_s, but no less than this, is named as missing.
STARTUP_FLOOR_S = 30.0
_DEBUG = flags.DEFINE_bool("debug", False, "Show a failure's traceback, not one line.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
    with failures.one_line_errors("skyjax.main", _DEBUG.value):
        if len(argv) > 1:
            raise failures.BadInput(f"unexpected arguments {argv[1:]} (flags are --name=value)")
        config = FLAGS.config
        try:
            validate_config(config)
        except ValueError as e:  # before JAX starts: one line, and the workdir untouched
            raise failures.BadInput(f"Invalid config: {e}") from e
        check_launch(config)
        check_profile_path(config)
        fit_rehearsal(config)
        workdir_lib.check_writable(_WORKDIR.value)
        start_jax(config)
        failures.interrupt_on_sigterm()
        from skyjax import train  # imports jax: only once the config is known to be good

        logging.info("config:\n%s", config)
        train.train_and_evaluate(config, _WORKDIR.value)
        if config.cluster.mode == "distributed":
            from skyjax.transport import group as distributed

            distributed.shutdown()


def check_launch(config) -> None:
    """A run started as one of several processes (``skyjax.launch``, ``srun``) must be a
    distributed one: otherwise each process would train the whole model into one workdir."""
    n = os.environ.get(env_vars.NUM_PROCESSES) or os.environ.get("SLURM_STEP_NUM_TASKS") or "1"
    if n.isdigit() and int(n) > 1 and config.cluster.mode != "distributed":
        raise ValueError(f"config.cluster.mode={config.cluster.mode!r} but this process is one "
                         f"of {n} started together: set --config.cluster.mode=distributed, or "
                         f"start one process")


def check_profile_path(config) -> None:
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
    record = profile_format.model_record(
        hf_config.read(m.pretrained) if m.pretrained else m, attention=m.attention,
        compute_dtype=dtype, granularity=config.allocation.granularity)
    if dtype == "auto":  # resolved from the devices, once JAX starts (train.profile_phase)
        del record["compute_dtype"]
    profile_format.check_measured_for(profile, record, profile_format.run_microbatch(config),
                                      f"config.profile.path={config.profile.path!r}",
                                      profile_format.config_keys(config))


def fit_rehearsal(config) -> None:
    """A rehearsal (``config.rehearse.profile``): its profile read and checked, and the run given
    its devices and unit count (``skyjax.plan.replay.declared.fit_config``), before JAX starts."""
    if not config.rehearse.profile:
        return
    from skyjax.plan.replay.declared import fit_config  # JSON and numpy, no JAX

    try:
        fit_config(config)
        validate_config(config)
    except ValueError as e:
        raise failures.BadInput(f"Invalid config: {e}") from e


def start_jax(config) -> None:
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


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
