"""`open_store(url, mode=...)`: a store from one string, for configuration and the command line.

| URL | store |
| --- | --- |
| `memory:` | a fresh, empty `MemoryStore` |
| `sqlite:///abs/path.db`, `sqlite:relative/path.db` | `SQLiteStore` on that file |
| `/abs/path.db`, `relative/path.db` (no scheme) | `SQLiteStore` on that file |
| `postgresql://...`, `postgres://...` | `PostgresStore` with the URL as its DSN |

A SQLite URL may carry the store's options as query parameters:
`sqlite:///var/lib/work.db?synchronous=NORMAL&busy_timeout_ms=5000`. The
PostgreSQL backend is imported only when a PostgreSQL URL is opened; its
`connect_timeout` (whole seconds, at least 2 as libpq counts them) is the
store's `connect_timeout_s`, how long it waits for a server that does not
answer (without one, or with 0 or less, `CONNECT_TIMEOUT_S`, 10 s).

`mode` says what the caller means to do, and so what may happen to a file:

- `"read"`: the store must exist; a SQLite file is opened read-only (it is
  never created, never written, and may be a file the caller cannot write);
- `"write"` (the default): the store must exist and is opened for writing;
- `"create"`: the store is created when absent, then opened for writing.

A URL of `None` means the one in the environment variable `WORKWARDEN_STORE`.

Every failure is a `WorkloadError` with a catalogue code, and never repeats a
PostgreSQL URL (which may hold a password):

- `WORKLOAD_STORE_URL_INVALID`: no URL at all, or one that names no store (an
  unknown scheme, a SQLite URL with a host or an unknown option, text that is
  not UTF-8, a NUL character in the URL or in its decoded path, at which
  SQLite would cut the file name). It is also a `ValueError`, as a URL that
  names no store always was.
- `WORKLOAD_STORE_NOT_FOUND`: the SQLite file (or, for `"create"`, its
  directory) does not exist; `details.path` names it. For PostgreSQL: the
  server has no database of the URL's name (workwarden never creates one), or
  the database holds no workwarden tables, opened to read or write
  (`"create"` creates them).
- `WORKLOAD_STORE_UNUSABLE`: the store exists but cannot serve the mode: a
  directory, a file that is not a SQLite database or not a workwarden store,
  one written by a newer release (a SQLite file or a PostgreSQL database), one
  of an older release opened to read (either backend: a command that writes
  brings it up to date), or a read-only file opened to write.
- `WORKLOAD_STORAGE_FAILURE`: the store could not be reached or stayed locked
  (a server that is down, a file locked past the busy timeout): try later.
"""

from __future__ import annotations

import importlib
import os
import re
import sqlite3
from typing import Any, Literal, cast
from urllib.parse import parse_qs, unquote

from workwarden.statemachine import errors
from workwarden.statemachine.errors import STORAGE_FAILURE, WorkloadError
from workwarden.storage.base import Store, StoreAbsent, StoreError
from workwarden.storage.memory import MemoryStore
from workwarden.storage.sqlite import SQLiteStore, Synchronous

__all__ = [
    "STORE_NOT_FOUND",
    "STORE_UNUSABLE",
    "STORE_URL_INVALID",
    "STORE_VARIABLE",
    "Mode",
    "StoreURLInvalid",
    "open_store",
]

#: The environment variable naming the store when no URL is given.
STORE_VARIABLE = "WORKWARDEN_STORE"

STORE_URL_INVALID = "WORKLOAD_STORE_URL_INVALID"
STORE_NOT_FOUND = "WORKLOAD_STORE_NOT_FOUND"
STORE_UNUSABLE = "WORKLOAD_STORE_UNUSABLE"

Mode = Literal["read", "write", "create"]
"""What the caller means to do with the store: read it, write it, or create it if absent."""

_MODES: frozenset[str] = frozenset({"read", "write", "create"})
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_SQLITE_OPTIONS = ("synchronous", "busy_timeout_ms")
_URL_FORMS = (
    "memory:, sqlite:///absolute/path, sqlite:relative/path, a file path, or postgresql://..."
)
# SQLite's answers that mean "try again later", not "this file cannot serve".
_TRANSIENT = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_IOERR", "SQLITE_FULL", "SQLITE_NOMEM")


class StoreURLInvalid(WorkloadError, ValueError):
    """`WORKLOAD_STORE_URL_INVALID`: the text names no store (also a `ValueError`)."""

    def __init__(self, message: str) -> None:
        super().__init__(STORE_URL_INVALID, message, {"forms": _URL_FORMS})


def _sqlite_options(query: str, shown: str) -> tuple[Synchronous, int]:
    try:
        options = parse_qs(query, keep_blank_values=True) if query else {}
    except ValueError as exc:
        raise StoreURLInvalid(f"{shown}: the query is malformed ({exc})") from None
    unknown = sorted(set(options) - set(_SQLITE_OPTIONS))
    if unknown:
        raise StoreURLInvalid(
            f"{shown}: unknown SQLite option(s) {', '.join(unknown)};"
            f" known: {', '.join(_SQLITE_OPTIONS)}"
        )
    synchronous = options.get("synchronous", ["FULL"])[-1].upper()
    if synchronous not in ("FULL", "EXTRA", "NORMAL"):
        raise StoreURLInvalid(f"{shown}: synchronous must be one of FULL, EXTRA, NORMAL")
    timeout = options.get("busy_timeout_ms", ["10000"])[-1]
    # SQLite's busy timeout is a C int of milliseconds.
    if re.fullmatch(r"[0-9]{1,10}", timeout, re.ASCII) is None or int(timeout) > 2**31 - 1:
        raise StoreURLInvalid(
            f"{shown}: busy_timeout_ms must be a whole number of ms, at most 2,147,483,647"
        )
    return cast(Synchronous, synchronous), int(timeout)


def _sqlite_path(rest: str, shown: str) -> tuple[str, str]:
    """The file path and the query of the part of a SQLite URL after `sqlite:`."""
    path, _, query = rest.partition("?")
    if path.startswith("//"):
        # sqlite:///abs/path: an empty authority, then the absolute path.
        authority, slash, tail = path[2:].partition("/")
        if authority:
            raise StoreURLInvalid(
                f"{shown}: a SQLite URL names no host; write sqlite:///absolute/path"
                " or sqlite:relative/path"
            )
        path = slash + tail
    path = unquote(path, errors="strict")
    if not path:
        raise StoreURLInvalid(f"{shown}: the SQLite URL names no file")
    if "\x00" in path:
        raise StoreURLInvalid(f"{shown}: the path holds a NUL character (%00)")
    return path, query


def _unusable(path: str, message: str) -> WorkloadError:
    return WorkloadError(STORE_UNUSABLE, message, {"path": path})


def _open_sqlite(path: str, query: str, shown: str, mode: Mode) -> SQLiteStore:
    synchronous, busy_timeout_ms = _sqlite_options(query, shown)
    if path == ":memory:" or path.startswith("file:"):
        raise StoreURLInvalid(f"{shown}: name a file (for a store in memory, write memory:)")
    if os.path.isdir(path):
        raise _unusable(path, f"{path} is a directory, not a store file")
    if mode != "create" and not os.path.exists(path):
        raise WorkloadError(
            STORE_NOT_FOUND,
            f"no store at {path} (no such file); {_not_created(mode)}",
            {"path": path},
        )
    directory = os.path.dirname(os.path.abspath(path))
    if mode == "create" and not os.path.isdir(directory):
        raise WorkloadError(
            STORE_NOT_FOUND,
            f"cannot create a store at {path}: its directory {directory} does not exist",
            {"path": path},
        )
    try:
        return SQLiteStore(
            path,
            synchronous=synchronous,
            busy_timeout_ms=busy_timeout_ms,
            read_only=mode == "read",
            create=mode == "create",
        )
    except StoreError as exc:
        cause = exc.__cause__
        name = str(getattr(cause, "sqlite_errorname", ""))
        if isinstance(cause, sqlite3.Error) and name.startswith(_TRANSIENT):
            raise WorkloadError(
                STORAGE_FAILURE, f"cannot open the store at {path}: {exc}", {"path": path}
            ) from None
        raise _unusable(path, f"cannot use {path} as a store: {exc}") from None
    except (ValueError, UnicodeError) as exc:
        raise StoreURLInvalid(f"{shown}: {exc}") from None


def _check_postgres_numbers(params: dict[str, Any]) -> None:
    """Refuse a port or connect timeout no connection can be made with (libpq would only say
    so at each attempt, so the store would try for its whole connect timeout)."""
    ports = str(params.get("port") or "")
    for port in ports.split(",") if ports else ():
        if port and not (re.fullmatch(r"[0-9]{1,5}", port, re.ASCII) and 1 <= int(port) <= 65535):
            raise StoreURLInvalid(
                f"the PostgreSQL URL's port {port[:20]!r} is not a port number (1 to 65535)"
            )
    timeout = str(params.get("connect_timeout") or "").strip()
    if timeout and re.fullmatch(r"[+-]?[0-9]+", timeout, re.ASCII) is None:
        raise StoreURLInvalid(
            f"the PostgreSQL URL's connect_timeout {timeout[:20]!r} is not a whole number of"
            " seconds"
        )
    digits = timeout.lstrip("+-").lstrip("0")
    if len(digits) > 10 or (digits and int(digits) > MAX_CONNECT_TIMEOUT_S):
        # libpq's own limit (a C int); past about 9.2e9 s no wait can even be timed.
        raise StoreURLInvalid(
            f"the PostgreSQL URL's connect_timeout {timeout[:20]!r} is outside libpq's range"
            f" (at most {MAX_CONNECT_TIMEOUT_S:,} seconds)"
        )


#: The longest `connect_timeout` a PostgreSQL URL may give, in seconds (libpq's int).
MAX_CONNECT_TIMEOUT_S = 2**31 - 1


def _open_postgres(dsn: str, mode: Mode) -> Store:
    options: dict[str, Any] = {}
    try:
        import psycopg
        from psycopg import conninfo
    except ImportError:
        pass  # the backend's own import says what to install
    else:
        try:
            params = conninfo.conninfo_to_dict(dsn)
        except psycopg.Error:
            # psycopg's message quotes the URL, which may hold a password.
            raise StoreURLInvalid(
                "the PostgreSQL URL is malformed (see libpq's URI syntax)"
            ) from None
        _check_postgres_numbers(params)
        waited = _connect_timeout_s(params)
        if waited is not None:
            options["connect_timeout_s"] = waited
    module = importlib.import_module("workwarden.storage.postgres")
    schema = importlib.import_module("workwarden.storage.pg_schema")
    try:
        store: Store = module.PostgresStore(
            dsn, create=mode == "create", upgrade=mode != "read", **options
        )
    except (schema.NewerSchema, schema.OlderSchema) as exc:
        # Not a failure to retry later: the store needs a newer workwarden, or a write.
        raise WorkloadError(
            STORE_UNUSABLE, "cannot use the PostgreSQL store: " + _without(str(exc), dsn)
        ) from None
    except StoreAbsent:
        raise WorkloadError(
            STORE_NOT_FOUND,
            f"the PostgreSQL database holds no workwarden store; {_not_created(mode)}",
        ) from None
    except StoreError as exc:
        missing = _MISSING_DATABASE.search(str(exc))
        if missing is not None:
            # Not a failure to retry later: no database of that name will appear by itself.
            raise WorkloadError(
                STORE_NOT_FOUND,
                f"the PostgreSQL server has no database {missing.group(1)!r} (workwarden never"
                " creates databases: create it, with createdb or CREATE DATABASE, or fix the"
                " URL)",
            ) from None
        raise WorkloadError(
            STORAGE_FAILURE, "cannot open the PostgreSQL store: " + _without(str(exc), dsn)
        ) from None
    return store


# The server's refusal of a connection to a database it does not have (SQLSTATE 3D000,
# which libpq does not hand on at connect time; a server whose messages are translated
# words it otherwise, and is then a storage failure).
_MISSING_DATABASE = re.compile(r'FATAL:\s+database "([^"]*)" does not exist')


def _connect_timeout_s(params: dict[str, Any]) -> float | None:
    """The URL's `connect_timeout` as the store's wait for its server, or None for the default.

    libpq counts whole seconds and at least 2; 0 or less (libpq: wait
    forever) keeps the store's bounded default.
    """
    timeout = str(params.get("connect_timeout") or "").strip()
    if not timeout or int(timeout) <= 0:
        return None
    return float(max(2, int(timeout)))


def _not_created(mode: Mode) -> str:
    """Why a missing store was not made, for `mode` (read or write)."""
    if mode == "read":
        return "reading never creates a store"
    return (
        "a store is created only when asked: --create (serve, worker, sweeper,"
        ' scheduler, import), or open_store(url, mode="create")'
    )


def _without(message: str, secret: str) -> str:
    """`message` with any copy of `secret` (a URL that may hold a password) blanked."""
    return message.replace(secret, "<url>")


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def open_store(url: str | None = None, *, mode: Mode = "write") -> Store:
    """The store `url` names, opened for `mode` (see the module docstring).

    `url` None reads `WORKWARDEN_STORE`. Raises only `WorkloadError`s with
    the codes the module docstring lists.
    """
    if mode not in _MODES:
        raise errors.bad_argument("mode", f"mode must be read, write or create, not {mode!r}")
    if url is None:
        url = os.environ.get(STORE_VARIABLE)
        if not url:
            raise StoreURLInvalid(f"no store: give --store URL or set {STORE_VARIABLE}")
    if not isinstance(url, str) or not url.strip():
        raise StoreURLInvalid("a store URL is required, for example sqlite:///var/lib/work.db")
    if _has_surrogates(url):
        raise StoreURLInvalid("the store URL is not UTF-8 text")
    if "\x00" in url:
        raise StoreURLInvalid("the store URL holds a NUL character")
    match = _SCHEME.match(url)
    # One letter before the colon is a Windows drive (C:\work.db), not a scheme.
    if match is None or len(match.group(1)) == 1:
        return _open_sqlite(url, "", url, mode)
    scheme = match.group(1).lower()
    rest = url[match.end() :]
    if scheme == "memory":
        if rest not in ("", "//"):
            raise StoreURLInvalid(f"{url}: a memory store takes no path; write memory:")
        return MemoryStore()
    if scheme == "sqlite":
        try:
            path, query = _sqlite_path(rest, url)
        except UnicodeDecodeError:
            raise StoreURLInvalid(f"{url}: the path is not UTF-8 once decoded") from None
        return _open_sqlite(path, query, url, mode)
    if scheme in ("postgresql", "postgres"):
        return _open_postgres(url, mode)
    raise StoreURLInvalid(f"unknown store URL scheme {scheme!r}: use {_URL_FORMS}")
