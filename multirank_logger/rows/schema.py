"""The store's tables, defined once: the one place column names are spelled.

This module describes the schema at the code's head revision. It never creates or
alters a table: that is the job of the Alembic revisions in ``migrations/``. A test
checks that upgrading an empty store to head gives exactly these tables.

Value encoding (``metrics.value`` + ``metrics.dtype``): SQLite silently stores NaN as
NULL, so NaN is kept as ``value IS NULL`` with ``dtype = DTYPE_NAN`` on every backend.
``+inf``/``-inf`` are stored as they are; ``-0.0`` (whose sign SQLite drops) is
``0.0`` with ``dtype = DTYPE_NEG_ZERO``. ``dtype`` also remembers whether the logged
Python scalar was an ``int`` or a ``bool``, so that an export prints ``0`` and ``True``
exactly as CSVLogger does, not ``0.0`` and ``1.0``.
"""

from __future__ import annotations

import math
from typing import Any

import sqlalchemy as sa

__all__ = [
    "BIGINT_MAX",
    "BIGINT_MIN",
    "DTYPE_BOOL",
    "DTYPE_FLOAT",
    "DTYPE_INT",
    "DTYPE_NAN",
    "DTYPE_NEG_ZERO",
    "DTYPE_OF_TYPE",
    "METRIC_COLUMNS",
    "RUN_STATUSES",
    "SEQ_ATTEMPT_SHIFT",
    "SIDE_TABLES",
    "SUMMARY_STEPS",
    "COARSE_STEPS",
    "alerts",
    "attempts",
    "decisions",
    "findings",
    "logs",
    "step_summaries",
    "coarse_summaries",
    "verdicts",
    "step_timing",
    "unheard_ends",
    "decode_value",
    "encode_value",
    "fits_bigint",
    "imports",
    "metadata",
    "metric_spans",
    "metrics",
    "ranks",
    "runs",
]

# `metrics.dtype` codes: what Python type the logged scalar had.
DTYPE_FLOAT = 0
DTYPE_INT = 1
DTYPE_BOOL = 2
DTYPE_NAN = 3  # value is NULL: SQLite cannot store NaN
DTYPE_NEG_ZERO = 4  # value is 0.0: SQLite drops the sign of -0.0, CSVLogger prints it

#: the code of each logged Python type; a float's code is refined for NaN and -0.0 (encode_value)
DTYPE_OF_TYPE = {float: DTYPE_FLOAT, int: DTYPE_INT, bool: DTYPE_BOOL}

#: ``incomplete``: the run ended, but values went to spill files or were lost (runs.values_*);
#: importing the spill files completes it
RUN_STATUSES = ("running", "success", "failed", "interrupted", "incomplete")

#: what a BigInteger column holds in every backend (run ids, ranks, steps): a number past it names
#: no row, and a driver binding it overflows
BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1


def fits_bigint(number: int) -> bool:
    """Whether `number` can be stored in (and so compared against) a BigInteger column."""
    return BIGINT_MIN <= number <= BIGINT_MAX


#: a row's ``seq`` is ``(attempt << SEQ_ATTEMPT_SHIFT) + the rank's call counter in that launch``:
#: every launch of a run (ddp_spawn phases, resume after preemption) numbers its calls apart
SEQ_ATTEMPT_SHIFT = 40

metadata = sa.MetaData()

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False, comment="run id, allocated as max(id) + 1"),
    sa.Column("name", sa.String(255), nullable=False, comment="experiment name (CSVLogger's `name`)"),
    sa.Column("version", sa.Integer, nullable=False, comment="version number within name (version_N)"),
    sa.Column("status", sa.String(16), nullable=False, comment="running | success | failed | interrupted"),
    sa.Column("world_size", sa.Integer, nullable=False, comment="number of ranks in the launch"),
    sa.Column("transport", sa.String(16), nullable=True, comment="how rows reached the store: direct | gather"),
    sa.Column("started_at", sa.Float(53), nullable=False, comment="unix time the run was registered"),
    sa.Column("ended_at", sa.Float(53), nullable=True, comment="unix time rank 0 finalized the run"),
    sa.Column("hparams", sa.Text, nullable=True, comment="hyperparameters as JSON text"),
    sa.Column("version_name", sa.String(255), nullable=True, comment="directory of a named version; NULL: version_N"),
    sa.Column("run_key", sa.String(255), nullable=True, comment="caller's key to resume the run by (a job id)"),
    sa.Column("values_spilled", sa.BigInteger, nullable=True, comment="values written to spill files instead of the store"),
    sa.Column("values_lost", sa.BigInteger, nullable=True, comment="values that reached neither the store nor a spill file"),
    sa.Column("run_uuid", sa.String(36), nullable=True, comment="the run's unique id (a UUID)"),
    sa.UniqueConstraint("name", "version", name="uq_runs_name_version"),
)

# One row per launch of a run: the first, each ddp_spawn phase, each resume after preemption.
attempts = sa.Table(
    "attempts",
    metadata,
    sa.Column("run_id", sa.Integer, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False, comment="0 for the first launch; the high bits of its rows' seq"),
    sa.Column("world_size", sa.Integer, nullable=False, comment="number of ranks in this launch"),
    sa.Column("status", sa.String(16), nullable=False, comment="how this launch ended (runs.status values)"),
    sa.Column("started_at", sa.Float(53), nullable=False),
    sa.Column("ended_at", sa.Float(53), nullable=True),
    sa.Column("host", sa.String(255), nullable=True, comment="rank 0's host"),
    sa.Column("job_id", sa.String(255), nullable=True, comment="the scheduler's job id, when one is set"),
    sa.PrimaryKeyConstraint("run_id", "attempt", name="pk_attempts"),
)

ranks = sa.Table(
    "ranks",
    metadata,
    sa.Column("run_id", sa.Integer, nullable=False),
    sa.Column("rank", sa.Integer, nullable=False, comment="global rank"),
    sa.Column("local_rank", sa.Integer, nullable=True),
    sa.Column("node_rank", sa.Integer, nullable=True),
    sa.Column("host", sa.String(255), nullable=True),
    sa.Column("pid", sa.Integer, nullable=True),
    sa.Column("status", sa.String(16), nullable=False, comment="running | success | failed | interrupted | missing"),
    sa.Column("started_at", sa.Float(53), nullable=False),
    sa.Column("ended_at", sa.Float(53), nullable=True),
    sa.Column("gpu_index", sa.Integer, nullable=True, comment="the CUDA device index the rank drives; NULL without CUDA"),
    sa.Column("gpu_name", sa.String(255), nullable=True, comment="its device's name (torch.cuda.get_device_name)"),
    sa.Column("gpu_uuid", sa.String(64), nullable=True, comment="its device's UUID, as nvidia-smi writes it (GPU-...)"),
    sa.Column("dp_rank", sa.Integer, nullable=True, comment="its index among the data-parallel replicas"),
    sa.Column("slurm_node", sa.String(255), nullable=True, comment="SLURMD_NODENAME: Slurm's name of its node"),
    sa.Column("mesh", sa.String(1024), nullable=True, comment="its device-mesh coordinates, JSON {dim: [coordinate, size]}"),
    sa.Column("side_rows_spilled", sa.BigInteger, nullable=True,
              comment="side-table rows (alerts, findings, logs...) in its spill file, not imported yet"),
    sa.PrimaryKeyConstraint("run_id", "rank", name="pk_ranks"),
)


# How each backend lays out `metrics` (measured in benchmarks/ingest, /query and /scale):
# - SQLite: a WITHOUT ROWID table clustered on (run_id, key, rank, seq), no other index.
#   One key's rows of one rank sit together, so an export or per_rank(key) reads ranges,
#   not one row lookup per value; inserts cost a third less than into a rowid table
#   and two secondary indexes, and the file is half the size.
# - DuckDB: no index at all (migration 0006 dropped the unique one on (run_id, rank, seq, key),
#   82% of the store's bytes: 52.3 against 9.6 B/row at 51.2M rows). Reads scan by the
#   min-max zone maps of each row group.
# - PostgreSQL: a heap with the two secondary indexes below (reads by rank and step, by key).
# A row's identity is (run_id, rank, seq, key) everywhere; what keeps each row stored once (a
# batch retried, a spill file imported again) is `metric_spans` below (store/seq_spans.py), not
# an index over every row.
metrics = sa.Table(
    "metrics",
    metadata,
    sa.Column("run_id", sa.Integer, nullable=False),
    sa.Column("rank", sa.Integer, nullable=False, comment="global rank that logged the value"),
    sa.Column("seq", sa.BigInteger, nullable=False, comment="the rank's own log-call counter, 0-based"),
    sa.Column("step", sa.BigInteger, nullable=False, comment="step passed to log_metrics"),
    sa.Column("key", sa.String, nullable=False, comment="metric name, prefix included"),
    sa.Column("value", sa.Float(53), nullable=True, comment="NULL when the value was NaN"),
    sa.Column("dtype", sa.SmallInteger, nullable=False, comment="0 float, 1 int, 2 bool, 3 NaN, 4 -0.0"),
    sa.Column("time", sa.Float(53), nullable=False, comment="unix time of the log call"),
    sa.PrimaryKeyConstraint("run_id", "key", "rank", "seq", name="pk_metrics").ddl_if(dialect="sqlite"),
    sqlite_with_rowid=False,
)
sa.Index("ix_metrics_run_rank_step", metrics.c.run_id, metrics.c.rank, metrics.c.step).ddl_if(dialect="postgresql")
sa.Index("ix_metrics_run_key", metrics.c.run_id, metrics.c.key).ddl_if(dialect="postgresql")

# Per (run, rank), the seq ranges that may hold stored metric rows (store/seq_spans.py): every
# insert checks its rows' range here first, and reads back only the rows of an overlap. A rank
# writing its calls in order keeps one span, extended by each batch.
metric_spans = sa.Table(
    "metric_spans",
    metadata,
    sa.Column("run_id", sa.Integer, nullable=False),
    sa.Column("rank", sa.Integer, nullable=False, comment="global rank"),
    sa.Column("first_seq", sa.BigInteger, nullable=False, comment="lowest seq of the span"),
    sa.Column("last_seq", sa.BigInteger, nullable=False, comment="highest seq of the span (inclusive)"),
    sa.PrimaryKeyConstraint("run_id", "rank", "first_seq", name="pk_metric_spans"),
)

METRIC_COLUMNS: tuple[str, ...] = tuple(c.name for c in metrics.columns)

#: steps per bucket of `step_summaries`: a bucket holds steps ``step .. step + SUMMARY_STEPS - 1``,
#: its ``step`` a multiple of it (also below 0); its ``steps_mask`` has one bit per step
SUMMARY_STEPS = 16

# Per (run, rank, key, bucket of SUMMARY_STEPS steps), what the rows there hold, kept by every
# insert of metric rows beside them (store/step_summaries.py): the page's first render and the
# runs list read these, not the rows. A row is a *partial* aggregate of the rows one insert
# added to that bucket: a bucket written by several inserts (flushes that cut it, a resumed
# run, an import) has several rows, merged by SUM (counts, total), MIN, MAX and OR (the mask).
def _summary_columns(bucket: str, mask: str) -> list[sa.Column[Any]]:
    """The columns of a level of summaries (`step_summaries`, `coarse_summaries`)."""
    return [
        sa.Column("run_id", sa.Integer, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False, comment="global rank that logged the values"),
        sa.Column("key", sa.String, nullable=False, comment="metric name, prefix included"),
        sa.Column("step", sa.BigInteger, nullable=False, comment=f"the bucket's first step: a multiple of {bucket}"),
        sa.Column("steps_mask", sa.Integer, nullable=False, comment=mask),
        sa.Column("n_finite", sa.BigInteger, nullable=False, comment="finite values"),
        sa.Column("total", sa.Float(53), nullable=False, comment="sum of the finite values (0 when none)"),
        sa.Column("lo", sa.Float(53), nullable=True, comment="least finite value; NULL when none"),
        sa.Column("hi", sa.Float(53), nullable=True, comment="greatest finite value; NULL when none"),
        sa.Column("n_nan", sa.BigInteger, nullable=False, comment="NaN values (stored as NULL)"),
        sa.Column("n_pos_inf", sa.BigInteger, nullable=False, comment="+inf values"),
        sa.Column("n_neg_inf", sa.BigInteger, nullable=False, comment="-inf values"),
        sa.Column("last_time", sa.Float(53), nullable=False, comment="latest unix time of a log call among the rows"),
    ]


step_summaries = sa.Table(
    "step_summaries", metadata, *_summary_columns("SUMMARY_STEPS", "bit i: a row at step `step + i`")
)
# SQLite and PostgreSQL read one key's summaries by this index; DuckDB by its zone maps, as metrics
# (a tuple of dialects: SQLAlchemy's documented form, which its type hints leave out)
sa.Index("ix_step_summaries_run_key", step_summaries.c.run_id, step_summaries.c.key).ddl_if(
    dialect=("sqlite", "postgresql")  # type: ignore[arg-type]
)

#: steps per bucket of `coarse_summaries`: ``COARSE_STEPS // SUMMARY_STEPS`` buckets of `step_summaries`
COARSE_STEPS = 64

# The same summaries per COARSE_STEPS steps, kept beside the 16-step ones by the same inserts (and
# partial in the same way): the page's buckets of a long run read one of these where they would
# read 4 of those (1,024 ranks x 100,000 steps: 6.4M summaries of a key -> 1.6M).
coarse_summaries = sa.Table(
    "coarse_summaries", metadata,
    *_summary_columns("COARSE_STEPS", "bit i: a row in steps `step + 16 i` .. `step + 16 i + 15`"),
)
sa.Index("ix_coarse_summaries_run_key", coarse_summaries.c.run_id, coarse_summaries.c.key).ddl_if(
    dialect=("sqlite", "postgresql")  # type: ignore[arg-type]
)

# One row per import of a spill file (store/spill_import.py). Insert-only, keyed by the file's id and the
# first frame read, so a file imported twice adds nothing twice, and a file that grew after
# an import adds only its new frames.
imports = sa.Table(
    "imports",
    metadata,
    sa.Column("spill_id", sa.String(64), nullable=False, comment="the spill file's unique id"),
    sa.Column("first_frame", sa.Integer, nullable=False, comment="first frame of the file this import read"),
    sa.Column("end_frame", sa.Integer, nullable=False, comment="frames of the file read so far (exclusive end)"),
    sa.Column("run_id", sa.Integer, nullable=False),
    sa.Column("rank", sa.Integer, nullable=False, comment="global rank that spilled the rows"),
    sa.Column("rows", sa.BigInteger, nullable=False, comment="rows added (rows the store already held are skipped)"),
    sa.Column("source", sa.Text, nullable=True, comment="path of the file when it was imported"),
    sa.Column("imported_at", sa.Float(53), nullable=False, comment="unix time of the import"),
    sa.PrimaryKeyConstraint("spill_id", "first_frame", name="pk_imports"),
)

# One row per (rank, launch) whose end gather rank 0 never heard: what that rank could not deliver
# is in its spill file, counted nowhere. The ranks table keeps only a rank's latest launch (a new
# launch registers it again), so this is what keeps the run from "success" after a later launch
# goes well; importing that launch's spill file deletes the row (store.spill_import.import_spill).
unheard_ends = sa.Table(
    "unheard_ends",
    metadata,
    sa.Column("run_id", sa.Integer, nullable=False),
    sa.Column("rank", sa.Integer, nullable=False, comment="global rank"),
    sa.Column("attempt", sa.Integer, nullable=False, comment="the launch (attempts.attempt)"),
    sa.Column("recorded_at", sa.Float(53), nullable=False, comment="unix time rank 0 recorded the rank missing"),
    sa.PrimaryKeyConstraint("run_id", "rank", "attempt", name="pk_unheard_ends"),
)


# -- side tables: what each rank saw beyond its metrics. `seq` numbers a rank's records (with
# the attempt in its high bits, as in metrics); rows reach the store as metrics rows do.

# A ModelCheckpoint / EarlyStopping decision, one row per (decision, rank): the rank's own
# monitored value and vote, and what the reduced decision was (callbacks/decision_audit.py).
decisions = sa.Table(
    "decisions",
    metadata,
    sa.Column("run_id", sa.Integer, nullable=False),
    sa.Column("rank", sa.Integer, nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False, comment="the decision's number: the same on every rank"),
    sa.Column("step", sa.BigInteger, nullable=False, comment="trainer.global_step"),
    sa.Column("epoch", sa.Integer, nullable=True),
    sa.Column("callback", sa.String(255), nullable=False, comment="ModelCheckpoint | EarlyStopping (class name)"),
    sa.Column("monitor", sa.String(255), nullable=True),
    sa.Column("mode", sa.String(16), nullable=True, comment="min | max"),
    sa.Column("value", sa.Float(53), nullable=True, comment="this rank's own monitored value"),
    sa.Column("vote", sa.Boolean, nullable=True, comment="this rank alone would save / stop"),
    sa.Column("decision", sa.Boolean, nullable=True, comment="what the ranks decided together"),
    sa.Column("path", sa.Text, nullable=True, comment="the checkpoint saved, if any"),
    sa.Column("best", sa.Float(53), nullable=True, comment="the callback's best score after the decision"),
    sa.Column("time", sa.Float(53), nullable=False),
    sa.PrimaryKeyConstraint("run_id", "rank", "seq", name="pk_decisions"),
)

# Every rank's Python logging records and warnings during the run (ddp/log_capture.py).
logs = sa.Table(
    "logs",
    metadata,
    sa.Column("run_id", sa.Integer, nullable=False),
    sa.Column("rank", sa.Integer, nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False, comment="the rank's record counter"),
    sa.Column("time", sa.Float(53), nullable=False),
    sa.Column("level", sa.String(16), nullable=False, comment="DEBUG | INFO | WARNING | ERROR | CRITICAL"),
    sa.Column("levelno", sa.Integer, nullable=False),
    sa.Column("logger", sa.String(255), nullable=False, comment="the logging.Logger's name; 'py.warnings' for warnings"),
    sa.Column("message", sa.Text, nullable=False),
    sa.PrimaryKeyConstraint("run_id", "rank", "seq", name="pk_logs"),
)

# Where each rank's training steps went (callbacks/step_timer.py): waiting for data, forward, the rest
# (backward, optimizer, DDP's all-reduce), and its memory and batch size.
step_timing = sa.Table(
    "step_timing",
    metadata,
    sa.Column("run_id", sa.Integer, nullable=False),
    sa.Column("rank", sa.Integer, nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False, comment="the rank's record counter"),
    sa.Column("step", sa.BigInteger, nullable=False, comment="trainer.global_step when the batch started"),
    sa.Column("epoch", sa.Integer, nullable=True),
    sa.Column("batch_idx", sa.BigInteger, nullable=True),
    sa.Column("data_s", sa.Float(53), nullable=True, comment="end of the previous batch to the start of this one"),
    sa.Column("forward_s", sa.Float(53), nullable=True),
    sa.Column("rest_s", sa.Float(53), nullable=True, comment="backward, optimizer and DDP communication"),
    sa.Column("batch_size", sa.BigInteger, nullable=True),
    sa.Column("mem_allocated_peak", sa.BigInteger, nullable=True, comment="CUDA: peak allocated bytes since the last step"),
    sa.Column("mem_reserved_peak", sa.BigInteger, nullable=True, comment="CUDA: peak reserved bytes since the last step"),
    sa.Column("alloc_retries", sa.BigInteger, nullable=True, comment="CUDA: the allocator's retries so far"),
    sa.Column("rss", sa.BigInteger, nullable=True, comment="CPU: the process's resident set, bytes"),
    sa.Column("time", sa.Float(53), nullable=False),
    sa.PrimaryKeyConstraint("run_id", "rank", "seq", name="pk_step_timing"),
)
# The TensorBoard export reads a run's timing rows a window of steps at a time: SQLite and
# PostgreSQL by this index (the key cannot serve a range of steps), DuckDB by its zone maps
sa.Index("ix_step_timing_run_step", step_timing.c.run_id, step_timing.c.step).ddl_if(
    dialect=("sqlite", "postgresql")  # type: ignore[arg-type]
)

# What the watch raised during the run (watch/watch.py), each finding once, recorded by rank 0:
# the rank it names (not the recording rank), the key, the first step, when it was seen.
alerts = sa.Table(
    "alerts",
    metadata,
    sa.Column("run_id", sa.Integer, nullable=False),
    sa.Column("rank", sa.Integer, nullable=False, comment="the rank the alert names"),
    sa.Column("seq", sa.BigInteger, nullable=False, comment="the alert's number in the run (rank 0's counter)"),
    sa.Column("kind", sa.String(32), nullable=False, comment="non_finite | departure | straggler | memory | stop"),
    sa.Column("key", sa.String, nullable=True, comment="the metric key (a phase or memory measure for timing)"),
    sa.Column("first_step", sa.BigInteger, nullable=True, comment="the finding's first step"),
    sa.Column("step_seen", sa.BigInteger, nullable=True, comment="the newest step the watch held when it raised it"),
    sa.Column("seen_at", sa.Float(53), nullable=False, comment="unix time the watch raised it"),
    sa.Column("value", sa.Float(53), nullable=True, comment="the finding's number (a ratio, a value)"),
    sa.Column("detail", sa.Text, nullable=True, comment="the finding's numbers as JSON"),
    sa.Column("message", sa.Text, nullable=False, comment="the console line"),
    sa.PrimaryKeyConstraint("run_id", "seq", name="pk_alerts"),
)

findings = sa.Table(
    "findings",
    metadata,
    sa.Column("run_id", sa.Integer, nullable=False),
    sa.Column("rank", sa.Integer, nullable=False, comment="the rank the finding names"),
    sa.Column("seq", sa.BigInteger, nullable=False, comment="its number in the run (rank 0's counter; the launch in the high bits)"),
    sa.Column("kind", sa.String(32), nullable=False, comment="non_finite | departure | straggler | memory"),
    sa.Column("series", sa.String, nullable=False, comment="the metric key, or timing:COLUMN (the page's series)"),
    sa.Column("first_step", sa.BigInteger, nullable=True, comment="its first step (None for memory)"),
    sa.Column("origin", sa.Boolean, nullable=False, comment="whether this rank is where the problem started"),
    sa.Column("origin_step", sa.BigInteger, nullable=True, comment="the step where the problem started (its origin's)"),
    sa.Column("value", sa.Float(53), nullable=True, comment="the finding's number (a ratio, seconds, a value)"),
    sa.Column("detail", sa.Text, nullable=True, comment="the finding's item as JSON (its numbers, its spread)"),
    sa.Column("sentence", sa.Text, nullable=False, comment="the finding in words (judgement/sentences.py)"),
    sa.Column("found_at", sa.Float(53), nullable=False, comment="unix time of the run's last judgement"),
    sa.PrimaryKeyConstraint("run_id", "seq", name="pk_findings"),
)

# One row per verdict kept (the watch's last judgement), beside its `findings` rows of the same
# launch: whether it judged the whole run as the report does and, then, how many metric rows of
# each rank it judged. A reader serves the kept findings instead of a pass over the rows while
# the store holds exactly those rows (query/kept_verdict.py); else it says `reason`.
verdicts = sa.Table(
    "verdicts",
    metadata,
    sa.Column("run_id", sa.Integer, nullable=False),
    sa.Column("rank", sa.Integer, nullable=False, comment="the rank that judged (0)"),
    sa.Column("seq", sa.BigInteger, nullable=False, comment="its number in the run (the launch in the high bits)"),
    sa.Column("complete", sa.Boolean, nullable=False, comment="whether the whole run was judged as the report judges it"),
    sa.Column("rows_by_rank", sa.Text, nullable=True, comment="JSON list: per rank, the metric rows judged (complete only)"),
    sa.Column("steps_by_rank", sa.Text, nullable=True, comment="JSON list: per rank, [its distinct steps, its last step] (null where its rows came out of step order)"),
    sa.Column("findings", sa.Integer, nullable=False, comment="the findings rows kept with it (its launch's)"),
    sa.Column("reason", sa.Text, nullable=True, comment="why it is not complete"),
    sa.Column("judged_at", sa.Float(53), nullable=False, comment="unix time of the run's last judgement"),
    sa.PrimaryKeyConstraint("run_id", "seq", name="pk_verdicts"),
)

#: the side tables by name: what `MultiRankLogger.record(table, ...)` accepts
SIDE_TABLES = {t.name: t for t in (decisions, logs, step_timing, alerts, findings, verdicts)}


def encode_value(value: bool | int | float) -> tuple[float | None, int]:
    """Split a logged scalar into the stored ``(value, dtype)`` pair.

    Raises:
        TypeError: for anything but a Python ``bool``, ``int`` or ``float``.
    """
    kind = type(value)
    if kind is float:
        if value == 0.0 and math.copysign(1.0, value) < 0:
            return 0.0, DTYPE_NEG_ZERO
        return (None, DTYPE_NAN) if value != value else (value, DTYPE_FLOAT)
    if kind in DTYPE_OF_TYPE:
        return float(value), DTYPE_OF_TYPE[kind]
    raise TypeError(f"cannot store a {kind.__name__}; expected bool, int or float")


def decode_value(value: float | None, dtype: int) -> bool | int | float:
    """Rebuild the Python scalar that was logged from its stored ``(value, dtype)`` pair."""
    if dtype == DTYPE_FLOAT:
        return value  # type: ignore[return-value]
    if dtype == DTYPE_INT:
        return int(value)  # type: ignore[arg-type]
    if dtype == DTYPE_BOOL:
        return bool(value)
    if dtype == DTYPE_NEG_ZERO:
        return -0.0
    return math.nan
