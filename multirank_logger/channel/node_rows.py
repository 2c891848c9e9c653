"""A node writer's own TCPStore: its node's rows never leave the node (the node transport).

Without it, every channel is a client of the launch's one TCPStore (rank 0's process), and a
node's rows would travel from its ranks to rank 0's host and back to the node's writer: at
hundreds of ranks, every row of the job through rank 0. `RowsHost` is a TCPStore server in the
writer's process, on a free port; the writer publishes its address through the launch's store
(a small value), and its node's senders point their `RowChannel` there (`RowChannel.route`).

The server lives in the writer's process (its thread is torch's, and dies with the process: a
crashed run leaves no server behind) and is closed with the channel at the end of the phase.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from datetime import timedelta
from typing import Any

from multirank_logger.channel.end_reports import EndReports
from multirank_logger.channel.tcpstore_client import bounded

__all__ = ["NodeRoutes", "RowsHost", "reachable_host"]

log = logging.getLogger(__name__)
#: a node writer's wait, at the end, for its finished senders to let go of its store
BYE_WAIT_S = 2.0

#: the address a writer publishes when every rank it serves is on its own host
LOOPBACK = "127.0.0.1"


class RowsHost:
    """A TCPStore server on a free port of this host (every interface), for one channel's rows.

    Args:
        timeout: the server's own bound on an operation, in seconds.

    Raises:
        Whatever torch raises when no server can be started (the caller keeps the launch's store).
    """

    def __init__(self, timeout: float) -> None:
        import torch.distributed as dist

        # port 0: the kernel picks a free one; a master store listens on every interface
        self._server: Any = dist.TCPStore(LOOPBACK, 0, None, True, timedelta(seconds=timeout), wait_for_workers=False)
        self.port = int(self._server.port)

    def __repr__(self) -> str:
        return f"RowsHost(port={self.port}, open={self._server is not None})"

    def close(self) -> None:
        """Stop the server: its port and thread are released (the clients' next calls fail)."""
        self._server = None  # the last reference: torch stops its thread and closes the socket


def reachable_host(across_hosts: bool, master: str | None = None) -> str:
    """The address the ranks a writer serves reach this host by.

    `across_hosts` False (every rank it serves runs on this host: one node, or simulated nodes):
    loopback. Otherwise the address of the interface this host reaches the launch's master by
    (`master`, default ``$MASTER_ADDR``): the network the launch's ranks share; else the host's name.
    """
    if not across_hosts:
        return LOOPBACK
    master = master or os.environ.get("MASTER_ADDR")
    if master:
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((master, 9))  # UDP: no packet is sent, the kernel only picks the route
            address = str(probe.getsockname()[0])
            if not address.startswith("127.") and address != "0.0.0.0":
                return address
    return socket.getfqdn()


class NodeRoutes(EndReports):
    """`RowChannel`'s routes: which rank receives this rank's rows (`writer`), and on which store."""

    writer: int
    senders: tuple[int, ...]

    def _init_state(self) -> None:
        super()._init_state()
        self._host: RowsHost | None = None  # a node writer's own TCPStore (`host_rows`)

    def route(self, writer: int, senders: tuple[int, ...] | list[int], rows_at: tuple[str, int] | None = None) -> None:
        """Make `writer` the rank this rank's rows go to, and (on `writer`) `senders` the ranks it
        receives from. Call it before any row goes through the channel, identically on those ranks.

        With `rows_at` (``(host, port)`` of the writer's own store, `host_rows`), the rows, their
        acknowledgements and end reports go there; the small values (`publish`, `fetch`) stay on
        the launch's store.
        """
        with self._lock:
            self.writer, self.senders = writer, tuple(senders) if self.rank == writer else ()
            self._started = False  # another role: its counters are read at the next call
            if rows_at is not None:
                self._move_rows(*rows_at)

    def host_rows(self) -> int | None:
        """Start a TCPStore server of this rank's own (a node's writer), stopped by `close`.

        Returns:
            Its port, or None when no server could be started (a warning says so; the rows then
            go through the launch's store, as without it).
        """
        try:
            self._host = RowsHost(self.timeout)
        except Exception as exc:  # noqa: BLE001 - the launch's store still carries the rows
            log.warning("multirank_logger: rank %d could not start a TCPStore for its node's rows (%s): they go "
                        "through the launch's TCPStore instead", self.rank, exc)
            return None
        return self._host.port

    @property
    def _peer(self) -> str:
        """The store this rank's rows go to, for messages."""
        return f"rank {self.writer}'s TCPStore" + (f" at {self.address}" if self._launch is not None else "")

    def _let_go(self, store: Any, finished: list[int]) -> None:
        """At `close` (holding `_lock`), with `store` the connection just dropped: a sender of a
        writer's own store says it is gone (``bye/{r}``); that writer waits (bounded) for the
        byes of the senders that `finished`, then stops its store, so that none still reading
        its last acknowledgement finds it gone. Best effort: never raises."""
        host, self._host = self._host, None
        try:
            if store is not None and self._launch is not None and not self.receives:
                bounded(lambda: store.set(f"bye/{self.rank}", b"1"), min(self.timeout, BYE_WAIT_S))
            elif store is not None and host is not None and finished:
                byes = [f"bye/{r}" for r in finished]
                bounded(lambda: store.wait(byes, timedelta(seconds=BYE_WAIT_S)), BYE_WAIT_S + 1.0)
        except Exception:  # noqa: BLE001 - a sender gone: nothing to wait for
            pass
        finally:
            if host is not None:
                host.close()
            if self._launch is not None:
                self._launch._store = None  # the launch's store too: a later call connects again
