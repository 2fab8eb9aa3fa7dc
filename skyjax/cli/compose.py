"""``python -m skyjax.profile.compose --cluster cluster.json --out profile.json``
(``skyjax-compose``): a whole cluster's profile from its parts
(:mod:`skyjax.profile.cluster_profile`, which describes the cluster file).

A bad cluster file or profile is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from skyjax.profile.cluster_profile import compose_file, summary
from skyjax.profile.format import save_profile


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m skyjax.profile.compose",
                                 description="A whole cluster's profile from its parts: one "
                                             "profiled device per kind, how many of each kind")
    ap.add_argument("--cluster", required=True, help="the cluster file (JSON, see above)")
    ap.add_argument("--out", required=True, help="where to write the cluster's profile.json")
    args = ap.parse_args(argv)
    try:
        prof = compose_file(args.cluster)
    except ValueError as e:  # ClusterError, ProfileError: they name the file, key or field
        print(f"skyjax.profile.compose: {e}", file=sys.stderr)
        return 2
    save_profile(prof, args.out)
    print(f"{args.out}: {summary(prof)}")
    return 0


def run() -> None:
    """The command's entry point (``skyjax-compose``, ``python -m skyjax.profile.compose``)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
