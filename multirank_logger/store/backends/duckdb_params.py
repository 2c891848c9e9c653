"""Statement parameters written into DuckDB's SQL as literals.

DuckDB's Python client imports pandas the first time a statement binds any parameter (an
int, a string, even a ``duckdb.Value``: it checks each one against pandas' types): 0.3-0.5 s
on 2 cores, before the statement runs, on the calling thread. A read command (``per_rank``,
``export``, the report) opens the store, resolves its run and reads its rows through such
statements, so every command paid the import first, where ``per_rank`` could have had it
on another thread during its query. Written as literals, a statement binds nothing.

Only plain values are written (int, float, str, bool, None); a statement with anything
else keeps its parameters. Strings are quoted as DuckDB reads them: in ``'...'`` a quote
is doubled and nothing else is special (a backslash is itself). SQLAlchemy's own literal
rendering for duckdb_engine follows PostgreSQL's dialect and doubles backslashes, which
DuckDB would keep: it changed the string.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["inline_parameters", "inline_before_cursor_execute"]

# a quoted string or identifier (skipped: a "$1" inside one is text), or a "$N" placeholder
# (duckdb_engine's paramstyle is numeric_dollar)
_TOKENS = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\$(\d+)")


def _literal(value: Any) -> str | None:
    """`value` as a DuckDB literal; None when it is not a plain value."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return f"'{value!r}'::DOUBLE"  # 'nan', 'inf', '-inf'
        # an exponent makes it a DOUBLE literal: "0.1" alone is DECIMAL(2,1), which a SELECT
        # hands back as a Decimal; repr's digits read back as the same double
        text = repr(value)
        return text if "e" in text else text + "e0"
    if isinstance(value, str) and "\x00" not in value:
        return "'" + value.replace("'", "''") + "'"
    return None


def inline_parameters(statement: str, parameters: Sequence[Any] | None) -> str | None:
    """`statement` with each ``$N`` replaced by parameter N as a literal; None when a parameter
    is not a plain value (the caller binds them as before)."""
    if not parameters:
        return statement
    literals = [_literal(value) for value in parameters]
    if any(lit is None for lit in literals):
        return None

    def replace(match: re.Match[str]) -> str:
        number = match.group(1)
        return match.group(0) if number is None else literals[int(number) - 1]  # type: ignore[return-value]

    return _TOKENS.sub(replace, statement)


def inline_before_cursor_execute(
    _conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, executemany: bool
) -> tuple[str, Any]:
    """SQLAlchemy's ``before_cursor_execute`` (retval=True) for a DuckDB engine: see the module doc."""
    if executemany or not isinstance(parameters, (list, tuple)):
        return statement, parameters
    inlined = inline_parameters(statement, parameters)
    return (statement, parameters) if inlined is None else (inlined, ())
