"""Nested hyperparameters by their dotted paths (rows/param_path.py, issue 49): every leaf of any
nested dict has one path, the path reads back to its keys, and `runs --param PATH=VALUE` finds
the run by it in a real store (SQLite and DuckDB), a key holding a dot never taken for a nesting
nor a list walked into. Hypothesis over nested dicts."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multirank_logger import open_store
from multirank_logger.logger.run_settings import jsonable
from multirank_logger.query.run_filter import RunFilter, parse_param
from multirank_logger.rows.param_path import dotted, flat_params, param_at, split_key_value, split_path, split_words
from multirank_logger.store.sql_store import Store

#: keys as people write them, and the characters a path must quote: dots, spaces, '='; quotes
#: and backslashes only in the pure tests (SQLite's JSON paths cannot name them: refused there)
SEARCHABLE_KEYS = st.text(alphabet="ab.= _-0", min_size=1, max_size=6)
ANY_KEYS = st.text(alphabet='ab."\\=, \t0', max_size=5)
LEAVES = (st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False, width=32) | st.booleans()
          | st.none() | st.text(alphabet="xy .=", max_size=4) | st.lists(st.integers(0, 9), max_size=3))


def _nested(keys: st.SearchStrategy[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.recursive(st.dictionaries(keys, LEAVES, max_size=3),
                        lambda inner: st.dictionaries(keys, inner | LEAVES, max_size=3), max_leaves=8)


def _leaves(d: dict[str, Any], above: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every leaf by its keys, walked by hand (not by the module under test)."""
    out = []
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out += _leaves(v, (*above, k))
        else:
            out.append(((*above, k), v))
    return out


@given(_nested(ANY_KEYS))
def test_every_leaf_has_one_path_that_reads_back(params: dict[str, Any]) -> None:
    """split_path(dotted(keys)) is keys; the path finds the leaf; flat_params holds each leaf
    under its path; two leaves never share a path."""
    leaves = _leaves(params)
    for keys, value in leaves:
        text = dotted(keys)
        assert split_path(text) == keys
        assert param_at(params, split_path(text)) == (True, value)
        assert split_key_value(f"{text}=v=w") == (text, "v=w")  # the first '=' outside a quoted key
    flat = flat_params(params)
    assert len(flat) == len(leaves) and flat == {dotted(k): v for k, v in leaves}


@given(st.lists(st.lists(ANY_KEYS, min_size=1, max_size=3).map(tuple), max_size=4), st.sampled_from([", ", ",", " ", "\t "]))
def test_a_list_of_paths_splits_back_into_its_paths(paths: list[tuple[str, ...]], between: str) -> None:
    """Paths written by `dotted` and listed with commas (``--show-params``) or spaces (the page's
    filter words, KEY=VALUE each) split back into those paths: a key holding a comma or a space
    is quoted, and the split never cuts inside quotes."""
    separators = "," if "," in between else " \t\n\r"
    listed = split_words(between.join(dotted(p) for p in paths), separators)
    assert [split_path(w.strip()) for w in listed] == paths
    words = split_words(between.replace(",", " ").join(f"{dotted(p)}=v,w" for p in paths), " \t\n\r")
    assert [(split_path(k), v) for k, v in map(split_key_value, words)] == [(p, "v,w") for p in paths]


def _value_text(value: Any) -> str:
    """A leaf as --param's VALUE: a string as its text, a number, true/false/null, a list's JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value)


@pytest.fixture(scope="module", params=[".sqlite", ".duckdb"])
def store_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("params") / f"runs{request.param}"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(params=_nested(SEARCHABLE_KEYS), decoy=_nested(SEARCHABLE_KEYS))
def test_every_leaf_is_found_by_its_path_in_a_real_store(store_path: Path, params: dict[str, Any],
                                                        decoy: dict[str, Any]) -> None:
    """Two runs, one with `params` and one with `decoy`, stored: `--param PATH=VALUE` of each leaf
    of `params` finds its run, and finds the decoy only where the decoy holds that same value at
    that same path (by hand)."""
    store = Store(str(store_path))
    try:
        run = store.create_run("params", world_size=1, hparams=params).id
        other = store.create_run("params", world_size=1, hparams=decoy).id
    finally:
        store.close()
    with open_store(str(store_path)) as reader:
        for keys, value in _leaves(params):
            if isinstance(value, str) and value != value.strip():
                continue  # --param strips its VALUE, as a shell word would hold none
            key, text = parse_param(f"{dotted(keys)}={_value_text(value)}")
            found = {r["id"] for r in reader.run_rows(RunFilter(params=((key, text),)))}
            assert run in found, (keys, value, params)
            held, there = param_at(decoy, keys)
            assert (other in found) == (held and _rule(there, text)), (keys, value, decoy)


def _rule(held: Any, text: str) -> bool:
    """--param's rule, written out by hand: a string by its text, true/false/null by those words,
    a number by its value or its text, a list or an object by its JSON."""
    if isinstance(held, str):
        return held == text
    if isinstance(held, bool) or held is None:
        return json.dumps(held) == text
    if isinstance(held, int | float):
        try:
            return float(text) == float(held)
        except ValueError:
            return False
    try:
        return bool(json.loads(text) == held)
    except ValueError:
        return False


@dataclass
class _Optimizer:
    lr: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])


@dataclass
class _Config:
    optimizer: _Optimizer = field(default_factory=_Optimizer)
    name: str = "run"


def test_a_dataclass_is_stored_nested_and_found_by_path(tmp_path: Path) -> None:
    """Lightning's save_hyperparameters of a dataclass: stored as its fields, nested, and found by
    ``cfg.optimizer.lr``."""
    hparams = jsonable({"cfg": _Config()})
    assert hparams == {"cfg": {"optimizer": {"lr": 0.1, "betas": [0.9, 0.99]}, "name": "run"}}
    store = Store(str(tmp_path / "runs.sqlite"))
    run = store.create_run("dc", world_size=1, hparams=hparams).id
    store.close()
    with open_store(str(tmp_path / "runs.sqlite")) as reader:
        assert [r["id"] for r in reader.run_rows(RunFilter(params=(parse_param("cfg.optimizer.lr=0.1"),)))] == [run]
        assert reader.run_rows(RunFilter(params=(parse_param("cfg.optimizer.betas.0=0.9"),))) == []
