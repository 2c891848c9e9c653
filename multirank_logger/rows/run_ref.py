"""Which run: the one run-reference type every layer passes around.

A run is a row of the store's ``runs`` table. Its id says which row; name and version say where
its files go (``save_dir/name/version_N`` or a named version's directory); ``started_at`` (the
row's allocation time) tells two stores' runs of the same id apart; ``uuid`` is the run's one
identity everywhere (the store, its spill files, its exports).
"""

from __future__ import annotations

from dataclasses import dataclass

from multirank_logger.rows.schema import BIGINT_MAX

__all__ = ["RunRef", "run_number"]


@dataclass(frozen=True)
class RunRef:
    """One run of a store.

    Args:
        id: the ``runs`` row's id.
        name: the experiment name (CSVLogger's ``name``).
        version: the version number (``version_N``).
        version_name: a named version's directory (``version="2020-02-05"``), else None.
        started_at: the ``runs`` row's allocation time (Unix seconds); 0.0 when not read.
        world_size: the number of ranks of its latest launch; 0 when not read.
        uuid: the ``runs`` row's ``run_uuid``; None when not read (or a store from before schema 0007).
    """

    id: int
    name: str
    version: int
    version_name: str | None = None
    started_at: float = 0.0
    world_size: int = 0
    uuid: str | None = None

    @property
    def dir_name(self) -> str:
        """The run's directory under ``save_dir/name``: ``version_N``, or a named version."""
        return self.version_name if self.version_name is not None else f"version_{self.version}"

    @property
    def label(self) -> str:
        """``name/version_N``, as the CLI and the query side accept it."""
        return f"{self.name}/version_{self.version}"


def run_number(digits: str) -> int | None:
    """A run id or version given as digits, or None where no run can have it (past a 64-bit
    integer, what every backend stores; past 4,300 digits, int()'s own bound; a Unicode digit
    such as "²", which int() refuses)."""
    if not digits.isascii() or len(digits) > len(str(BIGINT_MAX)) or int(digits) > BIGINT_MAX:
        return None
    return int(digits)
