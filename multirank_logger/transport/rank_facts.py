"""What each rank says about itself for the ``ranks`` table (local and node rank, host, pid),
and how a rank that does not write the store hands those facts to rank 0 over the run's channel.

A gather sender publishes its facts at set-up (`publish_facts`); rank 0 fetches them at the end
(`fetch_facts`) and records them with each rank's end (store/status.py: record_rank_end). Every wait is bounded:
a rank that never published is recorded without its facts.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterable
from typing import Any

from multirank_logger.errors import ChannelError
from multirank_logger.transport.row_channel import RowChannel

__all__ = ["FACTS_WAIT_S", "fetch_facts", "publish_facts", "rank_facts"]

log = logging.getLogger(__name__)

#: the longest rank 0 waits, for all ranks together, for facts the others did not publish
FACTS_WAIT_S = 2.0
_FACTS_KEY = "facts/{rank}"


def rank_facts() -> dict[str, Any]:
    """This process's facts for the `ranks` table."""
    return {
        "local_rank": _env_int("LOCAL_RANK", 0),
        "node_rank": _env_int("NODE_RANK", _env_int("GROUP_RANK", 0)),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def publish_facts(channel: RowChannel) -> None:
    """A rank that does not write the store (gather): leave its facts for rank 0. Best effort."""
    try:
        channel.publish(_FACTS_KEY.format(rank=channel.rank), json.dumps(rank_facts()).encode())
    except ChannelError as exc:
        log.warning("multirank_logger: rank %d could not publish its host and pid: %s", channel.rank, exc)


def fetch_facts(channel: RowChannel, ranks: Iterable[int], bound: float = FACTS_WAIT_S) -> dict[int, dict[str, Any]]:
    """Rank 0: the facts `ranks` published, waiting at most `bound` seconds for all of them."""
    deadline = time.monotonic() + bound
    out: dict[int, dict[str, Any]] = {}
    for rank in ranks:
        try:
            raw = channel.fetch(_FACTS_KEY.format(rank=rank), max(0.01, deadline - time.monotonic()))
            facts = json.loads(raw)
        except (ChannelError, ValueError):
            continue  # died before set-up ended, or the channel is gone: status only
        if isinstance(facts, dict):
            out[rank] = {k: facts[k] for k in ("local_rank", "node_rank", "host", "pid") if k in facts}
    return out


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default
