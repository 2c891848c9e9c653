"""choose_transport: validation, and rank 0's decision reaching every rank through a real TCPStore."""

from __future__ import annotations

import datetime
import threading
from pathlib import Path

import pytest
import torch.distributed as dist

from multirank_logger.errors import InvalidTransport
from multirank_logger.store.backends import backend_for, resolve_url
from multirank_logger.transport.row_channel import RowChannel
from multirank_logger.write.transport_choice import choose_transport, filesystem_type
from tests.helpers.launches import free_port

pytestmark = pytest.mark.timeout(60)


def _both_ranks(db: Path, requested: str = "auto", rank1: bool = True, timeout: float = 10) -> list:
    """Rank 0 and rank 1 decide at once, each on its own channel to one TCPStore."""
    server = dist.TCPStore("127.0.0.1", free_port(), None, True, datetime.timedelta(seconds=10), wait_for_workers=False)
    backend = backend_for(resolve_url(db))
    out: list = [None, None]

    def decide(rank: int) -> None:
        channel = RowChannel("p", rank, 2, host="127.0.0.1", port=server.port)
        out[rank] = choose_transport(requested, backend, 2, rank=rank, channel=channel, timeout=timeout)

    threads = [threading.Thread(target=decide, args=(r,)) for r in ((0, 1) if rank1 else (0,))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_unknown_transport_is_refused() -> None:
    """A typo in transport= is an error that lists the choices."""
    backend = backend_for(resolve_url("x.sqlite"))
    with pytest.raises(InvalidTransport, match="transport='gahter' is not one of 'auto', 'direct', 'gather'"):
        choose_transport("gahter", backend, 2)


def test_direct_with_duckdb_and_several_ranks_is_refused() -> None:
    """DuckDB takes one writing process: forcing direct with 2 ranks says to use gather."""
    with pytest.raises(InvalidTransport, match="takes one writing process per file"):
        choose_transport("direct", backend_for(resolve_url("x.duckdb")), 2)


def test_forced_choices_need_no_channel() -> None:
    """transport='gather' or 'direct' is decided locally, the same on every rank."""
    backend = backend_for(resolve_url("x.sqlite"))
    assert choose_transport("gather", backend, 4, rank=3)[0] == "gather"
    assert choose_transport("direct", backend, 4, rank=3)[0] == "direct"


def test_auto_gathers_for_duckdb(tmp_path: Path) -> None:
    """auto + DuckDB: both ranks get gather, with the reason."""
    out = _both_ranks(tmp_path / "runs.duckdb")
    assert out[0] == out[1]
    assert out[0][0] == "gather" and "one writing process" in out[0][1]


def test_auto_writes_directly_to_sqlite_every_rank_sees(tmp_path: Path) -> None:
    """auto + SQLite on a local disk both ranks see: direct on both, and the probe file is gone."""
    out = _both_ranks(tmp_path / "runs.sqlite")
    assert out[0] == out[1]
    assert out[0][0] == "direct"
    assert not list(tmp_path.glob(".multirank-probe-*"))


def test_auto_gathers_when_a_rank_does_not_answer(tmp_path: Path) -> None:
    """A rank that never answers rank 0's probe must not write directly: rank 0 picks gather within its bound."""
    out = _both_ranks(tmp_path / "runs.sqlite", rank1=False, timeout=0.5)
    assert out[0][0] == "gather" and "rank(s) 1 cannot see" in out[0][1]


def test_filesystem_type_reads_the_deepest_mount(tmp_path: Path) -> None:
    """The deepest mount holding the path gives its type: an NFS mount inside a local disk is NFS."""
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/sda1 / ext4 rw 0 0\nserver:/vol /shared nfs4 rw 0 0\n")
    assert filesystem_type("/shared/runs/x.sqlite", str(mounts)) == "nfs4"
    assert filesystem_type("/sharedother", str(mounts)) == "ext4"
