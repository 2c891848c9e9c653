"""A hyperparameter's place in the run's nested hyperparameters, written as one dotted text.

A run's hyperparameters are stored as they were logged, nested (``{"optimizer": {"lr": 0.1}}``,
Lightning's ``save_hyperparameters`` of a dict, a Namespace or a dataclass). A person names a
value by its path, the keys from the top joined by dots: ``optimizer.lr``. A key that itself
holds a dot (or a quote, a backslash, ``=``, a space, or nothing) is written in double quotes,
``\\"`` and ``\\\\`` inside: ``"model.lr"`` is the top-level key ``model.lr``, and
``optimizer."beta.1"`` the key ``beta.1`` under ``optimizer`` (the quoting of SQL's JSON paths).
A list is a value, never walked into: ``layers`` is ``[64, 128]``, and ``layers.0`` names a key
``0`` of an object only. So every value has one path, and every path names at most one value.

``runs --param PATH=VALUE``, ``runs --show-params PATH`` and the page's filter box all take it;
the page and ``--show-params`` show the leaves (values that are not objects, and empty objects)
by their paths (`flat_params`).

A list of paths is split outside quotes (`split_words`): ``--show-params`` at its commas, the
page's filter box at its spaces (the same rule in ``ui/static/run_filter.js``), so ``"a,b"`` and
``"my key"`` are one path each; `dotted` quotes a key holding a comma or a space, so any path it
writes can be listed there as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["dotted", "flat_params", "param_at", "split_key_value", "split_path", "split_words"]

#: what makes a key be written in quotes: the path's own characters, and what a list of paths
#: (`split_words`: commas, white space), a filter word or KEY=VALUE could not hold or would strip
_QUOTED_WHEN = frozenset('."\\=, \t\n\r')


def _segment(key: str) -> str:
    if key and not (_QUOTED_WHEN & set(key)):
        return key
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dotted(keys: tuple[str, ...] | list[str]) -> str:
    """The path of the value under `keys` (from the top) as one text: `split_path`'s inverse."""
    return ".".join(_segment(k) for k in keys)


def split_path(text: str) -> tuple[str, ...]:
    """A dotted path as its keys, from the top (see the module docstring).

    Raises:
        ValueError: for an empty part (``a..b``, a trailing dot) or an unclosed quote.
    """
    keys: list[str] = []
    i, n = 0, len(text)
    while True:
        if i < n and text[i] == '"':
            key, i = _quoted(text, i)
        else:
            end = text.find(".", i)
            end = n if end < 0 else end
            key, i = text[i:end], end
            if not key:
                raise ValueError(f"{text!r}: a path's parts are keys joined by dots; write an empty key as \"\"")
        keys.append(key)
        if i == n:
            return tuple(keys)
        if text[i] != ".":
            raise ValueError(f"{text!r}: a quoted key ends at its closing quote, then a dot or the end")
        i += 1
        if i == n:
            raise ValueError(f"{text!r}: the path ends with a dot; a key with a dot is written in quotes: \"a.b\"")


def _quoted(text: str, start: int) -> tuple[str, int]:
    """The quoted key that starts at `start` (its opening quote), and the index after its closing one."""
    out: list[str] = []
    i = start + 1
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            out.append(text[i + 1])
            i += 2
        elif ch == '"':
            return "".join(out), i + 1
        else:
            out.append(ch)
            i += 1
    raise ValueError(f"{text!r}: a quoted key needs its closing quote")


def split_key_value(text: str) -> tuple[str, str]:
    """``PATH=VALUE`` split at the first ``=`` outside a quoted key (one may hold ``=``)."""
    i = 0
    quoted = False
    while i < len(text):
        ch = text[i]
        if quoted and ch == "\\":
            i += 2
            continue
        if ch == '"':
            quoted = not quoted
        elif ch == "=" and not quoted:
            return text[:i], text[i + 1 :]
        i += 1
    return text, ""


def split_words(text: str, separators: str) -> list[str]:
    """`text` cut at each of `separators` outside double quotes (a backslash inside quotes keeps
    the next character, as in a quoted key), the words as written (their quotes kept, for
    `split_path`), empty ones left out: ``'"a,b",c'`` at ``","`` is ``['"a,b"', "c"]``. A quote
    left open holds the rest of the text (`split_path` then says so)."""
    words: list[str] = []
    start, i, quoted = 0, 0, False
    while i < len(text):
        ch = text[i]
        if quoted and ch == "\\":
            i += 2
            continue
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in separators:
            words.append(text[start:i])
            start = i + 1
        i += 1
    words.append(text[start:])
    return [w for w in words if w]


def param_at(params: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[bool, Any]:
    """(found, value) of the value under `keys` in `params`, walking objects only (never a list)."""
    held: Any = params
    for key in keys:
        if not isinstance(held, Mapping) or key not in held:
            return False, None
        held = held[key]
    return True, held


def flat_params(params: Mapping[str, Any], _above: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every leaf of `params` (a value that is not an object, or an empty object) by its dotted
    path, in the stored order."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        keys = (*_above, str(key))
        if isinstance(value, Mapping) and value:
            out.update(flat_params(value, keys))
        else:
            out[dotted(keys)] = value
    return out
