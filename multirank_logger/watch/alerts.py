"""Where an alert goes: rank 0's console, the ``alerts`` table, ``on_alert`` and ``alert_url``.

Each new finding of the watch (watch.py) is raised once, here, on the watch's thread:

- one line on rank 0's console at once (standard error): the finding's one sentence, e.g.
  ``rank 37 train_loss NaN from step 1,200; followed by ranks 0-36,38-63 at step 1,201 (...)
  (seen at step 1,204)`` (judgement/sentences.py);
- a row of the ``alerts`` table, through rank 0's own side rows (the writer stores it with its
  next cycle, spills it like any row);
- ``on_alert(alert)``, the user's callable: its exceptions are caught and said (once per
  exception type), never raised into training;
- ``alert_url``: a POST of JSON with a ``text`` field (Slack and Mattermost take it) that names
  the run, a ``run`` object (name, version, id, UUID, rank 0's host, the store without its
  password: `run_facts`) and the ``alert``'s fields, on a
  thread of its own, with a bounded timeout and retries; no redirect is followed (the URL's
  credentials never reach another host), and the answer is read up to a small bound. The first
  failure is said at once, and at the run's end how many alerts the hook did not take; the URL is
  shown as its scheme and host only (a webhook's path is its token: never on a console line, in
  a log record or a stored row).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import queue
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from multirank_logger.ddp.log_capture import SHOWN
from multirank_logger.judgement.finding import Finding
from multirank_logger.judgement.sentences import KINDS, cost_clause
from multirank_logger.rows.run_ref import RunRef
from multirank_logger.rows.schema import alerts as alerts_table

__all__ = ["ALERT_KINDS", "Alert", "AlertOutlets", "Webhook", "redact_url", "run_facts", "webhook_payload"]

log = logging.getLogger(__name__)

#: the kinds of alert the watch raises: the kinds of finding (judgement/sentences.py)
ALERT_KINDS = frozenset(KINDS)
#: seconds one webhook request may take
WEBHOOK_TIMEOUT_S = 5.0
#: tries of one webhook POST (with 1 s, 2 s between them)
WEBHOOK_TRIES = 3
#: alerts waiting for the webhook at most (past that new ones are dropped, counted and said)
WEBHOOK_QUEUE = 1000
#: bytes of the webhook's answer read at most (the answer is not used; a huge one is never read whole)
WEBHOOK_ANSWER_BYTES = 64 * 1024


@dataclass(frozen=True)
class Alert:
    """One alert: what `on_alert` gets, and what the ``alerts`` table holds.

    ``kind``: ``non_finite``, ``departure``, ``straggler``, ``memory`` (or ``stop``: StopOnAlert
    ended the fit); ``rank``: the rank it names; ``key``: the metric key (``timing:data_s``...
    for a straggler, the memory measure); ``first_step``: the finding's first step, as the
    report gives it; ``step_seen``: the newest step the watch held; ``seen_at``: unix time.
    """

    kind: str
    rank: int
    key: str
    first_step: int | None
    step_seen: int | None
    seen_at: float
    value: float | None
    message: str
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def redact_url(url: str) -> str:
    """A webhook URL as it may be shown: scheme and host (no user, password, path or query)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}/…"
    except ValueError:
        return "(the alert_url)"


def check_alert_url(url: str | None) -> None:
    """A clear error at the call for an alert_url that cannot be posted to (its text never shown)."""
    if url is None:
        return
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("alert_url: pass an http:// or https:// URL (a Slack or Mattermost incoming webhook), or None.")


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: the alert_url's credentials (basic auth) go to its own host only,
    never to whatever host a redirect names; urllib then raises the 3xx as an HTTPError."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> None:
        return None


class Webhook:
    """POSTs each alert's JSON on a thread of its own; what it did not take is counted and said.

    An alert is tried `tries` times (a pause of `backoff`, then twice that, between them); once
    one failed every try, each later alert is tried once while the hook keeps failing (a dead
    hook must not hold the queue for minutes), and the full tries again after one is taken. A
    redirect is a failure, not followed. The first failure is said at once; `close` (the run's
    end) says how many of the alerts were not delivered, and why.
    """

    def __init__(self, url: str, timeout: float | None = None, tries: int | None = None,
                 backoff: float = 1.0, queue_size: int | None = None) -> None:
        parts = urlsplit(url)
        self._headers = {"Content-Type": "application/json"}
        if parts.username is not None:  # user:password@ in the URL: HTTP basic auth (urllib sends none itself)
            token = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            self._headers["Authorization"] = "Basic " + base64.b64encode(token).decode()
            host = parts.hostname or ""
            netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
            url = urlunsplit(parts._replace(netloc=netloc))
        self._url = url
        self.shown = redact_url(url)
        self.timeout = WEBHOOK_TIMEOUT_S if timeout is None else timeout
        self.tries = WEBHOOK_TRIES if tries is None else tries
        self.backoff = backoff
        self.queue_size = WEBHOOK_QUEUE if queue_size is None else queue_size
        self._opener = urllib.request.build_opener(_RefuseRedirects)
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(self.queue_size)
        self._counts = threading.Lock()  # send() runs on the watch's thread, _run on the hook's
        self.offered = 0  # every alert handed to send()
        self.sent = 0  # taken by the hook (a 2xx answer)
        self.failed = 0  # refused or unanswered after its tries
        self.dropped = 0  # not queued: queue_size alerts were waiting already
        self.last_failure = ""  # why the latest failed one failed (never the URL)
        self._failing = False
        self._said_failure = False
        self._said_full = False
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="multirank-logger-alert-webhook", daemon=True)
        self._thread.start()

    @property
    def not_delivered(self) -> int:
        """Alerts handed over that the hook has not taken (failed, dropped, or still waiting)."""
        return self.offered - self.sent

    def send(self, payload: dict[str, Any]) -> None:
        with self._counts:
            self.offered += 1
        try:
            self._queue.put_nowait(payload)
        except queue.Full:
            with self._counts:
                self.dropped += 1
            if not self._said_full:
                self._said_full = True
                say(f"the alert webhook {self.shown} has {self.queue_size} alerts waiting (it takes them slower "
                    "than they are raised); later alerts are dropped while the queue is full, counted, and "
                    "the count said at the run's end.")

    def close(self, timeout: float = 0.0) -> None:
        """Stop after what is queued, waiting at most `timeout`; then say how many alerts were not
        delivered (failed, dropped, or still waiting: those are not sent)."""
        self._closing.set()
        try:
            self._queue.put_nowait(None)  # wakes a thread waiting on an empty queue
        except queue.Full:
            pass  # a full queue: the thread ends when it has emptied it (see _run)
        self._thread.join(timeout)
        if self.not_delivered:
            say(self.end_line())

    def end_line(self) -> str:
        """E.g. ``12 of 40 alerts were not delivered to the webhook https://host/…: HTTP 500``."""
        with self._counts:
            offered, missed, failed, dropped = self.offered, self.offered - self.sent, self.failed, self.dropped
        waiting = missed - failed - dropped  # queued or in flight when the run ended
        why = []
        if failed:
            why.append(self.last_failure if failed == missed else f"{failed} failed ({self.last_failure})")
        if dropped:
            why.append(f"{dropped} dropped while {self.queue_size} were waiting")
        if waiting:
            why.append(f"{waiting} still waiting when the run ended (not sent)")
        return f"{missed} of {offered} alerts were not delivered to the webhook {self.shown}: {'; '.join(why)}"

    def _run(self) -> None:
        while (payload := self._queue.get()) is not None:
            self._deliver(payload)
            if self._closing.is_set() and self._queue.empty():
                break  # closed while the queue was full (no room for close's None): all taken

    def _deliver(self, payload: dict[str, Any]) -> None:
        data = json.dumps(payload, default=str).encode()
        tries = 1 if self._failing else self.tries
        why, again = "", False
        for attempt in range(tries):
            why, again = self._post(data)
            if not why:
                with self._counts:
                    self.sent += 1
                self._failing = False
                return
            if not again:
                break
            if attempt + 1 < tries:
                time.sleep(self.backoff * (attempt + 1))
        with self._counts:
            self.failed += 1
            self.last_failure = why
        self._failing = True
        if not self._said_failure:
            self._said_failure = True
            tried = f" after {tries} tries" if tries > 1 and again else ""
            say(f"the alert webhook {self.shown} did not take an alert{tried} ({why}); while it keeps failing "
                "each later alert is tried once, and how many it did not take is said at the run's end.")

    def _post(self, data: bytes) -> tuple[str, bool]:
        """One POST: ``("", _)`` when taken, else why not (never the URL) and whether a retry may help."""
        request = urllib.request.Request(self._url, data=data, method="POST", headers=self._headers)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                response.read(WEBHOOK_ANSWER_BYTES)  # the answer is not used: never read a huge one whole
            return "", False
        except urllib.error.HTTPError as exc:  # the status only: its text may echo the URL
            exc.close()  # its body unread
            if 300 <= exc.code < 400:
                return (f"HTTP {exc.code}: a redirect, not followed (the alert and the URL's credentials go to "
                        "alert_url's own host only; set alert_url to the address the hook redirects to)"), False
            return f"HTTP {exc.code}", exc.code >= 500 or exc.code == 429
        except Exception as exc:  # noqa: BLE001 - a webhook never takes the run down
            return _reason(exc), True


def say(message: str, level: int = logging.WARNING) -> None:
    """A line on rank 0's console now (standard error, as an alert's), and a log record (the
    run's ``logs`` table keeps it); the record is not printed again by logging's last resort."""
    print(f"multirank_logger: {message}", file=sys.stderr, flush=True)
    if log.isEnabledFor(level):
        record = log.makeRecord(log.name, level, __file__, 0, f"multirank_logger: {message}", (), None,
                                extra={SHOWN: True})
        for handler in _handlers(log):
            if record.levelno >= handler.level:
                handler.handle(record)


def _handlers(logger: logging.Logger) -> list[logging.Handler]:
    """The handlers a record of `logger` reaches, less those writing to the console (the line is
    printed already) and logging's last resort."""
    out: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        out += [h for h in current.handlers if not _to_console(h)]
        current = current.parent if current.propagate else None
    return out


def _to_console(handler: logging.Handler) -> bool:
    stream = getattr(handler, "stream", None)
    return type(handler) is logging.StreamHandler and stream in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)


def _reason(exc: BaseException) -> str:
    """Why a POST failed, in words that never hold the URL."""
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        if isinstance(reason, BaseException):
            return type(reason).__name__ + (" (timed out)" if "timed out" in str(reason) else "")
        return "URLError"
    if isinstance(exc, TimeoutError) or "timed out" in str(exc):
        return "timed out"
    return type(exc).__name__


class AlertOutlets:
    """Each alert, once, to the console, the store, the callable and the webhook.

    Args:
        record: appends a row to rank 0's side rows (``SideRecords.add``).
        on_alert: the user's callable, or None.
        alert_url: the webhook, or None.
        echo: print the console line (rank 0's standard error).
        run: which run, for the webhook's payload (`run_facts`): a channel that ten jobs share
            must tell them apart.
    """

    def __init__(self, record: Callable[[str, dict[str, Any]], None], on_alert: Callable[[Alert], Any] | None = None,
                 alert_url: str | None = None, echo: bool = True, run: dict[str, Any] | None = None) -> None:
        self.record = record
        self.run = run or {}
        self.on_alert = on_alert
        self.webhook = Webhook(alert_url) if alert_url else None
        self.echo = echo
        self.raised: list[Alert] = []
        self._lock = threading.Lock()
        self._callable_failures: set[str] = set()

    def raise_alert(self, finding: Finding, at_end: bool = False) -> Alert:
        """`finding` as an alert, delivered; `at_end`: found by the last judgement, once every
        rank's last rows were in (said so: it could not stop or warn the run any earlier)."""
        detail = dict(finding.detail)
        # a straggler's cost so far beside its sentence (judgement/cost.py); in `detail` too, for on_alert and the webhook
        cost = cost_clause(finding.kind, [finding.item()], so_far=not at_end)
        message = finding.sentence + cost + ("; found at the run's end" if at_end else "")
        if at_end:
            detail["at_end"] = True
        if finding.spread is not None:  # where it started: the stop, the page and a later reader name the origin
            detail.update(spread=finding.spread, origin=finding.origin)
        alert = Alert(finding.kind, finding.rank, finding.key, finding.first_step, finding.step_seen, time.time(),
                      finding.value, message, detail)
        self.deliver(alert)
        return alert

    def deliver(self, alert: Alert) -> None:
        with self._lock:
            self.raised.append(alert)
        if self.echo:
            print(f"multirank_logger alert: {alert.message}", file=sys.stderr, flush=True)
        value = _finite(alert.value)
        row = {"rank": alert.rank, "kind": alert.kind, "key": alert.key, "first_step": alert.first_step,
               "step_seen": alert.step_seen, "seen_at": alert.seen_at, "value": value,
               "detail": json.dumps(alert.detail, default=_jsonable), "message": alert.message}
        try:
            self.record(alerts_table.name, row)
        except Exception as exc:  # noqa: BLE001
            say(f"an alert could not be kept for the store: {exc}")
        if self.on_alert is not None:
            try:
                self.on_alert(alert)
            # BaseException: a sys.exit or KeyboardInterrupt raised in it would end the watch's thread
            except BaseException as exc:  # noqa: BLE001 - the user's callable never reaches training
                name = type(exc).__name__
                if name not in self._callable_failures:
                    self._callable_failures.add(name)
                    say(f"on_alert raised {name}: {exc} (caught: training goes on; said once per exception type)")
        if self.webhook is not None:
            self.webhook.send(webhook_payload(alert, self.run))

    def close(self, timeout: float = 0.0) -> None:
        if self.webhook is not None:
            self.webhook.close(timeout)


def run_facts(ref: RunRef, store: str) -> dict[str, Any]:
    """Which run an alert is about, as its webhook payload says it: name, version, id, UUID, rank
    0's host and the store as `public_name` gives it (no password)."""
    return {"name": ref.name, "version": ref.dir_name, "id": ref.id, "uuid": ref.uuid, "host": socket.gethostname(),
            "store": store}


def webhook_payload(alert: Alert, run: dict[str, Any]) -> dict[str, Any]:
    """The JSON an alert is POSTed as: Slack's and Mattermost's ``text`` (which names the run: a
    channel many jobs share), the run, and the alert's fields."""
    value = _finite(alert.value)
    where = f"{run['name']}/{run['version']} on {run['host']}: " if run else ""
    return {"text": f"multirank_logger: {where}{alert.message}", "run": run, "alert": {**alert.to_dict(), "value": value}}


def _finite(value: float | None) -> float | None:
    """An alert's number as stored and sent: None for none or NaN (JSON has no NaN)."""
    return value if value is not None and not math.isnan(value) else None


def _jsonable(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)
