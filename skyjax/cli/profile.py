"""``python -m skyjax.profile --config configs/local_hetero.py --out profile.json``
(``skyjax-profile``).

Measures (or, with ``--workdir``, reuses the cached) profile of the config's model on the config's
cluster (:func:`skyjax.profile.profiler.profile_config`): one progress line per unit and device,
a short table at the end. The result is the profile.json that ``python -m skyjax.plan --profile
...`` plans from. Any config key can be overridden, e.g. ``--config.cluster.slowdowns="(1, 2,
4)"``.

For a CPU cluster of ``config.cluster.num_devices`` devices in one process the host device count
is set before JAX starts; a ``"distributed"`` config profiled here runs its processes' devices in
this one process (same compute path; links are then probed with ``jax.device_put``).
"""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from skyjax import failures, workdir
from skyjax.cli.flags import run_absl
from skyjax.config import validate_config

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).", lock_config=True)
_OUT = flags.DEFINE_string("out", None, "Where to write profile.json (optional).")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Cache profiles under WORKDIR/profiles/<key>.json and reuse them.")
_REPROFILE = flags.DEFINE_bool("reprofile", False, "Measure even if a cached profile exists.")
_REPEATS = flags.DEFINE_integer("repeats", None, "Timed repeats (default config.profile.repeats).")
_BUDGET = flags.DEFINE_float("budget_s", None, "Timing budget per unit and device class (s).")
_DEDUP = flags.DEFINE_bool("dedup", True, "Measure identical units / devices once.")
_DEBUG = flags.DEFINE_bool("debug", False, "Show a failure's traceback, not one line.")
flags.mark_flags_as_required(["config"])


def main(argv: list[str]) -> None:
    with failures.one_line_errors("skyjax.profile", _DEBUG.value):
        if len(argv) > 1:
            raise failures.BadInput(f"unexpected arguments {argv[1:]} (flags are --name=value)")
        if not _OUT.value and not _WORKDIR.value:
            raise failures.BadInput("pass --out and/or --workdir")
        config = FLAGS.config
        try:  # everything that needs no device, before profiling
            validate_config(config)
        except ValueError as e:
            raise failures.BadInput(f"Invalid config: {e}") from e
        if _OUT.value:
            workdir.check_output_file("--out", _OUT.value)
        if _WORKDIR.value:
            workdir.check_writable(_WORKDIR.value)
        measure_and_write(config)


def measure_and_write(config) -> None:
    """Profiles the config's model on its cluster (or loads the workdir's cached profile), writes
    ``--out`` and prints the summary table."""
    from skyjax import cluster

    probes = None
    if config.cluster.shared_host:  # the optional shared-host model's probes (skyjax.hostmodel)
        from skyjax import hostmodel

        hostmodel.activate()
        probes = hostmodel.probes()
    cluster.ensure_host_device_count(int(config.cluster.num_devices))
    # These import JAX: after XLA_FLAGS.
    from skyjax.profile.format import save_profile
    from skyjax.profile.profiler import profile_config
    from skyjax.report.profile_table import summary_table

    overrides = {"dedup_units": _DEDUP.value, "dedup_devices": _DEDUP.value}
    if _REPEATS.value:
        overrides.update(repeats=_REPEATS.value, min_repeats=min(3, _REPEATS.value))
    if _BUDGET.value:
        overrides["budget_s"] = _BUDGET.value
    prof = profile_config(config, workdir=_WORKDIR.value, reprofile=_REPROFILE.value,
                          host=probes, log=lambda msg: print(msg, flush=True), **overrides)
    if _OUT.value:
        save_profile(prof, _OUT.value)
        print(f"wrote {_OUT.value}")
    meta = prof.extra.get("profiler", {})
    print(summary_table(prof))
    if "profile_time_s" in meta:
        print(f"profiled in {meta['profile_time_s']:.1f} s (compilation {meta['compile_s']:.1f} s)")


def run() -> None:
    """The command's entry point (``skyjax-profile``, ``python -m skyjax.profile``)."""
    run_absl(main, __name__)


if __name__ == "__main__":
    run()
