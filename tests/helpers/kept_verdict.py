"""What a real training's tests check of the verdict its watch kept (query/kept_verdict.py)."""

from __future__ import annotations

from typing import Any

#: why a real run's watch may not hold its whole run on a loaded machine: a rank's rows came more
#: than close_after seconds after the others' (its step was judged without them), or the watch fell behind
LOAD_REASONS = ("came after their step was judged", "fell behind")


def assert_served_as_judged(served: Any, judged: Any) -> None:
    """`served` (``find``) says what `judged` (``find(..., from_rows=True)``) says, every finding and
    number; where the kept verdict was not served, only for a reason a loaded machine gives."""
    a, b = served.to_dict(), judged.to_dict()
    assert b.pop("judged_from") == "rows"
    if a.pop("judged_from") != "kept verdict":
        assert any(reason in (a["verdict_not_served"] or "") for reason in LOAD_REASONS), a["verdict_not_served"]
    a.pop("verdict_not_served")
    b.pop("verdict_not_served")
    assert a == b
