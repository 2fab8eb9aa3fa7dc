"""``python -m skyjax.main --config configs/local_demo.py --workdir DIR`` (``skyjax-train``): train
and evaluate a config.

Parses the flags, then calls :func:`skyjax.startup.before_jax` (the config checked before
anything is compiled) and :func:`skyjax.train.train_and_evaluate`. Any key can be overridden,
e.g. ``--config.train.steps=50`` or ``--config.cluster.slowdowns="(1, 2, 3, 6)"``.
"""

from __future__ import annotations

from absl import flags, logging
from ml_collections import config_flags

from skyjax import failures, startup
from skyjax.cli.flags import run_absl

FLAGS = flags.FLAGS
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for summary.json, plan.json, metrics.")
config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).", lock_config=True)
_DEBUG = flags.DEFINE_bool("debug", False, "Show a failure's traceback, not one line.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
    with failures.one_line_errors("skyjax.main", _DEBUG.value):
        if len(argv) > 1:
            raise failures.BadInput(f"unexpected arguments {argv[1:]} (flags are --name=value)")
        config = FLAGS.config
        rehearsal = startup.before_jax(config, _WORKDIR.value)
        from skyjax import train  # imports jax: only once the config is known to be good

        logging.info("config:\n%s", config)
        train.train_and_evaluate(config, _WORKDIR.value, rehearsal)
        startup.after_training(config)


def run() -> None:
    """The command's entry point (``skyjax-train``, ``python -m skyjax.main``)."""
    run_absl(main, __name__)


if __name__ == "__main__":
    run()
