"""_util/rank_zero.py: rank 0's console line and warning, with Lightning in the process or not.

Without Lightning (a plain-API script) they go to stderr and `warnings` on rank 0 alone, as
Lightning's ``rank_zero_info``/``rank_zero_warn`` do under a Trainer; with it, through Lightning's.
"""

from __future__ import annotations

import sys
import warnings

import pytest

from multirank_logger._util import rank_zero

LAUNCH_VARS = ("RANK", "NODE_RANK", "GROUP_RANK", "SLURM_NODEID", "SLURM_PROCID", "LOCAL_RANK", "SLURM_LOCALID")


@pytest.fixture
def without_lightning(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """This process as a plain script sees it: no Lightning imported, no launcher's variables."""
    monkeypatch.delitem(sys.modules, "lightning.pytorch", raising=False)
    for var in LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_rank_0_says_and_warns_without_lightning(without_lightning: pytest.MonkeyPatch,
                                                 capfd: pytest.CaptureFixture[str]) -> None:
    without_lightning.setenv("RANK", "0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rank_zero.rank_zero_info("MultiRankLogger: run x/version_0")
        rank_zero.rank_zero_warn("a warning for rank 0")
    assert capfd.readouterr().err == "MultiRankLogger: run x/version_0\n"
    assert [(w.category, str(w.message)) for w in caught] == [(UserWarning, "a warning for rank 0")]
    assert "lightning.pytorch" not in sys.modules  # neither imported it


@pytest.mark.parametrize("var", ["RANK", "LOCAL_RANK", "SLURM_PROCID"])
def test_other_ranks_stay_quiet_without_lightning(without_lightning: pytest.MonkeyPatch,
                                                  capfd: pytest.CaptureFixture[str], var: str) -> None:
    without_lightning.setenv(var, "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rank_zero.rank_zero_info("MultiRankLogger: run x/version_0")
        rank_zero.rank_zero_warn("a warning for rank 0")
    assert capfd.readouterr().err == "" and caught == []


def test_under_lightning_its_own_rank_zero_functions_say_it(monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """Lightning imported: its logger takes the line (its console handler, its name in the logs table)."""
    import lightning.pytorch  # noqa: F401 - in sys.modules: what a Trainer's process has
    from lightning.pytorch.utilities import rank_zero as lightning_rank_zero

    monkeypatch.setattr(lightning_rank_zero.rank_zero_only, "rank", 0)
    with caplog.at_level("INFO"):
        rank_zero.rank_zero_info("MultiRankLogger: run x/version_0")
    # a record of Lightning's logger ("pytorch_lightning..." once the standalone package is imported too)
    said = [(r.name.split(".")[0], r.getMessage()) for r in caplog.records]
    assert said in ([("lightning", "MultiRankLogger: run x/version_0")],
                    [("pytorch_lightning", "MultiRankLogger: run x/version_0")]), said
    with pytest.warns(UserWarning, match="a warning for rank 0"):
        rank_zero.rank_zero_warn("a warning for rank 0")
