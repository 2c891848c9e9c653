"""A store's address: a path or a SQLAlchemy URL resolved to the URL of one of our backends (told by
the file's first bytes, else its suffix), and named without its secrets for every message.

A secret stays in the process that was given it: `public_name` is what is printed, logged and
exchanged between ranks; `without_secrets` cleans a driver's error text that may quote the URL.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from urllib.parse import quote, quote_plus

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

from multirank_logger.errors import UnsupportedStore
from multirank_logger.store.backends.store_files import SUFFIXES, kind_from_bytes

__all__ = ["BACKEND_NAMES", "names_a_store", "public_name", "resolve_url", "without_secrets"]

#: the SQLAlchemy backend names we write (one module next to this one each)
BACKEND_NAMES = ("sqlite", "duckdb", "postgresql")
_STORE_URL = re.compile(rf"^({'|'.join(BACKEND_NAMES)})[a-z0-9+]*://")


def names_a_store(text: str) -> bool:
    """Whether ``text`` names a store: one of our backends' URLs, a path with a store's suffix, or
    a file that begins as a SQLite or DuckDB database does."""
    return bool(_STORE_URL.match(text)) or Path(text).suffix.lower() in SUFFIXES or kind_from_bytes(text) is not None


def public_name(db: str | os.PathLike[str] | URL) -> str:
    """The store named without its password: for every message, log record, import command and
    for what ranks exchange to agree on the store. A secret stays in the process that was given it;
    each rank connects with its own (its `db` argument, or libpq's PGPASSWORD, PGPASSFILE, service file).
    """
    if isinstance(db, URL):  # libpq also takes a password as a query parameter
        public = db._replace(password=None).difference_update_query(_SECRET_QUERY_KEYS)
        return public.render_as_string(hide_password=False)
    text = os.fspath(db)
    if not re.match(r"^[a-z][a-z0-9+]*://", text):
        return text  # a path
    try:
        return public_name(make_url(text))
    except (sa.exc.ArgumentError, ValueError):  # no URL SQLAlchemy can read: drop what sits between "user:" and the last "@"
        text = re.sub(r"^([a-z][a-z0-9+]*://[^:/@]*):.*@", r"\1@", text)
        return re.sub(rf"([?&](?:{'|'.join(_SECRET_QUERY_KEYS)})=)[^&]*", r"\1***", text)


def without_secrets(text: str, db: str | os.PathLike[str] | URL) -> str:
    """`text` (an error's, say: a driver may quote the URL it was given) with the store's secrets
    (its password, raw and URL-quoted, and the secret query parameters) replaced by ``***``."""
    if not isinstance(db, URL):
        name = os.fspath(db)
        if not re.match(r"^[a-z][a-z0-9+]*://", name):
            return text  # a path
        try:
            db = make_url(name)
        except (sa.exc.ArgumentError, ValueError):  # no URL SQLAlchemy reads: the whole of it goes
            return text.replace(name, public_name(name))
    secrets = [db.password or ""] + [str(v) for k, v in db.query.items() if k in _SECRET_QUERY_KEYS]
    for secret in filter(None, secrets):
        for form in {str(secret), quote(str(secret), safe=""), quote_plus(str(secret))}:
            text = text.replace(form, "***")
    return text


#: query parameters of a URL that carry a secret (libpq's keywords), dropped by `public_name`
_SECRET_QUERY_KEYS = ("password", "sslpassword")


def resolve_url(db: str | os.PathLike[str] | URL) -> URL:
    """Turn a filesystem path or a SQLAlchemy URL into a URL, choosing the backend by suffix.

    Raises:
        UnsupportedStore: for a path whose suffix names no backend we write.
    """
    if isinstance(db, URL):
        return db
    text = os.fspath(db)
    if re.match(r"^[a-z][a-z0-9+]*://", text):
        try:
            url = make_url(text)
        except (sa.exc.ArgumentError, ValueError):  # its message would quote the text, password included
            raise UnsupportedStore(public_name(text), SUFFIXES) from None
        if url.get_backend_name() not in BACKEND_NAMES:
            raise UnsupportedStore(public_name(text), SUFFIXES)
        return _with_postgres_driver(url)
    kind = kind_from_bytes(text) or SUFFIXES.get(Path(text).suffix.lower())
    if kind is None:
        raise UnsupportedStore(text, SUFFIXES)
    return URL.create(kind, database=str(Path(text).expanduser().resolve()))


def _with_postgres_driver(url: URL) -> URL:
    """``postgresql://`` means psycopg2 to SQLAlchemy; our ``postgres`` extra installs psycopg 3.
    Take psycopg 3 whenever the URL names no driver and it is installed (psycopg2 beside it, a
    dependency of something else, must not take its place: COPY and `sql()` need psycopg 3);
    ``postgresql+psycopg2://`` still chooses psycopg2."""
    if url.drivername == "postgresql" and importlib.util.find_spec("psycopg") is not None:
        return url.set(drivername="postgresql+psycopg")
    return url
