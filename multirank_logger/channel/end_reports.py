"""The end of a run over the channel: each sender reports what it could not deliver, the receiver
takes the reports and says so (the ``end/{r}`` and ``counted/{r}`` keys of row_channel.py)."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from multirank_logger.channel.tcpstore_client import StoreClient
from multirank_logger.errors import ChannelError

__all__ = ["EndReport", "EndReports"]


class EndReport(NamedTuple):
    """What a sender could not deliver, as it reported at its end (``end/{r}``)."""

    spilled: int  # values in its spill file
    lost: int  # values gone
    side_spilled: int = 0  # side-table rows (alerts, log lines, timing) in its spill file


class EndReports(StoreClient):
    """`RowChannel`'s end-of-run reports, and which rank receives (`writer`, set by `RowChannel`)."""

    writer: int

    @property
    def receives(self) -> bool:
        """True on the rank that receives rows (rank 0, or a node's writer)."""
        return self.rank == self.writer

    def _require_rank0(self, what: str) -> None:
        if not self.receives:
            raise ValueError(f"RowChannel.{what} runs on rank {self.writer} only (this is rank {self.rank})")

    def report_spilled_lost(self, spilled: int, lost: int, side_spilled: int = 0) -> bool:
        """Tell rank 0 how many values this rank put in its spill file or lost, and how many
        side-table rows it put in its spill file (its last word).

        Returns:
            False when rank 0's store cannot be reached (rank 0 then records this rank as missing).
        """
        report = f"{int(spilled)} {int(lost)} {int(side_spilled)}"
        with self._lock:
            try:
                self._call(lambda store: store.set(f"end/{self.rank}", report))
            except Exception:  # noqa: BLE001 - ChannelError, or the store gone with rank 0
                return False
        return True

    def spilled_lost_reports(self, ranks: list[int], timeout: float) -> dict[int, EndReport]:
        """Rank 0: what `ranks` reported (`report_spilled_lost`), waiting at most `timeout` for all of them."""
        self._require_rank0("spilled_lost_reports")
        deadline = time.monotonic() + timeout
        out: dict[int, EndReport] = {}
        for r in ranks:
            try:
                if timeout <= 0:  # only what is there already
                    raw = self._fetch_raw(f"end/{r}", 0.001, f"end/{r}") if self._has(f"end/{r}") else b""
                else:
                    raw = self._fetch_raw(f"end/{r}", max(deadline - time.monotonic(), 0.01), f"end/{r}")
                out[r] = EndReport(*(int(n) for n in raw.decode().split()))
            except (ChannelError, ValueError, TypeError):
                continue  # never reported (or not readable): rank 0 records it as missing
        return out

    def acknowledge_reports(self, ranks: list[int]) -> None:
        """Rank 0: tell `ranks` that the counts they reported are taken. Best effort: a sender that
        hears nothing reports the same counts again with its next phase's (counted twice at worst,
        never not at all)."""
        self._require_rank0("acknowledge_reports")
        with self._lock:
            try:

                def tell(store: Any) -> None:
                    for r in ranks:
                        store.set(f"counted/{r}", b"1")

                self._call(tell)
            except Exception:  # noqa: BLE001 - see above
                pass

    def report_counted(self, timeout: float) -> bool:
        """Sender: whether rank 0 took this rank's `report_spilled_lost` counts, waiting up to `timeout` s."""
        try:
            self._fetch_raw(f"counted/{self.rank}", timeout, "counted")  # bounded, its connect included
        except Exception:  # noqa: BLE001 - ChannelError, TimeoutError: rank 0 did not take them
            return False
        return True
