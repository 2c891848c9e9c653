"""One run, one identity: how every rank of a launch learns the (run id, version) rank 0 took.

Rank 0 allocates the run in the store; the other ranks never guess. They learn it from
the first of these that applies:

1. the pickled logger (``ddp_spawn``, ``ddp_notebook``): state travels with the object;
2. an environment variable in the child processes Lightning's and Fabric's subprocess
   launchers start (``strategy="ddp"``: the script run again, with a copy of ``os.environ``).
   Rank 0 keeps its identity aside (`_for_children`) and it is in ``os.environ`` only while such
   a launcher starts the children (logger/launch_env.py): a logger kept alive, never finalized
   (a failed test's traceback, a notebook), leaves nothing in the environment of its process or
   of the processes it starts later. This is the channel for a child that reads the version
   before ``fit`` (no process group, so no TCPStore, is up yet);
3. a key rank 0 published in the job's TCPStore (the server on MASTER_ADDR:MASTER_PORT),
   read with a bounded wait. No collective: a rank that reads it alone cannot hang the others.

Keys are scoped by the logger's construction index in its process (every rank runs the
same script, so the k-th logger of rank 0 pairs with the k-th logger of rank 1) and by
torchrun's restart count.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from multirank_logger._util.dist_env import current_world_size, dist_if_initialized
from multirank_logger.channel.row_channel import RowChannel
from multirank_logger.errors import ChannelTimeout, IdentityTimeout
from multirank_logger.rows.run_ref import RunRef

__all__ = ["IdentityBoard", "RunIdentity", "children_environment", "withdraw_identity"]

ENV_PREFIX = "MULTIRANK_LOGGER_RUN_"

#: what rank 0 published for the child processes a launcher starts: variable -> identity (JSON)
_for_children: dict[str, str] = {}


@contextmanager
def children_environment() -> Iterator[None]:
    """``os.environ`` holds every identity published here while the block runs (a launcher
    copying it into the children it starts), and is as it was once the block is left."""
    published = _for_children.copy()  # one C-level copy: a collector thread may withdraw meanwhile
    before = {name: os.environ.get(name) for name in published}
    os.environ.update(published)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def withdraw_identity(env_var: str) -> None:
    """No later child learns this identity (the launch is over, or its logger was collected)."""
    _for_children.pop(env_var, None)
    os.environ.pop(env_var, None)  # set there only where no launcher could be hooked (`publish`)


@dataclass(frozen=True)
class RunIdentity:
    """What rank 0 tells the others: the run (its ``started_at`` lets a direct-writing rank tell
    it is rank 0's run), and whom the message is for.

    A message that carries the `RunRef`, not a RunRef itself: `db` and `pid` say nothing about the
    run but who may adopt the message, and the store's URL has no place
    in every reference to a run that the other layers pass around and print.
    """

    run: RunRef
    db: str  # the store's URL less its password, so a stale variable for another store is never adopted
    pid: int = 0  # the process that opened the run: only its own children adopt the environment variable

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> RunIdentity:
        """Raises ValueError for text that is no identity (an older release's, say)."""
        message = json.loads(text)
        try:
            return cls(RunRef(**message["run"]), message["db"], message["pid"])
        except (KeyError, TypeError) as exc:
            raise ValueError("not a run identity") from exc


class IdentityBoard:
    """Where rank 0 leaves the run identity for the other ranks (env and TCPStore).

    Args:
        instance: the logger's construction index in this process.
        timeout: the channel's bound on connecting and on each call.
        wait: the longest a rank waits for rank 0 to publish (default: `timeout`).
    """

    def __init__(self, instance: int, timeout: float, wait: float | None = None) -> None:
        self.instance = instance
        self.timeout = timeout
        self.wait = timeout if wait is None else wait
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        #: the RowChannel namespace of this logger in this launch (rows travel under it too)
        self.namespace = f"logger{instance}-restart{restart}"
        self._channel: RowChannel | None = None
        self._withdrawn = False

    @property
    def env_var(self) -> str:
        return f"{ENV_PREFIX}{self.instance}"

    def channel(self, rank: int, world_size: int) -> RowChannel | None:
        """The channel to the job's TCPStore, or None while no store is up to connect to."""
        if self._channel is not None:
            return self._channel
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        if dist_if_initialized() is None and not agent_store:
            return None  # nothing listens on MASTER_PORT before the process group is up
        if not os.environ.get("MASTER_ADDR") or not os.environ.get("MASTER_PORT"):
            return None
        self._channel = RowChannel(self.namespace, rank, world_size, timeout=self.timeout)
        return self._channel

    def publish(self, identity: RunIdentity, environ: bool = False) -> bool:
        """Rank 0: keep the identity for the children a launcher starts and, when one is up, put
        it in the TCPStore.

        Args:
            environ: set the variable in ``os.environ`` now, until `withdraw` (where no launcher
                could be hooked to set it only while it starts the children).

        Returns:
            True when it reached the TCPStore.
        """
        if not self._withdrawn:
            _for_children[self.env_var] = identity.to_json()
            if environ:
                os.environ[self.env_var] = identity.to_json()
        channel = self.channel(0, current_world_size())
        if channel is None:
            return False
        channel.publish("identity", identity.to_json().encode())
        return True

    def withdraw(self) -> None:
        """Rank 0, once its launch is over: no later child learns the identity from the
        environment, for good: every process of the launch has started by then."""
        self._withdrawn = True
        withdraw_identity(self.env_var)

    def close(self) -> None:
        """Drop the connection to the TCPStore (the launch is over); `channel` opens a new one."""
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def from_env(self, db: str) -> RunIdentity | None:
        """Ranks > 0: the identity rank 0 gave this process at its launch, if it is for `db`."""
        text = os.environ.get(self.env_var)
        if not text:
            return None
        try:
            identity = RunIdentity.from_json(text)
        except (ValueError, TypeError):
            return None
        # the variable is inherited further than we want (a test runner's children, torchrun's
        # workers): only the children rank 0 itself started may trust it
        return identity if identity.db == db and identity.pid == os.getppid() else None

    def fetch(self, rank: int, what: str) -> RunIdentity | None:
        """Ranks > 0: wait (bounded) for rank 0's key; None when no TCPStore is up yet.

        Raises:
            IdentityTimeout: when rank 0 did not publish within the timeout.
        """
        channel = self.channel(rank, current_world_size())
        if channel is None:
            return None
        try:
            return RunIdentity.from_json(channel.fetch("identity", self.wait))
        except ChannelTimeout as exc:
            raise IdentityTimeout(rank, self.wait, what) from exc

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_channel"] = None  # holds a socket; the new process connects its own
        return state
