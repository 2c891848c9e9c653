"""The package's layers: every import points down, no import circle, small modules.

The table below is the architecture (docs/architecture.md draws it). Imports are read from the
source with ``ast``, at any depth: module level, inside functions and under ``TYPE_CHECKING``
alike, since a type-only import back up is still a circle to a reader.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "multirank_logger"
MAX_LINES = 450

#: what each part of the package may import, besides itself (bottom to top)
ALLOWED: dict[str, set[str]] = {
    "_version": set(),
    "errors": set(),
    "_util": {"errors", "_version"},
    "model": {"_util", "errors"},
    "store": {"model", "_util", "errors", "_version"},
    "transport": {"model", "_util", "errors"},
    "ddp": {"_util", "errors"},
    "judgement": {"model", "_util", "errors"},
    "query": {"judgement", "store", "model", "ddp", "_util", "errors"},
    "write": {"judgement", "store", "transport", "ddp", "model", "_util", "errors"},
    "logger": {"write", "query", "judgement", "store", "transport", "ddp", "model", "_util", "errors", "_version"},
    "report": {"query", "judgement", "store", "model", "_util", "errors"},
    "callbacks": {"logger", "ddp", "model", "_util", "errors"},
    "ui": {"report", "query", "judgement", "store", "model", "_util", "errors"},
    "cli": {"ui", "report", "query", "store", "model", "_util", "errors", "_version"},
    "__init__": {"callbacks", "logger", "query", "store", "ddp", "_version"},
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


def test_no_module_is_over_450_lines() -> None:
    """Small modules: each reads in one sitting."""
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_importing_the_package_loads_no_transport_report_or_torch() -> None:
    """`import multirank_logger` (the CLI's start) loads neither the channel, the report nor torch."""
    code = (
        "import sys, multirank_logger\n"
        "print(sorted(m for m in sys.modules if m.startswith(('multirank_logger.transport', "
        "'multirank_logger.report', 'multirank_logger.logger', 'torch', 'lightning'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
