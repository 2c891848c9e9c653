"""A finding in words: one sentence per finding, the same on every surface.

The console alert, the webhook's ``text``, the report (text and HTML), the page and the stop's
reason all say a finding with `finding_sentence`; none words one itself. A sentence leads with
the event (``rank 2 train_loss NaN from step 150``), then how it spread (origin.py), then its
numbers; an alert adds the step the watch had reached (``seen at step 199``).

The item is the report's JSON item of the kind, or a finding record's (`judgement.finding.Finding.item`):
the same fields (``rank``, ``first_step``, ``last_step``, ``steps``, the kind's numbers, and
``spread`` where several ranks show it).
"""

from __future__ import annotations

from typing import Any

from multirank_logger._util.readable import duration_text, format_ranks, number_text

__all__ = ["KINDS", "cost_clause", "finding_sentence", "followers_sentence", "sentence_groups", "series_of", "steps_after_clause"]

#: the kinds of finding the watch raises and the report lists, with the series each is on
KINDS = ("non_finite", "departure", "straggler", "memory")


def series_of(kind: str, item: dict[str, Any]) -> str:
    """The series a finding is on, as the page names it: a metric key, ``timing:data_s`` for a
    straggler's phase, the memory measure (``timing:rss``, or DeviceStatsMonitor's key)."""
    if kind == "straggler":
        return f"timing:{item['phase']}_s"
    if kind == "memory":
        measure = str(item["measure"])  # StepTimer's column, or the metric key DeviceStatsMonitor logged it under
        return measure if "/" in measure else f"timing:{measure}"
    return str(item["key"])


def finding_sentence(kind: str, item: dict[str, Any], seen_step: int | None = None) -> str:
    """The one sentence of a finding (see the module docstring); `seen_step`: an alert's newest step."""
    rank = item["rank"]
    text: str
    if kind == "non_finite":
        text = f"rank {rank} {item['key']} {_non_finite_word(item)} from step {item['first_step']:,}"
    elif kind == "departure":
        times = f", {number_text(item['ratio'])}x the median" if item.get("ratio") is not None else ""
        text = (f"rank {rank} {item['key']} departs from the other ranks {_stretch(item)}: "
                f"{number_text(item.get('excess'))} off{times}, {number_text(item.get('spreads'))}x the ranks' typical spread")
    elif kind == "straggler":
        text = (f"rank {rank} straggles in {item['phase']} {_stretch(item)}: {number_text(item.get('excess_s'), 's')} "
                f"longer than the other ranks per step ({item.get('share_of_step', float('nan')):.0%} of a step)")
    elif kind == "memory":
        ratio = item.get("ratio")
        size = f", {ratio:.2f}x the other ranks' median peak" if ratio is not None else ""
        retries = f", {item['alloc_retries']} allocator retries" if item.get("alloc_retries") else ""
        text = (f"rank {rank} stands out in peak memory ({item['measure']}): {number_text(item.get('peak_bytes'), 'B')}"
                f"{size} ({number_text(item.get('others_median_bytes'), 'B')}){retries}")
    else:
        text = f"rank {rank} {item.get('key', '')}: {kind}"
    text += _spread_clause(item)
    return text + (f" (seen at step {seen_step:,})" if seen_step is not None else "")


def followers_sentence(kind: str, items: list[dict[str, Any]]) -> str:
    """One sentence for the followers of one problem that went at the same step (items of one
    kind, on one series, each naming the same origin): at 1,024 ranks, one line, not 1,023. The
    origins of one problem (every rank of a host going at one step) are one sentence too
    (`_origins_sentence`)."""
    if len(items) == 1:
        return finding_sentence(kind, items[0])
    if items[0].get("origin"):
        return _origins_sentence(kind, items)
    first, spread = items[0], items[0]["spread"]
    ranks = format_ranks(int(i["rank"]) for i in items)
    if kind == "non_finite":
        what = f"{first['key']} {_non_finite_word(first)}"
    elif kind == "departure":
        what = f"{first['key']} depart from the other ranks"
    elif kind == "straggler":
        what = f"straggle in {first['phase']}"
    else:
        what = f"{series_of(kind, first)}: {kind}"
    return (f"{ranks} {what} from step {first['first_step']:,}, after {format_ranks(spread['origin_ranks'])} "
            f"at step {spread['origin_step']:,}")


def sentence_groups(kind: str, items: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """`items` (ordered by origin.with_origin) cut where a sentence is said: the origins of one
    problem together (the ranks that went at its first step: every rank of a host), the followers
    of one problem at one step together (`followers_sentence`)."""
    groups: list[list[dict[str, Any]]] = []
    for item in items:
        prev = groups[-1][-1] if groups else None
        together = (prev is not None and bool(item.get("origin")) == bool(prev.get("origin")) and item.get("spread")
                    and prev.get("spread") and series_of(kind, prev) == series_of(kind, item)
                    and prev["first_step"] == item["first_step"]
                    and (not item.get("origin") or prev["spread"]["origin_ranks"] == item["spread"]["origin_ranks"]))
        if together:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


#: a sentence's verb after one rank, and after several
_PLURAL = {"straggles": "straggle", "departs": "depart", "stands out": "stand out"}


def _origins_sentence(kind: str, items: list[dict[str, Any]]) -> str:
    """The ranks that started one problem at one step as one sentence: the first's sentence (its
    numbers; those of ranks going together are alike) led by all of them, without ``with ranks
    ... at the same step`` (they are the subject), then who followed."""
    first = items[0]
    alone = {**first, "spread": {**first["spread"], "origin_ranks": [first["rank"]]}}
    text = finding_sentence(kind, alone).removeprefix(f"rank {first['rank']} ")
    for one, several in _PLURAL.items():
        if text.startswith(one):
            text = several + text[len(one):]
            break
    return f"{format_ranks(int(i['rank']) for i in items)} {text}"


#: follower steps named in a sentence (1,024 ranks following one by one stay one line)
_FOLLOWER_STEPS = 4


def _non_finite_word(item: dict[str, Any]) -> str:
    if isinstance(item.get("value"), str):  # the first value's kind (judgement/non_finite.py)
        return str(item["value"])
    nan, inf = item.get("nan", 0), item.get("inf", 0)
    return "NaN" if nan and not inf else "inf" if inf and not nan else "NaN/inf"


def _stretch(item: dict[str, Any]) -> str:
    last, steps = item.get("last_step"), item.get("steps")
    if last is None or last == item["first_step"]:
        return f"from step {item['first_step']:,}"
    if not steps:
        return f"from step {item['first_step']:,} to {last:,}"
    # `steps`: the steps at which it was off, which a stretch with steps back in line outnumbers
    every = steps == last - item["first_step"] + 1
    return f"from step {item['first_step']:,} to {last:,} ({steps:,} steps)" if every else \
        f"from step {item['first_step']:,} to {last:,} (off at {steps:,} of these steps)"


def cost_clause(kind: str, items: list[dict[str, Any]], so_far: bool = False) -> str:
    """What a straggler (or the stragglers of one sentence group) cost (judgement/cost.py): the
    time every rank waited on it and the device time lost; `so_far`: an alert's, while it may still
    straggle. Said beside the sentence, not in it: a finding's sentence is said alike everywhere,
    and its cost grows with the run (the report's is over its whole stretch)."""
    # a straggler's cost per rank counts the same steps as its neighbours': a group waited at
    # least the largest of them, not their sum
    item = max(items, key=lambda i: i.get("waited_s") or 0.0)
    at_least = len(items) > 1
    if kind == "straggler" and item.get("waited_s") is not None:
        waited = float(item["waited_s"])
        said = number_text(waited, "s") if waited < 1 else duration_text(waited)
        unit = item.get("hours_unit", "rank-hours")
        unit = unit if unit == "GPU-hours" else f"{unit} (CPU ranks)"
        return (f"; every rank waited {'at least ' if at_least else ''}{said} on {'them' if at_least else 'it'} over {item.get('cost_steps', 0):,} "
                f"steps: {number_text(item.get('rank_hours'))} {unit} lost{' so far' if so_far else ''}")
    return ""


def steps_after_clause(item: dict[str, Any]) -> str:
    """A NaN/inf finding's cost where the report computed it (``steps_after``, judgement/cost.py):
    said beside its sentence in the report's text, not in it (the watch's kept verdict words the
    same finding without the run's last step)."""
    if item.get("steps_after") is None:
        return ""
    origin = item["spread"]["origin_step"] if item.get("spread") else item["first_step"]
    return f"; the run trained {int(item['steps_after']):,} steps past step {origin:,}"


def _spread_clause(item: dict[str, Any]) -> str:
    """How the problem spread: the origin names who followed; a follower names the origin."""
    spread = item.get("spread")
    if not spread:
        return ""
    if not item.get("origin"):
        return f", after {format_ranks(spread['origin_ranks'])} at step {spread['origin_step']:,}"
    others = [r for r in spread["origin_ranks"] if r != item["rank"]]
    text = f", with {format_ranks(others)} at the same step" if others else ""
    followers = spread["followers"]
    if not followers:
        return text
    by_step: dict[int, list[int]] = {}
    for r, s in followers:
        by_step.setdefault(s, []).append(r)
    said = [f"{format_ranks(ranks)} at step {s:,}" for s, ranks in list(by_step.items())[:_FOLLOWER_STEPS]]
    later = sum(len(ranks) for ranks in list(by_step.values())[_FOLLOWER_STEPS:])
    text += "; followed by " + ", ".join(said) + (f" and {later} more rank(s) later" if later else "")
    if spread.get("all_reduce"):
        lag = spread["lag"]
        text += f" (every other rank within {lag} step{'s' if lag != 1 else ''}: spread through the gradient all-reduce)"
    return text

