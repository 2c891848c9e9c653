"""RowChannel: ship batches of metric rows (Arrow record batches) from every rank to rank 0 without a collective.

The channel is a client of the torch.distributed TCPStore that the launch already runs
(tcpstore_client.py: connecting, bounded calls, the size of a queue item); this module is the
protocol over it: batches, acknowledgements, side rows, end reports. Nothing here is a
collective: a rank that logs nothing, or dies, never makes another wait beyond a bounded time.
It knows nothing about SQL.

Wire format, under the prefix ``multirank_logger/{namespace}/``:

- ``rows/{r}``: a TCPStore queue per sending rank ``r``; each item is one encoded batch
  (``rows.wire.encode_batch``: an Arrow IPC stream of one record batch, no pickle). ``queue_pop``
  removes what rank 0 consumed, so the server's memory stays flat.
- ``ack/{r}``: a counter of rank ``r``'s items that rank 0 has taken *and* handed to its
  writer (an item is acknowledged at the ``receive`` call after the one that returned
  it, i.e. once the writer came back for more; a ``peek`` in between, rank 0's watch looking
  at the rows early, acknowledges nothing). A sender keeps unacknowledged batches, so that
  when rank 0 is gone it can spill every row that may not have been stored.
- ``done/{r}``: ``"{items} {status}"`` set by ``mark_done``: rank ``r`` sent ``items``
  items in all and will send no more.
- ``end/{r}``: ``"{spilled} {lost} {side_spilled}"`` set by ``report_spilled_lost`` once rank ``r``
  knows what it could not deliver (after rank 0 acknowledged its last rows, or gave up waiting):
  values spilled and lost, side-table rows spilled.
- ``counted/{r}``: set by rank 0 once it took rank ``r``'s ``end/{r}`` (``acknowledge_reports``):
  those counts are in the run's totals, and the sender's next phase reports only what follows.
- ``kv/{key}``: small values published by rank 0 (``publish``/``fetch``).

By default rank 0 receives from every other rank (the gather transport). `route` makes the
channel one node's (the node transport): its writer receives from the ranks it names, the
others send to it, on a TCPStore the writer hosts (`host_rows`, node_rows.py) while the
``kv/`` values stay on the launch's; the keys are per sending rank either way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from multirank_logger._util.torch_version import require_store_queues
from multirank_logger.channel.node_rows import NodeRoutes
from multirank_logger.channel.tcpstore_client import bounded, pop_all, split_rows
from multirank_logger.errors import ChannelError
from multirank_logger.rows.wire import decode_batch, encode_batch

__all__ = ["RowChannel"]

log = logging.getLogger(__name__)
_POLL_S = 0.02
_POLL_MAX_S = 0.25


class RowChannel(NodeRoutes):
    """Rows from ranks 1..N-1 to rank 0 over the launch's TCPStore; never a collective.

    Args:
        namespace: keys live under ``multirank_logger/{namespace}/``; identical on every rank
            and unique per channel within one launch (e.g. one per logger instance and run).
        rank: this process's global rank.
        world_size: number of ranks in the launch.
        host: the TCPStore's host; defaults to ``$MASTER_ADDR``.
        port: the TCPStore's port; defaults to ``$MASTER_PORT``.
        timeout: the bound, in seconds, on connecting, on every store operation, and on how long
            rank 0 may leave a sender's rows unacknowledged before the sender gives up on it.

    Senders (rank != 0) call `send` from a background thread and `mark_done` at the end;
    rank 0 calls `receive` and `done_ranks`. On `ChannelError`, spill ``exc.undelivered``.
    Small values go through `publish` and `fetch` (`StoreClient`'s), the counts of rows that
    did not arrive through `report_spilled_lost` and its kin (`EndReports`').

    Example::

        channel = RowChannel("run-7", rank, world_size)
        if rank == 0:
            for batch in channel.receive():
                store.write(batch)
        else:
            channel.send(buffer.drain(run_id, rank))
    """

    def __init__(
        self,
        namespace: str,
        rank: int,
        world_size: int,
        *,
        host: str | None = None,
        port: int | None = None,
        timeout: float = 30.0,
    ) -> None:
        require_store_queues()
        super().__init__(namespace, rank, world_size, host=host, port=port, timeout=timeout)

    def _init_state(self) -> None:
        super()._init_state()
        #: the rank that receives this rank's rows (or, on it, from `senders`): rank 0 until `route`
        self.writer = 0
        self.senders: tuple[int, ...] = tuple(range(1, self.world_size)) if self.rank == 0 else ()
        self._failed: str | None = None
        # sender side: items are numbered from `_base` (the ack counter when we first connected)
        self._base = 0
        self._sent = 0
        self._inflight: deque[tuple[int, pa.RecordBatch, float]] = deque()
        # receiver side (rank 0), per sending rank
        self._taken: dict[int, int] = {}
        self._to_ack: dict[int, int] = {}
        # payloads popped from the store, not yet returned by `receive`: a take given up on (its
        # store stopped answering) still lands what it pops here, for the next `receive`; one a
        # `peek` read is kept decoded (a batch), so `receive` does not decode it again
        self._popped: deque[tuple[int, bytes | pa.RecordBatch]] = deque()
        self._side_popped: deque[bytes] = deque()
        self._taking = threading.Lock()  # held while a take runs, also one given up on
        self._done_totals: dict[int, tuple[int, str]] = {}
        #: payloads `receive` could not read (and dropped), in all and per sending rank
        self.damaged_batches = 0
        self.damaged_from: dict[int, int] = {}

    def __repr__(self) -> str:
        return f"RowChannel({self.namespace!r}, rank={self.rank}, world_size={self.world_size})"

    def _starting_state(self, store: Any) -> Callable[[], None]:
        if self.receives:
            taken = {r: store.add(f"ack/{r}", 0) for r in self.senders}

            def start() -> None:
                self._taken = taken
                self._to_ack = dict.fromkeys(taken, 0)

            return start
        base = store.add(f"ack/{self.rank}", 0)

        def start_sender() -> None:
            self._base = base

        return start_sender

    # -- sending (rank != 0) -----------------------------------------------------------

    def send(self, batch: pa.RecordBatch) -> None:
        """Queue `batch` for rank 0. Costs a round trip to the store per 64k rows, no waiting.

        The batch is kept until rank 0 acknowledges it, so that none is lost unseen.

        Raises:
            ChannelError: when rank 0 is gone or has taken nothing for `timeout` seconds;
                ``exc.undelivered`` holds every batch not acknowledged (this one included).
                Once failed, the channel fails at once on every later call.
        """
        if self.receives:
            raise ValueError(f"rank {self.rank} writes its own rows; RowChannel.send is for the ranks that send")
        if len(batch) == 0:
            return
        with self._lock:
            if self._failed is not None:
                raise ChannelError(self._failed, [batch])
            now = time.monotonic()
            first = len(self._inflight)
            for chunk in split_rows(batch):
                # kept before pushing: a push can "succeed" into a dead peer's socket buffer
                self._inflight.append((self._sent, chunk, now))
                self._sent += 1
            try:

                payloads = [encode_batch(self._inflight[i][1]) for i in range(first, len(self._inflight))]

                def push(store: Any) -> int:
                    for payload in payloads:
                        store.queue_push(f"rows/{self.rank}", payload)
                    return self._acked(store)

                self._drop_acked(self._call(push))  # the first call connects, bounded too
            except Exception as exc:
                raise self._fail(f"Rank {self.rank} cannot reach {self._peer} ({exc})") from exc
            oldest = self._inflight[0][2] if self._inflight else now
            if now - oldest > self.timeout:
                raise self._fail(
                    f"Rank {self.writer} has taken no rows from rank {self.rank} for {now - oldest:.0f} s "
                    f"(timeout={self.timeout:g})"
                )

    def _acked(self, store: Any) -> int:
        """How many of this rank's items the receiver acknowledged (read in the bounded call)."""
        return int(store.add(f"ack/{self.rank}", 0)) - self._base

    def _drop_acked(self, acked: int) -> None:
        """Forget the batches acknowledged (by the caller, holding `_lock`: never a call given up on)."""
        while self._inflight and self._inflight[0][0] < acked:
            self._inflight.popleft()

    def _fail(self, reason: str) -> ChannelError:
        self._failed = reason  # the caller says what becomes of the rows (write/sinks.py spills them)
        undelivered = [batch for _, batch, _ in self._inflight]
        self._inflight.clear()
        return ChannelError(self._failed, undelivered)

    def pending(self) -> int:
        """Batches sent and not yet acknowledged by rank 0."""
        return len(self._inflight)

    def unacknowledged_values(self, refresh: bool = True) -> int:
        """Values sent and not yet acknowledged (this sender's memory held for the writer).

        With `refresh`, asks the store for the acknowledgements first (bounded; a store that does
        not answer leaves the count as it was: the next `send` fails the channel).
        """
        with self._lock:
            if refresh and self._failed is None and self._store is not None and self._inflight:
                try:
                    self._drop_acked(self._call(self._acked))
                except Exception:  # noqa: BLE001 - the next send says what is wrong
                    pass
            return sum(len(batch) for _, batch, _ in self._inflight)

    def mark_done(self, status: str) -> None:
        """Tell rank 0 that this rank sends no more rows, and how it ended.

        Raises:
            ChannelError: when rank 0's store is gone (``undelivered`` as for `send`).
        """
        if self.receives:
            raise ValueError(f"rank {self.rank} is the receiver; it does not mark itself done")
        if " " in status:
            raise ValueError(f"status must be one word, got {status!r}")
        with self._lock:
            if self._failed is not None:
                raise ChannelError(self._failed)
            try:
                self._call(lambda store: store.set(f"done/{self.rank}", f"{self._base + self._sent} {status}"))
            except Exception as exc:  # a ChannelError too (no connection): the batches in flight go with it
                raise self._fail(f"Rank {self.rank} cannot reach {self._peer} ({exc})") from exc

    def wait_delivered(self, timeout: float) -> list[pa.RecordBatch]:
        """Wait up to `timeout` s for rank 0 to acknowledge every batch sent.

        Returns:
            The batches still unacknowledged (to spill); empty when all were delivered.
        """
        deadline = time.monotonic() + timeout
        delay = _POLL_S
        while True:
            with self._lock:
                if self._failed is not None or not self._inflight:
                    return []  # a failure already handed its batches to the caller
                try:
                    self._drop_acked(self._call(self._acked))
                except Exception as exc:
                    return self._fail(f"Rank {self.rank} lost {self._peer} ({exc})").undelivered
                if not self._inflight:
                    return []
                if time.monotonic() >= deadline:
                    return self._fail(f"Rank {self.writer} did not acknowledge rank {self.rank}'s last rows in {timeout:g} s").undelivered
            # backing off: hundreds of senders finishing at once must not flood rank 0's TCPStore
            time.sleep(delay)
            delay = min(delay * 1.5, _POLL_MAX_S)

    # -- receiving (rank 0) ------------------------------------------------------------

    def receive(self) -> list[pa.RecordBatch]:
        """Every batch the other ranks sent since the last call, in each rank's order. Never blocks.

        Calling again acknowledges what the previous call returned: call it once the previous
        batches are written (or at least owned by the writer). A payload that is not a whole
        row batch (cut short, damaged) is logged as an error, counted in `damaged_batches`
        and skipped: the batches after it still arrive.

        Raises:
            ChannelError: when the store cannot be reached.
        """
        self._require_rank0("receive")
        if not self.senders:
            return []
        out: list[pa.RecordBatch] = []
        with self._lock:
            try:
                self._take_rows()
            except ChannelError:
                raise
            except Exception as exc:
                raise ChannelError(f"Rank 0 cannot read rows from the TCPStore: {exc}") from exc
            while self._popped:
                r, payload = self._popped.popleft()
                self._taken[r] = self._taken.get(r, 0) + 1
                self._to_ack[r] = self._to_ack.get(r, 0) + 1
                if isinstance(payload, pa.RecordBatch):  # a `peek` decoded it
                    out.append(payload)
                    continue
                try:
                    out.append(decode_batch(payload))
                except ValueError as exc:
                    self.damaged_batches += 1
                    self.damaged_from[r] = self.damaged_from.get(r, 0) + 1
                    log.error("multirank_logger: rank 0 dropped a row batch from rank %d that it cannot "
                              "read (%d bytes): %s", r, len(payload), exc)
        return out

    def peek(self) -> list[pa.RecordBatch]:
        """Rank 0: the batches the other ranks sent since the last `peek` or `receive`, to look at
        now (rank 0's watch: watch/watch.py) rather than at the writer's next cycle. Never blocks.

        Nothing is acknowledged: the batches stay the channel's until `receive` returns them to the
        writer, and are acknowledged at the `receive` after that, as any batch; a rank 0 gone
        meanwhile leaves them with their senders, which spill them. A payload that is not a whole
        batch is left for `receive` to count and say.

        Raises:
            ChannelError: when the store cannot be reached.
        """
        self._require_rank0("peek")
        if not self.senders:
            return []
        out: list[pa.RecordBatch] = []
        with self._lock:
            try:
                self._take_rows(acknowledge=False)
            except ChannelError:
                raise
            except Exception as exc:
                raise ChannelError(f"Rank 0 cannot read rows from the TCPStore: {exc}") from exc
            # by index: a take given up on may still append behind (never before) the ones read here
            for i in range(len(self._popped)):
                r, payload = self._popped[i]
                if isinstance(payload, pa.RecordBatch):
                    continue  # an earlier peek's
                try:
                    batch = decode_batch(payload)
                except ValueError:
                    continue
                self._popped[i] = (r, batch)
                out.append(batch)
        return out

    def _take_rows(self, acknowledge: bool = True) -> None:
        """Acknowledge what the last `receive` returned (unless not to `acknowledge`: a `peek`); pop
        every rank's queued payloads into `_popped`.

        A take given up on (the store stopped answering) goes on in its helper thread when the
        store answers again: the acknowledgements it holds reach the store once, what it pops
        reaches `_popped`, and no other take starts meanwhile (each rank's order kept).
        """
        if not self._taking.acquire(blocking=False):
            return
        try:
            self._client()  # connected (bounded) before any acknowledgement leaves `_to_ack`
        except BaseException:
            self._taking.release()
            raise
        acks = {r: n for r, n in self._to_ack.items() if n and acknowledge}
        for r in acks:
            self._to_ack[r] = 0

        def take(store: Any) -> None:
            try:
                for r, n in list(acks.items()):
                    store.add(f"ack/{r}", n)
                    del acks[r]
                for r in self.senders:
                    self._popped.extend((r, payload) for payload in pop_all(store, f"rows/{r}"))
            finally:
                self._taking.release()

        try:
            self._call(take)
        except TimeoutError:
            raise  # `take` still holds its acknowledgements, and sends them when the store answers
        except BaseException:
            for r, n in acks.items():  # not sent: the next take sends them
                self._to_ack[r] += n
            raise

    # -- side-table rows (decisions, logs, step timing) --------------------------------------
    # A queue of their own, without the acknowledgements the metrics get: they are few, and a
    # sender whose rank 0 is gone says how many it could not deliver (write/sinks.py).

    def send_side(self, payload: bytes) -> None:
        """Queue one encoded set of side rows (`rows.side_records.encode_side`) for rank 0.

        Raises:
            ChannelError: when rank 0's store cannot be reached.
        """
        if self.receives:
            raise ValueError(f"rank {self.rank} writes its own side rows; RowChannel.send_side is for the ranks that send")
        with self._lock:
            if self._failed is not None:
                raise ChannelError(self._failed)
            try:
                self._call(lambda store: store.queue_push(f"side/{self.rank}", payload))
            except Exception as exc:
                raise ChannelError(f"Rank {self.rank} cannot reach {self._peer} ({exc})") from exc

    def receive_side(self) -> list[bytes]:
        """Rank 0: every side payload the other ranks queued since the last call. Never blocks."""
        self._require_rank0("receive_side")
        if not self.senders:
            return []
        out: list[bytes] = []
        with self._lock:
            try:

                def take_side(store: Any) -> None:
                    # into `_side_popped`: a call given up on still hands what it pops to the next one
                    self._side_popped.extend(bytes(p) for r in self.senders for p in pop_all(store, f"side/{r}"))

                self._call(take_side)
            except Exception as exc:
                raise ChannelError(f"Rank 0 cannot read side rows from the TCPStore: {exc}") from exc
            while self._side_popped:
                out.append(self._side_popped.popleft())
        return out

    def _send_acks(self, store: Any) -> None:
        for r, n in self._to_ack.items():
            if n:
                self._to_ack[r] = 0
                store.add(f"ack/{r}", n)

    def done_ranks(self) -> dict[int, str]:
        """Ranks that called `mark_done` and whose every row `receive` has returned, with status.

        Raises:
            ChannelError: when the store cannot be reached.
        """
        self._require_rank0("done_ranks")
        out: dict[int, str] = {}
        with self._lock:
            try:

                def read_done(store: Any) -> None:
                    for r in self.senders:
                        if r not in self._done_totals and store.check([f"done/{r}"]):
                            count, _, status = bytes(store.get(f"done/{r}")).decode().partition(" ")
                            self._done_totals[r] = (int(count), status)

                self._call(read_done)
            except Exception as exc:
                raise ChannelError(f"Rank 0 cannot read the ranks' status from the TCPStore: {exc}") from exc
            for r, (total, status) in self._done_totals.items():
                if self._taken.get(r, 0) >= total:
                    out[r] = status
        return out

    def close(self) -> None:
        """Acknowledge what rank 0 took, and drop the connection (and a node writer's own store,
        `NodeRoutes.let_go`). Best effort: never raises."""
        with self._lock:
            store, self._store = self._store, None
            try:
                if store is not None and self.receives:
                    bounded(lambda: self._send_acks(store), self.timeout)  # a stopped store must not hang the exit
            except Exception:
                pass  # the store is gone with its host; nothing left to tell anyone
            self._let_go(store, list(self._done_totals))
