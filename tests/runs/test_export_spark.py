"""Spark (local mode, a JVM in a process of its own) reads the Parquet export: every row of every
rank of every run of one store, and the lake two stores share, each run under its UUID."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from multirank_logger import open_store
from multirank_logger.cli import main
from tests.helpers.exported_rows import COLUMNS, build_two_runs, comparable_rows, stored_rows
from tests.helpers.logged_calls import store_calls, trainer_calls


def _uuid(db: Path, run_id: int = 1) -> str:
    with open_store(db) as reader:
        found = reader.resolve_run(run_id).uuid
    assert found is not None
    return found


def _stored_rows(db: Path, run_id: int = 1) -> int:
    with open_store(db) as reader:
        return len(reader.metrics(run_id, all_attempts=True))


def test_spark_reads_every_row(tmp_path: Path) -> None:
    """Spark in local mode (one session, in a process of its own) reads the dataset: every row
    of every rank of every run, equal to the store's, the run from its Hive partition."""
    pytest.importorskip("pyspark", reason="pyspark is in the [test] extra")
    two_runs = build_two_runs(tmp_path / "runs.duckdb")  # the same files from every backend: one JVM start is enough
    dest = tmp_path / "lake"
    result = CliRunner().invoke(main, ["export", str(two_runs), "--format", "parquet", "--all-runs", "-o", str(dest)])
    assert result.exit_code == 0, result.output
    script = f"""
import json
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").appName("multirank-export-test")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "1")
         .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")  # a quicker JVM start
         .getOrCreate())
from pyspark.sql import functions as F
rows = spark.read.parquet({str(dest / 'metrics')!r}).withColumn("time", F.unix_micros("time")).collect()
print(json.dumps([r.asDict() for r in rows]))
spark.stop()
"""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])  # json writes Spark's NaN as NaN, and reads it back
    assert comparable_rows({c: [r[c] for r in rows] for c in COLUMNS}) == stored_rows(two_runs)


def test_spark_reads_two_stores_lake(tmp_path: Path) -> None:
    """Spark in local mode reads the lake of two stores' run 1: each run's rows under its UUID."""
    pytest.importorskip("pyspark", reason="pyspark is in the [test] extra")
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    store_calls(a, {rank: trainer_calls(rank, 20) for rank in range(2)})
    store_calls(b, {0: trainer_calls(0, 10)})
    lake = tmp_path / "lake"
    for db in (a, b):
        result = CliRunner().invoke(main, ["export", str(db), "--format", "parquet", "-o", str(lake)])
        assert result.exit_code == 0, result.output
    script = f"""
import json
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").appName("multirank-lake-test")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "1")
         .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
         .getOrCreate())
counts = spark.read.parquet({str(lake / "metrics")!r}).groupBy("run_uuid", "run_id").count().collect()
print(json.dumps([[r["run_uuid"], r["run_id"], r["count"]] for r in counts]))
spark.stop()
"""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(map(tuple, counts)) == sorted([(_uuid(a), 1, _stored_rows(a)), (_uuid(b), 1, _stored_rows(b))])
