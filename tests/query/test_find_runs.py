"""Find runs (issue 49): `runs` filtered by name, status, start date and hyperparameters (SQL over
the runs table, on DuckDB, SQLite and PostgreSQL), chosen hyperparameters as columns, `alerts
--all-runs`, and the page's filter box and params column in a real Chromium."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from multirank_logger.cli import main
from multirank_logger.store.sql_store import Store
from multirank_logger.write.buffer import RecordBuffer
from tests.helpers.ui_browser import served, wait_for

DAY = 86400.0
T0 = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC

#: (name, status, started, hparams): four runs a person would look for among
RUNS = [
    ("resnet", "success", T0, {"lr": 0.001, "opt": "adam", "bs": 32, "aug": True, "tag": "base line"}),
    ("resnet", "failed", T0 + 3 * DAY, {"lr": 3e-4, "opt": "sgd", "bs": 64, "aug": False,
                                        "optimizer": {"lr": 0.1, "beta.1": 0.5, "betas": [0.9, 0.99]}}),
    ("vit_big", "running", T0 + 10 * DAY + 3600, {"lr": 1e-05, "opt": "adam", "bs": 32, "layers": [1, 2], "note": None}),
    ("BERT", "interrupted", T0 + 20 * DAY, {"optimizer.lr": 0.1}),  # a top-level key holding a dot
]


def build(db: str | Path) -> str:
    """RUNS in a new store (ids 1-4), three steps of `loss` each; runs 2 and 3 with an alert each."""
    store = Store(db)
    for name, status, started, hparams in RUNS:
        run = store.create_run(name, world_size=1, hparams=hparams)
        buffer = RecordBuffer()
        for step in range(3):
            buffer.append(step, {"loss": 1.0 / (step + 1)})
        store.write(buffer.drain(run.id, 0))
        store.update_run(run.id, status=status, started_at=started, ended_at=started + 60)
    store.write_side({"alerts": [
        {"run_id": run_id, "rank": 0, "seq": 1, "kind": kind, "key": "loss", "first_step": 1, "step_seen": 2,
         "seen_at": T0 + run_id * DAY, "value": 1.0, "detail": None, "message": f"rank 0 loss {kind} (run {run_id})"}
        for run_id, kind in ((2, "non_finite"), (3, "departure"))
    ]})
    store.close()
    return str(db)


@pytest.fixture
def found(any_db: str) -> str:
    return build(any_db)


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def _table_ids(out: str) -> list[int]:
    return [int(line.split()[0]) for line in out.splitlines()[1:]]


#: each filter and the run ids it leaves
CASES: list[tuple[tuple[str, ...], list[int]]] = [
    ((), [1, 2, 3, 4]),
    (("--name", "res"), [1, 2]),
    (("--name", "bert"), [4]),  # any case
    (("--name", "*t"), [1, 2, 4]),  # a glob: the whole name
    (("--name", "R?SNET"), [1, 2]),
    (("--name", "_"), [3]),  # LIKE's wildcard taken as itself
    (("--name", "%"), []),
    (("--status", "failed"), [2]),
    (("--status", "failed", "--status", "RUNNING"), [2, 3]),
    (("--since", "2026-01-04"), [2, 3, 4]),
    (("--until", "2026-01-04"), [1, 2]),  # a day: to its end
    (("--since", "2026-01-04", "--until", "2026-01-11"), [2, 3]),
    (("--since", "2026-01-11 01:00"), [3, 4]),
    (("--until", "2026-01-11 00:59:59"), [1, 2]),
    (("--param", "lr=3e-4"), [2]),  # a number as its value
    (("--param", "lr=0.0003"), [2]),
    (("--param", "lr=0.00001"), [3]),
    (("--param", "opt=adam"), [1, 3]),
    (("--param", "opt=adam", "--param", "bs=32"), [1, 3]),
    (("--param", "opt=adam", "--param", "bs=64"), []),
    (("--param", "bs=32.0"), [1, 3]),
    (("--param", "aug=true"), [1]),
    (("--param", "aug=false"), [2]),
    (("--param", "note=null"), [3]),
    (("--param", "tag=base line"), [1]),
    (("--param", "opt=ADAM"), []),  # a string as its own characters
    (("--param", "missing=1"), []),
    (("--name", "resnet", "--status", "success", "--param", "opt=adam"), [1]),
    # nested keys by their path; a key holding a dot in quotes, never confused with a nesting
    (("--param", "optimizer.lr=0.1"), [2]),
    (("--param", '"optimizer.lr"=0.1'), [4]),
    (("--param", 'optimizer."beta.1"=0.5'), [2]),
    (("--param", "optimizer.beta.1=0.5"), []),
    (("--param", "optimizer.betas=[0.9,0.99]"), [2]),
    (("--param", "optimizer.betas.0=0.9"), []),  # a list is a value, never walked into
    (("--param", "optimizer.lr=0.1", "--param", "opt=sgd"), [2]),
]


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_runs_filters_leave_exactly_the_matching_runs(found: str, fmt: str) -> None:
    """Each filter, alone and together, in the table (no pandas) and in JSON (the frame)."""
    for args, expected in CASES:
        code, out = _invoke("runs", found, "--format", fmt, *args)
        assert code == 0, (args, out)
        if fmt == "json":
            got = [r["id"] for r in json.loads(out)]
        elif expected:
            got = _table_ids(out)
        else:
            got = []
            assert "match these filters" in out, (args, out)
        assert got == expected, (args, out)


def test_runs_param_on_a_list_is_its_json_text(found: str) -> None:
    """A list is matched by its JSON text, with or without spaces (each database writes it its way)."""
    for value in ("[1,2]", "[1, 2]"):
        code, out = _invoke("runs", found, "--format", "json", "--param", f"layers={value}")
        assert code == 0 and [r["id"] for r in json.loads(out)] == [3], (value, out)


def test_show_params_adds_the_chosen_hyperparameters_as_columns(found: str) -> None:
    code, out = _invoke("runs", found, "--show-params", "lr,opt,layers,aug", "--since", "2026-01-02")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split()[-4:] == ["lr", "opt", "layers", "aug"]
    assert [line.split()[-4:] for line in lines[1:]] == [["0.0003", "sgd", "-", "false"], ["1e-05", "adam", "[1,2]", "-"],
                                                         ["-", "-", "-", "-"]]
    code, out = _invoke("runs", found, "--format", "json", "--show-params", "lr,layers")
    assert [(r["param.lr"], r["param.layers"]) for r in json.loads(out)] == [(0.001, None), (0.0003, None), (1e-05, [1, 2]),
                                                                              (None, None)]
    code, out = _invoke("runs", found, "--format", "csv", "--show-params", "opt")
    assert [r["param.opt"] for r in csv.DictReader(io.StringIO(out))] == ["adam", "sgd", "adam", ""]
    # nested keys by their path, a dotted key in quotes; an object's path shows its JSON
    code, out = _invoke("runs", found, "--format", "json", "--show-params", 'optimizer.lr,"optimizer.lr",optimizer."beta.1"')
    assert [(r["param.optimizer.lr"], r['param."optimizer.lr"'], r['param.optimizer."beta.1"']) for r in json.loads(out)] == [
        (None, None, None), (0.1, None, 0.5), (None, None, None), (None, 0.1, None)]
    code, out = _invoke("runs", found, "--show-params", "optimizer", "--status", "failed")
    assert json.loads(out.splitlines()[1].split()[-1]) == RUNS[1][3]["optimizer"], out


@pytest.mark.parametrize(("args", "said"), [
    (("--param", "lr"), "give KEY=VALUE"),
    (("--param", "=3"), "give KEY=VALUE"),
    (("--since", "yesterday"), "YYYY-MM-DD"),
    (("--until", "2026-13-01"), "YYYY-MM-DD"),
    (("--status", "sucess"), "a status is one of"),
    (("--param", "optimizer..lr=1"), "joined by dots"),
    (("--param", "optimizer.=1"), "ends with a dot"),
    (("--param", 'say"hi=1'), "cannot be searched"),
    (("--show-params", 'optimizer."lr'), "closing quote"),
])
def test_runs_refuses_a_filter_it_cannot_read(tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    db = build(tmp_path / "runs.sqlite")
    code, out = _invoke("runs", db, *args)
    assert code == 2 and said in out and "Traceback" not in out, out


def test_alerts_all_runs_lists_every_runs_alerts_with_its_run(found: str) -> None:
    code, out = _invoke("alerts", found, "--all-runs")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == "2 alert(s) in 2 run(s)"
    assert "resnet/version_1 (run 2)" in lines[1] and "non_finite" in lines[1] and "(run 2)" in lines[1]
    assert "vit_big/version_0 (run 3)" in lines[2] and "departure" in lines[2]
    code, out = _invoke("alerts", found, "--all-runs", "--format", "json")
    answer = json.loads(out)
    assert [(r["run"], r["run_id"], [a["kind"] for a in r["alerts"]]) for r in answer] == [
        ("resnet/version_1", 2, ["non_finite"]), ("vit_big/version_0", 3, ["departure"])]
    assert _invoke("alerts", found, "--all-runs", "--run", "2")[0] == 2
    # one run's alerts as before
    code, out = _invoke("alerts", found, "--run", "3")
    assert code == 0 and out.splitlines()[0] == "vit_big/version_0 (run 3): 1 alert(s)"


def test_alerts_all_runs_on_a_store_without_alerts(tmp_path: Path) -> None:
    store = Store(tmp_path / "runs.duckdb")
    store.create_run("quiet", world_size=1)
    store.close()
    code, out = _invoke("alerts", str(tmp_path / "runs.duckdb"), "--all-runs")
    assert code == 0 and out.startswith("No alerts in any run"), out


# -- the page -------------------------------------------------------------------------------


@pytest.fixture
def page_url(tmp_path: Path) -> Iterator[str]:
    with served(build(tmp_path / "runs.sqlite")) as url:
        yield url


#: the run ids of the rows shown, top to bottom
SHOWN = "[...document.querySelectorAll('#runs tr[data-run]')].filter((r) => r.offsetParent !== null).map((r) => +r.dataset.run)"


def test_page_filter_box_leaves_exactly_the_matching_runs_in_chromium(page_url: str) -> None:
    """Typing in the filter box leaves the rows it matches (name, status, key=value as `runs
    --param` reads it), and each run's hyperparameters are in its row."""
    from selenium.webdriver.common.keys import Keys

    from tests.helpers.ui_browser import chromium

    with chromium(1300, 900) as driver:
        driver.get(page_url)
        wait_for(driver, "return document.body.dataset.drawn && document.querySelectorAll('#runs tr[data-run]').length === 4")
        assert driver.execute_script("return " + SHOWN) == [4, 3, 2, 1]
        params = {int(r): (t, title) for r, t, title in driver.execute_script(
            "return [...document.querySelectorAll('#runs tr[data-run]')].map((r) => { const c = r.querySelector('td.params');"
            " return [r.dataset.run, c.innerText, c.title]; })")}
        assert params[2][0] == "aug=false bs=64 lr=0.0003 opt=sgd +3 more"  # a run's params, in its row
        assert {"optimizer.lr=0.1", 'optimizer."beta.1"=0.5', "optimizer.betas=[0.9,0.99]"} <= set(params[2][1].splitlines())
        assert params[1][0] == "aug=true bs=32 lr=0.001 opt=adam +1 more" and "tag=base line" in params[1][1].splitlines()
        assert "lr=0.00001" in params[3][0]  # (JavaScript's number text)
        assert params[4][0] == '"optimizer.lr"=0.1'  # a key holding a dot, quoted: not optimizer's lr
        box = driver.find_element("id", "run-filter")
        for typed, expected in (("res", [2, 1]), ("resnet fail", [2]), ("lr=3e-4", [2]), ("opt=adam", [3, 1]),
                                ("opt=adam bs=32 vit", [3]), ("interrupted", [4]), ("aug=false", [2]), ("nothing", []),
                                ("optimizer.lr=0.1", [2]), ('"optimizer.lr"=0.1', [4]), ('optimizer."beta.1"=0.5', [2]),
                                ("optimizer.beta.1=0.5", []),
                                ("", [4, 3, 2, 1])):
            box.send_keys(Keys.CONTROL, "a")
            box.send_keys(Keys.BACKSPACE)
            if typed:
                box.send_keys(typed)
            wait_for(driver, f"return JSON.stringify({SHOWN}) === {json.dumps(json.dumps(expected, separators=(',', ':')))}")
        # the filter is kept in the URL: a reload keeps it applied
        box.send_keys("opt=sgd")
        wait_for(driver, "return location.search === '?filter=opt%3Dsgd'")
        driver.refresh()
        wait_for(driver, "return document.body.dataset.drawn && document.getElementById('run-filter').value === 'opt=sgd'")
        assert driver.execute_script("return " + SHOWN) == [2]
        assert driver.find_element("id", "run-count").text == "1 of 4 runs"


# -- keys holding a comma or a space: one rule to cut a list of paths, in the CLI and the page ----

#: (name, hparams): a key with a comma, one with a space, one with both and a dot
ODD_KEYS = [("my run", {"a,b": 1, "my key": "x", "plain": 5, "c, d.e": {"f g": True}}),
            ("other", {"a,b": 2, "my key": "y", "plain": 6})]


def _odd_store(db: str | Path) -> str:
    store = Store(db)
    for name, hparams in ODD_KEYS:
        store.create_run(name, world_size=1, hparams=hparams)
    store.close()
    return str(db)


def test_show_params_and_param_name_a_key_holding_a_comma_or_a_space(db_path: Path) -> None:
    """``--show-params`` cuts its list at the commas outside quotes: ``"a,b"`` and ``"my key"`` are
    one key each, nested ones too; ``--param`` finds them (SQLite and DuckDB)."""
    db = _odd_store(db_path)
    shown = '"a,b", "my key",plain,"c, d.e"."f g"'
    code, out = _invoke("runs", db, "--format", "json", "--show-params", shown)
    assert code == 0, out
    got = [(r['param."a,b"'], r['param."my key"'], r["param.plain"], r['param."c, d.e"."f g"']) for r in json.loads(out)]
    assert got == [(1, "x", 5, True), (2, "y", 6, None)]
    code, out = _invoke("runs", db, "--show-params", shown)
    assert code == 0 and out.splitlines()[0].endswith(' "a,b" "my key" plain "c, d.e"."f g"'), out
    for param, ids in (('"my key"=y', [2]), ('"a,b"=1', [1]), ("a,b=2", [2]), ('"c, d.e"."f g"=true', [1])):
        code, out = _invoke("runs", db, "--format", "json", "--param", param)
        assert code == 0 and [r["id"] for r in json.loads(out)] == ids, (param, out)
    code, out = _invoke("runs", db, "--show-params", '"a,b,plain')  # an unclosed quote: said, not split
    assert code == 2 and "closing quote" in out, out


def test_page_filter_names_a_key_holding_a_comma_or_a_space_in_chromium(tmp_path: Path) -> None:
    """The filter box cuts its words at spaces outside quotes (``"my key"=x`` is one word), reads
    KEY as a path (``"a,b"`` and ``a,b`` name one key), and a quoted name word (``"my run"``)
    finds the name; the page's split, path and KEY=VALUE functions give param_path's answers
    on any text."""
    import random

    from selenium.webdriver.common.keys import Keys

    from multirank_logger.rows.param_path import dotted, split_key_value, split_path, split_words
    from tests.helpers.ui_browser import chromium

    with served(_odd_store(tmp_path / "runs.sqlite")) as url, chromium(1300, 900) as driver:
        driver.get(url)
        wait_for(driver, "return document.body.dataset.drawn && document.querySelectorAll('#runs tr[data-run]').length === 2")
        title = driver.execute_script("return document.querySelector('#runs tr[data-run=\"1\"] td.params').title")
        assert {'"a,b"=1', '"my key"=x', '"c, d.e"."f g"=true'} <= set(title.splitlines())
        box = driver.find_element("id", "run-filter")
        for typed, expected in (('"my key"=x', [1]), ('"a,b"=2', [2]), ("a,b=2", [2]), ('"my key"=y plain=6', [2]),
                                ('"c, d.e"."f g"=true', [1]), ('"my run"', [1]), ("my run", [1]), ('"my key=x', []),
                                ("", [2, 1])):
            box.send_keys(Keys.CONTROL, "a")
            box.send_keys(Keys.BACKSPACE)
            if typed:
                box.send_keys(typed)
            wait_for(driver, f"return JSON.stringify({SHOWN}) === {json.dumps(json.dumps(expected, separators=(',', ':')))}")
        # the same rule as param_path's, on texts made to break it: quotes, escapes, separators, dots
        rng = random.Random(49)
        texts = ["".join(rng.choice('ab."\\=, \t') for _ in range(rng.randrange(12))) for _ in range(400)]
        keys = [[("".join(rng.choice('ab."\\=, \t\n') for _ in range(rng.randrange(4)))) for _ in range(rng.randrange(1, 4))]
                for _ in range(200)]
        page = driver.execute_script(
            "const f = window.MRL_RUN_FILTER; return [arguments[0].map((t) => [f.splitWords(t, ','), f.splitWords(t, f.SPACES),"
            " f.splitPath(t), f.splitKeyValue(t)]), arguments[1].map(f.dotted)];", texts, keys)

        def _path(text: str) -> list[str] | None:
            try:
                return list(split_path(text))
            except ValueError:
                return None

        ours = [[split_words(t, ","), split_words(t, " \t\n\r"), _path(t), list(split_key_value(t)) if "=" in t and
                 split_key_value(t) != (t, "") else None] for t in texts]
        assert page[0] == ours
        assert page[1] == [dotted(k) for k in keys]
