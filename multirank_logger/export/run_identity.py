"""A run's identity outside its store: the UUID an export files it under.

A store's run id (1, 2, ...) is unique in that store only: two stores, or a store deleted and
made again, each have a run 1. Exports that many stores and jobs share (a Parquet lake, a
TensorBoard logdir) key a run by ``runs.run_uuid`` instead.

A run from before UUIDs (``run_uuid`` NULL: a row no upgrade gave one) gets a UUID derived from
what its row holds: `uuid.uuid5` of its id, name, version and allocation time (``started_at``,
which tells two stores' runs of one id apart). The same row gives the same UUID at every export,
so a re-export still replaces that run; another store's run with the same id gets another.
"""

from __future__ import annotations

import uuid

from multirank_logger.rows.run_ref import RunRef

__all__ = ["LEGACY_NAMESPACE", "legacy_uuid", "run_identity", "short_identity"]

#: the namespace of derived UUIDs (fixed: a change would file every legacy run under a new key)
LEGACY_NAMESPACE = uuid.UUID("5b0c8f3e-7a51-4d0e-9b6f-2f1c4a7d9e10")
#: hex digits of the UUID a TensorBoard run folder carries after its name
SHORT_DIGITS = 8


def legacy_uuid(ref: RunRef) -> str:
    """The UUID derived for a run with no ``run_uuid``: stable for one row, distinct across stores."""
    return str(uuid.uuid5(LEGACY_NAMESPACE, f"{ref.id}\x1f{ref.name}\x1f{ref.version}\x1f{ref.started_at!r}"))


def run_identity(ref: RunRef) -> str:
    """The run's UUID: its ``run_uuid``, else `legacy_uuid`."""
    return ref.uuid if ref.uuid else legacy_uuid(ref)


def short_identity(ref: RunRef) -> str:
    """The first `SHORT_DIGITS` hex digits of `run_identity`, to tell runs of one name apart at a glance."""
    return run_identity(ref).replace("-", "")[:SHORT_DIGITS]
