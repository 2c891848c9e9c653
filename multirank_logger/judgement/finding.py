"""One finding, as every surface takes it: a typed record.

The watch makes them as rows arrive (live.py); the report's items (report/findings.py, JSON-ready
dicts) become them through `Finding.from_item`; the alerts, the kept verdict (the ``findings``
table), the page's marks and the report's check of each alert read their fields, none a dict's
keys of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from multirank_logger.judgement.sentences import finding_sentence, series_of

__all__ = ["Finding", "value_of"]

#: the field of a finding's item that is its one number
_VALUE_FIELD = {"departure": "ratio", "straggler": "excess_s", "memory": "ratio"}


def value_of(kind: str, item: dict[str, Any]) -> float | None:
    """A finding's one number: a departure's or memory's ratio, a straggler's extra seconds, the
    first non-finite value (NaN, inf, -inf, from its word); None where it has none."""
    if kind == "non_finite":
        word = item.get("value")
        return float(word) if isinstance(word, str) else None
    value = item.get(_VALUE_FIELD.get(kind, ""))
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Finding:
    """One finding: its kind (``non_finite``, ``departure``, ``straggler``, ``memory``), the rank it
    names, the key (a metric key; ``timing:data_s`` for a straggler; the measure for memory), its
    first step (None for memory), the newest step held when the watch found it (None from the
    report), its number (`value_of`), its numbers (the report's item of the kind, less rank and
    key) and where its problem started (`origin.spread_of`; None while it is the only rank)."""

    kind: str
    rank: int
    key: str
    first_step: int | None
    step_seen: int | None
    value: float | None
    detail: dict[str, Any] = field(default_factory=dict)
    spread: dict[str, Any] | None = None

    @classmethod
    def from_item(cls, kind: str, item: dict[str, Any], step_seen: int | None = None) -> Finding:
        """The report's item of `kind` (a dict with rank, first_step, its numbers, and ``origin``
        and ``spread`` where origin.with_origin added them) as a record."""
        if kind == "straggler":
            key = series_of(kind, item)
        elif kind == "memory":
            key = str(item["measure"])
        else:
            key = str(item["key"])
        first = item.get("first_step")
        detail = {k: v for k, v in item.items() if k not in ("rank", "key", "first_step", "spread", "origin")}
        return cls(kind, int(item["rank"]), key, None if first is None else int(first), step_seen,
                   value_of(kind, item), detail, item.get("spread"))

    @property
    def origin(self) -> bool:
        """Whether its rank is (among) the first to show the problem."""
        return self.spread is None or self.rank in self.spread["origin_ranks"]

    @property
    def origin_step(self) -> int | None:
        """The step where its problem started (its own first step where it is the origin)."""
        return self.first_step if self.spread is None else int(self.spread["origin_step"])

    @property
    def series(self) -> str:
        """The page's series it is on (sentences.series_of)."""
        return series_of(self.kind, self.item())

    def item(self) -> dict[str, Any]:
        """The finding as the report's item of its kind (what `finding_sentence` words)."""
        return {"rank": self.rank, "key": self.key, "first_step": self.first_step, **self.detail,
                "spread": self.spread, "origin": self.origin}

    @property
    def sentence(self) -> str:
        """Its one sentence, with the step the watch had reached where it has one (judgement/sentences.py)."""
        return finding_sentence(self.kind, self.item(), self.step_seen)

    def matches(self, other: Finding) -> bool:
        """The same finding (kind, rank, key, first step): an alert and the report agree on it."""
        return (self.kind, self.rank, self.key, self.first_step) == (other.kind, other.rank, other.key, other.first_step)
