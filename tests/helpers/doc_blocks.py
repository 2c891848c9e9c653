"""The README's and docs/' ```python blocks, run as a user runs them (tests/project/test_docs.py runs
those that launch nothing, tests/runs/test_docs_examples.py those that launch DDP scripts).

How the blocks run: a file's blocks run in order, in one namespace, in a working directory of
their own (empty when the file's first block starts), so a block may use what an earlier one
of the same file defined or wrote (the README reads the store its quick start left). One test
per block, parametrized by file and block index; each test runs the file's earlier blocks
first when this process has not run them yet, and reports only its own block's error.

- A block with an ``if __name__ == "__main__":`` guard launches DDP (``strategy="ddp"``
  re-executes the script), so it is saved to a file and run with ``sys.executable`` in a
  subprocess; it is then executed in the namespace under another ``__name__``, so that later
  blocks see its definitions without training again. Such a block runs in
  tests/runs/ (slow), and so does every later block of its file (they read what it left).
- Any other block is executed in this process. What a block changes process-wide (the
  working directory, environment variables, logging handlers and their filters, the warnings
  machinery) is put back after it.
- A block whose fence has ``<!-- docs-test: skip (REASON) -->`` on the line before it is
  reported as skipped with REASON (a PostgreSQL server, a cluster).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.launches import RAY_FAST_POLL, free_port, import_transformers_here, with_transformers

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP_MARK = re.compile(r"<!--\s*docs-test:\s*skip\s*\((?P<reason>.+)\)\s*-->")
MAIN_GUARD = re.compile(r"^if __name__ == [\"']__main__[\"']:", re.MULTILINE)
CLI = "import sys; from multirank_logger.cli import main; sys.exit(main())"


@dataclass

class Block:
    file: str  # relative to the repository root
    index: int  # among the file's python blocks
    line: int  # of the opening fence, 1-based
    code: str
    skip: str | None

    @property
    def script(self) -> bool:
        return bool(MAIN_GUARD.search(self.code))


def python_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            i += 1
            body: list[str] = []
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            mark = SKIP_MARK.search(lines[start - 1]) if start else None
            blocks.append(Block(str(path.relative_to(ROOT)), len(blocks), start + 1, "\n".join(body) + "\n",
                                mark.group("reason") if mark else None))
        i += 1
    return blocks


def code_blocks(path: Path) -> list[str]:
    """The text of every fenced block, whatever its language."""
    return fenced_blocks(path.read_text(encoding="utf-8"))


def fenced_blocks(text: str) -> list[str]:
    """The text of every fenced block of `text`, whatever its language."""
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def block_params(launching: bool) -> list[Any]:
    """The docs' python blocks as pytest params: with `launching`, each block that launches a script
    (DDP) and every later block of its file, which read what it left (tests/runs/); else the others."""
    params = []
    for path in DOC_FILES:
        after_script = False
        for block in python_blocks(path):
            # a file's blocks run in order in one process (`file_run`), both modules' alike: on one
            # worker, or a worker given a later block runs every block before it once more (a DDP
            # training among them)
            marks: list[Any] = [pytest.mark.xdist_group(f"docs {block.file}")]
            if block.skip:
                marks.append(pytest.mark.skip(reason=block.skip))
            launches = not block.skip and (block.script or after_script)
            after_script = after_script or (block.script and not block.skip)
            if launches == launching:
                params.append(pytest.param(block.file, block.index, marks=marks, id=f"{block.file}#{block.index}"))
    return params


def launch_env() -> dict[str, str]:
    """This checkout first on the path; no launcher variables (the script is a fresh launch);
    a free port for the script's own rendezvous (other tests may train beside it); Ray's quick poll."""
    env = {**os.environ, "MASTER_PORT": str(free_port()), **RAY_FAST_POLL}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    for var in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        env.pop(var, None)
    return env


def run_cli(*args: str, cwd: Path) -> str:
    proc = subprocess.run([sys.executable, "-c", CLI, *args], cwd=cwd, env=launch_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"multirank-logger {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


class _ProcessState:
    """What a block may change in this process, put back afterwards."""

    def __enter__(self) -> _ProcessState:
        self.cwd = os.getcwd()
        self.environ = dict(os.environ)
        root = logging.getLogger()
        self.root_level, self.root_handlers = root.level, list(root.handlers)
        self.handler_state = {h: (list(h.filters), h.formatter) for h in self.root_handlers}
        self.showwarning = warnings.showwarning
        self.warning_filters = list(warnings.filters)
        return self

    def __exit__(self, *exc: object) -> None:
        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.environ)
        root = logging.getLogger()
        root.setLevel(self.root_level)
        root.handlers[:] = self.root_handlers
        for handler, (filters, formatter) in self.handler_state.items():
            handler.filters[:] = filters
            handler.setFormatter(formatter)
        warnings.showwarning = self.showwarning  # type: ignore[assignment]
        warnings.filters[:] = self.warning_filters  # type: ignore[index]


@dataclass

class FileRun:
    """One documentation file's blocks, run in order in one namespace and one directory."""

    blocks: list[Block]
    cwd: Path
    namespace: dict[str, Any] = field(default_factory=lambda: {"__name__": "__docs__"})
    done: int = 0
    errors: dict[int, str] = field(default_factory=dict)
    listing_before: dict[int, list[str]] = field(default_factory=dict)
    script_output: dict[int, str] = field(default_factory=dict)

    def run_through(self, index: int) -> None:
        while self.done <= index:
            block = self.blocks[self.done]
            self.done += 1
            if block.skip:
                continue
            self.listing_before[block.index] = sorted(p.name for p in self.cwd.iterdir())
            try:
                self._run(block)
            except Exception as exc:  # reported by this block's own test
                self.errors[block.index] = f"{block.file} block {block.index} (line {block.line}): {exc!r}"

    def _run(self, block: Block) -> None:
        code_lines = [line for line in block.code.splitlines() if not line.lstrip().startswith("#")]
        trains = any(".fit(" in line for line in code_lines) and 'strategy="ddp"' in block.code
        if trains and not block.script:
            raise AssertionError("a block that fits with strategy='ddp' must be a script: put the fit "
                                 "under `if __name__ == \"__main__\":` (DDP re-executes the script)")
        uses_transformers = re.search(r"^\s*(from|import) transformers\b", block.code, re.MULTILINE) is not None
        if uses_transformers:
            import_transformers_here()
        if block.script:
            script = self.cwd / f"docs_block_{block.index}.py"
            script.write_text(block.code, encoding="utf-8")
            env = with_transformers(launch_env()) if uses_transformers else launch_env()
            proc = subprocess.run([sys.executable, script.name], cwd=self.cwd, env=env, capture_output=True,
                                  text=True, timeout=300)
            self.script_output[block.index] = proc.stdout + proc.stderr
            if proc.returncode != 0:
                raise AssertionError(f"exit {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        compiled = compile(block.code, f"{block.file}#{block.index}", "exec")
        with _ProcessState():
            os.chdir(self.cwd)
            exec(compiled, self.namespace)  # __name__ is not "__main__": a script's guard stays shut


_RUNS: dict[str, FileRun] = {}


def file_run(name: str, tmp_path_factory: pytest.TempPathFactory) -> FileRun:
    if name not in _RUNS:
        cwd = tmp_path_factory.mktemp(re.sub(r"\W", "_", name))
        _RUNS[name] = FileRun(python_blocks(ROOT / name), cwd)
    return _RUNS[name]
