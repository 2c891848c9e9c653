"""How the report's pass names a row's key: a number, the key's index in the run's keys."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import sqlalchemy as sa

from multirank_logger.rows.schema import metrics

if TYPE_CHECKING:
    from multirank_logger.query.reader import StoreReader

__all__ = ["KeyNumbers"]

#: up to this many keys are numbered in SQL (a CASE); past it, the names are read and numbered here
KEYS_IN_CASE = 64


class KeyNumbers:
    """How a window's rows name their key: a number, the key's index in the run's ``keys``.

    By the key's hash where the backend has a cheap one (``Backend.key_hash``): DuckDB's
    ``hash(key)`` costs little more than no key at all, as DuckDB hashes a dictionary-compressed
    column's strings once per dictionary entry, where a ``CASE`` compares every row's string (on
    the 51.2M-row store: 2.4 s of CPU for the whole pass against 4.8 s). A lookup table by the
    hash's fewest low bits that tell the run's keys apart gives the index, and the full hash is
    compared, so a key the run did not have when the pass began (a live run) is dropped, never
    taken for another. Elsewhere a ``CASE`` in SQL (up to ``KEYS_IN_CASE`` keys) or the names
    themselves.
    """

    def __init__(self, reader: StoreReader, conn: sa.Connection, keys: list[str]) -> None:
        self.keys = keys
        self.hashes: np.ndarray | None = None
        self.key_hash = reader.store.backend.key_hash
        named = sa.values(sa.column("k", sa.String), name="run_keys").data([(k,) for k in keys])
        if (hashed := self.key_hash(named.c.k)) is not None:
            found: dict[str, int] = {k: h for k, h in conn.execute(sa.select(named.c.k, hashed))}
            hashes = np.array([found[k] for k in keys], dtype=np.uint64)
            for bits in range(max(1, len(keys) - 1).bit_length(), 25):  # the fewest low bits that tell the keys apart
                low = hashes & np.uint64(2**bits - 1)
                if len(np.unique(low)) == len(keys):
                    self.hashes, self.mask = hashes, np.uint64(2**bits - 1)
                    self.lookup = np.zeros(2**bits, np.int64)
                    self.lookup[low.astype(np.int64)] = np.arange(len(keys))
                    break

    @property
    def by_name(self) -> bool:
        """Whether `column()` reads the names themselves (too many keys for a CASE)."""
        return self.hashes is None and len(self.keys) > KEYS_IN_CASE

    def column(self) -> Any:
        if self.hashes is not None:
            return self.key_hash(metrics.c.key)
        if len(self.keys) <= KEYS_IN_CASE:
            return sa.case({k: i for i, k in enumerate(self.keys)}, value=metrics.c.key, else_=-1)
        return metrics.c.key

    def numbers(self, column: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The key numbers of `column` (as `column()` read it), and which rows to keep (None: all)."""
        if self.hashes is not None:
            low = column & self.mask
            index = self.lookup[low.view(np.int64)]  # below 2**24: the same numbers, no copy
            del low
            known = self.hashes[index] == column
            return index, None if known.all() else known
        if column.dtype != object:
            number = column.astype(np.int64, copy=False)
        else:
            index = {k: i for i, k in enumerate(self.keys)}
            number = np.fromiter((index.get(k, -1) for k in column), np.int64, len(column))
        known = number >= 0
        return number, None if known.all() else known
