"""Entry point: ``python -m skyjax.main --config configs/local_demo.py --workdir DIR``.

Kept short on purpose: parse flags, check the config (before anything is compiled), then call
:func:`skyjax.train.train_and_evaluate`. Any key can be overridden, e.g.
``--config.train.steps=50`` or ``--config.cluster.slowdowns="(1, 2, 3, 6)"``.
"""

from __future__ import annotations

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from skyjax.config import defaults as config_defaults
from skyjax.config import validate_config

FLAGS = flags.FLAGS
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for summary.json, plan.json, metrics.")
config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).", lock_config=True)
flags.mark_flags_as_required(["config", "workdir"])


def _unknown_override(argv: list[str]) -> str | None:
    """The first ``--config.a.b=...`` argument whose key is not in the schema, if any."""
    schema = config_defaults.base_config()
    for arg in argv[1:]:
        if not arg.startswith("--config."):
            continue
        node = schema
        for part in arg[len("--config."):].split("=", 1)[0].split("."):
            if not hasattr(node, "keys") or part not in node:
                return arg
            node = node[part]
    return None


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing, with an unknown ``--config.*`` key reported by name, not a traceback."""
    try:
        return FLAGS(argv)
    except flags.Error as e:
        sys.exit(f"FATAL Flags parsing error: {e}\nPass --helpshort or --helpfull for help.")
    except (AttributeError, KeyError) as e:
        bad = _unknown_override(argv)
        if bad is None:
            raise
        key = bad.split("=", 1)[0][2:]
        sys.exit(f"Invalid config: {key}: unknown config key (from {bad}; error {e})")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    config = FLAGS.config
    try:
        validate_config(config)
    except ValueError as e:
        sys.exit(f"Invalid config: {e}")
    start_jax(config)
    from skyjax import train  # imports jax: only once the config is known to be good

    from skyjax import checkpoint
    from skyjax.data.glue import DataError
    from skyjax.guard import NonFiniteError
    from skyjax.names import EXIT_NON_FINITE
    from skyjax.models.hf_loading import CheckpointError as PretrainedError

    logging.info("config:\n%s", config)
    try:
        train.train_and_evaluate(config, _WORKDIR.value)
    except NonFiniteError as e:  # the run diverged: one line, its own exit status
        print(f"NonFiniteError: {e}", file=sys.stderr, flush=True)
        sys.exit(EXIT_NON_FINITE)
    except (checkpoint.CheckpointMismatch, checkpoint.CheckpointError, PretrainedError,
            DataError) as e:  # bad input named in one line (file, tensor, unit), no traceback
        sys.exit(f"{type(e).__name__}: {e}")
    if config.cluster.mode == "distributed":
        from skyjax.transport import group as distributed

        distributed.shutdown()


def start_jax(config) -> None:
    """Before JAX starts: join ``jax.distributed`` (one process per stage; coordinator from the
    config, our launcher's environment, or SLURM / TPU auto-detection), or ask for
    ``config.cluster.num_devices`` CPU devices when a local run has too few."""
    if config.cluster.mode == "distributed":
        from skyjax.transport import group as distributed

        distributed.initialize(coordinator_address=config.cluster.coordinator_address or None)
    else:
        from skyjax import cluster

        cluster.ensure_host_device_count(config.cluster.num_devices)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
