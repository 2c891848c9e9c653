"""The alert webhook against real HTTP servers on 127.0.0.1 (watch/alerts.py's `Webhook`).

No mock of urllib: each test starts `http.server` servers in threads and the webhook POSTs to
them. A redirect is not followed (the URL's credentials never reach the host it names); the
answer is read up to a bound; every alert the hook did not take is counted and said at the end.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from multirank_logger.watch import alerts
from multirank_logger.watch.alerts import AlertOutlets, Webhook

SECRET = "T0KEN-xyz789"  # the hook's path and password: never on a console line


@contextmanager
def _server(answer: Callable[[http.server.BaseHTTPRequestHandler, bytes], None]) -> Iterator[tuple[str, list[dict]]]:
    """A server on 127.0.0.1 in a thread; `answer(handler, body)` answers each POST. Yields its
    base URL and the requests it got (path, Authorization header, JSON body)."""
    got: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            got.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": json.loads(body or b"null")})
            answer(self, body)

        do_GET = do_POST  # noqa: N815 - a followed 302 would come as a GET

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", got
    finally:
        server.shutdown()
        server.server_close()


def _status(code: int, headers: dict[str, str] | None = None) -> Callable[[http.server.BaseHTTPRequestHandler, bytes], None]:
    def answer(handler: http.server.BaseHTTPRequestHandler, body: bytes) -> None:
        handler.send_response(code)
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


def test_a_redirect_is_not_followed_and_the_credentials_stay_home(capsys: pytest.CaptureFixture[str]) -> None:
    """The hook answers 302 to another server: that server gets no request (so no Authorization
    header), the alert counts as not delivered, and the failure is said without path or password."""
    with _server(_status(200)) as (elsewhere, stolen):
        with _server(_status(302, {"Location": f"http://{elsewhere}/steal"})) as (hook, received):
            webhook = Webhook(f"http://bot:pw-{SECRET}@{hook}/hooks/{SECRET}", timeout=5.0, tries=3, backoff=0.01)
            webhook.send({"text": "alert 1"})
            webhook.close(timeout=10.0)
    assert stolen == []  # nothing reached the other host: no credentials, no alert
    assert len(received) == 1 and received[0]["auth"].startswith("Basic ")  # a redirect is not retried
    assert (webhook.sent, webhook.failed) == (0, 1)
    err = capsys.readouterr().err
    assert "did not take an alert (HTTP 302: a redirect, not followed" in err
    assert f"1 of 1 alerts were not delivered to the webhook http://{hook}/…: HTTP 302" in err
    assert SECRET not in err and "pw-" not in err and "/steal" not in err


def test_a_failing_hook_every_alert_not_taken_is_counted(capsys: pytest.CaptureFixture[str]) -> None:
    """40 alerts, the hook answers 500 to 12 of them (whichever try): the end line counts exactly
    12 of 40; the other 28 arrived, each once, though they came after failures (the first
    failure's words, "each later alert is tried", are true)."""
    refused = {i for i in range(40) if i % 10 in (2, 3, 7)}

    def answer(handler: http.server.BaseHTTPRequestHandler, body: bytes) -> None:
        _status(500 if json.loads(body)["i"] in refused else 200)(handler, body)

    with _server(answer) as (hook, received):
        webhook = Webhook(f"http://{hook}/hooks/{SECRET}", timeout=5.0, tries=2, backoff=0.01)
        for i in range(40):
            webhook.send({"i": i})
        webhook.close(timeout=60.0)
    taken = [r["body"]["i"] for r in received if r["body"]["i"] not in refused]
    assert sorted(taken) == sorted(set(range(40)) - refused)
    assert (webhook.offered, webhook.sent, webhook.failed, webhook.dropped) == (40, 28, 12, 0)
    err = capsys.readouterr().err
    assert err.count("did not take an alert") == 1
    assert f"12 of 40 alerts were not delivered to the webhook http://{hook}/…: HTTP 500\n" in err
    assert SECRET not in err


def test_a_full_queue_is_said_once_and_its_drops_counted(capsys: pytest.CaptureFixture[str]) -> None:
    """A hook that holds its first answer: with room for 2 waiting, 2 of 5 alerts are dropped,
    said once when it happens and counted at the end."""
    first_in, release = threading.Event(), threading.Event()

    def answer(handler: http.server.BaseHTTPRequestHandler, body: bytes) -> None:
        first_in.set()
        release.wait(30)
        _status(200)(handler, body)

    with _server(answer) as (hook, received):
        webhook = Webhook(f"http://{hook}/x", timeout=30.0, tries=1, queue_size=2)
        webhook.send({"i": 0})
        assert first_in.wait(30)  # alert 0 is in flight: the queue is empty
        for i in range(1, 5):
            webhook.send({"i": i})
        release.set()
        webhook.close(timeout=30.0)
    assert sorted(r["body"]["i"] for r in received) == [0, 1, 2]
    err = capsys.readouterr().err
    assert err.count("has 2 alerts waiting") == 1
    assert f"2 of 5 alerts were not delivered to the webhook http://{hook}/…: 2 dropped while 2 were waiting" in err


def test_alerts_still_waiting_at_the_end_are_counted(capsys: pytest.CaptureFixture[str]) -> None:
    """The run ends while the hook holds its answer: the alerts in flight or waiting are said as
    not delivered (the close does not wait past its timeout)."""
    release = threading.Event()

    def answer(handler: http.server.BaseHTTPRequestHandler, body: bytes) -> None:
        release.wait(30)
        _status(200)(handler, body)

    with _server(answer) as (hook, _):
        webhook = Webhook(f"http://{hook}/x", timeout=30.0, tries=1)
        for i in range(3):
            webhook.send({"i": i})
        webhook.close(timeout=0.2)
        release.set()
    assert f"3 of 3 alerts were not delivered to the webhook http://{hook}/…: 3 still waiting" in capsys.readouterr().err


def test_a_huge_answer_is_read_only_up_to_the_bound() -> None:
    """The hook answers 200 with a 256 MiB body, written in 64 KiB chunks: the alert is delivered
    and the webhook stopped reading at its bound, so the server could not write the body whole
    (what it wrote is bounded by the bound plus the sockets' buffers)."""
    body_size, chunk = 256 * 2**20, b"x" * 2**16
    written = [0]

    def answer(handler: http.server.BaseHTTPRequestHandler, body: bytes) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(body_size))
        handler.end_headers()
        try:
            while written[0] < body_size:
                handler.wfile.write(chunk)
                written[0] += len(chunk)
        except OSError:  # the client closed: it read no more
            pass

    with _server(answer) as (hook, _):
        webhook = Webhook(f"http://{hook}/x", timeout=30.0, tries=1)
        webhook.send({"i": 0})
        webhook.close(timeout=60.0)
    assert (webhook.sent, webhook.not_delivered) == (1, 0)
    assert alerts.WEBHOOK_ANSWER_BYTES <= 2**16
    assert written[0] < 64 * 2**20  # far from the whole 256 MiB: the client closed after its bound


def test_outlets_close_says_the_count(capsys: pytest.CaptureFixture[str]) -> None:
    """AlertOutlets' close (the run's end) ends the hook and says its count."""
    with _server(_status(500)) as (hook, _):
        outlets = AlertOutlets(lambda table, row: None, alert_url=f"http://{hook}/x", echo=False)
        assert outlets.webhook is not None
        outlets.webhook.tries, outlets.webhook.backoff = 1, 0.0
        for i in range(3):
            outlets.webhook.send({"i": i})
        outlets.close(timeout=30.0)
    assert f"3 of 3 alerts were not delivered to the webhook http://{hook}/…: HTTP 500" in capsys.readouterr().err
