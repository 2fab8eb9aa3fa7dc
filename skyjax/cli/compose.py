"""``python -m skyjax.profile.compose --cluster cluster.json --out profile.json``
(``skyjax-compose``): a whole cluster's profile from its parts
(:mod:`skyjax.profile.cluster_profile`, which describes the cluster file).

``--out`` is checked before any work (not the cluster file, not a directory, in a directory that
exists). A bad cluster file, profile or ``--out`` is one line on stderr naming the file and the
key, and exit status 2.
"""

from __future__ import annotations

import sys

from skyjax.cli.flags import OneLineParser
from skyjax.profile.cluster_profile import summary, write_profile


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m skyjax.profile.compose",
                       description="A whole cluster's profile from its parts: one profiled "
                                   "device per kind, how many of each kind")
    ap.add_argument("--cluster", required=True, help="the cluster file (JSON, see above)")
    ap.add_argument("--out", required=True, help="where to write the cluster's profile.json")
    args = ap.parse_args(argv)
    try:
        prof = write_profile(args.cluster, args.out)
    except ValueError as e:  # ClusterError, ProfileError: they name the file, key or field
        print(f"skyjax.profile.compose: {e}", file=sys.stderr)
        return 2
    print(f"{args.out}: {summary(prof)}")
    return 0


def run() -> None:
    """The command's entry point (``skyjax-compose``, ``python -m skyjax.profile.compose``)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
