"""The bounded client of the launch's TCPStore that `RowChannel` is built on.

The TCPStore is the one the launch already runs (``MASTER_ADDR:MASTER_PORT``; it lives in rank
0's process under Lightning's launcher, and in the agent under torchrun). `StoreClient`
connects to it as a client on first use (no new server, no collective), in a PrefixStore so
that our keys never meet torch's, never pickles its socket, and carries the small values
rank 0 publishes (``kv/{key}``). `bounded` bounds the calls that wait for a reply: with rank 0
stopped, no call made through it waits longer than its timeout. Nothing here knows what a row
means: only keys, queues (`pop_all`) and the size of one queue item (`CHUNK_ROWS`, `split_rows`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import pyarrow as pa

from multirank_logger._util.best_effort import bounded as run_bounded
from multirank_logger.errors import ChannelError, ChannelTimeout

__all__ = ["CHUNK_ROWS", "StoreClient", "bounded", "connect", "pop_all", "split_rows"]

#: Rows per queue item: big batches are cut so that one item stays a few MiB.
CHUNK_ROWS = 65_536
T = TypeVar("T")


def connect(namespace: str, rank: int, host: str | None, port: int | None, timeout: float) -> Any:
    """A client of the launch's TCPStore, under the prefix ``multirank_logger/{namespace}/``.

    Args:
        host, port: the TCPStore's address; default to ``$MASTER_ADDR`` and ``$MASTER_PORT``.
        timeout: the client's bound, in seconds, on connecting and on each operation.

    Raises:
        ChannelError: when no address is known or the store cannot be reached.
    """
    import torch.distributed as dist

    host = host or os.environ.get("MASTER_ADDR")
    where: int | str | None = port or os.environ.get("MASTER_PORT")
    if not host or not where:
        raise ChannelError(
            "Cannot reach rank 0: MASTER_ADDR and MASTER_PORT are not set. Run under a DDP "
            "launcher (Lightning, torchrun), or pass host= and port= to RowChannel."
        )
    try:
        # a client of the launch's own store: no new server, no collective
        client = dist.TCPStore(str(host), int(where), None, False, timedelta(seconds=timeout), wait_for_workers=False)
    except Exception as exc:  # DistNetworkError, TimeoutError, RuntimeError
        raise ChannelError(f"Rank {rank} cannot connect to the TCPStore at {host}:{where}: {exc}") from exc
    return dist.PrefixStore(f"multirank_logger/{namespace}/", client)


def bounded(call: Callable[[], T], timeout: float) -> T:
    """`call` (TCPStore operations that wait for a reply), given up after `timeout` (best_effort.bounded).

    A client's own timeout does not cover a server that stopped answering: with rank 0 stopped
    (SIGSTOP, a hung host), `add` and `set` wait forever (seen with torch 2.13), and so would the
    sender's writer and its finalize. The caller fails the channel and never uses that client again.

    Raises:
        TimeoutError: when `call` did not return within `timeout`; else whatever `call` raised.
    """
    return run_bounded(call, timeout, "rank 0's TCPStore")


class StoreClient:
    """One rank's client of the TCPStore under ``multirank_logger/{namespace}/``, connected on first use.

    Args are `RowChannel`'s. Subclasses read what their state starts from in `_starting_state`
    (at the first connection only: a reconnection keeps the state) and set up their
    per-process state in `_init_state` (run again in a process that unpickles one).
    """

    def __init__(
        self, namespace: str, rank: int, world_size: int, *, host: str | None, port: int | None, timeout: float
    ) -> None:
        self.namespace = namespace
        self.rank = rank
        self.world_size = world_size
        self.host = host
        self.port = port
        self.timeout = timeout
        self._init_state()

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._store: Any = None
        self._started = False  # `_starting_state` applied: a reconnection does not apply it again
        #: where the small values (`publish`, `fetch`) go once the rows moved to another store
        #: (`_move_rows`): the launch's, which every rank reaches
        self._launch: StoreClient | None = None

    # ddp_spawn pickles the logger into its workers: never ship a socket, reconnect lazily
    def __getstate__(self) -> dict[str, Any]:
        return {k: self.__dict__[k] for k in ("namespace", "rank", "world_size", "host", "port", "timeout")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_state()

    def _client(self) -> Any:
        """The connected store, connecting on first use (the caller holds `_lock`).

        Raises:
            ChannelError: when the server did not answer within the timeout (a stopped rank 0
                accepts the connection in its kernel and never answers the handshake).
        """
        if self._store is None:
            try:
                self._store = bounded(
                    lambda: connect(self.namespace, self.rank, self.host, self.port, self.timeout), self.timeout + 1.0
                )
            except TimeoutError as exc:
                raise ChannelError(f"Rank {self.rank} could not connect to rank 0's TCPStore: {exc}") from exc
        if not self._started:
            store = self._store
            try:
                start = bounded(lambda: self._starting_state(store), self.timeout)
            except TimeoutError as exc:
                self._store = None
                raise ChannelError(f"Rank {self.rank} could not read its state from rank 0's TCPStore: {exc}") from exc
            # applied here, not in the helper thread: one given up on must not reset the counters later
            if start is not None:
                start()
            self._started = True
        return self._store

    def _call(self, fn: Callable[[Any], T], timeout: float | None = None) -> T:
        """`fn(client)`, bounded (the caller holds `_lock`): a stopped server fails the call instead
        of hanging it. A client given up on is dropped: the next call connects again (bounded)."""
        store = self._client()
        try:
            return bounded(lambda: fn(store), self.timeout if timeout is None else timeout)
        except TimeoutError:
            self._store = None
            raise

    def _move_rows(self, host: str, port: int) -> None:
        """From now on this client's calls go to the store at `host`:`port` (a node writer's own),
        except `publish` and `fetch`, which stay on the store they went to so far (the caller
        holds `_lock`; the counters are read there at the next call)."""
        if self._launch is None:
            self._launch = StoreClient(
                self.namespace, self.rank, self.world_size, host=self.host, port=self.port, timeout=self.timeout
            )
            self._launch._store, self._store = self._store, None  # the connection already open goes with it
        self.host, self.port, self._store, self._started = host, port, None, False

    @property
    def address(self) -> str:
        """Where this client's rows go: ``host:port`` (the launch's store when none was given)."""
        return f"{self.host or os.environ.get('MASTER_ADDR')}:{self.port or os.environ.get('MASTER_PORT')}"

    def _starting_state(self, store: Any) -> Callable[[], None] | None:
        """Read from `store` what this client's counters start from, at its first connection.

        Runs in a bounded helper thread; returns what sets the counters, run by the caller once
        the read returned. A reconnection (after a call timed out) does not call it: the counters
        go on from where they were (read again then, they would renumber what is in flight).
        """
        return None

    # -- small values ------------------------------------------------------------------

    def publish(self, key: str, value: bytes) -> None:
        """Make `value` readable by every rank under `key` (typically from rank 0).

        Raises:
            ChannelError: when the store cannot be reached.
        """
        if self._launch is not None:
            return self._launch.publish(key, value)
        with self._lock:
            try:
                self._call(lambda store: store.set(f"kv/{key}", value))
            except ChannelError:
                raise
            except Exception as exc:
                raise ChannelError(f"Rank {self.rank} could not publish {key!r}: {exc}") from exc

    def fetch(self, key: str, timeout: float) -> bytes:
        """The value published under `key`, waiting up to `timeout` seconds for it.

        Raises:
            ChannelTimeout: when nothing was published under `key` within `timeout`.
            ChannelError: when the store cannot be reached.
        """
        if self._launch is not None:
            return self._launch.fetch(key, timeout)
        return self._fetch_raw(f"kv/{key}", timeout, key)

    def _fetch_raw(self, raw_key: str, timeout: float, key: str) -> bytes:
        """The value under the channel's `raw_key` (`key` in messages), as `fetch` describes."""
        import torch.distributed as dist

        def wait_and_get(store: Any) -> bytes:
            store.wait([raw_key], timedelta(seconds=timeout))
            return bytes(store.get(raw_key))

        try:
            with self._lock:
                store = self._client()
            # the wait itself outside the lock: a sender's writer keeps using the channel meanwhile
            return bounded(lambda: wait_and_get(store), timeout + self.timeout)
        except ChannelError:
            raise
        except dist.DistNetworkError as exc:
            raise ChannelError(f"Rank {self.rank} lost the TCPStore while waiting for {key!r}: {exc}") from exc
        except Exception as exc:
            raise ChannelTimeout(
                f"Rank {self.rank} waited {timeout:g} s for {key!r} from rank 0 and it never came. "
                f"Check that rank 0 is alive and that every rank uses namespace {self.namespace!r}."
            ) from exc

    def _has(self, key: str) -> bool:
        """Whether `key` is set now (False when the store cannot be asked)."""
        try:
            with self._lock:
                store = self._client()
            return bool(bounded(lambda: store.check([key]), self.timeout))
        except Exception:  # noqa: BLE001 - the store gone: nothing there to read
            return False


def pop_all(store: Any, queue: str) -> Iterator[bytes]:
    """The items in `queue` when called, oldest first, each removed from the store as it is taken."""
    import torch.distributed as dist

    for _ in range(store.queue_len(queue)):
        try:
            yield store.queue_pop(queue, False)
        except dist.QueueEmptyError:
            return


def split_rows(batch: pa.RecordBatch) -> list[pa.RecordBatch]:
    """`batch` cut into queue items of at most `CHUNK_ROWS` rows (views: the wire writes each one's rows)."""
    if len(batch) <= CHUNK_ROWS:
        return [batch]
    return [batch.slice(i, CHUNK_ROWS) for i in range(0, len(batch), CHUNK_ROWS)]
