"""The oldest torch this package runs on, and a clear error below it.

The gather channel (channel.row_channel.RowChannel) uses the TCPStore's queues, ``queue_push``,
``queue_pop`` and ``queue_len``. They came with pytorch/pytorch#150969 ("c10d/Store: add
queues", April 2025, after the 2.7 branch cut), so the first release that has them is torch
2.8. Below it every multi-rank run would fail at its first flush with an AttributeError from
inside the writer thread; we check once, where the logger and the channel are built.
"""

from __future__ import annotations

from multirank_logger.errors import TorchTooOld

__all__ = ["TORCH_FLOOR", "require_store_queues"]

TORCH_FLOOR = "2.8"
_QUEUE_CALLS = ("queue_push", "queue_pop", "queue_len")


def require_store_queues() -> None:
    """Raise `TorchTooOld` when the installed torch's Store lacks the queue calls."""
    import torch
    import torch.distributed as dist

    store = getattr(dist, "Store", None)
    missing = [name for name in _QUEUE_CALLS if not hasattr(store, name)]
    if missing:
        raise TorchTooOld(torch.__version__, missing, TORCH_FLOOR)
