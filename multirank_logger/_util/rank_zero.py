"""Rank 0's console lines and warnings, with or without Lightning in the process.

Under Lightning they go through Lightning's own ``rank_zero_info``/``rank_zero_warn``: its rank
(set by the strategy), its console handler, its logger's name in a captured ``logs`` table, as
every other line of the fit. A script of the plain API (Accelerate, Transformers, torchrun)
never imports Lightning (seconds of every rank's start): the same text then goes to stderr, and
the warning through `warnings`, on rank 0 alone (``dist_env.current_rank``).
"""

from __future__ import annotations

import sys
import warnings

from multirank_logger._util.dist_env import current_rank

__all__ = ["rank_zero_info", "rank_zero_warn"]

#: imported by the user's code (a Trainer, Fabric) or by MultiRankLogger: then Lightning says it
_LIGHTNING = "lightning.pytorch"


def rank_zero_info(message: str) -> None:
    """`message` on rank 0's console (Lightning's info line where Lightning runs)."""
    if _LIGHTNING in sys.modules:
        from lightning.pytorch.utilities.rank_zero import rank_zero_info as lightning_info

        lightning_info(message)
    elif current_rank() == 0:
        print(message, file=sys.stderr, flush=True)


def rank_zero_warn(message: str) -> None:
    """`message` as a UserWarning on rank 0 (Lightning's ``rank_zero_warn`` where Lightning runs)."""
    if _LIGHTNING in sys.modules:
        from lightning.pytorch.utilities.rank_zero import rank_zero_warn as lightning_warn

        lightning_warn(message)
    elif current_rank() == 0:
        warnings.warn(message, UserWarning, stacklevel=3)
