"""The README and docs/ as a user reads them: every ```python block that launches nothing runs
(those that launch DDP scripts: tests/runs/test_docs_examples.py; how they run:
tests/helpers/doc_blocks.py), every CLI command, option, link, module and Fabric method they
name exists."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

from tests.helpers.doc_blocks import DOC_FILES, ROOT, block_params, code_blocks, fenced_blocks, file_run

README_MAX_LINES = 300


@pytest.mark.parametrize(("name", "index"), block_params(launching=False))
def test_python_block_runs(name: str, index: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each ```python block of README.md and docs/*.md runs as written (how: tests/helpers/doc_blocks.py)."""
    run = file_run(name, tmp_path_factory)
    run.run_through(index)
    if index in run.errors:
        pytest.fail(run.errors[index], pytrace=False)


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
    """docs/architecture.md's "What may import what" is tests/project/test_layers.py's ALLOWED."""
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
            for p in part.parent.rglob("*.py") if p.name != "__init__.py"}


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
             for name in re.split(r"\s+\|\s+", m.group(1))}
    described = set(re.findall(r"^\| `(\w+)` \|", section, re.MULTILINE))
    wrong = [f"multirank_logger/{part}: add it to the drawing under '## The layers', at its layer "
             "(its own line, or beside the parts it does not import: `a  |  b`)"
             for part in sorted(_tree_parts() - {"__init__"} - drawn)]
    wrong += [f"multirank_logger/{part}: add a row '| `{part}` | what it holds |' to the table under '## The layers'"
              for part in sorted(_tree_parts() - described)]
    wrong += [f"'{part}' is drawn or described in docs/architecture.md but is no part of the package"
              for part in sorted((drawn | described) - _tree_parts())]
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
             for m in re.findall(r"\bfabric\.(\w+)", path.read_text(encoding="utf-8"))}
    wrong = [f"{where}: fabric.{name}" for where, name in named if name not in methods]
    assert not wrong, wrong
