"""Exceptions raised by multirank_logger, each building its own message.

Every message says what was found, what was expected, and what to do next.

MultiRankLoggerError
 ├── StoreError                  the store cannot be used as it is
 │    ├── UnsupportedStore       a db path or URL of a kind we do not write
 │    │    └── RemoteStore       a db on a remote filesystem (s3://, memory://...)
 │    ├── StoreNotWritable       the db's directory cannot be written
 │    │    └── NotAStoreFile     the db path names a directory, a FIFO, a device: no file a store can be
 │    ├── StoreUnreachable       the database server cannot be reached (its URL's password left out)
 │    ├── WalNotReadable         a SQLite log that only a reader who can write its directory reads
 │    ├── NotADatabase           the file exists but is not a database of its kind
 │    ├── DamagedStore           a database of its kind, but damaged: refused before any write
 │    ├── ForeignStore           another application's database: refused before any write
 │    ├── StoreLocked            another process holds a DuckDB file open for writing
 │    ├── SchemaOutdated         the store is behind the code: run `db upgrade`
 │    ├── SchemaTooNew           the store was written by a newer multirank_logger
 │    ├── ReadOnlyViolation      a write statement sent through the read-only query path
 │    └── StoreGone              the store's file was deleted or replaced during the run
 ├── DirNotWritable              save_dir or spill_dir cannot be written
 ├── ExportFailed                an export's destination cannot be written (its URL's secrets left out)
 ├── LookupFailed                a run or a key that the store does not hold
 ├── QueryFailed                 the database engine rejected a query (its message kept)
 │    ├── QueryTimedOut          a user's query ran past its timeout and was stopped
 │    └── ReadsStopped           a reader's queries were stopped (Ctrl-C, a page request's bound)
 ├── InvalidMetric               a log call the store cannot hold (value, key or step)
 ├── InvalidTransport            a transport= the logger does not know (also a ValueError)
 ├── InvalidHostName             a host name to allow (ui --allow-host) that is no host name (also a ValueError)
 ├── MissingExtra                an optional dependency (an extra) is not installed
 ├── NoMultiRankLogger           DecisionAudit in a Trainer that logs to no MultiRankLogger
 ├── RunIdentityMismatch         a rank's store holds another run than rank 0 announced
 ├── ResumeRefused               resume= asked for a run that cannot be resumed
 ├── IdentityTimeout             rank 0 never published the run identity in time
 ├── SpillCorrupt                a spill file that cannot be read
 ├── SpillsDamaged               spill files imported but for their damaged frames
 ├── SpillOfAnotherRun           a spill file of a run other than the store's run of that name
 └── ChannelError                the channel to rank 0 cannot be used
      └── ChannelTimeout         a bounded wait on the channel ran out
GatherMismatch (ValueError)      all_gather's ranks passed tensors that cannot be gathered together
TorchTooOld (ImportError)        the installed torch lacks the TCPStore queues the channel needs
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = [
    "ChannelError",
    "ChannelTimeout",
    "DamagedStore",
    "DirNotWritable",
    "ExportFailed",
    "ForeignStore",
    "GatherMismatch",
    "IdentityTimeout",
    "InvalidHostName",
    "InvalidMetric",
    "InvalidTransport",
    "LookupFailed",
    "MissingExtra",
    "MultiRankLoggerError",
    "NoMultiRankLogger",
    "NotADatabase",
    "NotAStoreFile",
    "ProcessGroupFirst",
    "QueryFailed",
    "QueryTimedOut",
    "ReadsStopped",
    "ReadOnlyViolation",
    "RemoteStore",
    "ResumeRefused",
    "RunFinished",
    "RunIdentityMismatch",
    "SchemaOutdated",
    "SchemaTooNew",
    "SpillCorrupt",
    "SpillsDamaged",
    "SpillOfAnotherRun",
    "StoreError",
    "StoreGone",
    "StoreLocked",
    "StoreNotWritable",
    "StoreUnreachable",
    "TorchTooOld",
    "UnsupportedStore",
    "WalNotReadable",
]


class MultiRankLoggerError(Exception):
    """Base class of every error this library raises on purpose."""


class StoreError(MultiRankLoggerError):
    """The store cannot be opened or used as it is."""


class UnsupportedStore(StoreError):
    def __init__(self, db: str, choices: Iterable[str]) -> None:
        self.db = db
        super().__init__(
            f"Cannot tell which database {db!r} is. Use a path ending in one of "
            f"{', '.join(choices)}, or a SQLAlchemy URL (sqlite:///..., duckdb:///..., "
            "postgresql+psycopg://...)."
        )


class RemoteStore(UnsupportedStore):
    def __init__(self, db: str, protocol: str, save_dir: str | None = None) -> None:
        self.db = db
        where = f"save_dir={save_dir!r} is on a remote filesystem ({protocol}), so the default store inside it " \
            "cannot be used" if save_dir is not None else f"db={db!r} is on a remote filesystem ({protocol})"
        StoreError.__init__(
            self,
            f"{where}: the store is a local file or a database server. Keep save_dir remote (metrics.csv, "
            "hparams.yaml and checkpoints go there through fsspec) and pass db= a local path, e.g. "
            "db='runs.sqlite', or a postgresql:// URL.",
        )


class StoreNotWritable(StoreError):
    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        super().__init__(
            f"Cannot write the store at {path}: {reason}. "
            "Pass a db path in a directory you can write to."
        )


class NotAStoreFile(StoreNotWritable):
    def __init__(self, path: str, what: str, example: str) -> None:
        self.path = path
        StoreError.__init__(
            self,
            f"{path} is {what}, not a store file: a store is a regular file (or a server's URL). "
            f"Pass the path of a store file, e.g. {example}.",
        )


class StoreUnreachable(StoreError):
    def __init__(self, db: str, reason: str) -> None:
        self.db = db
        super().__init__(f"Cannot connect to the store {db}: {reason}. Check that its server runs and that the URL's "
                         "host, port, user and database are right (a password: in the URL, PGPASSWORD or ~/.pgpass).")


class WalNotReadable(StoreError):
    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"Cannot read {path} from here: its write-ahead log ({path}-wal) holds rows not yet in the file, "
            f"and SQLite reads it only through {path}-shm, which it must create in that directory, and this "
            "process cannot write there (a read-only mount, another user's folder). Copy the store with its log "
            f"to a directory you can write and read the copy (cp {path} {path}-wal DIR/), or ask the store's "
            "owner to open it once, which folds the log into the file."
        )


class DirNotWritable(MultiRankLoggerError):
    def __init__(self, argument: str, path: str, use: str, reason: str) -> None:
        self.path = path
        super().__init__(
            f"Cannot write {argument}={path!r} ({use}): {reason}. Pass a {argument} in a directory you can write to."
        )


class ExportFailed(MultiRankLoggerError):
    def __init__(self, destination: str, reason: str, todo: str) -> None:
        self.destination = destination
        super().__init__(f"Cannot export to {destination}: {reason}. {todo}")


class NotADatabase(StoreError):
    def __init__(self, path: str, backend: str, detail: str) -> None:
        self.path = path
        super().__init__(
            f"{path} exists but is not a {backend} database ({detail}). "
            "It was left untouched; pass another db path, or move the file away."
        )


class DamagedStore(StoreError):
    def __init__(self, path: str, backend: str, detail: str) -> None:
        self.path = path
        super().__init__(
            f"{path} is a {backend} database, but damaged ({detail}). It was left untouched: nothing is "
            "written to a damaged store. Log this run to another file; restore the damaged one from a backup."
        )


class ForeignStore(StoreError):
    def __init__(self, path: str, found: str, advice: str) -> None:
        self.path = path
        super().__init__(
            f"{path} is not a multirank_logger store: it holds {found}. It was left untouched. {advice}"
        )


class StoreLocked(StoreError):
    _DUCKDB_HINT = (
        "DuckDB allows one writing process per file: wait for that process to finish, or log this "
        "run to another file."
    )

    def __init__(self, path: str, detail: str, hint: str = _DUCKDB_HINT) -> None:
        self.path = path
        super().__init__(f"{path} is open for writing in another process ({detail}). {hint}")


class SchemaOutdated(StoreError):
    def __init__(self, url: str, found: str, head: str, version: str) -> None:
        self.found, self.head = found, head
        super().__init__(
            f"Store {url} is at schema {found}; multirank_logger {version} needs {head}.\n"
            f"Back up the file, then run: multirank-logger db upgrade {url}"
        )


class SchemaTooNew(StoreError):
    def __init__(self, url: str, found: str, version: str) -> None:
        self.found = found
        super().__init__(
            f"Store {url} is at schema {found}, which multirank_logger {version} does not know: "
            "it was written by a newer version. Upgrade the package (from an up-to-date clone: pip install -U ./multirank-logger)"
        )


class ReadOnlyViolation(StoreError):
    def __init__(self, statement: str) -> None:
        super().__init__(
            f"Refused: the query path is read-only, and this statement would change the store: "
            f"{statement.strip()[:200]!r}. Use a SELECT (or WITH ... SELECT) query."
        )


class LookupFailed(MultiRankLoggerError):
    def __init__(self, what: str, wanted: str, available: Iterable[str]) -> None:
        names = sorted(str(a) for a in available)
        listing = ", ".join(names) if names else "(none)"
        super().__init__(f"No {what} {wanted!r} in this store. Available: {listing}")


class QueryFailed(MultiRankLoggerError):
    def __init__(self, engine: str, detail: str) -> None:
        self.detail = detail
        super().__init__(f"{engine} rejected the query: {detail.strip()}")


class QueryTimedOut(QueryFailed):
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        MultiRankLoggerError.__init__(
            self,
            f"The query ran past its timeout of {timeout_s:g} s and was stopped; the store is unchanged. "
            "Pass a larger --timeout, or narrow the query (WHERE run_id = ..., key = ...).",
        )


class ReadsStopped(QueryFailed):
    """A reader's queries were stopped from another thread (``StoreReader.interrupt``); ``reason``
    says why and what to do: the message as it is."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        MultiRankLoggerError.__init__(self, reason)


class InvalidMetric(MultiRankLoggerError, ValueError):
    """A log call the store cannot hold, refused whole at the call (nothing of it is recorded).

    ``problem`` says what is wrong when it is not the value: ``"step"`` (``value`` is the step,
    ``key`` the call's keys), ``"surrogate:POS"``, ``"nul:POS"`` or ``"long:BYTES"`` (the key).
    """

    def __init__(self, key: str, value: object, step: object = None, *, problem: str | None = None) -> None:
        self.key = key
        self.step = step
        at = "" if step is None else f" (logged at step {step!r})"
        kind, _, where = (problem or "").partition(":")
        if kind == "step":
            message = (
                f"Step {value!r} of the call logging {key} is not a whole number of the store's 64-bit step "
                f"column (-2**63 to 2**63-1); nothing of this call was recorded. Pass an int step (e.g. "
                "trainer.global_step); a float is taken only when it is whole (3.0)."
            )
        elif kind == "surrogate":
            message = (
                f"Metric key {key!r}{at} holds a lone surrogate at position {where}, which is not UTF-8 text "
                "(os.listdir and sys.argv give these for file names that are not UTF-8); nothing of this call "
                "was recorded. Clean the key first, e.g. "
                "key.encode('utf-8', 'surrogateescape').decode('utf-8', 'replace')."
            )
        elif kind == "nul":
            message = (
                f"Metric key {key!r}{at} holds a NUL character at position {where}, which PostgreSQL's text "
                "refuses and CSV readers stop at; nothing of this call was recorded. Drop or replace it."
            )
        elif kind == "long":
            message = (
                f"Metric key {key[:40]!r}...{at} is {where} bytes of UTF-8, longer than the 1024 a store's "
                "key index holds; nothing of this call was recorded. Log it under a shorter name."
            )
        elif type(value) is int:  # a number, but past what a float64 column holds
            message = (
                f"Metric {key!r}{at} is an int of {value.bit_length()} bits, too large for the store's "
                "64-bit float values (about 1.8e308 at most). Log it scaled, or as a float ratio."
            )
        else:
            shown = type(value).__name__
            shape = getattr(value, "shape", None)
            if shape is not None:
                shown += f" of shape {tuple(shape)}"
            message = (
                f"Metric {key!r}{at} is a {shown}; loggers store one number per key. "
                "Log a scalar (a Python number or a one-element tensor), e.g. reduce it with .mean()."
            )
        super().__init__(message)


class MissingExtra(MultiRankLoggerError, ImportError):
    def __init__(self, feature: str, package: str, extra: str) -> None:
        self.package = package
        super().__init__(
            f"{feature} need {package}, which is not installed. "
            f"Install it with: pip install {package} (the package's [{extra}] extra; from a clone: "
            f"pip install './multirank-logger[{extra}]')"
        )


class NoMultiRankLogger(MultiRankLoggerError):
    def __init__(self, loggers: Iterable[str]) -> None:
        found = ", ".join(loggers) or "none"
        super().__init__(
            f"DecisionAudit records into the Trainer's MultiRankLogger, and this Trainer has none (loggers: {found}). "
            "Add one: Trainer(logger=MultiRankLogger(db=...), callbacks=[..., DecisionAudit()])."
        )


class InvalidTransport(MultiRankLoggerError, ValueError):
    def __init__(self, requested: object, choices: tuple[str, ...], detail: str = "") -> None:
        super().__init__(
            detail
            or f"transport={requested!r} is not one of {', '.join(map(repr, choices))}. "
            "Use 'auto' (the default) to let the logger choose, 'direct' for every rank to write "
            "the store, or 'gather' for rank 0 alone to write it."
        )


class InvalidHostName(MultiRankLoggerError, ValueError):
    def __init__(self, value: str, suggestion: str | None) -> None:
        self.value = value
        instead = f": pass {suggestion}" if suggestion else ": pass a name such as tunnel.example.com"
        super().__init__(f"--allow-host {value!r} is not a host name (a name or an address, with a port or without: "
                         f"no scheme, path or user){instead}.")


class IdentityTimeout(MultiRankLoggerError):
    def __init__(self, rank: int, seconds: float, what: str) -> None:
        super().__init__(
            f"Rank {rank} waited {seconds:.0f} s for rank 0 to publish the run identity of {what}. "
            "Check that rank 0 is alive and builds the same MultiRankLogger (same db and name, "
            "created in the same order), or raise the logger's start_timeout (it starts late)."
        )


class RunIdentityMismatch(MultiRankLoggerError):
    def __init__(self, rank: int, expected: str, found: str, db: str) -> None:
        super().__init__(
            f"Rank {rank} was told by rank 0 to write run {expected}, but the store it opened ({db}) holds "
            f"{found}: this rank does not see rank 0's store (another disk, or another file of the same name). "
            "Point db at a filesystem every rank shares, or pass transport='gather' so only rank 0 writes."
        )


class ResumeRefused(MultiRankLoggerError):
    def __init__(self, message: str) -> None:
        super().__init__(message)


class SpillCorrupt(MultiRankLoggerError):
    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        super().__init__(f"{path} is not a readable spill file ({detail}). It was left untouched; nothing was imported.")


class SpillsDamaged(MultiRankLoggerError):
    def __init__(self, parts: int, values: int, unknown: bool) -> None:
        more = " and an unknown number more" if unknown else ""
        super().__init__(
            f"{parts} part(s) of the spill files did not read (above): {values} value(s){more} were not imported; "
            "every intact frame was. Those values stay counted as spilled, so the run stays incomplete. If a rank was "
            "still writing its file, or an intact copy exists, import it again: only the frames the store lacks are added."
        )


class SpillOfAnotherRun(MultiRankLoggerError):
    def __init__(self, path: str, spilled: str, stored: str, db: str) -> None:
        self.path = path
        super().__init__(
            f"{path} holds rows of run {spilled}, but {db} holds another run of that name and version: "
            f"{stored}. Nothing was imported. Import the file into the store its run was logged to, "
            "or into a new store file, where the run is recreated: create it first with `multirank-logger db "
            "upgrade NEW_DB`, then `multirank-logger import NEW_DB FILE...`."
        )


class TorchTooOld(ImportError):
    def __init__(self, found: str, missing: list[str], floor: str) -> None:
        super().__init__(
            f"multirank_logger needs torch>={floor}: its rank-to-rank channel uses the TCPStore "
            f"queues ({', '.join(missing)} missing in torch {found}). Upgrade: pip install 'torch>={floor}'"
        )


class ChannelError(MultiRankLoggerError):
    """The channel to rank 0 cannot be used.

    Attributes:
        undelivered: batches that may not have reached rank 0's store; the caller spills them
            (``spill.SpillWriter``). Each batch is handed out once: a later error carries only
            the batches given to that later call.
    """

    def __init__(self, message: str, undelivered: list[Any] | None = None) -> None:
        self.undelivered: list[Any] = list(undelivered or [])
        super().__init__(message)


class ChannelTimeout(ChannelError):
    """A bounded wait on the channel ran out (``fetch``, ``wait_delivered``)."""


class GatherMismatch(ValueError):
    """The ranks passed tensors that cannot be gathered together (dtype or number of dimensions)."""


class StoreGone(StoreError):
    """The store's file was deleted or replaced while the run wrote it."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"The store file {path} was deleted or replaced during the run. Rows are kept and retried; put the file back "
            "to have them written, or they go to a spill file at the end."
        )


class RunFinished(MultiRankLoggerError):
    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what}: this run was finished (run.finish(), the end of its `with` block, or the exit). "
            "Call multirank_logger.init(...) again for a new run, or with the same run_key= to continue it."
        )


class ProcessGroupFirst(MultiRankLoggerError):
    def __init__(self, tasks: int) -> None:
        super().__init__(
            f"Slurm started {tasks} tasks and this one knows no rank yet: WORLD_SIZE is not set and the "
            "process group is not up. Call torch.distributed.init_process_group(...) before "
            "multirank_logger.init(...) (or launch with torchrun, or export RANK and WORLD_SIZE). "
            "A single process in a Slurm allocation of several tasks: set WORLD_SIZE=1."
        )
