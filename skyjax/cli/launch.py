"""``python -m skyjax.launch`` (``skyjax-launch``): N local processes of a module under
``jax.distributed`` (:func:`skyjax.launcher.launch`).

    python -m skyjax.launch --num_processes 4 [--timeout 600] [--max_restarts K] [--bind_cores] \\
        -- --config configs/local_hetero.py --workdir /tmp/w

runs ``python -m skyjax.main <args after -->`` four times, each child's lines prefixed with
``[pK] ``; one child failing, or the timeout, stops them all.
"""

from __future__ import annotations

import sys
from typing import Sequence

from absl import flags
from ml_collections import config_flags

from skyjax import failures, launcher
from skyjax.cli.flags import OneLineParser


def rehearses(module_args: Sequence[str]) -> bool:
    """Whether the children's arguments set a rehearsal (a non-empty ``config.rehearse.profile``),
    read as the children's absl flags read them: ``--config.rehearse.profile=P`` or
    ``--config.rehearse.profile P``, one dash or two, from a ``--flagfile`` or from the config
    file itself. Arguments that do not parse are no rehearsal (each child names what is
    wrong)."""
    argv = ["child", *module_args]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
    try:
        values(argv, known_only=True)
        config = values.config
        return bool(config is not None and config.rehearse.profile)
    except Exception:  # noqa: BLE001 - the config file runs user code; the children report it
        return False


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        i = argv.index("--")
        own, rest = argv[:i], argv[i + 1:]
    else:
        own, rest = argv, []
    parser = OneLineParser(
        prog="python -m skyjax.launch",
        description="Start N local processes of a module (default skyjax.main) under "
                    "jax.distributed; arguments after -- go to the module.")
    parser.add_argument("--num_processes", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds before every process is stopped (default: none)")
    parser.add_argument("--module", default="skyjax.main")
    parser.add_argument("--grace", type=float, default=launcher.GRACE_S,
                        help="seconds between SIGTERM and SIGKILL when stopping")
    parser.add_argument("--max_restarts", type=int, default=0,
                        help="when a process dies, restart the job on the survivors (from the "
                             "last checkpoint) up to this many times")
    parser.add_argument("--survive_losses", action="store_true",
                        help="when a process other than 0 dies, keep the others running: with "
                             "several pipelines they finish the run without its pipeline")
    parser.add_argument("--bind_cores", action="store_true",
                        help="bind each process to its own disjoint slice of this host's cores "
                             "(as SLURM's --cpu-bind=cores): they stop sharing cores")
    args = parser.parse_args(own)
    with failures.one_line_errors("skyjax.launch"):
        problem = launcher.check_module(args.module)
        if problem:
            raise failures.BadInput(problem)
        return launcher.launch(rest, args.num_processes, args.timeout, module=args.module,
                               grace_s=args.grace, max_restarts=args.max_restarts,
                               bind_cores=args.bind_cores, survive_losses=args.survive_losses,
                               rehearsal=rehearses(rest))


def run() -> None:
    """The command's entry point (``skyjax-launch``, ``python -m skyjax.launch``)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
