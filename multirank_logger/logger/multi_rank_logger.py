"""MultiRankLogger: the Lightning front-end, `MultiRankLoggerCore` (core.py) as Lightning's ``Logger``.

Everything a rank does (the hot path, the run, its end) is the core's; this class adds what
only Lightning asks of a logger: to be an instance of its ``Logger`` (and ``CSVLogger``, for
Trainer.log_dir) in every Lightning package imported, ``log_graph`` (a model's device mesh) and
Lightning's do-nothing experiment on ranks other than 0.
"""

from __future__ import annotations

from typing import Any

from lightning.fabric.loggers.logger import _DummyExperiment
from lightning.pytorch.loggers.logger import Logger
from typing_extensions import override

from multirank_logger._util import lightning_compat
from multirank_logger.logger.core import MultiRankLoggerCore

__all__ = ["MultiRankLogger"]


class MultiRankLogger(MultiRankLoggerCore, Logger):
    r"""Record every rank's own metrics from Lightning (or Fabric) into one SQL store.

    Laid out like `CSVLogger` (``save_dir/name/version_N``), so checkpoints land where they
    would with it; rank 0 also writes the ``metrics.csv`` (as the run goes, live_csv.py) and
    ``hparams.yaml`` that `CSVLogger` would have written.

    The first five parameters are CSVLogger's, in its order: ``CSVLogger("logs")`` becomes
    ``MultiRankLogger("logs")``.

    Args:
        save_dir: where ``name/version_N`` lives (local, or any fsspec URL such as ``s3://...``,
            as with CSVLogger); defaults to the db file's directory (the working directory for a
            server URL).
        name: experiment name; ``None`` means ``""``, as in CSVLogger.
        version: version number within `name`, or a str for a named version (its directory is
            the str itself, as in CSVLogger); ``None`` takes the next version free both in the
            store and on disk (a ``version_N`` of another logger is never reused).
        prefix: a string put before every metric key (joined with ``"-"``).
        flush_logs_every_n_steps: pending log calls that make the writer flush early (and write
            rank 0's ``metrics.csv``, as CSVLogger does every that many steps); a DuckDB store,
            which each write opens, is written once per ``flush_interval`` or at
            ``writer_thread.SELDOM_MAX_CALLS`` pending calls instead.
        db: the store: a path ending in ``.duckdb``, ``.db``, ``.sqlite``, ``.sqlite3``, or a
            SQLAlchemy URL. Created at the current schema when missing. None: the environment's
            ``MULTIRANK_LOGGER_DB`` when set (a URL with a password kept out of the arguments
            LightningCLI saves, see docs/configuration.md), else ``save_dir/runs.sqlite``: SQLite never blocks a reader and lets every rank of a node
            write (see the README). A local file or a server: never a remote filesystem.
        flush_interval: seconds between two flushes of the background writer.
        transport: ``"direct"`` (every rank writes the store), ``"gather"`` (rank 0 writes,
            the others ship their rows to it), ``"node"`` (a server store: one writer per node,
            which the node's ranks ship their rows to) or ``"auto"`` (gather for DuckDB with
            several ranks; for PostgreSQL, direct while the server has connections free for
            every rank, else node; direct otherwise). See docs/scale.md.
        max_writers: the most processes that write a server store at once (``"auto"`` and
            ``"node"``); None: as many as half its free connections allow, at most one per node.
        export_csv: rank 0 writes ``metrics.csv`` into `log_dir` as the run goes (and leaves it
            after a failure) and ``hparams.yaml`` when hyperparameters are logged, as CSVLogger does.
        timeout: the longest any wait on another rank or on a busy store lasts, in seconds
            (each wait, and the ones named below: docs/configuration.md#waits).
        spill_dir: where a rank that cannot deliver its rows to rank 0 (gather transport, rank 0
            gone) writes them, for ``multirank-logger import``; defaults to the db file's
            directory (the working directory for a server URL), as seen by that rank.
        capture_logs: keep every rank's `logging` records at or above this level (a name or
            number; ``True`` is INFO) and its `warnings` in the store's ``logs`` table, from
            construction to `finalize`; ``False`` or ``None`` keeps none. On by default: a
            record costs an append in memory, off the metrics path, and the console shows
            what it showed before (see log_capture.py).
        resume: whether an existing run (the `version` or `run_key` given) is continued as a
            new attempt: ``"allow"`` (default), ``"must"`` (it must exist; with neither given,
            the latest run of `name`) or ``"never"``. See run_lifecycle.py.
        run_key: your key for the run, e.g. the scheduler's job id: a launch with the same
            key and name continues that run, so a requeue needs no version bookkeeping.
        finalize_timeout: the longest `finalize` lasts, in seconds; past it (a store that stopped
            answering) what is unwritten goes to the spill file. Default: ``2 * timeout + 30``.
        start_timeout: the longest a rank other than 0 waits for rank 0 to open the run (ranks a
            scheduler starts minutes apart), in seconds. Default: ``2 * timeout + 30`` (rank 0's
            own open may wait `timeout` on a busy store, after its start-up).
        watch: rank 0 judges the steps as they arrive, with the report's judgement, and raises
            each new finding once as an alert: a rank's first NaN/inf of a key, a rank departing
            persistently from the others, a straggler or a memory peak (with ``StepTimer``).
            An alert is a line on rank 0's console, a row of the ``alerts`` table, and goes to
            `on_alert` and `alert_url`. ``False`` turns it off. See docs/report.md#alerts-during-the-run.
        on_alert: called with each `Alert` on rank 0's watch thread (its exceptions are caught
            and said, never raised into training).
        alert_url: a webhook (Slack, Mattermost): each alert is POSTed as JSON with a ``text``
            field, off the training thread, with a bounded timeout and retries; no redirect is
            followed, and the alerts it did not take are counted and said at the run's end. The
            URL is never shown or stored (only its scheme and host, in a failure's message).
            None: the environment's ``MULTIRANK_LOGGER_ALERT_URL`` when set.
        mesh: the device mesh the run trains on (``torch.distributed.device_mesh.init_device_mesh``,
            a strategy's ``device_mesh``): each rank's coordinates in it are stored (``ranks.mesh``),
            and a verdict that names every rank of a group says so ("every rank of tp group 1").
            None: the mesh torch has entered (``with mesh:``), if any.

    Raises:
        StoreError: when the store cannot be written (checked at construction); RemoteStore for
            a db on a remote filesystem.

    Example::

        from lightning.pytorch import Trainer
        from multirank_logger import MultiRankLogger

        logger = MultiRankLogger("logs", name="my_model")  # the store: logs/runs.sqlite
        trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=logger)
    """

    _idle_experiment = _DummyExperiment
    _version_advice = "Read MultiRankLogger.version after fit starts"

    def _built(self) -> None:
        lightning_compat.adopt(MultiRankLogger, *LIGHTNING_BASES)  # pytorch_lightning imported since

    @override
    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """No graph is stored. A model on a device mesh gives this rank's coordinates in it:
        Lightning's ModelParallelStrategy builds its mesh after this logger registered the rank
        and hands the module here (``_log_hyperparams``, after the strategy's set-up); they are
        recorded with the rank's end. A ``mesh=`` given to the logger wins."""
        from multirank_logger.channel.rank_facts import given_mesh, use_mesh

        mesh = getattr(model, "_device_mesh", None)  # LightningModule.device_mesh, without its error when unset
        if mesh is None:
            return
        given = given_mesh()
        if given is None:
            use_mesh(mesh)
        elif given is not mesh:  # a mesh= given to a logger wins
            return
        # the mesh is the process's, the place each logger's: with Trainer(logger=[a, b]) the second
        # finds the mesh already recorded by the first, and its rank row still needs the coordinates
        self._run.sink_holder.place_moved()


#: the Lightning classes the logger is an instance of, in both packages (_util/lightning_compat.py).
#: CSVLogger: Trainer.log_dir asks isinstance(loggers[0], (TensorBoardLogger, CSVLogger)) to decide
#: whether the first logger has a per-version log_dir, and falls back to save_dir otherwise (so
#: LightningCLI would write config.yaml into save_dir and refuse a 2nd run). Ours has CSVLogger's
#: layout: it says so to that check, without inheriting CSVLogger's file writing.
LIGHTNING_BASES = (("loggers", "Logger"), ("loggers", "CSVLogger"))
lightning_compat.adopt(MultiRankLogger, *LIGHTNING_BASES)
