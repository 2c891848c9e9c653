"""The page groups a heatmap's rows by host and says a row's place on hover, in a real Chromium.

The store of tests/helpers/places_store.py (12 ranks, GPUs 0-3 of each host), its hosts then dealt
round-robin (rank r on node10, node2, node9 for r % 3 = 0, 1, 2): rows in rank order would
interleave the hosts, so the page must reorder them to keep a host's rows together, hosts in
natural order (node2, node9, node10: numbers as numbers, not as text).
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers.places_store import PER_HOST, RANKS, build_places_store
from tests.helpers.ui_browser import chromium, served, wait_for

#: the host number of ranks r % 3 = 0, 1, 2 (as text, node10 would come first)
HOST_NUMBERS = (10, 2, 9)


def test_heatmap_rows_grouped_by_host_and_a_rows_place_on_hover(tmp_path: Path) -> None:
    import sqlite3

    db = build_places_store(str(tmp_path / "places.sqlite"))
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE ranks SET host = 'node' || CASE rank % 3 WHEN 0 THEN 10 WHEN 1 THEN 2 ELSE 9 END, "
                     "node_rank = rank % 3")
    with served(db) as url, chromium() as driver:
        driver.get(url + "run/1")
        wait_for(driver, "const c = document.querySelector('section[data-series=loss] canvas.heatmap');"
                         "return c && c.dataset.plotWidth;")
        rows = driver.execute_script(
            "const c = document.querySelector('section[data-series=loss] canvas.heatmap');"
            "const r = c.getBoundingClientRect(), left = Number(c.dataset.left), w = Number(c.dataset.plotWidth);"
            "const tip = c.parentElement.querySelector('.tip'), out = [];"
            f"for (let i = 0; i < {RANKS}; i++) {{"
            f"  const y = r.top + (i + 0.5) / {RANKS} * r.height;"
            "  c.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + left + w / 2, clientY: y, bubbles: true}));"
            "  out.push(tip.textContent); }"
            "return out;")
    # each row's tip names its rank, its host and its GPU; the rows come host by host
    hosts = []
    for text in rows:
        rank = int(text.split()[1])
        number = HOST_NUMBERS[rank % 3]
        assert f"(node{number} (node {rank % 3}), GPU {rank % PER_HOST} (NVIDIA H200)," in text, text
        hosts.append(number)
    assert sorted(int(t.split()[1]) for t in rows) == list(range(RANKS))
    assert hosts == sorted(hosts), hosts  # a host's rows together, never interleaved; node2 before node10
