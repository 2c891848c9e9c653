"""The README and docs/ as a user reads them: every ```python block runs, every CLI command exists.

How the blocks run: a file's blocks run in order, in one namespace, in a working directory of
their own (empty when the file's first block starts), so a block may use what an earlier one
of the same file defined or wrote (the README reads the store its quick start left). One test
per block, parametrized by file and block index; each test runs the file's earlier blocks
first when this process has not run them yet, and reports only its own block's error.

- A block with an ``if __name__ == "__main__":`` guard launches DDP (``strategy="ddp"``
  re-executes the script), so it is saved to a file and run with ``sys.executable`` in a
  subprocess; it is then executed in the namespace under another ``__name__``, so that later
  blocks see its definitions without training again. Such a block is ``slow``, and so is
  every later block of its file (they read what it left).
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
import shlex
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.launches import free_port

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP_MARK = re.compile(r"<!--\s*docs-test:\s*skip\s*\((?P<reason>.+)\)\s*-->")
MAIN_GUARD = re.compile(r"^if __name__ == [\"']__main__[\"']:", re.MULTILINE)
README_MAX_LINES = 300
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
                                mark.group("reason") if mark else None))  # fmt: skip
        i += 1
    return blocks


def code_blocks(path: Path) -> list[str]:
    """The text of every fenced block, whatever its language."""
    return fenced_blocks(path.read_text(encoding="utf-8"))


def fenced_blocks(text: str) -> list[str]:
    """The text of every fenced block of `text`, whatever its language."""
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def _params() -> list[Any]:
    params = []
    for path in DOC_FILES:
        after_script = False
        for block in python_blocks(path):
            marks: list[Any] = []
            if block.skip:
                marks.append(pytest.mark.skip(reason=block.skip))
            elif block.script or after_script:
                marks.append(pytest.mark.slow)
            after_script = after_script or (block.script and not block.skip)
            params.append(pytest.param(block.file, block.index, marks=marks, id=f"{block.file}#{block.index}"))
    return params


def _env() -> dict[str, str]:
    """This checkout first on the path; no launcher variables (the script is a fresh launch);
    a free port for the script's own rendezvous (other tests may train beside it)."""
    env = {**os.environ, "MASTER_PORT": str(free_port())}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    for var in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        env.pop(var, None)
    return env


def run_cli(*args: str, cwd: Path) -> str:
    proc = subprocess.run([sys.executable, "-c", CLI, *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
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
                                 "under `if __name__ == \"__main__\":` (DDP re-executes the script)")  # fmt: skip
        if block.script:
            script = self.cwd / f"docs_block_{block.index}.py"
            script.write_text(block.code, encoding="utf-8")
            proc = subprocess.run([sys.executable, script.name], cwd=self.cwd, env=_env(), capture_output=True,
                                  text=True, timeout=300)  # fmt: skip
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


@pytest.mark.parametrize(("name", "index"), _params())
def test_python_block_runs(name: str, index: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each ```python block of README.md and docs/*.md runs as written (see the module doc)."""
    run = file_run(name, tmp_path_factory)
    run.run_through(index)
    if index in run.errors:
        pytest.fail(run.errors[index], pytrace=False)


@pytest.mark.slow
def test_readme_quick_start_trains_two_ranks_that_the_cli_reads(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The README's first python block, saved to a file in an empty directory and run, trains
    two ranks; `multirank-logger ranks DB KEY` shows both ranks' values, and `runs` the run as a
    success."""
    run = file_run("README.md", tmp_path_factory)
    first = run.blocks[0]
    assert first.script and not first.skip, "the README's first python block is the quick start script"
    db = re.search(r"MultiRankLogger\(db=\"([^\"]+)\"\)", first.code)
    key = re.search(r"self\.log\(\"([^\"]+)\"", first.code)
    assert db and key, "the quick start logs a key into MultiRankLogger(db=...)"
    run.run_through(0)
    assert 0 not in run.errors, run.errors[0]
    assert run.listing_before[0] == [], "the quick start ran in an empty directory"

    out = run_cli("ranks", db.group(1), key.group(1), cwd=run.cwd)
    assert f"{key.group(1)} in lightning_logs/version_0 (run 1): 2 ranks" in out, out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == ["rank", "rank", "0", "rank", "1"])
    rows = []
    for line in lines[header + 2:]:
        if not line.strip():
            break
        if line.strip() != "...":
            rows.append([float(x) for x in line.split()])
    assert rows and all(len(row) == 3 for row in rows), out
    assert all(row[1] == row[1] and row[2] == row[2] for row in rows), "a value for each rank at each step"

    runs = run_cli("runs", db.group(1), cwd=run.cwd)
    header_cols, row = runs.splitlines()[0].split(), runs.splitlines()[1].split()
    assert row[header_cols.index("run")] == "lightning_logs/version_0"
    assert row[header_cols.index("status")] == "success"
    assert row[header_cols.index("ranks")] == "2"


# -- what the docs name exists ------------------------------------------------------------


def test_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the rest goes to docs/"


def _cli_lines() -> list[tuple[str, str]]:
    """Every `multirank-logger ...` command line in the docs: in code blocks, and inline."""
    found = []
    for path in [*DOC_FILES, ROOT / "DESIGN.md"]:
        text = path.read_text(encoding="utf-8")
        for block in code_blocks(path):
            for line in block.splitlines():
                line = line.strip().removeprefix("$ ")
                if line.startswith("multirank-logger "):
                    found.append((path.name, line))
        found += [(path.name, m) for m in re.findall(r"`(multirank-logger [^`]+)`", text)]
    return found


def test_every_cli_command_and_option_the_docs_name_exists() -> None:
    """Each `multirank-logger COMMAND --option` in README, docs/ and DESIGN.md is a real command and option."""
    import click

    from multirank_logger.cli import main

    wrong = []
    for where, line in _cli_lines():
        words = [w.strip("[]") for w in shlex.split(line, comments=True)[1:]]
        command: click.Command = main
        while isinstance(command, click.Group) and words and words[0] in command.commands:
            command = command.commands[words.pop(0)]
        if command is main or isinstance(command, click.Group):
            wrong.append(f"{where}: {line!r}: no such command")
            continue
        options = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"--help"}
        wrong += [f"{where}: {line!r}: {w} is no option of it" for w in words if w.startswith("-") and w not in options]
    assert not wrong, "\n".join(wrong)


def test_every_relative_link_points_to_a_file() -> None:
    broken = []
    for path in [*DOC_FILES, ROOT / "DESIGN.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
            if "://" not in target and not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, "\n".join(broken)


def test_architecture_doc_has_the_layer_table_of_test_layers() -> None:
    """docs/architecture.md's "What may import what" is tests/test_layers.py's ALLOWED."""
    from tests.project.test_layers import ALLOWED

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## What may import what", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            table[cells[0].strip("`")] = set(re.findall(r"`(\w+)`", cells[1]))
    assert table == ALLOWED


ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "multirank_logger"


def _architecture_section(title: str) -> str:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert f"\n## {title}\n" in text, f"docs/architecture.md has no section '## {title}'"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _tree_parts() -> set[str]:
    """The package's parts: each subpackage and each top-level module (``cli``, ``errors``...)."""
    parts = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    return parts | {p.stem for p in PACKAGE.glob("*.py")}


def _tree_modules() -> set[str]:
    """Every module file under a subpackage, as a path below the package: ``store/backends/sqlite.py``."""
    return {str(p.relative_to(PACKAGE)) for part in PACKAGE.glob("*/__init__.py")
            for p in part.parent.rglob("*.py") if p.name != "__init__.py"}  # fmt: skip


def _listed_modules() -> dict[str, set[str]]:
    """The module list of docs/architecture.md: per subpackage, the module paths its line names.

    A line reads ``- `part/`: `a.py` (what it does), `sub/` (`b.py`, `c.py`)``: a module named
    inside the parentheses after a folder ``sub/`` is ``part/sub/b.py``; other parentheses are
    words about the module before them."""
    listed: dict[str, set[str]] = {}
    section = _architecture_section("The modules")
    for part, body in re.findall(r"^- `(\w+)/`:(.*?)(?=^- `|^\S|\Z)", section, re.MULTILINE | re.DOTALL):
        names = listed.setdefault(part, set())
        folders: list[str] = []  # the folder of each open parenthesis ("" for words)
        folder = ""
        for token in re.finditer(r"`([\w/.]+)`|\(|\)", body):
            if token.group(0) == "(":
                folders.append(folder)
            elif token.group(0) == ")" and folders:
                folders.pop()
            elif re.fullmatch(r"\w+\.py", token.group(1) or ""):  # a path with a / is words about another module
                names.add("/".join([part, *filter(None, folders), token.group(1)]))
            folder = token.group(1)[:-1] if (token.group(1) or "").endswith("/") else ""
    return listed


def test_architecture_doc_names_only_modules_that_exist() -> None:
    """Each module docs/architecture.md lists under a subpackage is a file of that subpackage."""
    gone = sorted(set().union(*_listed_modules().values()) - _tree_modules())
    assert not gone, f"docs/architecture.md's module list names modules that are gone: {gone}"


def test_architecture_doc_lists_every_module_of_the_tree() -> None:
    """Each module file of each subpackage (``__init__.py`` aside, subfolders included) is in the module list."""
    listed = _listed_modules()
    missing = sorted(_tree_modules() - set().union(*listed.values()))
    hints = []
    for path in missing:
        part, _, rest = path.partition("/")
        folder, _, name = rest.rpartition("/")
        where = f"inside `{folder}/` (...) " if folder else ""
        line = f'on the line "- `{part}/`:"' if part in listed else f'on a new line "- `{part}/`: ..."'
        hints.append(f"multirank_logger/{path}: add `{name}` (and a few words on its job) {where}{line}")
    assert not missing, "docs/architecture.md's module list (## The modules) misses:\n" + "\n".join(hints)


def test_architecture_doc_draws_and_describes_every_part() -> None:
    """Each subpackage and top-level module of the tree has a line in the drawing (## The layers)
    and a row in its "what it holds" table."""
    section = _architecture_section("The layers")
    drawing = fenced_blocks(section)[0]
    drawn = {name for line in drawing.splitlines()
             if (m := re.match(r"(\w+(?:\s+\|\s+\w+)*)(?:\s{2,}|$)", line))
             for name in re.split(r"\s+\|\s+", m.group(1))}  # fmt: skip
    described = set(re.findall(r"^\| `(\w+)` \|", section, re.MULTILINE))
    wrong = [f"multirank_logger/{part}: add it to the drawing under '## The layers', at its layer "
             "(its own line, or beside the parts it does not import: `a  |  b`)"
             for part in sorted(_tree_parts() - {"__init__"} - drawn)]  # fmt: skip
    wrong += [f"multirank_logger/{part}: add a row '| `{part}` | what it holds |' to the table under '## The layers'"
              for part in sorted(_tree_parts() - described)]  # fmt: skip
    wrong += [f"'{part}' is drawn or described in docs/architecture.md but is no part of the package"
              for part in sorted((drawn | described) - _tree_parts())]  # fmt: skip
    assert not wrong, "docs/architecture.md:\n" + "\n".join(wrong)


def test_install_lines_work_before_the_package_is_published() -> None:
    """The README's install block installs from a clone (the package is not on the index yet:
    `pip install multirank-logger` fails), and keeps the published lines for later. The CPU torch
    comes before the package (after, pip has pulled CUDA's gigabytes); every extra a user installs is named."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pytest depends on tomli below 3.11
        import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

    block = next(b for b in fenced_blocks((ROOT / "README.md").read_text(encoding="utf-8")) if "pip install" in b)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip().startswith("pip")]
    assert commands[0] == "pip install torch --index-url https://download.pytorch.org/whl/cpu", commands
    assert all("./multirank-logger" in c or "dist/" in c for c in commands[1:]), commands
    assert "pip wheel" in block and "git clone" in block
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    named = {e for c in commands for group in re.findall(r"\[([\w,-]+)\]", c) for e in group.split(",")}
    assert set(extras) - {"test"} <= named, sorted(set(extras) - {"test"} - named)


def test_every_fabric_method_the_docs_name_exists() -> None:
    """`fabric.NAME(` in the docs is a method of Lightning's Fabric (2.6 has no log_hyperparams:
    `fabric.logger.log_hyperparams` is the call)."""
    import importlib.util

    # Fabric's methods and properties from its source (importing lightning.fabric takes seconds)
    spec = importlib.util.find_spec("lightning")  # a top-level spec: nothing imported
    assert spec and spec.origin
    source = Path(spec.origin).parent / "fabric" / "fabric.py"
    methods = set(re.findall(r"^    def (\w+)\(", source.read_text(encoding="utf-8"), re.MULTILINE))
    assert {"log", "log_dict", "logger", "launch"} <= methods
    named = {(path.name, m) for path in [*DOC_FILES, ROOT / "DESIGN.md"]
             for m in re.findall(r"\bfabric\.(\w+)", path.read_text(encoding="utf-8"))}  # fmt: skip
    wrong = [f"{where}: fabric.{name}" for where, name in named if name not in methods]
    assert not wrong, wrong
