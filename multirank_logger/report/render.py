"""A run's findings as terminal text.

The HTML report (``report -o FILE.html``) is the ui's page of the run in one file:
``multirank_logger/ui/report_page.py``; the PNG plots (``plot``) are ``report/plots.py``'s.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from multirank_logger._util.readable import duration_text
from multirank_logger.judgement.ranks import MIN_RANKS
from multirank_logger.query.side_tables import stop_text
from multirank_logger.report.findings import Findings

__all__ = ["findings_text"]

#: past this many ranks, the ranks' list counts them per status and names only the ranks that differ
COMPACT_RANKS = 16


def _readable(value: Any, unit: str = "") -> str:
    """A number for a reader: seconds as ms, bytes as MiB, else 4 significant digits; "-" for none."""
    if value is None or value != value:
        return "-"
    if unit == "s":
        return f"{value * 1e3:.3g} ms"
    if unit == "B":
        return f"{value / 2**20:,.0f} MiB"
    return f"{value:.4g}"


def _sections(f: Findings) -> list[tuple[str, list[str]]]:
    """The findings as (section title, lines); shared by the text and the HTML."""
    ranks = _rank_lines(f.ranks)
    timing = [
        f"rank {t['rank']}: data {_readable(t['data_s'], 's')}, forward {_readable(t['forward_s'], 's')}, "
        f"rest {_readable(t['rest_s'], 's')} (median per step over {t['steps']} steps; batch {_readable(t['batch_size'])})"
        for t in f.timing
    ]
    if len(timing) > COMPACT_RANKS:  # the stragglers below name the ranks whose time stands out
        timing = [_timing_summary(f.timing)]
    stragglers = [
        f"rank {s['rank']}: {s['phase']} {_readable(s['excess_s'], 's')} longer than the other ranks per step "
        f"({s['share_of_step']:.0%} of a step) from step {s['first_step']} to {s['last_step']} ({s['steps']} steps)"
        for s in f.stragglers
    ]
    outliers = [
        f"{o['key']}: rank {o['rank']} departs from the ranks' median from step {o['first_step']} to "
        f"{o['last_step']} ({o['steps']} steps): {_readable(o['excess'])} off"
        + (f", {_readable(o['ratio'])}x the median" if o["ratio"] is not None else "")
        + f", {_readable(o['spreads'])}x the ranks' typical spread"
        for o in f.outliers
    ]
    if f.world_size < MIN_RANKS:  # not "none": nothing was judged
        outliers = [f"not judged: it takes {MIN_RANKS} ranks or more, and this run has {f.world_size} "
                    "(with two, each is as far from their median as the other)"]  # fmt: skip
    non_finite = [
        f"{n['key']}: rank {n['rank']} first at step {n['first_step']}, {n['count']} values "
        f"({n['nan']} NaN, {n['inf']} inf)"
        for n in f.non_finite
    ]
    memory = [
        f"rank {m['rank']}: peak {m['measure']} {_readable(m['peak_bytes'], 'B')}, other ranks' median "
        f"{_readable(m['others_median_bytes'], 'B')}"
        + (f", {m['alloc_retries']} allocator retries" if m["alloc_retries"] else "")
        for m in f.memory
    ]
    decisions = [
        f"step {d['step']} {d['callback']} ({d['monitor']}): {_decided(d['callback'], d['decision'])}; votes "
        + ", ".join(f"rank {r} {_vote(v)}" for r, v in d["votes"].items())
        for d in f.decisions
    ]
    logs, notices = ([f"{m['level']} on ranks {m['ranks']} ({m['count']}x): {m['message']}" for m in messages]
                     for messages in (f.log_messages, f.library_warnings))
    alerts = [
        f"{time.strftime('%H:%M:%S', time.localtime(a['seen_at']))} {a['message']}"
        + ("" if a["in_report"] is None else " [found here too]" if a["in_report"] else " [not a finding of the whole run]")
        for a in f.alerts
    ]
    sections = [("Alerts raised during the run", alerts), ("Ranks", ranks), ("Step timing", timing), ("Stragglers", stragglers), ("Outlier ranks", outliers),
                ("Non-finite values", non_finite), ("Memory", memory), ("Decisions the ranks disagreed on", decisions),
                ("Warnings and errors", logs), ("Notices (library warnings that name no rank; no finding)", notices)]  # fmt: skip
    always = ("Stragglers", "Outlier ranks", "Non-finite values")  # "none" is an answer there
    return [(title, lines) for title, lines in sections if lines or title in always]


#: what a decision did, in the words of `multirank-logger decisions` and the page
DECIDED = {"ModelCheckpoint": ("saved", "not saved"), "EarlyStopping": ("stop", "continue")}


def _decided(callback: str, decision: Any) -> str:
    done, not_done = DECIDED.get(callback, ("yes", "no"))
    return "-" if decision is None else done if decision else not_done


def _vote(vote: Any) -> str:
    return "-" if vote is None else "yes" if vote else "no"


def _rank_line(r: dict[str, Any]) -> str:
    took = f", its part took {duration_text(r['duration_s'])}" if r["duration_s"] is not None else ""
    return f"rank {r['rank']}: {r['status']} on {r['host'] or '?'}, {r['steps']} logged steps{took}"


def _rank_lines(ranks: list[dict[str, Any]]) -> list[str]:
    """One line per rank; past COMPACT_RANKS, the count per status and each rank that differs
    from the most: another status, or another number of logged steps."""
    if len(ranks) <= COMPACT_RANKS:
        return [_rank_line(r) for r in ranks]
    statuses = Counter(r["status"] for r in ranks)
    usual_status = statuses.most_common(1)[0][0]
    usual_steps = Counter(r["steps"] for r in ranks).most_common(1)[0][0]
    hosts = len({r["host"] for r in ranks})
    odd = [r for r in ranks if r["status"] != usual_status or r["steps"] != usual_steps]
    head = (f"{len(ranks)} ranks on {hosts} host(s): " + ", ".join(f"{n} {status}" for status, n in statuses.most_common())
            + f"; {len(ranks) - len(odd)} with {usual_steps} logged steps"
            + (f"; {len(odd)} differ:" if odd else ""))  # fmt: skip
    return [head] + [_rank_line(r) for r in odd]


def _timing_summary(timing: list[dict[str, Any]]) -> str:
    def median(col: str) -> float | None:
        values = sorted(t[col] for t in timing if t[col] is not None)
        return values[len(values) // 2] if values else None

    return (f"{len(timing)} ranks, the median rank per step: data {_readable(median('data_s'), 's')}, "
            f"forward {_readable(median('forward_s'), 's')}, rest {_readable(median('rest_s'), 's')}")  # fmt: skip


def findings_text(f: Findings) -> str:
    """The findings for a terminal."""
    out = [f"Report for {f.run} (run {f.run_id}, {f.world_size} ranks)"]
    if f.stopped_by is not None:  # why it ended where it did: the ranks' steps below stop there
        text = stop_text(f.stopped_by)
        out.append(f"{text[0].upper()}{text[1:]}: the fit ended there on every rank.")
    for title, lines in _sections(f):
        out += ["", f"{title}:"] + [f"  {line}" for line in lines or ["none"]]
    notes = [n for n in f.notes if not (f.world_size < MIN_RANKS and n.startswith("Outlier ranks need"))]  # said above
    out += [""] + notes if notes else []
    out += ["", _verdict(f)]
    return "\n".join(out)


def _verdict(f: Findings) -> str:
    if not f.problems:
        return "Nothing stands out."
    if f.log_messages and not any((f.stragglers, f.outliers, f.non_finite, f.memory, f.decisions)):
        return "No rank stands out in the numbers; read the warnings and errors above."
    return "See above: which rank, from which step, how much."
