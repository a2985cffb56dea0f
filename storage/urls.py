"""`open_store(url)`: a store from one string, for configuration files and the command line.

| URL | store |
| --- | --- |
| `memory:` | a fresh `MemoryStore` |
| `sqlite:///abs/path.db`, `sqlite:relative/path.db` | `SQLiteStore` on that file |
| `/abs/path.db`, `relative/path.db` (no scheme) | `SQLiteStore` on that file |
| `postgresql://...`, `postgres://...` | `PostgresStore` with the URL as its DSN |

A SQLite URL may carry the store's options as query parameters:
`sqlite:///var/lib/work.db?synchronous=NORMAL&busy_timeout_ms=5000`. The
PostgreSQL backend is imported only when a PostgreSQL URL is opened.
"""

from __future__ import annotations

import importlib
import re
from typing import cast
from urllib.parse import parse_qs, unquote

from workwarden.storage.base import Store
from workwarden.storage.memory import MemoryStore
from workwarden.storage.sqlite import SQLiteStore, Synchronous

__all__ = ["open_store"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_SQLITE_OPTIONS = ("synchronous", "busy_timeout_ms")


def _sqlite(rest: str, url_for_errors: str) -> SQLiteStore:
    path, _, query = rest.partition("?")
    if path.startswith("//"):
        # sqlite:///abs/path: an empty authority, then the absolute path.
        authority, slash, tail = path[2:].partition("/")
        if authority:
            raise ValueError(
                f"{url_for_errors}: a SQLite URL names no host; write sqlite:///absolute/path"
                " or sqlite:relative/path"
            )
        path = slash + tail
    path = unquote(path)
    if not path:
        raise ValueError(f"{url_for_errors}: the SQLite URL names no file")
    options = parse_qs(query, keep_blank_values=True, strict_parsing=False) if query else {}
    unknown = sorted(set(options) - set(_SQLITE_OPTIONS))
    if unknown:
        raise ValueError(
            f"{url_for_errors}: unknown SQLite option(s) {', '.join(unknown)};"
            f" known: {', '.join(_SQLITE_OPTIONS)}"
        )
    synchronous = options.get("synchronous", ["FULL"])[-1].upper()
    timeout = options.get("busy_timeout_ms", ["10000"])[-1]
    if not timeout.isdigit():
        raise ValueError(f"{url_for_errors}: busy_timeout_ms must be a whole number of ms")
    return SQLiteStore(
        path, synchronous=cast(Synchronous, synchronous), busy_timeout_ms=int(timeout)
    )


def _postgres(dsn: str) -> Store:
    module = importlib.import_module("workwarden.storage.postgres")
    store: Store = module.PostgresStore(dsn)
    return store


def open_store(url: str) -> Store:
    """The store `url` names (see the module docstring); `ValueError` for one it cannot name.

    Error messages never repeat a PostgreSQL URL, which may hold a password.
    """
    if not isinstance(url, str) or not url.strip():
        raise ValueError("a store URL is required, for example sqlite:///var/lib/work.db")
    match = _SCHEME.match(url)
    # One letter before the colon is a Windows drive (C:\work.db), not a scheme.
    if match is None or len(match.group(1)) == 1:
        return SQLiteStore(url)
    scheme = match.group(1).lower()
    rest = url[match.end() :]
    if scheme == "memory":
        if rest not in ("", "//"):
            raise ValueError(f"{url}: a memory store takes no path; write memory:")
        return MemoryStore()
    if scheme == "sqlite":
        return _sqlite(rest, url)
    if scheme in ("postgresql", "postgres"):
        return _postgres(url)
    raise ValueError(
        f"unknown store URL scheme {scheme!r}: use memory:, sqlite:///absolute/path,"
        " sqlite:relative/path, a file path, or postgresql://..."
    )
