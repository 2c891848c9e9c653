"""A PostgreSQL server that admits fewer connections than the job has ranks: one writer per node.

16 ranks (4 simulated nodes: NODE_RANK/LOCAL_RANK as Lightning's launcher sets them) into a
server started with max_connections=10, its own instance. Every rank opening its own connection
(what "auto" chose before) crashed every rank at set-up with "too many clients already".
Plain processes over gloo (tests/scripts/logger_many_ranks.py), forked from a server process that has
imported torch and the logger, so that 16 of them share those pages.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from multirank_logger.store.backends import public_name
from tests.helpers.launches import forkserver, join_ranks, start_ranks
from tests.helpers.logger_helpers import query, ranks_stderr
from tests.helpers.stores import new_postgres_database, with_password
from tests.scripts.logger_many_ranks import rank_main, value

pytestmark = pytest.mark.timeout(300)
WORLD = 16
NODES = 4
MAX_CONNECTIONS = 10
CALLS = 200
JOIN_TIMEOUT_S = 200


@pytest.fixture(scope="module")
def small_server() -> Iterator[Any]:
    """A PostgreSQL server of its own that admits `MAX_CONNECTIONS` clients."""
    pgserver = pytest.importorskip("pgserver", reason="pgserver is not installed (pip install -e '.[test]')")
    from pgserver._commands import pg_ctl

    data = Path(tempfile.mkdtemp(prefix="multirank-pg-small-"))
    server = pgserver.get_server(data, cleanup_mode="stop")
    server.psql(f"ALTER SYSTEM SET max_connections = {MAX_CONNECTIONS};")
    pg_ctl(["-w", "-m", "fast", "restart"], pgdata=data, user=server.system_user, timeout=60)
    assert str(MAX_CONNECTIONS) in server.psql("SHOW max_connections;")
    yield server
    server.cleanup()
    shutil.rmtree(data, ignore_errors=True)


def _start(
    db: str, out: Path, transport: str, go: Path | None = None, *, world: int = WORLD, nodes: int = NODES,
    calls: int = CALLS, kill: dict[str, Any] | None = None, **options: Any,
) -> list[Any]:
    ctx = forkserver("tests.scripts.logger_many_ranks")
    return start_ranks(rank_main, world, db, calls, str(out), transport, nodes, options, go and str(go), True, kill, ctx=ctx)


def _launch(db: str, out: Path, transport: str, **options: Any) -> list[int | None]:
    return join_ranks(_start(db, out, transport, **options), JOIN_TIMEOUT_S)


def test_sixteen_ranks_into_a_server_of_ten_connections_store_every_row(small_server: Any, tmp_path: Path) -> None:
    """transport="auto" reads the server's free connections and writes through one writer per
    node: every rank's rows stored once, every rank and the run `success`. The rows stay on
    their node: each writer hosts a TCPStore of its own (not the launch's, rank 0's), its
    node's ranks send there, and the launch's store holds no row key of any rank."""
    db, out = new_postgres_database(small_server), tmp_path / "out"
    out.mkdir()
    assert _launch(db, out, "auto") == [0] * WORLD
    assert "too many clients" not in ranks_stderr(out)
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert {(r["transport"], r["run_id"]) for r in reports} == {("node", 1)}
    counts = query(db, "SELECT rank, count(*) FROM metrics WHERE key = 'value' GROUP BY rank ORDER BY rank")
    assert counts == [(r, CALLS) for r in range(WORLD)]
    for r in (0, 5, 15):
        rows = query(db, "SELECT step, value FROM metrics WHERE rank = :r AND key = 'value' ORDER BY seq", r=r)
        assert rows == [(c, value(r, c)) for c in range(CALLS)]
    assert query(db, "SELECT status, transport, world_size FROM runs") == [("success", "node", WORLD)]
    ranks = query(db, "SELECT rank, status, node_rank, local_rank FROM ranks ORDER BY rank")
    assert ranks == [(r, "success", r // 4, r % 4) for r in range(WORLD)]
    launch = json.loads((out / "launch_store.json").read_text())
    routes = [r["route"] for r in reports]
    assert [route["writer"] for route in routes] == [r - r % 4 for r in range(WORLD)]
    stores = [{route["rows_at"] for route in routes[n * 4:n * 4 + 4]} for n in range(NODES)]
    assert all(len(node) == 1 for node in stores)  # a node's ranks: one store, their writer's
    addresses = [node.pop() for node in stores]
    assert len(set(addresses)) == NODES and all(a.startswith("127.0.0.1:") for a in addresses)
    assert f"127.0.0.1:{launch['port']}" not in addresses
    assert launch["ack"] == launch["done"] == []  # no rank's rows crossed the launch's store


def test_ranks_the_server_refuses_go_on_and_spill(small_server: Any, tmp_path: Path) -> None:
    """transport="direct", as a role that the server stops admitting once the run is set up (the
    ranks wait to log meanwhile): the ranks that hold no connection then (at least 9 of 16: the
    role gets 7 of the server's 10) are refused for the rest of the launch. A refused rank is not
    killed; its rows wait, then go to its spill file, which the output names; importing the
    files stores every row once and makes the run a success."""
    from click.testing import CliRunner
    from sqlalchemy.engine import make_url

    from multirank_logger.cli import main

    db, _ = with_password(small_server, new_postgres_database(small_server))
    role, out, go = make_url(db).username, tmp_path / "out", tmp_path / "go"
    out.mkdir()
    procs = _start(db, out, "direct", go, timeout=5.0, spill_dir=str(tmp_path / "spill"))
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while len(list(tmp_path.glob("go.ready*"))) < WORLD:
        if time.monotonic() > deadline or any(p.exitcode is not None for p in procs):
            join_ranks(procs, 5)  # ends the others: what each said is then whole
            pytest.fail(f"the ranks did not set up (exit codes {[p.exitcode for p in procs]}):\n{ranks_stderr(out)[-6000:]}")
        time.sleep(0.05)
    small_server.psql(f"ALTER ROLE {role} CONNECTION LIMIT 0;")  # the connections open stay; no new one
    try:
        go.touch()
        assert join_ranks(procs, JOIN_TIMEOUT_S) == [0] * WORLD
    finally:
        small_server.psql(f"ALTER ROLE {role} CONNECTION LIMIT -1;")
    captured = ranks_stderr(out)
    files = sorted((tmp_path / "spill").glob("*"))
    name = public_name(db)  # messages name the store without its password
    for f in files:  # every file the ranks wrote is named with its import command
        assert f"import {name} {f}" in captured or f"import '{name}' {f}" in captured
    stored = dict(query(db, "SELECT rank, count(*) FROM metrics WHERE key = 'value' GROUP BY rank"))
    refused = [r for r in range(WORLD) if stored.get(r, 0) < CALLS]
    assert len(refused) >= WORLD - 7 and len(files) == len(refused)  # each rank refused spilled
    assert query(db, "SELECT status FROM runs") == [("incomplete",)]
    result = CliRunner().invoke(main, ["import", db, *map(str, files)])
    assert result.exit_code == 0, result.output
    counts = query(db, "SELECT rank, count(*) FROM metrics WHERE key = 'value' GROUP BY rank ORDER BY rank")
    assert counts == [(r, CALLS) for r in range(WORLD)]
    assert query(db, "SELECT status, transport FROM runs") == [("success", "direct")]


def test_a_node_writer_killed_mid_run_its_senders_spill_and_the_import_completes(
    small_server: Any, tmp_path: Path
) -> None:
    """8 ranks on 2 nodes, transport="node": the second node's writer (rank 4) is killed
    (SIGKILL) halfway. Its store dies with it: its node's senders name it, spill what it had not
    acknowledged and everything after, and finish; the other node is untouched. Importing the
    spill files stores every sender's row once; rank 4 keeps what it stored before, once."""
    from click.testing import CliRunner

    from multirank_logger.cli import main

    world, calls, killed = 8, 60, 4
    db, out, spill, gate = new_postgres_database(small_server), tmp_path / "out", tmp_path / "spill", tmp_path / "gate"
    out.mkdir()
    procs = _start(db, out, "node", world=world, nodes=2, calls=calls, kill={"rank": killed, "at": calls // 2,
                   "gate": str(gate)}, timeout=5.0, spill_dir=str(spill))
    procs[killed].join(JOIN_TIMEOUT_S)
    gate.touch()
    assert join_ranks(procs, JOIN_TIMEOUT_S) == [0] * killed + [-9] + [0] * (world - killed - 1)
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world) if r != killed]
    rows_at = {r["rank"]: r["route"]["rows_at"] for r in reports}
    assert len(set(rows_at.values())) == 2 and rows_at[1] != rows_at[5]
    captured = ranks_stderr(out)
    assert f"cannot reach rank {killed}'s TCPStore at {rows_at[5]}" in captured
    files = sorted(spill.glob("*"))
    assert sorted(int(f.name.split("-rank")[1].split("-")[0]) for f in files) == [5, 6, 7], files
    result = CliRunner().invoke(main, ["import", db, *map(str, files)])
    assert result.exit_code == 0, result.output
    counts = query(db, "SELECT rank, count(*), count(DISTINCT seq) FROM metrics WHERE key = 'value' GROUP BY rank")
    stored = {r: (n, distinct) for r, n, distinct in counts}
    assert all(stored[r] == (calls, calls) for r in range(world) if r != killed)
    assert calls // 2 - 20 <= stored[killed][0] == stored[killed][1] <= calls // 2  # its flushed rows, once
    for r in (1, 5, 7):
        rows = query(db, "SELECT step, value FROM metrics WHERE rank = :r AND key = 'value' ORDER BY seq", r=r)
        assert rows == [(c, value(r, c)) for c in range(calls)]
