"""Where rows are written: every rank straight into the store ("direct"), rank 0 alone
("gather"), or one writer per node (or per group of nodes) of a server store ("node").

`choose_transport` decides once per run, identically on every rank: rank 0 looks at the
store (backend, filesystem, whether every rank sees it; a server's free connections) and
publishes the choice through the RowChannel; the other ranks take it from there. No
collective is used, and every wait is bounded.

The node transport keeps a server store's connections bounded by nodes, not ranks: each
rank says which node it is on (host and node rank), rank 0 cuts the nodes into at most
``max_writers`` groups, and the lowest rank of each group receives the group's rows over the
channel (`RowChannel.route`) and writes them on its one connection. Each such writer hosts a
TCPStore of its own (channel/node_rows.py) and publishes its address through the launch's
store; its ranks' rows go there, never through rank 0's store, which carries only the small
values of the choice.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multirank_logger.channel.node_rows import LOOPBACK, reachable_host
from multirank_logger.channel.rank_facts import rank_facts
from multirank_logger.errors import InvalidTransport, MultiRankLoggerError

if TYPE_CHECKING:
    from multirank_logger.channel.row_channel import RowChannel
    from multirank_logger.store.backends import Backend

__all__ = ["NETWORK_FILESYSTEMS", "TRANSPORTS", "FreeConnections", "choose_transport", "filesystem_type"]

TRANSPORTS = ("auto", "direct", "gather", "node")
#: what rank 0 learns of a server: (connections free now, one line saying what it read), or None
FreeConnections = Callable[[], "tuple[int, str] | None"]

#: Filesystems on which SQLite's locking is unsafe (or which are shared between hosts).
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs", "nfs4", "lustre", "gpfs", "cifs", "smb", "smb2", "smb3", "smbfs", "ceph", "fuse.ceph",
        "glusterfs", "fuse.glusterfs", "beegfs", "fuse.sshfs", "sshfs", "afs", "ocfs2", "gfs2",
        "panfs", "wekafs", "9p", "fuse.juicefs", "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone",
    }
)

# the channel keys of the choice (the same code on every rank of a launch)
_KEY_PROBE = "transport/probe"
_KEY_CHOICE = "transport/choice"
_KEY_SEEN = "transport/seen/{rank}"
_KEY_NODE = "transport/node/{rank}"
_KEY_PLAN = "transport/plan"
_KEY_ROWS_AT = "transport/rows_at/{rank}"


def filesystem_type(path: str | os.PathLike[str], mounts: str = "/proc/mounts") -> str | None:
    """The type of the filesystem holding `path` (``ext4``, ``nfs4``...), from the mount table.

    Returns None where there is no readable mount table (not Linux).
    """
    try:
        with open(mounts, encoding="utf-8", errors="replace") as fh:
            table = [line.split() for line in fh]
    except OSError:
        return None
    target = os.path.realpath(path)
    best, kind = "", None
    for fields in table:
        if len(fields) < 3:
            continue
        # the mount table escapes spaces as \040
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):  # the last, deepest mount wins
            best, kind = point, fields[2]
    return kind


def choose_transport(
    requested: str,
    backend: Backend,
    world_size: int,
    *,
    rank: int = 0,
    channel: RowChannel | None = None,
    timeout: float = 30.0,
    max_writers: int | None = None,
    free_connections: FreeConnections | None = None,
) -> tuple[str, str]:
    """Decide "direct", "gather" or "node" for this run; the same answer on every rank.

    Call it on every rank at the same point of the setup (all ranks arrive there): with
    ``requested="auto"`` and a file store, rank 0 asks the other ranks, through `channel`,
    whether they see a marker file next to the store, waiting at most `timeout` seconds.

    With "node" (asked for, or chosen by "auto" for a server with fewer free connections than
    ranks), `channel` is routed (`RowChannel.route`): its rows go to this rank's node writer.

    Args:
        requested: "auto", "direct", "gather" or "node".
        backend: the store's backend (``Store.backend`` or ``backends.backend_for(url)``).
        world_size: number of ranks.
        rank: this process's global rank.
        channel: the run's RowChannel; needed when ``requested="auto"`` and ``world_size > 1``.
        timeout: seconds to wait for the other ranks (rank 0) or for rank 0's choice (others).
        max_writers: the most processes that may write a server store at once (None: as many
            as its free connections allow, `free_connections`).
        free_connections: rank 0 only: asks the server how many connections are free.

    Returns:
        ``(choice, reason)``: the transport and one sentence saying why, for rank 0's console.

    Raises:
        InvalidTransport: for an unknown value, or "direct" with a backend that takes one writer.
        ChannelTimeout: on a rank other than 0, when rank 0 published no choice within `timeout`.
    """
    if requested not in TRANSPORTS:
        raise InvalidTransport(requested, TRANSPORTS)
    if requested == "gather":
        return "gather", "transport='gather' was requested: rank 0 writes every rank's rows"
    if requested == "node" and not backend.concurrent_writers:
        raise InvalidTransport(
            requested, TRANSPORTS,
            f"transport='node' needs a store that several processes can write, and {backend.name} takes "
            "one writing process per file. Use transport='gather' (or 'auto').",
        )
    if world_size > 1 and (requested == "node" or (requested == "auto" and _is_server(backend))):
        if channel is None:
            raise ValueError(f"choose_transport(requested={requested!r}) with several ranks needs the run's RowChannel")
        return _choose_for_server(requested, world_size, rank, channel, timeout, max_writers, free_connections)
    if requested == "direct":
        if world_size > 1 and not backend.concurrent_writers:
            raise InvalidTransport(
                requested,
                TRANSPORTS,
                f"transport='direct' needs a store that several processes can write, and "
                f"{backend.name} takes one writing process per file. Use transport='gather' "
                "(or 'auto'), or a SQLite/PostgreSQL store.",
            )
        _warn_if_network(backend, rank)
        return "direct", "transport='direct' was requested: every rank writes the store"
    if world_size < 2:
        return "direct", "one rank: it writes the store itself"
    if channel is None:
        raise ValueError("choose_transport(requested='auto') with several ranks needs the run's RowChannel")
    if rank == 0:
        choice, reason = _decide_on_rank0(backend, world_size, channel, timeout)
        channel.publish(_KEY_CHOICE, f"{choice}\n{reason}".encode())
        return choice, reason
    _answer_probe(channel, timeout)
    choice, _, reason = channel.fetch(_KEY_CHOICE, timeout).decode().partition("\n")
    return choice, reason


def _is_server(backend: Backend) -> bool:
    return backend.path is None and backend.concurrent_writers


def _choose_for_server(
    requested: str,
    world: int,
    rank: int,
    channel: RowChannel,
    timeout: float,
    max_writers: int | None,
    free_connections: FreeConnections | None,
) -> tuple[str, str]:
    """A server store: every rank writes while its free connections allow, else one writer per node."""
    if rank != 0:
        facts = rank_facts()
        channel.publish(_KEY_NODE.format(rank=rank), f"{facts['host']}|{facts['node_rank']}".encode())
        choice, _, reason = channel.fetch(_KEY_CHOICE, timeout).decode().partition("\n")
        if choice == "node":
            _follow_plan(channel, json.loads(channel.fetch(_KEY_PLAN, timeout)), timeout)
        return choice, reason
    choice, reason, plan = _decide_for_server(requested, world, channel, timeout, max_writers, free_connections)
    if plan is not None:
        channel.publish(_KEY_PLAN, json.dumps(plan).encode())
        _follow_plan(channel, plan, timeout)
    channel.publish(_KEY_CHOICE, f"{choice}\n{reason}".encode())
    return choice, reason


def _decide_for_server(
    requested: str,
    world: int,
    channel: RowChannel,
    timeout: float,
    max_writers: int | None,
    free_connections: FreeConnections | None,
) -> tuple[str, str, dict[str, Any] | None]:
    """Rank 0: (choice, reason, for "node" the plan: the writer of each rank, and the writers
    whose ranks are on more hosts than their own)."""
    free = free_connections() if free_connections is not None else None
    # the connections this job may add to rank 0's own: half of those free now (the server is
    # shared: readers, other jobs), and no more than max_writers asks
    extra = world - 1 if free is None else max(free[0] // 2, 0)
    if max_writers is not None:
        extra = min(extra, max_writers - 1)
    seen = "" if free is None else f"the server has {free[0]} connection(s) free ({free[1]}); "
    if requested == "auto" and world - 1 <= extra:
        return "direct", f"{seen}every rank writes its own rows ({world} connections)", None
    node_of = _gather_nodes(channel, world, timeout)
    nodes = sorted(set(node_of.values()), key=lambda n: min(r for r, m in node_of.items() if m == n))
    writers = max(1, min(len(nodes), extra + 1))
    writer_of = _plan(node_of, nodes, writers, world)
    host_of = {r: node.rpartition("|")[0] for r, node in node_of.items()}
    across = sorted({w for r, w in enumerate(writer_of) if host_of[r] != host_of[w]})
    why = f"max_writers={max_writers}" if max_writers is not None and max_writers - 1 == extra else "free connections"
    reason = (
        f"{seen}{world} ranks on {len(nodes)} node(s) write through {writers} writer(s) (bounded by {why}): "
        "each node's ranks ship their rows to their node's writer, which writes them on one connection"
    )
    return "node", reason, {"writer_of": _runs(writer_of), "across_hosts": across}


def _gather_nodes(channel: RowChannel, world: int, timeout: float) -> dict[int, str]:
    """Rank 0: the node each rank said it is on; one bound for all. A rank that did not say joins rank 0's."""
    facts = rank_facts()
    node_of = {0: f"{facts['host']}|{facts['node_rank']}"}
    deadline = time.monotonic() + timeout
    for r in range(1, world):
        try:
            node_of[r] = channel.fetch(_KEY_NODE.format(rank=r), max(0.05, deadline - time.monotonic())).decode()
        except MultiRankLoggerError:
            node_of[r] = node_of[0]  # rank 0 receives its rows: the safe answer
    return node_of


def _plan(node_of: dict[int, str], nodes: list[str], writers: int, world: int) -> list[int]:
    """The writer of each rank: the nodes (in order of their lowest rank) cut into `writers`
    groups of consecutive nodes; the lowest rank of a group writes it."""
    group_of = {node: i * writers // len(nodes) for i, node in enumerate(nodes)}
    first: dict[int, int] = {}
    for r in range(world):
        first.setdefault(group_of[node_of[r]], r)
    return [first[group_of[node_of[r]]] for r in range(world)]


def _runs(writer_of: list[int]) -> list[list[int]]:
    """`writer_of` as runs of [writer, count]: every rank reads the plan, and a node's ranks are
    mostly consecutive, so it stays a few bytes per node instead of a few per rank (1,024 ranks
    reading 1,024 numbers each would move ~5 MB through the launch's store)."""
    runs: list[list[int]] = []
    for w in writer_of:
        if runs and runs[-1][0] == w:
            runs[-1][1] += 1
        else:
            runs.append([w, 1])
    return runs


def _follow_plan(channel: RowChannel, plan: dict[str, Any], timeout: float) -> None:
    """Route `channel` to this rank's writer; a writer hosts its ranks' rows on a TCPStore of its
    own and publishes where (a sender that hears nothing goes through the launch's store)."""
    me, writer_of = channel.rank, [w for w, n in plan["writer_of"] for _ in range(n)]
    writer = writer_of[me]
    if writer == me:
        senders = [r for r, w in enumerate(writer_of) if w == me and r != me]
        port = channel.host_rows() if senders else None
        where = f"{reachable_host(me in plan['across_hosts'])}:{port}" if port is not None else ""
        channel.publish(_KEY_ROWS_AT.format(rank=me), where.encode())
        channel.route(me, senders, rows_at=(LOOPBACK, port) if port is not None else None)
        return
    try:
        where = channel.fetch(_KEY_ROWS_AT.format(rank=writer), timeout).decode()
    except MultiRankLoggerError:
        where = ""  # its writer is gone: the rows wait in the launch's store, then spill
    host, _, number = where.rpartition(":")
    channel.route(writer, [], rows_at=(host, int(number)) if where else None)


def _warn_if_network(backend: Backend, rank: int) -> None:
    path = backend.path
    if rank == 0 and path is not None and backend.locking_unsafe_on_network_fs:
        kind = filesystem_type(path.parent)
        if kind in NETWORK_FILESYSTEMS:
            warnings.warn(
                f"transport='direct' with a SQLite store on {kind} ({path}): SQLite's locking is "
                "unsafe on network filesystems. Use transport='gather' (or 'auto').",
                stacklevel=3,
            )


def _decide_on_rank0(backend: Backend, world_size: int, channel: RowChannel, timeout: float) -> tuple[str, str]:
    """Rank 0's reasoning, cheapest facts first; the visibility probe only when it matters."""
    if not backend.concurrent_writers:
        channel.publish(_KEY_PROBE, b"")
        return "gather", f"{backend.name} takes one writing process per file: rank 0 writes every rank's rows"
    path = backend.path
    if path is None:
        channel.publish(_KEY_PROBE, b"")
        return "direct", f"{backend.name} is a server that takes concurrent writers: every rank writes"
    kind = filesystem_type(path.parent)
    if kind in NETWORK_FILESYSTEMS:
        channel.publish(_KEY_PROBE, b"")
        return "gather", f"the store is on {kind}, where {backend.name}'s locking is unsafe: rank 0 writes every rank's rows"
    blind = _probe_visibility(path.parent, world_size, channel, timeout)
    if blind:
        ranks = ", ".join(map(str, blind))
        return "gather", f"rank(s) {ranks} cannot see {path.parent} (no shared disk): rank 0 writes every rank's rows"
    return "direct", f"{backend.name} on a local {kind or 'disk'} that all {world_size} ranks see: every rank writes"


def _probe_visibility(directory: Path, world_size: int, channel: RowChannel, timeout: float) -> list[int]:
    """Ranks that do not see a marker file rank 0 creates in `directory` (or do not answer)."""
    token = secrets.token_hex(16)
    marker = directory / f".multirank-probe-{token}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        marker.write_text(token)
    except OSError:
        channel.publish(_KEY_PROBE, b"")
        return list(range(1, world_size))  # cannot tell: the safe answer is gather
    try:
        channel.publish(_KEY_PROBE, f"{marker}\n{token}".encode())
        blind = []
        deadline = time.monotonic() + timeout  # one bound for all ranks, not one each
        for r in range(1, world_size):
            try:
                left = max(0.05, deadline - time.monotonic())
                seen = channel.fetch(_KEY_SEEN.format(rank=r), left) == b"1"
            except MultiRankLoggerError:
                seen = False  # a rank that does not answer in time must not get a direct write
            if not seen:
                blind.append(r)
        return blind
    finally:
        marker.unlink(missing_ok=True)


def _answer_probe(channel: RowChannel, timeout: float) -> None:
    probe = channel.fetch(_KEY_PROBE, timeout).decode()
    if not probe:
        return
    path, _, token = probe.partition("\n")
    try:
        seen = Path(path).read_text() == token
    except OSError:
        seen = False
    channel.publish(_KEY_SEEN.format(rank=channel.rank), b"1" if seen else b"0")
