"""A run's findings as terminal text, and as one self-contained HTML file with per-rank plots.

The HTML needs no network: its style is inline and its plots are PNGs embedded as base64.
It plots each key with a finding (outlier ranks, non-finite values), or the run's main keys
(``MAIN_KEYS`` of them, losses first) when no key has one.
"""

from __future__ import annotations

import base64
import html
import os
from typing import Any

from multirank_logger.report.findings import Findings

__all__ = ["findings_text", "write_html"]

#: keys plotted when no key has a finding
MAIN_KEYS = 4
#: keys plotted at most
MAX_PLOTS = 12


def _num(value: Any, unit: str = "") -> str:
    if value is None or value != value:
        return "-"
    if unit == "s":
        return f"{value * 1e3:.3g} ms"
    if unit == "B":
        return f"{value / 2**20:,.0f} MiB"
    return f"{value:.4g}"


def _lines(f: Findings) -> list[tuple[str, list[str]]]:
    """The findings as (section title, lines); shared by the text and the HTML."""
    ranks = [
        f"rank {r['rank']}: {r['status']} on {r['host'] or '?'}, {r['steps']} logged steps, "
        f"{_num(r['duration_s'])} s" for r in f.ranks
    ]  # fmt: skip
    timing = [
        f"rank {t['rank']}: data {_num(t['data_s'], 's')}, forward {_num(t['forward_s'], 's')}, "
        f"rest {_num(t['rest_s'], 's')} (median per step over {t['steps']} steps; batch {_num(t['batch_size'])})"
        for t in f.timing
    ]
    stragglers = [
        f"rank {s['rank']}: {s['phase']} {_num(s['excess_s'], 's')} longer than the other ranks per step "
        f"({s['share_of_step']:.0%} of a step) from step {s['first_step']} to {s['last_step']} ({s['steps']} steps)"
        for s in f.stragglers
    ]
    outliers = [
        f"{o['key']}: rank {o['rank']} departs from the ranks' median from step {o['first_step']} to "
        f"{o['last_step']} ({o['steps']} steps): {_num(o['excess'])} off"
        + (f", {_num(o['ratio'])}x the median" if o["ratio"] is not None else "")
        + f", {_num(o['spreads'])}x the ranks' typical spread"
        for o in f.outliers
    ]
    non_finite = [
        f"{n['key']}: rank {n['rank']} first at step {n['first_step']}, {n['count']} values "
        f"({n['nan']} NaN, {n['inf']} inf)"
        for n in f.non_finite
    ]
    memory = [
        f"rank {m['rank']}: peak {m['measure']} {_num(m['peak_bytes'], 'B')}, other ranks' median "
        f"{_num(m['others_median_bytes'], 'B')}"
        + (f", {m['alloc_retries']} allocator retries" if m["alloc_retries"] else "")
        for m in f.memory
    ]
    decisions = [
        f"step {d['step']} {d['callback']} ({d['monitor']}): decided {d['decision']}; votes "
        + ", ".join(f"rank {r} {v}" for r, v in d["votes"].items())
        for d in f.decisions
    ]
    logs, notices = ([f"{m['level']} on ranks {m['ranks']} ({m['count']}x): {m['message']}" for m in messages]
                     for messages in (f.log_messages, f.library_warnings))
    sections = [("Ranks", ranks), ("Step timing", timing), ("Stragglers", stragglers), ("Outlier ranks", outliers),
                ("Non-finite values", non_finite), ("Memory", memory), ("Decisions the ranks disagreed on", decisions),
                ("Warnings and errors", logs), ("Notices (library warnings that name no rank; no finding)", notices)]  # fmt: skip
    always = ("Stragglers", "Outlier ranks", "Non-finite values")  # "none" is an answer there
    return [(title, lines) for title, lines in sections if lines or title in always]


def findings_text(f: Findings) -> str:
    """The findings for a terminal."""
    out = [f"Report for {f.run} (run {f.run_id}, {f.world_size} ranks)"]
    for title, lines in _lines(f):
        out += ["", f"{title}:"] + [f"  {line}" for line in lines or ["none"]]
    out += [""] + f.notes if f.notes else []
    out += ["", _verdict(f)]
    return "\n".join(out)


def _verdict(f: Findings) -> str:
    if not f.problems:
        return "Nothing stands out."
    if f.log_messages and not any((f.stragglers, f.outliers, f.non_finite, f.memory, f.decisions)):
        return "No rank stands out in the numbers; read the warnings and errors above."
    return "See above: which rank, from which step, how much."


def _plot_keys(reader: Any, f: Findings) -> list[str]:
    keys = f.keys_with_findings()
    if not keys:
        every = reader.keys(f.run_id)
        keys = sorted(every, key=lambda k: ("loss" not in k.lower(), k))[:MAIN_KEYS]
    return keys[:MAX_PLOTS]


def write_html(reader: Any, f: Findings, path: str | os.PathLike[str]) -> list[str]:
    """Write the findings and their plots to ``path``, one self-contained HTML file.

    Returns:
        The keys plotted.

    Raises:
        MissingExtra: when matplotlib is not installed.
    """
    from multirank_logger.report.plots import figure_png, plot_key

    keys = _plot_keys(reader, f)
    pngs = []
    for phase in dict.fromkeys(s["phase"] for s in f.stragglers):  # where the stragglers lose their time
        timing = reader.sql(f"SELECT step, rank, {phase}_s AS t FROM step_timing WHERE run_id = {f.run_id}")
        table = timing.dropna().pivot_table(index="step", columns="rank", values="t", aggfunc="sum") * 1e3
        slow = sorted({s["rank"] for s in f.stragglers if s["phase"] == phase})
        figure = plot_key(table, f"{phase} (ms)", slow, f"{phase} (ms) per rank")
        pngs.append((f"{phase} per rank", figure_png(figure)))
    for key in keys:
        outliers = sorted({o["rank"] for o in f.outliers if o["key"] == key})
        bad = {n["rank"]: n["first_step"] for n in f.non_finite if n["key"] == key}
        table = reader.per_rank(key, f.run_id)
        pngs.append((f"{key} per rank", figure_png(plot_key(table, key, outliers, f"{key} per rank", non_finite=bad))))
    figures = [
        f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}"></figure>'
        for alt, png in pngs
    ]
    body = [f"<h1>Report for {html.escape(f.run)}</h1>",
            f"<p>run {f.run_id}, {f.world_size} ranks. "
            + ("Findings below." if f.problems else "Nothing stands out.") + "</p>"]  # fmt: skip
    for title, lines in _lines(f):
        items = "".join(f"<li>{html.escape(line)}</li>" for line in lines) or "<li class=none>none</li>"
        body.append(f"<h2>{html.escape(title)}</h2><ul>{items}</ul>")
    body += [f"<p class=note>{html.escape(note)}</p>" for note in f.notes]
    body.append("<h2>Per rank</h2>" + "".join(figures))
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(f.run)}: multirank-logger report</title><style>{_STYLE}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(page)
    return keys


_STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:1000px;color:#222}"
    "h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.4em;border-bottom:1px solid #ccc}"
    "li{margin:.2em 0}.none{color:#888}.note{color:#555;font-style:italic}"
    "img{max-width:100%;border:1px solid #ddd}"
)
