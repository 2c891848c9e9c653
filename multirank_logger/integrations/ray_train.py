"""Ray Train: `MultiRankRayCallback` stores every worker's reported dict under its rank.

Ray Train v2 (the default since Ray 2.50; ``RAY_TRAIN_V2_ENABLED``) calls a ``UserCallback``'s
``after_report(run_context, metrics, checkpoint)`` on the controller with worker i's dict at
``metrics[i]``; v1 keeps only rank 0's. So this is a v2 ``UserCallback``: one process (the
controller) writes every worker's rows straight into the store (no logger on the workers, no
transport). One store run per Ray Train run. Its end: ``after_controller_finish`` (a
``ControllerCallback``: UserCallback has no end hook in Ray 2.60), ``failed`` when the result
carries an error, else ``success``; ``after_exception`` marks the ranks that raised.

The watch (watch/watch.py) runs on the controller too, as on a Lightning run's rank 0: it is
handed each report's rows as they are written, so an alert (NaN, an outlier, a straggler) is
raised during training, printed, stored in the ``alerts`` table as it is raised (the watch's
thread writes it, under the lock the reports' writes take) and given to ``on_alert`` /
``alert_url``; the run's end judges every step once more.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback
from ray.train.v2.api.callback import UserCallback

from multirank_logger.rows.batch import concat_batches
from multirank_logger.rows.side_records import SideRecords
from multirank_logger.store.backends import public_name
from multirank_logger.store.sql_store import Store
from multirank_logger.store.status import FAILED, SUCCESS, record_rank_end
from multirank_logger.watch.alerts import Alert, AlertOutlets, run_facts
from multirank_logger.watch.watch import Watch
from multirank_logger.write.buffer import RecordBuffer

__all__ = ["MultiRankRayCallback"]

#: seconds a step waits for a worker's report before the watch judges it without that worker
#: (every worker's dict of a report arrives at once here: only a worker that reports fewer times waits)
CLOSE_AFTER_S = 10.0
#: seconds the run's end waits for the watch's last judgement
WATCH_STOP_S = 10.0


class MultiRankRayCallback(UserCallback):
    """Pass it with its end hook: ``RunConfig(callbacks=MultiRankRayCallback(db="runs.sqlite").callbacks())``.

    Args:
        db: the store (a ``.sqlite`` / ``.duckdb`` path or a SQLAlchemy URL) the controller can write.
        name: the run's name (versions numbered per name); default: Ray Train's run name.
        step_key: a key of the reported dict taken as the step (else the report's count).
        watch: judge the run while it trains and raise alerts (as `MultiRankLogger`'s ``watch``).
        on_alert: called with each `Alert` on the controller (picklable: it travels there).
        alert_url: a webhook each alert is POSTed to (as `MultiRankLogger`'s ``alert_url``).
    """

    def __init__(self, db: str | os.PathLike[str], name: str | None = None, *, step_key: str = "step",
                 watch: bool = True, on_alert: Callable[[Alert], Any] | None = None,
                 alert_url: str | None = None) -> None:
        self.db = os.fspath(db)
        self.name = name
        self.step_key = step_key
        self.watch = watch
        self.on_alert = on_alert
        self.alert_url = alert_url
        self.run_id: int | None = None
        self._store: Store | None = None
        self._buffers: dict[int, RecordBuffer] = {}
        self._reports = 0
        self._raised: set[int] = set()
        self._watch: Watch | None = None  # on the controller, once the first report came
        self._side: SideRecords | None = None  # the watch's alert rows, written as they are raised
        self._write_lock: threading.Lock | None = None  # one writer at a time: the reports' and the watch's
        #: each worker's place ({rank: ranks-table columns}), from the worker group Ray started
        self._places: dict[int, dict[str, Any]] = {}

    def __getstate__(self) -> dict[str, Any]:  # pickled to the controller actor: no engine, thread or lock
        return {**self.__dict__, "_store": None, "_watch": None, "_side": None, "_write_lock": None}

    @property
    def alerts(self) -> list[Alert]:
        """The alerts raised so far (on the controller, where the callback runs)."""
        return list(self._watch.outlets.raised) if self._watch is not None else []

    def _open(self, run_context: Any, world_size: int) -> Store:
        if self._store is None:
            self._store = Store(self.db)
            self._write_lock = threading.Lock()
            name = self.name or run_context.get_run_config().name or "ray_train"
            run = self._store.create_run(
                name, world_size=world_size, transport="ray", hparams=run_context.train_loop_config
            )
            self.run_id = run.id
            self._store.register_absent_ranks(run.id, range(world_size))
            self._write_places()
            if self.watch:
                self._side = SideRecords()
                outlets = AlertOutlets(self._record_alert, self.on_alert, self.alert_url, run=run_facts(run, public_name(self.db)))
                self._watch = Watch(run.id, world_size, outlets, close_after=CLOSE_AFTER_S)
                self._watch.start()
        return self._store

    def worker_places(self, workers: list[Any]) -> None:
        """Each worker's host, local and node rank and GPU from the worker group Ray started (Ray's
        internal ``Worker``: ``metadata`` and ``distributed_context``). A worker Ray does not
        describe so keeps no place: never the controller's host, which would name the wrong one."""
        for worker in workers:
            try:
                meta, where = worker.metadata, worker.distributed_context
                gpus = [int(g) for g in meta.gpu_ids if str(g).isdigit()]
                self._places[int(where.world_rank)] = {
                    "host": str(meta.hostname), "pid": int(meta.pid), "local_rank": int(where.local_rank),
                    "node_rank": int(where.node_rank), "gpu_index": gpus[0] if len(gpus) == 1 else None,
                }
            except (AttributeError, TypeError, ValueError):  # another Ray's layout: no place, said by none
                continue
        if self._store is not None:
            self._write_places()

    def _write_places(self) -> None:
        assert self._store is not None and self.run_id is not None and self._write_lock is not None
        with self._write_lock:
            for rank, place in self._places.items():
                self._store.update_rank(self.run_id, rank, **place)

    def _record_alert(self, table: str, row: dict[str, Any]) -> None:
        """The watch's thread: an alert's row, stored now (the workers may wait on it)."""
        assert self._side is not None and self._store is not None
        self._side.add(table, row)
        self._write_alerts(self._store)

    def _write_alerts(self, store: Store) -> None:
        assert self._write_lock is not None
        with self._write_lock:
            if self._side is not None and self.run_id is not None and len(self._side):
                store.write_side(self._side.drain(self.run_id, 0))

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        store = self._open(run_context, len(metrics))
        assert self.run_id is not None
        batches = []
        for rank, reported in enumerate(metrics):
            values = {k: v for k, v in reported.items() if k != self.step_key and _is_number(v)}
            step = reported.get(self.step_key, self._reports)
            buffer = self._buffers.setdefault(rank, RecordBuffer())
            buffer.append(int(step), values)
            batches.append(buffer.drain(self.run_id, rank))
        assert self._write_lock is not None
        with self._write_lock:  # one transaction a report, whatever the workers (not one each)
            store.write(concat_batches(batches))
        self._reports += 1
        if self._watch is not None:
            self._watch.observe(batches, [])

    def after_exception(self, run_context: Any, worker_exceptions: Mapping[int, Exception]) -> None:
        self._raised.update(worker_exceptions)

    def callbacks(self) -> list[Any]:
        """This callback and its end hook, for ``RunConfig(callbacks=...)``. Ray runs a UserCallback
        inside its own handler, which forwards no end of run; the hook (a ControllerCallback) does.
        Both are pickled to the controller in one list, so the hook holds this very object there."""
        return [self, _RunEnd(self)]

    def after_controller_finish(self, result: Any) -> None:
        if self._store is None or self.run_id is None:
            return
        if self._watch is not None:  # every report is in: every step judged once more, then its alerts stored
            self._watch.stop(WATCH_STOP_S, final=True)
            self._write_alerts(self._store)
        status = FAILED if getattr(result, "error", None) is not None or self._raised else SUCCESS
        world = max(len(self._buffers), 1)
        others = {r: FAILED if r in self._raised else SUCCESS for r in range(1, world)}
        own = FAILED if 0 in self._raised else status if not self._raised else SUCCESS
        record_rank_end(
            self._store, self.run_id, rank=0, gather_world=world, status=own, others=others, facts={}, now=time.time()
        )
        if status == FAILED:
            self._store.update_run(self.run_id, status=FAILED)
        self._store.close()


class _RunEnd(ControllerCallback, WorkerGroupCallback):
    """Calls `MultiRankRayCallback.after_controller_finish` at the run's end, and gives it each
    worker's place once the worker group started (Ray's internal hooks)."""

    def __init__(self, owner: MultiRankRayCallback) -> None:
        self.owner = owner

    def after_worker_group_start(self, worker_group: Any) -> None:
        self.owner.worker_places(worker_group.get_workers())

    def after_controller_finish(self, result: Any) -> None:
        self.owner.after_controller_finish(result)


def _is_number(value: Any) -> bool:
    return isinstance(value, (bool, int, float)) or (
        hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1
    )
