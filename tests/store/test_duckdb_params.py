"""DuckDB statements bind no parameters (store/backends/duckdb_params.py) and Arrow columns
become NumPy without pyarrow's to_numpy (_util/arrow_numpy.py): both imported pandas, 0.3-0.5 s
before a read could start. What a statement says must not change: keys with quotes,
backslashes and "$1" in them are read back exactly, on a real DuckDB file."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import sqlalchemy as sa

from multirank_logger._util.arrow_numpy import column_numpy
from multirank_logger.errors import LookupFailed
from multirank_logger.query.reader import open_store
from multirank_logger.rows.schema import metrics, runs
from multirank_logger.store.backends.duckdb_params import inline_parameters
from multirank_logger.store.sql_store import Store
from tests.helpers.stores import keep_summaries

ODD_KEYS = ["it's", "back\\slash", "$1 and $2", 'a "quoted" name', "ünïcode/é", "new\nline", "NaN", ""]


def _store(path: Path, keys: list[str]) -> None:
    store = Store(path)
    with store.begin() as conn:
        conn.execute(sa.insert(runs), [{"id": 1, "name": "odd", "version": 0, "status": "success", "world_size": 3,
                                        "started_at": time.time()}])
        conn.execute(sa.insert(metrics), [
            {"run_id": 1, "rank": rank, "seq": i, "step": 10, "key": key, "value": rank * 100.0 + i, "dtype": 0, "time": 0.0}
            for rank in range(3) for i, key in enumerate(keys)
        ])
        keep_summaries(conn, 1)
    store.close()


def test_keys_with_quotes_backslashes_and_placeholders_are_read_back_exactly(tmp_path: Path) -> None:
    db = tmp_path / "runs.duckdb"
    _store(db, ODD_KEYS)
    with open_store(db) as reader:
        assert sorted(reader.keys()) == sorted(ODD_KEYS)
        for i, key in enumerate(ODD_KEYS):
            table = reader.per_rank(key)  # the key is a parameter of the statement
            assert table.to_numpy().tolist() == [[0.0 + i, 100.0 + i, 200.0 + i]]
        with pytest.raises(LookupFailed, match="No key"):
            reader.per_rank("it''s")  # a doubled quote is another key, not the same one


def test_a_read_of_a_duckdb_store_imports_no_pandas_until_it_builds_a_dataframe(tmp_path: Path) -> None:
    """Open, resolve the run, list its keys and read one key's rows (what per_rank does before
    its DataFrame): pandas stays unimported, so per_rank imports it beside its query."""
    db = tmp_path / "runs.duckdb"
    _store(db, ["loss", "acc"])
    code = (
        "import json, sys\n"
        "from multirank_logger.query.reader import open_store\n"
        f"reader = open_store({str(db)!r})\n"
        "ref = reader.resolve_run()\n"
        "keys = reader.keys(ref.id)\n"
        "with reader._connect() as conn:\n"
        "    rank, seq, step, value, dtype = reader.store.backend.per_rank_columns(conn, ref.id, 'loss')\n"
        "print(json.dumps({'pandas': 'pandas' in sys.modules, 'keys': sorted(keys), 'value': value.tolist()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"pandas": False, "keys": ["acc", "loss"], "value": [0.0, 100.0, 200.0]}


def test_inline_parameters_writes_literals_outside_quotes_only() -> None:
    sql = "SELECT '$1', \"$2\", $1, $10 FROM t WHERE a = $2 AND b = $3 AND c = $4 AND d = $5 AND e = $6"
    params = ["o'k", 7, 1.5, float("nan"), None, True, 0, 0, 0, "ten"]
    assert inline_parameters(sql, params) == (
        "SELECT '$1', \"$2\", 'o''k', 'ten' FROM t WHERE a = 7 AND b = 1.5e0 AND c = 'nan'::DOUBLE AND d = NULL AND e = TRUE"
    )
    assert inline_parameters("SELECT $1", [b"bytes"]) is None  # not a plain value: bound as before
    assert inline_parameters("SELECT $1", ["nul\x00"]) is None
    assert inline_parameters("SELECT 1", []) == "SELECT 1"


def test_column_numpy_views_one_chunk_and_joins_several() -> None:
    one = pa.array(np.arange(10, dtype=np.int32))
    view = column_numpy(one.slice(3, 4))
    assert view.dtype == np.int32 and view.tolist() == [3, 4, 5, 6]
    several = pa.chunked_array([pa.array(np.array([1.5, np.nan])), pa.array(np.array([-0.0]))])
    joined = column_numpy(several)
    assert joined.dtype == np.float64 and joined[0] == 1.5 and np.isnan(joined[1]) and np.signbit(joined[2])
    assert column_numpy(pa.chunked_array([], pa.uint64())).dtype == np.uint64
    assert column_numpy(pa.array(np.array([2**63], dtype=np.uint64))).tolist() == [2**63]
    with_null = pa.array([1.0, None])
    assert np.isnan(column_numpy(with_null)[1])  # through to_numpy: nulls need a copy


@pytest.mark.parametrize("value", [0.1, 1 / 3, 1764043200.123456, 123456.78901234567, 1e-300, 5e-324,
                                   1.7976931348623157e308, -0.0, 2.0**60, float("inf"), -7])
def test_a_number_written_as_a_literal_reads_back_as_the_same_number(tmp_path: Path, value: float) -> None:
    """Through SQLAlchemy on a DuckDB store, as the package's own statements go: a float comes
    back the same double (a literal "0.1" alone would be DECIMAL), an int the same int."""
    store = Store(tmp_path / "runs.duckdb")
    with store.begin() as conn:
        got = conn.execute(sa.select(sa.bindparam("x", value), sa.func.typeof(sa.bindparam("y", value)))).one()
    store.close()
    assert got[0] == value and type(got[0]) is type(value) and math.copysign(1, got[0]) == math.copysign(1, value)
    assert got[1] == ("DOUBLE" if isinstance(value, float) else "INTEGER")


def test_a_read_reserves_address_space_for_its_rows_not_for_a_billion(tmp_path: Path) -> None:
    """A DuckDB read (per_rank, the report's pass) asks for one Arrow chunk; DuckDB reserves
    address space for a whole chunk, and a batch size of 2**30 rows reserved 21 GB for a few
    rows: the test process could then no longer fork (ENOMEM under the kernel's overcommit
    heuristic). The process's peak address space stays within 2 GB of where it started."""
    db = tmp_path / "runs.duckdb"
    _store(db, ["loss", "acc"])
    code = (
        "import json\n"
        "from multirank_logger.query.reader import open_store\n"
        "from multirank_logger.report.findings import find\n"
        "def peak():\n"
        "    return next(int(line.split()[1]) for line in open('/proc/self/status') if line.startswith('VmPeak'))\n"
        f"reader = open_store({str(db)!r})\n"
        "before = peak()\n"
        "reader.per_rank('loss'); find(reader)\n"
        "print(json.dumps({'grew_kib': peak() - before}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1])["grew_kib"] < 2 * 2**20
