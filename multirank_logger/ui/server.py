"""`multirank-logger ui DB`: a local, read-only web server over one store.

The standard library's ``ThreadingHTTPServer`` serves it: a handful of JSON routes and the
package's own static files, for one person on their machine; no framework earns its weight here.

The viewer never blocks the writer: every request opens the store read-only (SQLite ``mode=ro``
under WAL; DuckDB ``read_only``) and closes it before it answers, so a training run that flushes
into a DuckDB file waits at most one query. A store that cannot be read (missing, being created,
of a newer schema, deleted while the server runs) gets a page that says so; the server stays up.

It answers only requests addressed to it: a ``Host`` header naming its own address (or a name
the user allowed, ``--allow-host``), and on the API no cross-site ``Origin``. A page of another
site, served from a name that resolves to 127.0.0.1 (DNS rebinding), gets a 403, never a run.

Routes: ``/`` (the runs), ``/run/ID``, ``/compare?runs=ID,ID,...``, ``/static/FILE``, and under
``/api/``: ``runs``, ``run/ID`` (``?brief=1``: the header only), ``run/ID/findings``, ``run/ID/alerts``, ``run/ID/clock``, ``run/ID/series?name=S``,
``run/ID/line?name=S&rank=R``, ``run/ID/logs``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from multirank_logger.errors import (
    InvalidHostName,
    LookupFailed,
    MultiRankLoggerError,
    NotAStoreFile,
    ReadsStopped,
    StoreUnreachable,
    UnsupportedStore,
)
from multirank_logger.query.reader import StoreReader, open_store
from multirank_logger.query.step_buckets import BucketSummary
from multirank_logger.rows.run_ref import run_number
from multirank_logger.rows.schema import BIGINT_MAX
from multirank_logger.store.backends import public_name, without_secrets
from multirank_logger.store.write_errors import describe
from multirank_logger.ui import views
from multirank_logger.ui.page import STATIC, page_html

__all__ = ["UiServer", "serve"]

#: seconds a request waits for a DuckDB file that a flush holds, before its page says so
LOCK_TIMEOUT_S = 3.0
#: summaries of finished runs kept in memory (a revisit draws at once)
CACHE_ENTRIES = 64
#: connections the kernel queues while every thread is busy: http.server's 5 dropped 11 of 200
#: concurrent requests (their SYNs lost, answered only after retries past 90 s); Linux caps it at somaxconn
REQUEST_QUEUE_SIZE = 1024
#: seconds one request's reads may run before they are stopped and it answers 503 (``--request-timeout``):
#: a heavy request (the findings of a huge run) never holds a thread forever
REQUEST_TIMEOUT_S = 60.0
#: seconds a stopped request's reads may take to end (its queries interrupted again and again meanwhile)
_STOP_GRACE_S = 5.0
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".txt": "text/plain"}


class _Cache:
    """Summaries of runs that are over: their rows no longer change."""

    def __init__(self) -> None:
        self._items: OrderedDict[tuple[int, str], BucketSummary] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[int, str], make: Callable[[], BucketSummary], final: bool) -> BucketSummary:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = make()
        if final:
            with self._lock:
                self._items[key] = value
                while len(self._items) > CACHE_ENTRIES:
                    self._items.popitem(last=False)
        return value


class UiServer(ThreadingHTTPServer):
    daemon_threads = True  # a request still running never holds Ctrl-C up
    request_queue_size = REQUEST_QUEUE_SIZE

    def __init__(self, db: str, host: str = "127.0.0.1", port: int = 0, allowed_hosts: Iterable[str] = (),
                 request_timeout: float | None = REQUEST_TIMEOUT_S) -> None:
        allowed = [allowed_host_name(name) for name in allowed_hosts]  # before the port is bound
        self.db = db
        self.cache = _Cache()
        self.request_timeout = request_timeout
        #: the readers of the requests running now, each with the event set when it has ended
        self._running: dict[StoreReader, threading.Event] = {}
        self._running_lock = threading.Lock()
        #: requests being answered now (not idle keep-alive connections): what `close` waits for
        self._answering = 0
        self._answered = threading.Condition()
        super().__init__((host, port), _Handler)
        self.own_hosts = _own_hosts(str(self.server_address[0])) | set(allowed)

    def host_allowed(self, value: str) -> bool:
        """Whether a ``Host`` header (or an ``Origin``'s host and port) names this server: one of
        its own names at its own port. Any other name may be a rebinding one's (DNS rebinding)."""
        try:
            parts = urlsplit(f"//{value}")
            port = parts.port or 80
        except ValueError:
            return False
        name = (parts.hostname or "").lower()
        if port != self.server_address[1]:
            return False
        if name in self.own_hosts:
            return True
        # bound to every interface: any address of the machine reaches it, and an address (no
        # name) is no rebinding: the browser resolved nothing
        return _is_wildcard(str(self.server_address[0])) and _is_ip(name)

    def host_refusal(self, value: str) -> str:
        """The 403's text: what was refused, and what to pass to allow it."""
        shown = ", ".join(sorted(self.own_hosts))
        return (f"Host {value!r} is not this server's address ({shown}, port {self.server_address[1]}): "
                f"refused, as a page of another site could read the store through it (DNS rebinding). "
                f"To open the page under that name, restart with: multirank-logger ui DB --allow-host {_bare_host(value) or 'NAME'}\n")

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), int(self.server_address[1])
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"

    @contextmanager
    def reader(self) -> Iterator[StoreReader]:
        """The store, open for this request only: one connection for all its queries (a DuckDB
        open costs ~20 ms of CPU), released before the answer goes out."""
        reader = open_store(self.db, lock_timeout=LOCK_TIMEOUT_S)
        # no second SQLite library in a server of concurrent requests: ADBC's driver bundles its own
        # SQLite, whose POSIX locks another request's sqlite3 connection drops when it closes (locks are
        # the process's), and a writer elsewhere may then take the WAL index from under its mmap (SIGBUS)
        reader.store.backend.arrow_reads = False
        ended = threading.Event()
        with self._running_lock:
            self._running[reader] = ended
        bound = None
        if self.request_timeout is not None:
            reason = (f"This request's reads ran past {self.request_timeout:g} s and were stopped. Reload to try again, "
                      f"or restart with a larger --request-timeout (or read the run with multirank-logger report).")
            bound = threading.Timer(self.request_timeout, _stop_reads, (reader, ended, reason))
            bound.daemon = True
            bound.start()
        try:
            with reader.store.writing():  # holds the read-only connection; writes nothing
                yield reader
        except Exception as exc:
            if reader.stopped is not None and not isinstance(exc, ReadsStopped):  # the engine's "interrupted"
                raise ReadsStopped(reader.stopped) from exc
            raise
        finally:
            if bound is not None:
                bound.cancel()
            with self._running_lock:
                self._running.pop(reader, None)
            ended.set()
            reader.close()

    def stop_requests(self) -> None:
        """Stop the reads of every request running now (Ctrl-C: the server is stopping) and wait,
        at most a few seconds, for them to end: no query is left running in the engine at exit."""
        with self._running_lock:
            running = list(self._running.items())
        stoppers = [threading.Thread(target=_stop_reads, args=(reader, ended, "The server is stopping (Ctrl-C)."),
                                     daemon=True) for reader, ended in running]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join(_STOP_GRACE_S + 1)

    @contextmanager
    def answering(self) -> Iterator[None]:
        """One request being answered: `close` waits for its answer to be written."""
        with self._answered:
            self._answering += 1
        try:
            yield
        finally:
            with self._answered:
                self._answering -= 1
                self._answered.notify_all()

    def close(self) -> None:
        """`stop_requests`, the answers of the requests running written (a stopped one's 503),
        then the listening socket closed."""
        self.stop_requests()
        with self._answered:
            self._answered.wait_for(lambda: self._answering == 0, timeout=_STOP_GRACE_S)
        self.server_close()

    def warm_up(self) -> None:
        """Load what the first request needs (pandas, pyarrow, the views) before the URL is shown,
        so the first page is not the one that pays for the imports. A store that cannot be
        read yet is no error here: the page says why. One that never can be is (a path that is
        no store file: a directory, a FIFO, a device, a name of no store's kind), and so is a server that cannot be reached.

        Raises:
            NotAStoreFile, StoreUnreachable, UnsupportedStore: the page could never show a run."""
        try:
            with self.reader() as reader:
                views.runs_view(reader)
        except (NotAStoreFile, StoreUnreachable, UnsupportedStore):
            raise
        except Exception:  # noqa: BLE001 (reported by the page, at the first request)
            pass


def _stop_reads(reader: StoreReader, ended: threading.Event, reason: str) -> None:
    """Interrupt ``reader``'s queries until its request has ended (a query that had not reached the
    engine at the first interrupt is caught by the next), for at most `_STOP_GRACE_S`."""
    ends_by = time.monotonic() + _STOP_GRACE_S
    while not ended.is_set() and time.monotonic() < ends_by:
        reader.interrupt(reason)
        ended.wait(0.1)


class _Handler(BaseHTTPRequestHandler):
    server: UiServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        if os.environ.get("MULTIRANK_LOGGER_UI_LOG"):
            super().log_message(format, *args)

    #: answering a HEAD: the same status and headers as GET, no body
    _head_only = False

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's name)
        self._head_only = True
        try:
            self.do_GET()
        finally:
            self._head_only = False

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        with self.server.answering():
            self._get()

    def _get(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        try:
            if not self._addressed_to_us(api=parts.path.startswith("/api/")):
                return
            if parts.path.startswith("/api/"):
                try:
                    self._send_json(HTTPStatus.OK, self._api(parts.path[len("/api/") :], query))
                except _Answer as answer:
                    self._send_json(answer.status, {"error": answer.message})
            elif parts.path == "/favicon.ico":
                self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
            elif parts.path.startswith("/static/"):
                self._send_static(parts.path[len("/static/") :])
            elif parts.path in ("/", "/compare") or re.fullmatch(r"/run/\d+", parts.path):
                self._send(HTTPStatus.OK, page_html(), "text/html")
            else:
                self._send(HTTPStatus.NOT_FOUND, page_html(error=f"No page at {parts.path}."), "text/html")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser went away (a reload): nothing to answer

    def _addressed_to_us(self, api: bool) -> bool:
        """Refuse (403) a Host that is not ours, and on the API an Origin of another site. A browser
        always sends Host, so a request without one (HTTP/1.0) comes from no web page: it passes,
        as one without Origin does (a same-origin GET, curl)."""
        host = self.headers.get("Host")
        if host is not None and not self.server.host_allowed(host):
            self._send(HTTPStatus.FORBIDDEN, self.server.host_refusal(host), "text/plain")
            return False
        origin = self.headers.get("Origin")
        if api and origin is not None and not self._same_origin(origin):
            self._send(HTTPStatus.FORBIDDEN, f"Origin {origin!r} is another site: the API answers only this server's own page.\n", "text/plain")
            return False
        return True

    def _same_origin(self, origin: str) -> bool:
        parts = urlsplit(origin)  # "null" (a sandboxed frame, a file:// page) has no host: refused
        return parts.scheme == "http" and bool(parts.netloc) and self.server.host_allowed(parts.netloc)

    def _api(self, route: str, query: dict[str, str]) -> Any:
        try:
            return self._route(route, query)
        except LookupFailed as exc:
            raise _Answer(HTTPStatus.NOT_FOUND, str(exc)) from exc
        except MultiRankLoggerError as exc:
            raise _Answer(HTTPStatus.SERVICE_UNAVAILABLE, str(exc)) from exc
        except _Answer:
            raise
        except Exception as exc:  # a driver's error on a file deleted or replaced under us: say it, stay up
            traceback.print_exc(file=sys.stderr)
            raise _Answer(HTTPStatus.INTERNAL_SERVER_ERROR, f"Could not read {public_name(self.server.db)}: {without_secrets(describe(exc), self.server.db)}") from exc

    def _route(self, route: str, query: dict[str, str]) -> Any:
        if route == "runs":
            with self.server.reader() as reader:
                return views.runs_view(reader)
        m = re.fullmatch(r"run/(\d+)(?:/(findings|series|line|logs|alerts|clock))?", route)
        if m is None:
            raise _Answer(HTTPStatus.NOT_FOUND, f"No API route {route}.")
        run_id, what = run_number(m[1]), m[2]
        if run_id is None:  # past 64 bits: no run has it
            shown = m[1] if len(m[1]) <= 40 else f"{m[1][:20]}...({len(m[1])} digits)"
            raise _Answer(HTTPStatus.NOT_FOUND, f"No run '{shown}': a run id is at most {BIGINT_MAX}.")
        with self.server.reader() as reader:
            ref = reader.resolve_run(run_id)
            if what is None:  # ?brief=1: the header only (what the open page polls: milliseconds)
                return views.runs_view(reader, only=ref.id)[0] if query.get("brief") else views.run_view(reader, ref.id)
            if what == "findings":
                return views.findings_view(reader, ref.id)
            if what == "logs":
                return views.logs_view(reader, ref.id)
            if what == "alerts":
                return views.alerts_view(reader, ref.id)
            if what == "clock":
                return views.clock_view(reader, ref)
            name = query.get("name")
            if not name:
                raise _Answer(HTTPStatus.BAD_REQUEST, "Give the series: ?name=KEY (or timing:COLUMN).")
            final = self._final(reader, ref.id)
            s = self.server.cache.get((ref.id, name), lambda: views.summary(reader, ref.id, name), final)
            if not s.ranks:
                raise _Answer(HTTPStatus.NOT_FOUND, f"Run {ref.id} holds no values of {name!r}.")
            if what == "line":
                given = query.get("rank", "")  # no rank has ten digits: int() is never given thousands
                rank = int(given) if re.fullmatch(r"-?[0-9]{1,10}", given) else -1
                if rank not in s.ranks:
                    raise _Answer(HTTPStatus.NOT_FOUND, f"Rank {rank} logged no {name!r} in run {ref.id}.")
                return views.line_view(s, rank)
            nodes_of, gpus_of = views._places(reader, ref.id)
            return views.series_view(s, nodes_of, gpus_of=gpus_of)

    @staticmethod
    def _final(reader: StoreReader, run_id: int) -> bool:
        """Whether the run is over: its rows no longer change, so its summaries can be kept."""
        return views.run_status(reader, run_id) != "running"

    def _send_static(self, name: str) -> None:
        path = STATIC / name
        if "/" in name or name.startswith(".") or not path.is_file():
            self._send(HTTPStatus.NOT_FOUND, f"No file {name}.".encode(), "text/plain")
            return
        self._send(HTTPStatus.OK, path.read_bytes(), _TYPES.get(path.suffix, "application/octet-stream"), cache=True)

    def _send_json(self, status: HTTPStatus, body: Any) -> None:
        self._send(status, json.dumps(body, allow_nan=False, separators=(",", ":")).encode(), "application/json")

    def _send(self, status: HTTPStatus, body: bytes | str, ctype: str, cache: bool = False) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", f"{ctype}; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "max-age=3600" if cache else "no-store")
        self.end_headers()
        if not self._head_only:
            self.wfile.write(data)


class _Answer(Exception):
    """An API answer that is not a 200: its status and a message the page shows as it is."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _bare_host(value: str) -> str:
    """A Host value or a name the user passed, without its port and brackets, lower case."""
    value = value.strip()
    if _is_ip(value):  # a bare IPv6 address: its colons are no port
        return value.lower()
    try:
        return (urlsplit(f"//{value}").hostname or "").lower()
    except ValueError:
        return value.lower()


_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_][a-z0-9_-]{0,62})*\.?")


def allowed_host_name(value: str) -> str:
    """A host name to allow (``--allow-host``), bare: a name or an address, with a port or without.

    Raises:
        InvalidHostName: for anything else (a URL, a path, a user@, a bad port), with the name
            it may have meant: ``http://evil.com/`` is never taken as a host named "http".
    """
    text = value.strip()
    if _is_ip(text):  # a bare IPv6 address: its colons are no port
        return text.lower()
    if re.fullmatch(r"([A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?", text):
        try:
            parts = urlsplit(f"//{text}")
            parts.port  # noqa: B018 (a port past 65535 or not a number raises ValueError)
            name = (parts.hostname or "").lower()
        except ValueError:
            name = ""
        if name and (_is_ip(name) or _HOST_NAME.fullmatch(name)):
            return name
    try:
        meant = urlsplit(text if "://" in text else f"//{text}").hostname
    except ValueError:
        meant = None
    raise InvalidHostName(value, f"--allow-host {meant}" if meant and meant != text.lower() else None)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _is_wildcard(address: str) -> bool:
    return _is_ip(address) and ipaddress.ip_address(address).is_unspecified


def _own_hosts(address: str) -> set[str]:
    """The names a browser reaching the bound ``address`` puts in ``Host``."""
    own = {address.lower()}
    if address in _LOOPBACK_NAMES or (_is_ip(address) and ipaddress.ip_address(address).is_loopback):
        own.update(_LOOPBACK_NAMES)
    if _is_wildcard(address):  # every interface: the loopback names and this machine's own name
        own.update(_LOOPBACK_NAMES)
        own.update({socket.gethostname().lower(), socket.getfqdn().lower()})
    return own


def serve(db: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 0, *, ready: Callable[[UiServer], None] | None = None,
          allowed_hosts: Iterable[str] = (), request_timeout: float | None = REQUEST_TIMEOUT_S) -> None:
    """Serve ``db`` until interrupted; ``ready(server)`` is called once it listens."""
    server = UiServer(str(Path(db)) if not str(db).count("://") else str(db), host, port, allowed_hosts, request_timeout)
    server.warm_up()
    if ready is not None:
        ready(server)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.close()
