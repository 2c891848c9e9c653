"""The read side of a real 2-rank DDP fit (tests/scripts/query_train.py) logged with CSVLogger and
MultiRankLogger side by side: rank 0's export is CSVLogger's file, each rank keeps its values."""

from __future__ import annotations

from pathlib import Path

from multirank_logger import open_store
from tests.helpers.launches import SCRIPTS, run_ranks_forked
from tests.helpers.logger_helpers import train_env


def test_ddp_rank0_export_is_csvloggers_file_and_ranks_keep_their_values(db_path: Path, tmp_path: Path) -> None:
    """Golden, end to end: a 2-rank DDP fit with CSVLogger and MultiRankLogger side by side."""
    script = SCRIPTS / "query_train.py"
    csv_dir = tmp_path / "csv"
    done = run_ranks_forked(script, [str(db_path), str(tmp_path / "mr"), str(csv_dir)], nproc=2, cwd=tmp_path,
                            env=train_env(), timeout=240)
    assert done.returncode == 0, done.stdout[-3000:]
    golden = (csv_dir / "lightning_logs" / "version_0" / "metrics.csv").read_bytes()
    with open_store(db_path) as reader:
        reader.export_csv(tmp_path / "rank0.csv", rank=0)
        reader.export_csv(tmp_path / "rank1.csv", rank=1)
        frames = {rank: reader.rank_frame(rank=rank) for rank in (0, 1)}
    assert (tmp_path / "rank0.csv").read_bytes() == golden
    rank1 = (tmp_path / "rank1.csv").read_bytes()
    assert rank1 != golden and rank1.split(b"\r\n")[0] == golden.split(b"\r\n")[0]
    for rank, frame in frames.items():
        train = frame.dropna(subset=["fit-rank_value"])
        assert (train["fit-rank_value"] == 1000 * rank + train["step"]).all() and len(train) == 6
