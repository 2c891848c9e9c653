"""The package's layers: every import points down, no import circle, no branch on a backend's name.

The table below is the architecture (docs/architecture.md draws it and lists the modules;
tests/project/test_docs.py checks that page against this table and the tree). Imports are read from the
source with ``ast``, at any depth: module level, inside functions and under ``TYPE_CHECKING``
alike, since a type-only import back up is still a circle to a reader.

A module holds one job its name says, whatever its length: the long ones are listed at the end of
every test run (tests/helpers/module_sizes.py), a smell to look at, never a failure or a target
to split against.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "multirank_logger"

#: what each part of the package may import, besides itself (bottom to top)
ALLOWED: dict[str, set[str]] = {
    "_version": set(),
    "errors": set(),
    "_util": {"errors", "_version"},
    "rows": {"_util", "errors"},
    "store": {"rows", "_util", "errors", "_version"},
    "channel": {"rows", "_util", "errors"},
    "ddp": {"_util", "errors"},
    "judgement": {"rows", "_util", "errors"},
    "query": {"judgement", "store", "rows", "ddp", "_util", "errors"},
    "write": {"judgement", "store", "channel", "ddp", "rows", "_util", "errors"},
    "watch": {"query", "judgement", "ddp", "rows", "_util", "errors"},
    "logger": {"watch", "write", "query", "judgement", "store", "channel", "ddp", "rows", "_util", "errors", "_version"},
    "report": {"query", "judgement", "store", "rows", "_util", "errors"},
    "export": {"query", "rows", "_util", "errors"},
    "callbacks": {"logger", "watch", "ddp", "rows", "_util", "errors"},
    "integrations": {"logger", "watch", "write", "store", "ddp", "rows", "_util", "errors"},
    "ui": {"report", "query", "judgement", "store", "rows", "_util", "errors"},
    "cli": {"ui", "report", "export", "query", "store", "rows", "_util", "errors", "_version"},
    "__init__": {"integrations", "callbacks", "logger", "query", "store", "ddp", "_version"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every multirank_logger module or name this file imports, as a dotted path."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("multirank_logger"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.startswith("multirank_logger"):
                found.update(f"{module}.{a.name}" for a in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in _imports(path):
            # "from pkg import name" names a module when pkg.name is one, else pkg itself
            target = imported if imported in modules else imported.rpartition(".")[0]
            if target in modules and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def _part(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def test_every_import_points_down_the_layers() -> None:
    """A module imports only from its own part of the package or from a part below it."""
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in _graph().items()
        for target in targets
        if _part(target) != _part(module) and _part(target) not in ALLOWED[_part(module)]
    )
    assert not wrong, "imports pointing up or sideways:\n" + "\n".join(wrong)


def test_every_part_is_in_the_table() -> None:
    """A new subpackage or top-level module gets its row in ALLOWED (and in docs/architecture.md)."""
    assert {_part(m) for m in _graph()} <= set(ALLOWED)


def test_no_import_circle() -> None:
    """No module reaches itself through imports, type-only ones included."""
    graph = _graph()
    circles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            # a package's __init__ importing its own modules is the package, not a circle
            if state.get(nxt) == 1 and not node.startswith(nxt + "."):
                circles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_the_pages_scripts_are_each_loaded_after_what_they_take() -> None:
    """ui/static's scripts, the page's layers: every one is loaded (ui/page.py's order), each takes
    (``window.MRL_X``) only what a script before it exports (``window.MRL_X =``)."""
    import re

    from multirank_logger.ui.page import _SCRIPTS

    static = PACKAGE / "ui" / "static"
    assert sorted(_SCRIPTS) == sorted(p.name for p in static.glob("*.js")), "a script in ui/static/ that no page loads"
    exported: set[str] = {"MRL_STATIC"}  # the self-contained report's answers, set before every script
    for name in _SCRIPTS:
        text = (static / name).read_text()
        exports = set(re.findall(r"window\.(MRL_\w+)\s*=(?!=)", text))
        taken = set(re.findall(r"window\.(MRL_\w+)", text)) - exports
        assert taken <= exported, f"{name} takes {sorted(taken - exported)} before a script exports it"
        exported |= exports


BACKENDS = PACKAGE / "store" / "backends"
#: the names a backend answers to: its `name`, SQLAlchemy's dialect and driver names
BACKEND_NAMES = frozenset({"sqlite", "duckdb", "postgresql", "generic"})


def _names_a_backend(node: ast.expr) -> bool:
    """`node` is a backend's name: ``backend.name``, ``store.backend.name``, ``engine.dialect.name``,
    ``url.drivername``, ``url.get_backend_name()``."""
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Attribute) and node.func.attr in {"get_backend_name", "get_dialect"}
    if not isinstance(node, ast.Attribute):
        return False
    if node.attr == "drivername":
        return True
    owner = node.value
    owner_name = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else ""
    return node.attr == "name" and any(word in owner_name.lower() for word in ("backend", "dialect"))


def _is_backend_name_literal(node: ast.expr) -> bool:
    """`node` spells a backend's name: ``"duckdb"``, or a tuple, list or set holding one."""
    if isinstance(node, ast.Constant):
        return node.value in BACKEND_NAMES
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(map(_is_backend_name_literal, node.elts))


def _backend_name_branches(path: Path) -> list[str]:
    """Each comparison or ``match`` in `path` on a backend's name, as "path:line: source"."""
    source = path.read_text()
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Match):
            operands = [node.subject, *(c.pattern.value for c in node.cases if isinstance(c.pattern, ast.MatchValue))]
        else:
            continue
        if any(map(_names_a_backend, operands)) or any(map(_is_backend_name_literal, operands)):
            where = str(path.relative_to(PACKAGE.parent))
            found.append((node.lineno, f"{where}:{node.lineno}: {(ast.get_source_segment(source, node) or '').splitlines()[0]}"))
    return [text for _, text in sorted(found)]


def test_no_branch_on_a_backend_name_outside_the_backends() -> None:
    """What differs per database lives in store/backends/: no module elsewhere compares a backend's name."""
    found = [hit for p in sorted(PACKAGE.rglob("*.py")) if BACKENDS not in p.parents for hit in _backend_name_branches(p)]
    assert not found, (
        "branches on a backend's name outside multirank_logger/store/backends/:\n" + "\n".join(found) + "\n"
        "Give the backends a method or attribute for what differs (a default in store/backends/base.py's "
        "Backend, the exception in store/backends/<name>.py) and call it here instead."
    )


def test_importing_the_package_loads_no_transport_report_or_torch() -> None:
    """`import multirank_logger` (the CLI's start) loads neither the channel, the report nor torch."""
    code = (
        "import sys, multirank_logger\n"
        "print(sorted(m for m in sys.modules if m.startswith(('multirank_logger.channel', "
        "'multirank_logger.report', 'multirank_logger.logger', 'torch', 'lightning'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_long_modules_report_names_each_file_past_the_line_and_no_other(tmp_path: Path) -> None:
    """The size report (tests/helpers/module_sizes.py) lists a file one line past `LONG_LINES`, not
    one at it, .py and .js alike, nested, and never the vendored uPlot."""
    from tests.helpers.module_sizes import LONG_LINES, long_modules

    (tmp_path / "ui" / "static").mkdir(parents=True)
    (tmp_path / "long.py").write_text("x = 1\n" * (LONG_LINES + 1))
    (tmp_path / "at_the_line.py").write_text("x = 1\n" * LONG_LINES)
    (tmp_path / "ui" / "static" / "chart.js").write_text("f();\n" * (LONG_LINES + 5))
    (tmp_path / "ui" / "static" / "uPlot.iife.min.js").write_text("f();\n" * (3 * LONG_LINES))
    assert long_modules(tmp_path) == {"long.py": LONG_LINES + 1, "ui/static/chart.js": LONG_LINES + 5}
