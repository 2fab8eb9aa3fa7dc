"""``python -m skyjax.transport.handoff_speed`` (``skyjax-handoff-speed``): how fast a stage
hand-off moves between two local processes, GB/s per message size, as a Markdown table
(:func:`skyjax.transport.handoff_timing.measure_handoff_gbps`).

    python -m skyjax.transport.handoff_speed [--sizes_mib 1,16,64] [--repeats 7]
        [--platform cpu|cuda] [--chunk_bytes N] [--parallel_copies N]
"""

from __future__ import annotations

import argparse
from typing import Sequence

from skyjax.transport.handoff_timing import markdown_table, measure_handoff_gbps


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="How fast a stage hand-off moves between two "
                                             "processes: GB/s per message size.")
    ap.add_argument("--sizes_mib", default="1,16,64")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--platform", default="cpu")
    ap.add_argument("--chunk_bytes", type=int, default=None)
    ap.add_argument("--parallel_copies", type=int, default=None)
    ap.add_argument("--ports", default="")
    args = ap.parse_args(argv)
    sizes = [int(float(s) * (1 << 20)) for s in args.sizes_mib.split(",")]
    result = measure_handoff_gbps(sizes, args.repeats, platform=args.platform,
                                  chunk_bytes=args.chunk_bytes,
                                  parallel_copies=args.parallel_copies, ports=args.ports)
    print(markdown_table(result))


def run() -> None:
    """The command's entry point (``skyjax-handoff-speed``,
    ``python -m skyjax.transport.handoff_speed``)."""
    main()


if __name__ == "__main__":
    run()
