"""A run's findings as terminal text.

The HTML report (``report -o FILE.html``) is the ui's page of the run in one file:
``multirank_logger/ui/report_page.py``; the PNG plots (``plot``) are ``report/plots.py``'s.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from multirank_logger._util.readable import duration_text, number_text
from multirank_logger.judgement.places import finding_ranks, place_clause
from multirank_logger.judgement.ranks import MIN_RANKS
from multirank_logger.judgement.sentences import (
    cost_clause,
    finding_sentence,
    followers_sentence,
    sentence_groups,
    steps_after_clause,
)
from multirank_logger.query.side_tables import stop_text
from multirank_logger.report.findings import Findings

__all__ = ["findings_text"]

#: past this many ranks, the ranks' list counts them per status and names only the ranks that differ
COMPACT_RANKS = 16


def _sections(f: Findings) -> list[tuple[str, list[str]]]:
    """The findings as (section title, lines); shared by the text and the HTML."""
    ranks = _rank_lines(f.ranks)
    timing = [
        f"rank {t['rank']}: data {number_text(t['data_s'], 's')}, forward {number_text(t['forward_s'], 's')}, "
        f"rest {number_text(t['rest_s'], 's')} (median per step over {t['steps']} steps; batch {number_text(t['batch_size'])})"
        for t in f.timing
    ]
    if len(timing) > COMPACT_RANKS:  # the stragglers below name the ranks whose time stands out
        timing = [_timing_summary(f.timing)]
    # each finding's one sentence (judgement/sentences.py), origins first (judgement/origin.py)
    # (the followers of one problem at one step in one sentence: one line at 1,024 ranks), where
    # its ranks are beside it (judgement/places.py), then what it cost
    places = f.places()

    def where(g: list[dict[str, Any]]) -> str:
        return place_clause(finding_ranks(g), places)

    stragglers = [followers_sentence("straggler", g) + where(g) + cost_clause("straggler", g) for g in sentence_groups("straggler", f.stragglers)]
    outliers = [followers_sentence("departure", g) + where(g) for g in sentence_groups("departure", f.outliers)]
    if f.world_size < MIN_RANKS:  # not "none": nothing was judged
        outliers = [f"not judged: it takes {MIN_RANKS} ranks or more, and this run has {f.world_size} "
                    "(with two, each is as far from their median as the other)"]
    non_finite = [f"{followers_sentence('non_finite', g)}{where(g)}{steps_after_clause(g[0])}: {_counts(g)}"
                  for g in sentence_groups("non_finite", f.non_finite)]
    memory = [finding_sentence("memory", m) + where([m]) for m in f.memory]
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
                ("Warnings and errors", logs), ("Notices (library warnings that name no rank; no finding)", notices)]
    always = ("Stragglers", "Outlier ranks", "Non-finite values")  # "none" is an answer there
    return [(title, lines) for title, lines in sections if lines or title in always]


def _counts(items: list[dict[str, Any]]) -> str:
    count, nan, inf = (sum(int(n[k]) for n in items) for k in ("count", "nan", "inf"))
    each = f" on {len(items):,} ranks" if len(items) > 1 else ""
    return f"{count:,} values{each} ({nan:,} NaN, {inf:,} inf)"


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
            + (f"; {len(odd)} differ:" if odd else ""))
    return [head] + [_rank_line(r) for r in odd]


def _timing_summary(timing: list[dict[str, Any]]) -> str:
    def median(col: str) -> float | None:
        values = sorted(t[col] for t in timing if t[col] is not None)
        return values[len(values) // 2] if values else None

    return (f"{len(timing)} ranks, the median rank per step: data {number_text(median('data_s'), 's')}, "
            f"forward {number_text(median('forward_s'), 's')}, rest {number_text(median('rest_s'), 's')}")


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
