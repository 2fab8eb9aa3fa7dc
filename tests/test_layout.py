"""The package layout keeps its promises (docs/design.md, "Layout"): packages import one way, in
the order of the rows of design.md's layout table (read from that file, its one home; every
import, lazy ones inside functions too, the commands' included), no import cycle between modules
or between packages, nothing imports the orchestration or the commands, commands live in
``skyjax/cli`` only and each ``python -m`` name only names one, the optional shared-host model
and the reporting package are imported by none of the core, the planner and the config checks
import no JAX, no module grows past ~400 lines, nothing edits ``sys.path``, and each package's
docstring lists exactly its modules."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "skyjax")
DESIGN = os.path.join(ROOT, "docs", "design.md")
MAX_LINES = 400  # past this a module has a second job: split it along a seam


def _modules() -> dict[str, str]:
    """Dotted module name -> file path, for every module of the package."""
    out = {}
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, f), ROOT)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = os.path.join(folder, f)
    return out


def _imports(path: str, name: str, modules: dict[str, str]) -> set[str]:
    """The skyjax modules that ``name`` imports (``from pkg import sub`` counts as ``pkg.sub``
    when ``sub`` is a module, else as ``pkg``)."""
    tree = ast.parse(open(path).read(), path)
    is_pkg = path.endswith("__init__.py")
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")
                parent = parts if is_pkg else parts[:-1]
                parent = parent[:len(parent) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t.startswith("skyjax") and t != name:
                out.add(t)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _layout_table() -> list[tuple[str, list[str]]]:
    """design.md's layout table, lowest row first: (row, the names in its packages column)."""
    with open(DESIGN) as f:
        section = f.read().split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and cells[0] not in ("row", "---"):
            rows.append((cells[0], re.findall(r"`([^`]+)`", cells[1])))
    assert rows, f"no layout table under '## Layout' in {DESIGN}"
    return rows


def _layers() -> tuple[list[set[str]], dict[str, str]]:
    """LAYERS (lowest first: a module may import its own package and the packages of lower rows
    only) and the modules named by path (``plan/__main__``), which sit in their row apart from
    their package, each mapped to its row's group ``"row <row>"``."""
    layers, by_path = [], {}
    for row, names in _layout_table():
        group = set()
        for name in names:
            if "/" in name:
                by_path["skyjax." + name.replace("/", ".")] = f"row {row}"
                group.add(f"row {row}")
            else:
                group.add(name)
        layers.append(group)
    return layers, by_path


LAYERS, BY_PATH = _layers()


def _group(module: str) -> str:
    """The package (first name under skyjax) a module belongs to, or its row's group when the
    table names it by path."""
    if module in BY_PATH:
        return BY_PATH[module]
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "skyjax"


def _row(group: str) -> int:
    for i, layer in enumerate(LAYERS):
        if group in layer:
            return i
    raise AssertionError(f"package {group!r} has no row in LAYERS")


def _aliases() -> set[str]:
    """The ``python -m`` names (the top row): each only names its command in ``skyjax.cli``."""
    return {m for m in _modules() if m != "skyjax" and _group(m) in LAYERS[-1]}


def _commands() -> set[str]:
    """The command modules: ``skyjax.cli``'s, but for the parsing they share (``flags``)."""
    return {m for m in _modules() if m.startswith("skyjax.cli.") and m != "skyjax.cli.flags"}


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Which packages import which (a module by its group: its package, or its row when the
    table names it by path)."""
    out: dict[str, set[str]] = {}
    for src, dsts in graph.items():
        for dst in dsts:
            if src != "skyjax" and _group(src) != _group(dst):
                out.setdefault(_group(src), set()).add(_group(dst))
    return out


def _upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports that point to a package in the same row (not the same package) or a higher row."""
    out = []
    for src, dsts in graph.items():
        if src == "skyjax":
            continue
        for dst in dsts:
            a, b = _group(src), _group(dst)
            if a != b and _row(b) >= _row(a):
                out.append((src, dst))
    return sorted(out)


def test_layer_checker_finds_an_upward_import():
    assert _upward({"skyjax.plan.pricing.cost": {"skyjax.runtime.pipeline"}}) == [
        ("skyjax.plan.pricing.cost", "skyjax.runtime.pipeline")]
    assert _upward({"skyjax.runtime.pipeline": {"skyjax.plan.pricing.cost"}}) == []
    assert _upward({"skyjax.cli.plan": {"skyjax.hostmodel.sharing"}}) == []
    assert _upward({"skyjax.plan.__main__": {"skyjax.cli.plan"}}) == []
    assert _upward({"skyjax.cli.plan": {"skyjax.plan.__main__"}}) == [
        ("skyjax.cli.plan", "skyjax.plan.__main__")]


def test_every_package_has_a_row():
    for module in _graph():
        if module != "skyjax":
            _row(_group(module))


def test_layout_table_names_only_modules_that_exist():
    modules = _modules()
    tops = {m.split(".")[1] for m in modules if m != "skyjax"}
    named = [n for _, names in _layout_table() for n in names]
    missing = [n for n in named if ("skyjax." + n.replace("/", ".") not in modules
                                    if "/" in n else n not in tops)]
    assert not missing, f"docs/design.md's layout table names no such module: {missing}"
    assert len(named) == len(set(named)), "a name in two rows of the layout table"
    assert {"skyjax.plan.__main__", "skyjax.profile.compose"} <= _aliases()


def _bullet_names(doc: str) -> list[str]:
    """The modules a package docstring lists: one ``* ``name``: what it does`` line each."""
    return re.findall(r"^[*-] ``(\w+)``", doc, re.MULTILINE)


def test_docstring_module_list_parser():
    doc = "Intro ``x``.\n\n* ``a``: one;\n* ``b`` (GPipe): two,\n  ``c`` wraps;\n- ``d``: three."
    assert _bullet_names(doc) == ["a", "b", "d"]


def test_package_docstrings_list_exactly_their_modules():
    """Each package's docstring lists its modules and subpackages, one line each, and nothing
    else (``__main__`` only calls the package's ``cli``)."""
    problems = {}
    for folder, dirs, files in os.walk(PACKAGE):
        if folder == PACKAGE or "__init__.py" not in files:
            continue
        have = {f[:-3] for f in files if f.endswith(".py") and f not in ("__init__.py",
                                                                         "__main__.py")}
        have |= {d for d in dirs if os.path.exists(os.path.join(folder, d, "__init__.py"))}
        with open(os.path.join(folder, "__init__.py")) as f:
            named = _bullet_names(ast.get_docstring(ast.parse(f.read())) or "")
        wrong = {"not listed": sorted(have - set(named)), "no such module": sorted(set(named) - have),
                 "listed twice": sorted({n for n in named if named.count(n) > 1})}
        if any(wrong.values()):
            problems[os.path.relpath(folder, ROOT)] = {k: v for k, v in wrong.items() if v}
    assert not problems, problems


def test_module_references_exist():
    """Every :mod:`...` in skyjax's source names a module that exists (relative ones from the
    referring module's package; ``experiments.x`` a file under experiments/)."""
    modules = _modules()
    missing = []
    for name, path in modules.items():
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        with open(path) as f:
            refs = re.findall(r":mod:`~?([\w.]+)`", f.read())
        for ref in refs:
            full = package + ref if ref.startswith(".") else ref
            exists = (full in modules if full.startswith("skyjax") else
                      os.path.exists(os.path.join(ROOT, *full.split(".")) + ".py"))
            if not exists:
                missing.append((name, ref))
    assert not missing, f"references to modules that do not exist: {missing}"


def test_packages_import_one_way():
    assert _upward(_graph()) == []


def test_core_runs_without_the_shared_host_model():
    """Planning, simulating and running never import skyjax.hostmodel unless a caller hands it
    in: importing the core leaves it unloaded."""
    code = ("import sys, skyjax.plan, skyjax.plan.replay.simulate, skyjax.plan.replan, skyjax.runtime, "
            "skyjax.profile.profiler, skyjax.report.outputs, skyjax.train; "
            "print(sorted(m for m in sys.modules if m.startswith('skyjax.hostmodel')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_cycle_detector_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_package_graph_checker_groups_aliases_by_path():
    graph = {"skyjax.plan.__main__": {"skyjax.cli.plan"}, "skyjax.cli.plan": {"skyjax.plan"}}
    assert _package_graph(graph) == {BY_PATH["skyjax.plan.__main__"]: {"cli"}, "cli": {"plan"}}
    assert _cycles(_package_graph({**graph, "skyjax.plan": {"skyjax.cli.plan"}})) == [
        ["cli", "plan"]]


def test_no_package_cycles():
    """Between packages (a module named by path in its row), commands included."""
    assert _cycles(_package_graph(_graph())) == []


def test_nothing_imports_the_orchestration():
    top = {"skyjax.train", "skyjax.startup", "skyjax.launcher"} | _commands() | _aliases()
    offenders = {(src, dst) for src, dsts in _graph().items() for dst in dsts
                 if dst in top and src not in _commands() | _aliases()}
    assert not offenders, f"modules importing the orchestration: {sorted(offenders)}"


def _module_level_calls(tree: ast.Module) -> list[str]:
    """The dotted names of the calls in a module's top-level statements."""
    out = []
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call):
                out.append(ast.unparse(node.func))
    return out


def test_commands_live_in_cli_only():
    """No library module parses a command line: none imports ``argparse`` or ``absl.app`` or
    defines absl flags of its own at import (reading another command's arguments, as
    ``survivors`` reads ``skyjax.main``'s, is library work)."""
    offenders = []
    for name, path in _modules().items():
        if name == "skyjax.cli" or name.startswith("skyjax.cli."):
            continue
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            offenders += [(name, n) for n in names if n in ("argparse", "absl.app")]
        offenders += [(name, c) for c in _module_level_calls(tree) if ".DEFINE" in c]
    assert not offenders, f"command code outside skyjax/cli: {offenders}"


def test_python_m_names_only_name_their_command():
    """Each ``python -m`` name (the top row) is a docstring, ``from skyjax.cli.X import run``
    and ``run()`` under ``if __name__ == "__main__"``: nothing else to keep in step."""
    wrong = []
    for name in sorted(_aliases()):
        with open(_modules()[name]) as f:
            body = ast.parse(f.read()).body
        ok = (len(body) == 3 and isinstance(body[0], ast.Expr)
              and isinstance(body[1], ast.ImportFrom) and body[1].module in _commands()
              and [a.name for a in body[1].names] == ["run"] and isinstance(body[2], ast.If)
              and ast.unparse(body[2]) == "if __name__ == '__main__':\n    run()")
        if not ok:
            wrong.append(name)
    assert not wrong, f"python -m names doing more than naming their command: {wrong}"
    assert {"skyjax.main", "skyjax.plan.__main__", "skyjax.data.prepare"} <= _aliases()


def test_console_scripts_name_every_command():
    """setup.py's console scripts are exactly the commands, each's ``run``."""
    with open(os.path.join(ROOT, "setup.py")) as f:
        targets = re.findall(r'"skyjax-[\w-]+=([\w.]+):(\w+)"', f.read())
    assert sorted(m for m, _ in targets) == sorted(_commands())
    for module, func in targets:
        with open(_modules()[module]) as f:
            defined = {n.name for n in ast.parse(f.read()).body if isinstance(n, ast.FunctionDef)}
        assert func in defined, f"{module} has no {func}()"


@pytest.mark.parametrize("module", ["skyjax.plan", "skyjax.cli.plan", "skyjax.plan.replay.simulate",
                                    "skyjax.plan.replan", "skyjax.config", "skyjax.cluster",
                                    "skyjax.profile.format", "skyjax.spans", "skyjax.names",
                                    "skyjax.survivors", "skyjax.launch", "skyjax.main"])
def test_modules_that_import_no_jax(module):
    code = f"import sys, {module}; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", f"importing {module} imports JAX"


def test_module_sizes():
    big = {name: n for name, path in _modules().items()
           if (n := sum(1 for _ in open(path))) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines (split along a seam): {big}"


def test_no_sys_path_edits():
    offenders = []
    for top in ("skyjax", "configs", "experiments", "tests"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                path = os.path.join(folder, f)
                if f.endswith(".py") and path != os.path.abspath(__file__):
                    if "sys.path.insert" in open(path).read() or "sys.path.append" in \
                            open(path).read():
                        offenders.append(os.path.relpath(path, ROOT))
    assert not offenders, f"sys.path edited in {offenders}"


def test_tests_share_helpers_only_through_tests_helpers():
    """What tests share lives in tests/helpers.py: no test module imports another test module,
    and none imports anything under experiments/ (the benchmarks are not the tests' fixtures)."""
    offenders = []
    folder = os.path.join(ROOT, "tests")
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(folder, name)) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [f"{node.module}.{a.name}" for a in node.names] + [node.module or ""]
            else:
                continue
            for m in modules:
                if m.split(".")[0] == "experiments" or (
                        m.startswith("tests.") and m.split(".")[1] != "helpers"):
                    offenders.append((name, m))
    assert not offenders, offenders


def _subpackage_order(package: str) -> list[str]:
    """The sub-packages of ``package`` in the order its docstring's map lists them (lowest
    first)."""
    folder = os.path.join(PACKAGE, *package.split(".")[1:])
    with open(os.path.join(folder, "__init__.py")) as f:
        named = _bullet_names(ast.get_docstring(ast.parse(f.read())) or "")
    return [n for n in named if os.path.exists(os.path.join(folder, n, "__init__.py"))]


def _inner_upward(graph: dict[str, set[str]], package: str) -> list[tuple[str, str]]:
    """Imports between ``package``'s sub-packages that point to the same rank or higher in its
    map's order; a module directly in ``package`` sits above all its sub-packages."""
    order = _subpackage_order(package)
    depth = package.count(".") + 1

    def rank(module: str) -> int | None:
        parts = module.split(".")
        if not module.startswith(package + ".") or len(parts) <= depth + 1:
            return len(order)  # the package's own modules (planner, replan) sit above
        return order.index(parts[depth]) if parts[depth] in order else len(order)

    out = []
    for src, dsts in graph.items():
        if not src.startswith(package + ".") or rank(src) == len(order):
            continue
        for dst in dsts:
            if dst.startswith(package + ".") and dst.split(".")[depth] != src.split(".")[depth] \
                    and rank(dst) >= rank(src):
                out.append((src, dst))
    return sorted(out)


def test_plan_subpackages_import_one_way():
    """plan/'s sub-packages import only those listed before them in plan/__init__.py's map."""
    assert _subpackage_order("skyjax.plan")[:2] == ["model", "pricing"]
    assert _inner_upward({"skyjax.plan.model.types": {"skyjax.plan.search.exact"}},
                         "skyjax.plan") == [("skyjax.plan.model.types", "skyjax.plan.search.exact")]
    assert _inner_upward(_graph(), "skyjax.plan") == []
