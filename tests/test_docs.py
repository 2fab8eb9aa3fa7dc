"""The documentation keeps its shape: README.md is a front door (short, no timings of the test
suite or CI), every relative link of README.md and docs/ resolves (file and heading), every
guide is reachable from the README, the commands the pages name exist, and every section of
docs/results.md was written by an experiment that writes it (experiments/results_doc.py)."""

from __future__ import annotations

import glob
import importlib.util
import os
import re

import pytest

from tests.helpers import REPO

README = os.path.join(REPO, "README.md")
DOCS = os.path.join(REPO, "docs")
PAGES = [README, *sorted(glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))]
GUIDES = sorted(glob.glob(os.path.join(DOCS, "guide", "*.md")))
README_MAX_LINES = 250


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (code marks and link targets dropped) in lower
    case, punctuation other than '-' and '_' dropped, spaces as '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: str) -> set[str]:
    """Every heading anchor of a markdown file (GitHub numbers repeated ones -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    text = re.sub(r"^```.*?^```", "", read(path), flags=re.S | re.M)
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def links(path: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"\]\(([^)\s]+)\)", prose(read(path)))]


def test_the_readme_is_a_front_door():
    lines = read(README).splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_the_readme_states_no_timing_of_the_tests_or_ci():
    """No paragraph of README.md that speaks of the tests or CI gives a duration or a test
    count (those belong to no page: they change with the host and every commit)."""
    duration = re.compile(r"\d+(\.\d+)?\s*(s|sec|seconds?|min|minutes?|h|hours?)\b", re.I)
    count = re.compile(r"\b\d+\s+tests\b", re.I)
    about_tests = re.compile(r"\btests?\b|\bsuite\b|\bCI\b|pytest|\.ci/run")
    for paragraph in read(README).split("\n\n"):
        if about_tests.search(paragraph):
            assert not duration.search(paragraph), paragraph
            assert not count.search(paragraph), paragraph
    for line in read(README).splitlines():
        if about_tests.search(line):
            assert not re.search(r"\b(a|an|one|two|\d+)\s+(minute|hour)s?\b", line), line


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, REPO))
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(full):
            broken.append(f"{target}: no file {os.path.relpath(full, REPO)}")
        elif anchor and full.endswith(".md") and anchor not in anchors(full):
            broken.append(f"{target}: no heading #{anchor} in {os.path.relpath(full, REPO)}")
    assert not broken, f"{os.path.relpath(page, REPO)}: " + "; ".join(broken)


def test_every_guide_is_linked_from_the_readme():
    linked = {os.path.normpath(os.path.join(REPO, t.partition("#")[0])) for t in links(README)}
    assert GUIDES and not [g for g in GUIDES if g not in linked]


def test_the_commands_the_pages_name_exist():
    """``python -m NAME`` names a module, ``python PATH`` and ``bash PATH`` a file, and every
    path under skyjax/, experiments/, configs/ or tests/ that a page quotes exists, in the
    README and every guide."""
    missing = []
    for page in [README, *GUIDES]:
        text = read(page)
        for name in set(re.findall(r"python3? -m ((?:skyjax|experiments)(?:\.\w+)*)", text)):
            if importlib.util.find_spec(name) is None:
                missing.append(f"{os.path.relpath(page, REPO)}: python -m {name}")
        paths = (re.findall(r"(?:python3?|bash) ((?:experiments|\.ci)/[\w./-]+)", text)
                 + re.findall(r"`((?:skyjax|experiments|configs|tests)/[\w/.-]*)", text)
                 + re.findall(r"\bconfigs/[\w/]+\.py\b", text))
        for path in set(paths):
            if not os.path.exists(os.path.join(REPO, path)):
                missing.append(f"{os.path.relpath(page, REPO)}: {path}")
    assert not missing, missing


def test_every_results_section_comes_from_an_experiment_that_writes_it():
    """Each section of docs/results.md sits between its markers and names the command that
    writes it (one module, named once per part it writes): an experiments module whose
    ``__main__`` hands its output to results_doc."""
    text = read(os.path.join(DOCS, "results.md"))
    names = re.findall(r"<!-- results:([\w-]+) -->", text)
    assert names and len(names) == len(set(names))
    assert names == re.findall(r"<!-- /results:([\w-]+) -->", text)
    for name in names:
        section = text.split(f"<!-- results:{name} -->")[1].split(f"<!-- /results:{name} -->")[0]
        # one module per section (a section of parts may name its command once per part)
        [module] = set(re.findall(r"`python -m experiments\.(\w+)[^`]*--results`", section))
        source = read(os.path.join(REPO, "experiments", f"{module}.py"))
        assert "results_doc.run(" in source and f'"{name}"' in source, (name, module)


def test_a_section_is_rewritten_in_place_and_the_others_kept(tmp_path):
    """experiments/results_doc.py's writer, run as the experiments run it (tests import
    nothing under experiments/)."""
    import subprocess
    import sys

    path = tmp_path / "results.md"
    calls = [("a", "first", False), ("b", "other", False), ("a", "second", True)]
    code = "\n".join(["from experiments.results_doc import write_section"] + [
        f"write_section({n!r}, {n.upper()!r}, {body!r}, 'python -m experiments.{n} --results', "
        f"path={str(path)!r}, where='here', carried={carried})" for n, body, carried in calls])
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = path.read_text()
    assert "second" in text and "first" not in text and "other" in text
    assert text.index("results:a") < text.index("results:b")  # rewritten where it was
    assert text.count("<!-- results:a -->") == text.count("<!-- /results:a -->") == 1
