"""The long modules, listed at the end of every test run: a smell to look at, never a failure.

A module holds one job its name says, whatever its length (httpx's `_client.py`, Lightning's
`wandb.py` read as one idea each). Past `LONG_LINES` a module is worth a look (has it grown a
second job?), so the run's summary names them, the package's modules and the page's scripts
alike; nothing fails on a number, and nothing is split to get under it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent.parent.parent / "multirank_logger"
#: the length past which a module is listed
LONG_LINES = 600
#: vendored, minified: not ours to read
_NOT_OURS = frozenset({"uPlot.iife.min.js"})


def long_modules(root: Path = PACKAGE, limit: int = LONG_LINES) -> dict[str, int]:
    """{path under `root`: its line count} for each .py and .js file over `limit` lines."""
    files = [*root.rglob("*.py"), *root.rglob("*.js")]
    sizes = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in files if p.name not in _NOT_OURS}
    return {path: n for path, n in sorted(sizes.items()) if n > limit}


def pytest_terminal_summary(terminalreporter: Any) -> None:
    long = long_modules()
    if long:
        terminalreporter.section("long modules (one job each? a smell to look at, not a failure)")
        for path, lines in long.items():
            terminalreporter.write_line(f"{lines:6d} lines  multirank_logger/{path}")
