"""Ranks for tests: free ports for a rendezvous, rank functions started in processes and joined."""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import multiprocessing as mp
import multiprocessing.forkserver as mp_forkserver
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from benchmarks._harness import free_port  # one rule for a rendezvous port: the benchmarks' and the tests'

#: the checkout's root (what a launched script puts on its PYTHONPATH) and the scripts the tests launch
REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "scripts"

#: transformers, installed beside the environment by `make` (the Makefile's `transformers-site` says why:
#: installed in it, every process that imports Lightning imports transformers too, ~1.4 s of CPU each).
#: What uses it puts this folder on its path; where the folder is missing (transformers installed in the
#: environment itself) nothing needs to.
TRANSFORMERS_SITE = Path(sys.prefix) / "transformers-site"


#: Ray Train's controller takes the workers' reports when it polls them, every 2 s by default, so a
#: worker's report waits up to that long: 0.2 s for the tests' Ray runs (the doc's example 39 s -> 22 s here).
#: A knob of Ray's pace, not of what reaches the callbacks
RAY_FAST_POLL = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}


def with_transformers(env: dict[str, str]) -> dict[str, str]:
    """`env` for a process that imports transformers: its folder on PYTHONPATH, after what is there."""
    if not TRANSFORMERS_SITE.is_dir():
        return env
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(TRANSFORMERS_SITE)]))}


def import_transformers_here() -> None:
    """Lets this process import transformers: its folder on the path, last (it holds transformers alone)."""
    if TRANSFORMERS_SITE.is_dir() and str(TRANSFORMERS_SITE) not in sys.path:
        sys.path.append(str(TRANSFORMERS_SITE))


def run_launch(cmd: Sequence[str], *, cwd: Any, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """A launch (torchrun and its ranks) run to its end; past `timeout`, the test fails with the tail
    of what the launch printed, and where each of its Python processes stood: every process of the
    launch runs with faulthandler on, and a stuck one is sent SIGABRT, which dumps each of its
    threads' stack to its stderr (a launch stuck on a fresh CI machine must say where)."""
    env = {**env, "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _abort_tree(proc.pid)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
        _kill_group(proc)  # any process of the launch the aborts left
        pytest.fail(f"the launch ran past {timeout:g} s: {' '.join(map(str, cmd))}\n--- stdout ---\n{out[-6000:]}"
                    f"\n--- stderr (the stacks of its processes last) ---\n{err[-20000:]}", pytrace=False)
    except BaseException:  # pytest-timeout, Ctrl-C: the launch (its own session) goes with the test
        _kill_group(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL to the launch's session (the launcher and its ranks), then reap the launcher."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _abort_tree(pid: int) -> None:
    """SIGABRT to the launch's ranks first, then the launcher: faulthandler prints each one's stacks."""
    children = _descendants(pid)
    for child in [*reversed(children), pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGABRT)
            time.sleep(0.5)  # one dump at a time on the shared stderr


def _descendants(pid: int) -> list[int]:
    """The processes below `pid`, parents before their children (from /proc)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(0), []):
            found.append(child)
            todo.append(child)
    return found


#: what a forked rank 0 would otherwise import anew at every launch, once Lightning is in: Alembic (a
#: new store's migrations), DuckDB's SQLAlchemy dialect, pyarrow.dataset (DuckDB's scan of an Arrow
#: batch imports it, and pandas with it) and s3fs (Lightning's hparams.yaml writer imports it where it
#: is installed, to ask whether the folder is object storage)
RANK_0_IMPORTS = ("alembic.command", "duckdb_engine", "pyarrow.dataset", "s3fs")


def forkserver(*modules: str) -> Any:
    """A forkserver context whose server imports torch.distributed, Lightning, the logger and
    `modules` once: its children start in a fraction of a spawned rank's time (8 ranks on 2 cores:
    70 s -> 6 s). Their stderr is the one of the test that started the server: a test that reads
    theirs has them write it to files (logger_helpers.stderr_to_file)."""
    ctx = mp.get_context("forkserver")
    preload = ["torch.distributed", "lightning.pytorch", "multirank_logger.logger", *RANK_0_IMPORTS, *modules]
    ctx.set_forkserver_preload(preload)
    with pytest.MonkeyPatch.context() as startup:  # the server's start-up reads these, as a launched script's
        for name, value in SERVER_STARTUP.items():
            startup.setenv(name, value)
        mp_forkserver.ensure_running()
    return ctx


#: what an interpreter reads once, at its start: the server starts with what logger_helpers.train_env
#: gives each launched script, and its children inherit it (`run_ranks_forked` checks the launch asks the same)
SERVER_STARTUP = {"PYTHONWARNINGS": "ignore", "PYTHONUNBUFFERED": "1"}


def start_ranks(target: Callable[..., None], world_size: int, *args: Any, ctx: Any = None) -> list[Any]:
    """Start `target(rank, world_size, port, *args)` in `world_size` processes of `ctx` (default:
    spawn), with a free port for their gloo rendezvous. The processes, for `join_ranks`."""
    ctx = ctx or mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world_size, port, *args)) for r in range(world_size)]
    for p in procs:
        p.start()
    return procs


def join_ranks(procs: list[Any], join_s: float = 90) -> list[int | None]:
    """Wait up to `join_s` for each of `procs` to end, then kill those left. Their exit codes."""
    for p in procs:
        p.join(join_s)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)
    return [p.exitcode for p in procs]


def spawn_ranks(
    target: Callable[..., None], world_size: int, *args: Any, join_s: float = 90, ctx: Any = None
) -> list[int | None]:
    """`start_ranks` then `join_ranks`: the exit codes of `target`'s ranks, each given `join_s` to end."""
    return join_ranks(start_ranks(target, world_size, *args, ctx=ctx), join_s)


def run_ranks_forked(
    script: Path, args: Sequence[str], *, nproc: int, cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """`start_ranks_forked`, then its end (`ForkedLaunch.wait`)."""
    return start_ranks_forked(script, args, nproc=nproc, cwd=cwd, env=env).wait(timeout)


def run_script_forked(
    script: Path, args: Sequence[str], *, cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """`python script args` as one process with no launcher's variables (a person's own run of a
    script), forked as `start_ranks_forked`'s ranks are; its end as `ForkedLaunch.wait` returns it."""
    return start_ranks_forked(script, args, nproc=1, cwd=cwd, env=env, launcher=False).wait(timeout)


def start_ranks_forked(
    script: Path, args: Sequence[str], *, nproc: int, cwd: Path, env: dict[str, str], launcher: bool = True
) -> ForkedLaunch:
    """`python script args` on `nproc` ranks of one host, as torchrun starts them, each rank forked
    from a server that imported Lightning once (`forkserver`), not a fresh interpreter.

    Each rank gets what torchrun's agent gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR
    and MASTER_PORT, TORCHELASTIC_RUN_ID, ...), so a script with ``Trainer(devices=nproc,
    strategy="ddp")`` starts no process of its own, as under torchrun or Slurm; it runs the script as
    ``__main__`` and ends as an interpreter ends (non-daemon threads joined, then the atexit hooks).
    What it costs is the training, not the 5-7 s of CPU a fresh rank spends importing Lightning here.
    Where the launcher or the process itself is what a test is about (signals, exits, Lightning's own
    launcher, torchrun's restarts), the test launches for real instead. `launcher=False`: one
    process with none of those variables (`run_script_forked`).
    """
    assert launcher or nproc == 1, "ranks without a launcher's variables are one process"
    differs = {k: env.get(k) for k, v in SERVER_STARTUP.items() if env.get(k) != v}
    assert not differs, f"the forkserver started with {SERVER_STARTUP}; a launch asking {differs} is launched for real"
    out = Path(cwd) / f"ranks-{uuid.uuid4().hex[:8]}.out"
    port = str(free_port())
    run_id = uuid.uuid4().hex  # torchrun --standalone's: one job, its own
    ctx = forkserver()
    launch = ForkedLaunch([sys.executable, str(script), *args], out)
    for rank in range(nproc):
        rank_env = {k: v for k, v in env.items() if not k.startswith(("MASTER_", "TORCHELASTIC_"))}
        if launcher:
            rank_env |= {
                "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
                "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": str(nproc), "WORLD_SIZE": str(nproc),
                "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": run_id,
                "TORCHELASTIC_USE_AGENT_STORE": "False", "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
            }
        launch.ranks.append(ctx.Process(target=_script_rank, args=(str(script), list(args), rank_env, str(cwd), str(out))))
    try:
        for rank_process in launch.ranks:
            rank_process.start()
    except BaseException:
        launch.kill()
        raise
    return launch


class ForkedLaunch:
    """The ranks `start_ranks_forked` started: wait for their end, or end them (a `with` block ends
    any left at its end, as a test's own launch must never outlive it)."""

    def __init__(self, args: list[str], out: Path) -> None:
        self.args = args
        #: where every rank's stdout and stderr go, in the order written (one file, as one launch's pipe)
        self.out = out
        self.ranks: list[Any] = []

    def wait(self, timeout: float) -> subprocess.CompletedProcess[str]:
        """The launch once every rank ended, as `run_launch` returns one: stdout is `out`'s text, stderr
        empty, the return code the first failed rank's (a signal's as -N), else 0. Past `timeout`, the
        test fails with the output's end and the stacks of the ranks still running."""
        try:
            deadline = time.monotonic() + timeout
            for rank in self.ranks:
                rank.join(max(0.0, deadline - time.monotonic()))
            if any(rank.is_alive() for rank in self.ranks):
                for rank in self.ranks:
                    if rank.is_alive():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(rank.pid, signal.SIGABRT)  # faulthandler: its threads' stacks into the output
                        rank.join(10)
                pytest.fail(f"the launch ran past {timeout:g} s: {' '.join(self.args[1:])}\n"
                            f"--- output (the stacks of the ranks left last) ---\n{_read(self.out)[-20000:]}",
                            pytrace=False)
        finally:
            self.kill()  # pytest-timeout, Ctrl-C, a launch past its time: no rank outlives the test
        failed = next((code for rank in self.ranks if (code := rank.exitcode)), 0)
        return subprocess.CompletedProcess(self.args, failed, _read(self.out), "")

    def wait_for_output(self, text: str, timeout: float) -> None:
        """Return once the launch's output holds `text`; fail with the output where the launch ended,
        or `timeout` passed, first."""
        deadline = time.monotonic() + timeout
        while text not in _read(self.out):
            if not self.running or time.monotonic() > deadline:
                pytest.fail(f"{text!r} not in the launch's output ({'ended' if not self.running else 'still running'} "
                            f"after {timeout:g} s):\n{_read(self.out)[-5000:]}", pytrace=False)
            time.sleep(0.05)

    @property
    def running(self) -> bool:
        """Whether any rank is still running."""
        return any(rank.is_alive() for rank in self.ranks)

    def kill(self) -> None:
        """SIGKILL to every rank still running, each then reaped."""
        for rank in self.ranks:
            if rank.pid is not None and rank.is_alive():
                rank.kill()
                rank.join(10)

    def __enter__(self) -> ForkedLaunch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _script_rank(script: str, argv: list[str], env: dict[str, str], cwd: str, out: str) -> None:
    """One rank of `run_ranks_forked`, in a child of the forkserver: `python script argv` from here on."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):  # as PYTHONUNBUFFERED: every line in the file as it is written
        stream.reconfigure(line_buffering=True, write_through=True)  # type: ignore[union-attr]
    faulthandler.enable()  # as `run_launch` gives every process it launches (PYTHONFAULTHANDLER)
    sys.argv = [script, *argv]
    # what `python script` puts first: the script's folder, then PYTHONPATH's entries the server lacks
    missing = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = [os.path.dirname(script), *missing]
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, (int, type(None))):
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    # the interpreter's end: non-daemon threads joined, then the atexit hooks (the logger's among them)
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
