"""docs/results.md, written by the commands that measure its figures.

Each measured figure of the documentation has one home: a section of ``docs/results.md``
between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->``, written by the experiment that
measures it. ``write_section`` replaces one section (or appends it) and leaves the rest of the
file as it is, so sections written by different commands, at different times, sit side by side.
An experiment's ``__main__`` calls ``run``: with ``--results`` on its command line, what it
prints goes to its section as well as to the terminal, with the command that reproduces it and
the machine it ran on. Nobody types a figure into results.md by hand; the README, the guides and
design.md link to it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Callable, Sequence

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results.md"
FLAG = "--results"
HEADER = """# Measured results

Every figure on this page is written by the command named in its section
(`experiments/results_doc.py`): running that command again rewrites its section, between its
markers, and leaves the others alone. A section says the machine it was measured on; figures
of emulated clusters depend on the host and its load, so read them beside the cost model of
[design.md](design.md) rather than as constants.
"""


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- results:{name} -->", f"<!-- /results:{name} -->"


def machine() -> str:
    """This host in a few words: cores, processor, the jax and Python versions."""
    try:
        jax = "jax " + importlib.metadata.version("jax")
    except importlib.metadata.PackageNotFoundError:
        jax = "no jax"
    cpu = platform.machine() or "unknown"
    return f"{os.cpu_count()} CPU cores ({cpu}), {jax}, Python {platform.python_version()}"


def write_section(name: str, title: str, markdown: str, command: str, *,
                  where: str | None = None, carried: bool = False,
                  path: Path | str = RESULTS) -> None:
    """Replace section ``name`` of ``path`` (or append it) with ``title``, the command that
    reproduces it, the machine (``where``, default this one) and ``markdown``. ``carried``:
    the figures are the ones the command printed on an earlier run, written here without
    running it again; the section says so."""
    path = Path(path)
    begin, end = _markers(name)
    how = (f"Reproduce: `{command}` (figures as that command last printed them"
           f"{', on ' + where if where else ''}; carried over, not re-measured by the writer)"
           if carried else f"Measured by `{command}` on {where or machine()}.")
    block = "\n".join([begin, f"## {title}", "", how, "", markdown.strip(), end])
    text = path.read_text(encoding="utf-8") if path.exists() else HEADER
    if begin in text:
        head, rest = text.split(begin, 1)
        if end not in rest:
            raise ValueError(f"{path}: section {name!r} has no end marker {end!r}")
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class _Tee(io.TextIOBase):
    """Writes to the terminal and keeps a copy."""

    def __init__(self, out):
        self.out, self.kept = out, io.StringIO()

    def write(self, s: str) -> int:
        self.kept.write(s)
        return self.out.write(s)

    def flush(self) -> None:
        self.out.flush()


Section = tuple[str | None, str, str, str]  # (argument that selects it, name, title, about)


def run(main: Callable[[], object], sections: Sequence[Section],
        keep: Callable[[str], str] = lambda text: text, fenced: bool = True) -> None:
    """Run ``main()`` (which parses ``sys.argv``). With ``--results`` among the arguments (taken
    out before ``main`` sees them), what it prints on stdout also becomes the section of the
    first of ``sections`` whose selecting argument is on the command line (``None``: any),
    ``about`` above it, ``keep(printed)`` below it: in a code block, or as it is where the
    command prints markdown (``fenced=False``)."""
    if FLAG not in sys.argv[1:]:
        main()
        return
    sys.argv = [sys.argv[0]] + [a for a in sys.argv[1:] if a != FLAG]
    args = sys.argv[1:]
    module = "experiments." + Path(sys.argv[0]).stem
    command = shlex.join(["python", "-m", module, *args, FLAG])
    chosen = next((s for s in sections if s[0] is None or s[0] in args), None)
    if chosen is None:
        sys.exit(f"{FLAG}: no section of docs/results.md for the arguments {args}")
    _, name, title, about = chosen
    tee = _Tee(sys.stdout)
    done = False
    try:
        with contextlib.redirect_stdout(tee):
            main()
        done = True
    except SystemExit as e:  # absl's app.run ends with sys.exit(0)
        done = e.code in (None, 0)
        raise
    finally:
        if done:
            printed = keep(tee.kept.getvalue()).strip("\n")
            body = f"```text\n{printed}\n```" if fenced else printed
            write_section(name, title, f"{about.strip()}\n\n{body}", command)
            print(f"{FLAG}: wrote section {name!r} of {RESULTS}", file=sys.stderr)
