"""Below the torch that has the TCPStore queues, the logger and the channel say which torch is needed."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from multirank_logger import MultiRankLogger
from multirank_logger._util.torch_version import TORCH_FLOOR
from multirank_logger.channel.row_channel import RowChannel
from multirank_logger.errors import TorchTooOld


def test_installed_torch_has_the_queue_calls() -> None:
    """The floor stated in pyproject is met here (the check passes on the torch the tests run)."""
    assert all(hasattr(dist.Store, n) for n in ("queue_push", "queue_pop", "queue_len"))


@pytest.mark.parametrize(
    "build", [lambda tmp: MultiRankLogger(db=str(tmp / "r.sqlite")), lambda tmp: RowChannel("x", 0, 2)]
)
def test_a_torch_without_store_queues_is_refused_at_construction(tmp_path, monkeypatch, build) -> None:
    """A torch whose Store lacks queue_len (torch < 2.8) fails at construction, naming the torch needed."""
    monkeypatch.delattr(dist.Store, "queue_len")
    with pytest.raises(
        TorchTooOld, match=rf"needs torch>={TORCH_FLOOR}.*queue_len missing.*pip install 'torch>={TORCH_FLOOR}'"
    ):
        build(tmp_path)
