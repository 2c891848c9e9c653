"""Every command, every bad argument: one clear line (issue 48).

Each subcommand of `multirank-logger` (found by walking the click groups, so a new command is
covered without a line here) is run over hostile stores: a directory, a FIFO, /dev/zero (as a
path and as a URL), a file that is not there, a path under a regular file, an unreachable
PostgreSQL server with a password in its URL; and, where it takes one, over run ids past 64 bits.
Each must exit non-zero with a few lines, no traceback and never the password. A FIFO (which
would block its reader) and `ui` (a server, were it to start) run in subprocesses with a bound;
the rest in-process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from multirank_logger.cli import main
from multirank_logger.store.sql_store import Store
from multirank_logger.write.buffer import RecordBuffer

PASSWORD = "secret"
UNREACHABLE = f"postgresql://user:{PASSWORD}@127.0.0.1:1/db"
MOST_LINES = 4  # click's usage error is 3: Usage, Try, Error
BOUND_S = 120  # a hang, not a slow start: generous on a loaded machine
#: (command, case) that rightly succeed or wait: `db upgrade` creates a missing store, `ui` waits
#: for the first run to create one (the page says so)
NOT_FAILURES = {("db upgrade", "missing"), ("ui", "missing")}
#: the values of required arguments other than DB
OTHER_ARGUMENTS = {"key": "loss", "query": "SELECT 1"}


def _commands(group: click.Group = main, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


COMMANDS = dict(_commands())


def _argv(name: tuple[str, ...], db: str, junk_file: Path, *options: str) -> list[str]:
    """The command with DB `db`, its other required arguments given plausible values."""
    argv = [*name]
    for param in COMMANDS[name].params:
        if not isinstance(param, click.Argument):
            continue
        if param.name == "db_path":
            argv.append(db)
        elif param.name == "files":
            argv.append(str(junk_file))
        else:
            argv.append(OTHER_ARGUMENTS.get(param.name or "", "x"))
    if name == ("ui",):
        argv += ["--port", "0"]
    return argv + list(options)


def _check(label: str, code: int | None, output: str) -> None:
    assert code not in (0, None), f"{label}: exit {code}\n{output}"
    assert "Traceback" not in output, f"{label}:\n{output}"
    assert len(output.strip().splitlines()) <= MOST_LINES, f"{label}: {len(output.splitlines())} lines\n{output}"
    assert PASSWORD not in output, f"{label}: the password printed\n{output}"
    assert output.strip(), f"{label}: says nothing"


def test_every_command_is_found() -> None:
    names = {" ".join(name) for name in COMMANDS}
    assert {"db current", "db upgrade", "runs", "export", "report", "ui", "import", "sql"} <= names, names


@pytest.fixture
def places(tmp_path: Path) -> dict[str, str]:
    directory = tmp_path / "dir.sqlite"
    directory.mkdir()
    under_a_file = tmp_path / "file.txt"
    under_a_file.write_text("not a directory\n")
    return {
        "directory": str(directory),
        "dev-zero": "/dev/zero",
        "dev-zero-url": "sqlite:////dev/zero",
        "missing": str(tmp_path / "missing.db"),
        "under-a-file": str(under_a_file / "x.duckdb"),
        "unreachable-postgresql": UNREACHABLE,
    }


def _junk(tmp_path: Path) -> Path:
    junk = tmp_path / "junk.spill"
    junk.write_bytes(b"no spill header\n")
    return junk


def _run_bounded(argvs: dict[str, list[str]], cwd: Path) -> dict[str, tuple[int | None, str]]:
    """Each argv in a subprocess of its own, all at once, each killed past BOUND_S (a hang fails)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = {label: subprocess.Popen([sys.executable, "-m", "multirank_logger.cli", *argv], cwd=cwd, env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True) for label, argv in argvs.items()}
    results: dict[str, tuple[int | None, str]] = {}
    for label, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=BOUND_S)
            results[label] = (proc.returncode, out)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            results[label] = (None, f"still running after {BOUND_S} s (a hang)\n{out}")
    return results


def test_every_command_on_hostile_stores(places: dict[str, str], tmp_path: Path) -> None:
    junk = _junk(tmp_path)
    in_process = {(name, case): db for name in COMMANDS if name != ("ui",) for case, db in places.items()}
    for (name, case), db in in_process.items():
        if (" ".join(name), case) in NOT_FAILURES:
            continue
        result = CliRunner().invoke(main, _argv(name, db, junk))
        label = f"{' '.join(name)} on {case}"
        assert result.exception is None or isinstance(result.exception, SystemExit), f"{label}: {result.exc_info}"
        _check(label, result.exit_code, result.output)
    assert not Path(places["missing"]).exists()  # no command but `db upgrade` (not run on it) creates a store


def test_every_command_on_a_fifo_and_ui_on_everything(places: dict[str, str], tmp_path: Path) -> None:
    """A FIFO named as the store: never opened (it would block its reader); and `ui` on every
    hostile store: one line and out, no page started. In subprocesses, each bounded."""
    junk = _junk(tmp_path)
    fifos = {suffix: tmp_path / f"fifo{suffix}" for suffix in (".duckdb", ".sqlite")}
    for fifo in fifos.values():
        os.mkfifo(fifo)
    argvs = {f"{' '.join(name)} on fifo{suffix}": _argv(name, str(fifo), junk)
             for name in COMMANDS for suffix, fifo in fifos.items()}
    argvs.update({f"ui on {case}": _argv(("ui",), db, junk) for case, db in places.items() if ("ui", case) not in NOT_FAILURES})
    for label, (code, output) in _run_bounded(argvs, tmp_path).items():
        _check(label, code, output)
    assert all(fifo.exists() and not fifo.is_file() for fifo in fifos.values())  # left as they were


@pytest.fixture
def one_run(tmp_path: Path) -> str:
    path = tmp_path / "one.sqlite"
    store = Store(path)
    run = store.create_run("lightning_logs", world_size=1)
    buffer = RecordBuffer()
    for step in range(3):
        buffer.append(step, {"loss": 1.0 / (step + 1)})
    store.write(buffer.drain(run.id, 0))
    store.close()
    return str(path)


HUGE = ["99999999999999999999", "9" * 5000, "lightning_logs/version_99999999999999999999", "١٢"]


def test_run_ids_past_64_bits_are_no_such_run(one_run: str, tmp_path: Path) -> None:
    junk = _junk(tmp_path)
    with_run = [name for name, command in COMMANDS.items() if any(p.name == "run" for p in command.params)]
    assert len(with_run) >= 6, with_run
    for name in with_run:
        for run in HUGE:
            result = CliRunner().invoke(main, _argv(name, one_run, junk, "--run", run, "-o", str(tmp_path / "out"))
                                        if any(p.name == "output" for p in COMMANDS[name].params)
                                        else _argv(name, one_run, junk, "--run", run))
            label = f"{' '.join(name)} --run {run[:30]}"
            assert result.exception is None or isinstance(result.exception, SystemExit), f"{label}: {result.exc_info}"
            _check(label, result.exit_code, result.output)
            assert "lightning_logs/version_0" in result.output, f"{label}: the runs there are, named\n{result.output}"


#: what each command with --rank says of a rank no run has: `export` refuses it naming the ranks
#: there are; `logs` selects no record (a filter, not a lookup)
NO_SUCH_RANK = {("export",): (1, "No rank '99999999999999999999' in this store. Available: 0"),
                ("logs",): (0, "No log records in lightning_logs/version_0 for this selection")}


def test_ranks_past_64_bits_are_no_such_rank(one_run: str) -> None:
    with_rank = [name for name, command in COMMANDS.items() if any(p.name == "rank" for p in command.params)]
    assert sorted(with_rank) == sorted(NO_SUCH_RANK), with_rank  # a new command with --rank: say what it answers
    for name in with_rank:
        result = CliRunner().invoke(main, _argv(name, one_run, Path("unused"), "--rank", "99999999999999999999"))
        assert result.exception is None or isinstance(result.exception, SystemExit), f"{name}: {result.exc_info}"
        assert "Traceback" not in result.output and len(result.output.splitlines()) <= MOST_LINES, result.output
        code, said = NO_SUCH_RANK[name]
        assert result.exit_code == code and said in result.output, f"{name}: exit {result.exit_code}\n{result.output}"


@pytest.mark.parametrize("value", ["http://evil.com/", "evil.com/path", "user@evil.com", "evil.com:99999", "", "a b"])
def test_allow_host_takes_a_host_name_only(value: str, tmp_path: Path) -> None:
    """`--allow-host http://evil.com/` once allowed a host named "http", silently."""
    result = CliRunner().invoke(main, ["ui", str(tmp_path / "runs.sqlite"), "--port", "0", "--allow-host", value])
    _check(f"--allow-host {value!r}", result.exit_code, result.output)
    assert "is not a host name" in result.output, result.output
    if "evil.com" in value:
        assert "pass --allow-host evil.com" in result.output, result.output


def test_allow_host_names_it_takes() -> None:
    from multirank_logger.ui.server import allowed_host_name

    assert [allowed_host_name(v) for v in ("Tunnel.Example.com", "tunnel.example.com:8080", "::1", "[::1]:80", "10.0.0.1")] == [
        "tunnel.example.com", "tunnel.example.com", "::1", "::1", "10.0.0.1"]
