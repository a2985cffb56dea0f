"""`SQLiteStore`: the `Store` protocol in one SQLite file, for one machine.

The embedded default. Documents are JSON text beside their index columns;
the three index queries ("claimable now", "lease expired", "deadline due")
each read a partial index named in the query (`INDEXED BY`), so a schema that
lost one fails loudly instead of scanning. The file is in WAL mode: readers
never wait for the writer. A write runs under `BEGIN IMMEDIATE`, so the
version check, the document and its audit record are one transaction under
the write lock; a competing writer, in this process or another, waits up to
the busy timeout. Every thread gets its own connection. A batch
(`write_many`, `claim_batch`) is one such transaction, each of its writes a
compare-and-swap whose conflict undoes its own statement and nothing else.

The store keeps pauses (`Pauses`: the claim query leaves paused scopes out
itself) and purges documents (`Purges`: a purged key's version is kept as a
tombstone, which a document created again under the key follows; such a
create expects the tombstone's version).

The file records its schema version (table `schema_version`) so that a later
release can migrate it; a file from a newer release is refused, an older one
is brought up to this version when opened for writing (and refused, saying
so, when opened read-only: this release's reads name columns it lacks).

The schema, its migration and the text of the statements are in
`workwarden.storage.sqlite_schema`; this module opens the file and runs
them. The names of that module remain importable from this one.
"""

from __future__ import annotations

import builtins
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Final, Literal
from urllib.parse import quote

from workwarden.statemachine import errors
from workwarden.storage.base import (
    CLAIM_PAGES,
    AuditRecord,
    CandidateCursor,
    ChooseClaims,
    IndexFields,
    LocalWakeUps,
    NextInstants,
    PauseRecord,
    PauseScope,
    StoreConflict,
    StoredDocument,
    StoreFailure,
    StoreLimited,
    WorkSignal,
    Write,
    WriteOutcome,
    check_audit_bounds,
    check_audit_since,
    distinct_keys,
    pause_from_row,
    wakes_claimers,
)
from workwarden.storage.base import document_from_row as _document

# The schema and statements, each importable from here as well as from their own module.
from workwarden.storage.sqlite_schema import (  # noqa: F401
    _ADD_PAUSE,
    _ADDED_COLUMNS,
    _ADDED_INDEXES,
    _APPEND_AUDIT,
    _AUDIT,
    _AUDIT_LOG,
    _AUDIT_OF,
    _AUDIT_SINCE,
    _AUDIT_TAIL,
    _BURY,
    _CLAIM_CANDIDATES,
    _CLAIM_CANDIDATES_AFTER,
    _CLAIM_ORDER,
    _CLAIMABLE,
    _CLAIMABLE_SCOPES,
    _COUNT_PAUSE,
    _DEADLINES_DUE,
    _DOCUMENT,
    _EXAMPLE,
    _EXPIRED_LEASES,
    _EXPLAINED,
    _FIND_REQUEST,
    _FIND_RESULT,
    _HELD_CLAIMS,
    _INSERT,
    _LIST,
    _LIST_PAGE,
    _LIST_PAGE_AFTER,
    _NEXT_INSTANTS,
    _NOT_PAUSED,
    _PAUSE_COLUMNS,
    _PAUSE_VERSION,
    _PAUSED,
    _PURGE,
    _READ,
    _READ_MANY_CHUNK,
    _REMOVE_PAUSE,
    _SCAN,
    _SCHEMA,
    _SCOPE,
    _TOMBSTONE,
    _UPDATE,
    SCHEMA_VERSION,
    _add_columns,
    _audit,
    _audit_params,
    _check_limit,
    _document_params,
    _ensure_schema,
    _keep_rate_mark,
    _purgeable,
    _read_many,
    _verify_schema,
)

__all__ = ["SCHEMA_VERSION", "SQLiteStore", "Synchronous"]

Synchronous = Literal["FULL", "EXTRA", "NORMAL"]
"""The `PRAGMA synchronous` levels a store may run at (`OFF` is never offered)."""

_SCAN_PAGE = 256

#: How often a work signal looks for commits by other connections (`PRAGMA data_version`).
_SIGNAL_POLL_S: Final = 0.05
#: How SQLite's query plans head a subquery's steps ("CORRELATED SCALAR SUBQUERY 2").
_HEADING: Final = re.compile(r"^(CORRELATED )?(SCALAR|LIST) SUBQUERY \d+$")
_SYNCHRONOUS: frozenset[str] = frozenset({"FULL", "EXTRA", "NORMAL"})


def _locked(exc: sqlite3.Error) -> bool:
    """Whether `exc` says the file stayed locked by another connection (busy timeout exceeded)."""
    return str(getattr(exc, "sqlite_errorname", "")).startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))


def _tombstone(conn: sqlite3.Connection, key: str) -> int | None:
    """The version the last purge of `key` wrote, or None if it was never purged.

    Read inside the caller's write transaction, so no purge comes between.
    """
    row = conn.execute(_TOMBSTONE, {"key": key}).fetchone()
    return None if row is None else int(row[0])


def _compare_and_swap(
    conn: sqlite3.Connection, key: str, values: dict[str, Any], expected_version: int | None
) -> StoreConflict | None:
    """Write one document (`_document_params`) if `expected_version` holds; else the conflict.

    None expects the key never written: not there, and never purged. A
    version expects that document, or, for a key absent since its purge,
    the purge's tombstone, which the key is then created again after. A key
    that exists breaks the primary key on insert, which the caller answers.
    """
    if expected_version is None:
        buried = _tombstone(conn, key)
        if buried is not None:
            return StoreConflict(f"{key} was purged at version {buried}; a create names it")
        conn.execute(_INSERT, values)
    elif conn.execute(_UPDATE, values).rowcount != 1:
        if _tombstone(conn, key) != expected_version:
            return StoreConflict(f"{key}: expected version {expected_version} does not hold")
        conn.execute(_INSERT, values)
    return None


def _file_name(path: object) -> str:
    """`path` as the text of a file name, or `WORKLOAD_INVALID` naming `path`.

    Bytes, objects that are not paths, and names holding a NUL (at which
    SQLite would cut the name, opening another file) are refused.
    """
    name: object = None
    if isinstance(path, str | os.PathLike):
        try:
            name = os.fspath(path)
        except TypeError:
            name = None
    if not isinstance(name, str):
        raise errors.bad_argument(
            "path", f"path must be a str or os.PathLike naming a file, not {type(path).__name__}"
        )
    if "\x00" in name:
        raise errors.bad_argument("path", "path must not hold a NUL character")
    return name


def _limit(limit: int | None) -> int:
    # SQLite reads a negative LIMIT as "no limit".
    return -1 if limit is None else max(limit, 0)


class SQLiteStore:
    """A CAS document store with index columns and an audit log in one SQLite file.

    `path` is the database file (created when absent; its directory must
    exist). With `create=False` the file must already hold a workwarden store
    (else `StoreFailure`); with `read_only=True` too, and the store is opened
    read-only: nothing is ever written, the file may be one the process cannot
    write, and a write fails with `StoreFailure`.

    Arguments are checked before any file is touched: `path` must be a `str`
    or `os.PathLike` naming a file as text, with no NUL character (which
    SQLite would cut the name at); `read_only` and `create` must be `bool`s;
    anything else is `WORKLOAD_INVALID` naming the argument (an
    `InvalidArgument`, also a `ValueError`).

    Several threads may share one store, and several processes may
    open the same file; every write is serialised by SQLite's write lock and
    a writer waits up to `busy_timeout_ms` for it before the write fails with
    `StoreFailure` saying the file stayed locked past the busy timeout (and
    nothing was written), never with a raw `sqlite3.OperationalError`.

    `synchronous` is SQLite's durability setting. `"FULL"` (the default)
    syncs the write-ahead log on every commit: a write that returned is on
    disk. `"NORMAL"` syncs only at checkpoints and is faster, but the most
    recent commits can be lost to a power cut or an operating-system crash
    (never to a crash of the process alone). The danger is specific: a claim
    acknowledged to a worker and then lost rolls the workload back to before
    the claim, so the same fencing token is issued again to another worker
    while the first still believes it holds the lease. Choose `"NORMAL"` only
    where that is acceptable. `"EXTRA"` is accepted too; with a write-ahead
    log it is as durable as `"FULL"`.

    Close the store (or use it as a context manager) when done; close it
    after every thread has finished with it.

    Thread-safety: any number of threads may share one store (each thread
    gets its own connection, and every call is one transaction), and any
    number of processes may open the same file.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "FULL",
        busy_timeout_ms: int = 10_000,
        read_only: bool = False,
        create: bool = True,
    ) -> None:
        name = _file_name(path)
        if name == "" or name == ":memory:" or name.startswith("file:"):
            raise errors.bad_argument(
                "path",
                f"SQLiteStore needs a file path, not {name!r}"
                " (for a store in memory use MemoryStore)",
            )
        level = synchronous.upper() if isinstance(synchronous, str) else ""
        if level not in _SYNCHRONOUS:
            raise errors.bad_argument(
                "synchronous",
                f"synchronous must be one of FULL, EXTRA, NORMAL, not {synchronous!r}",
            )
        if isinstance(busy_timeout_ms, bool) or not isinstance(busy_timeout_ms, int):
            raise errors.bad_argument(
                "busy_timeout_ms", "busy_timeout_ms must be an integer number of milliseconds"
            )
        if busy_timeout_ms < 0:
            raise errors.bad_argument("busy_timeout_ms", "busy_timeout_ms must not be negative")
        for flag, value in (("read_only", read_only), ("create", create)):
            if not isinstance(value, bool):
                raise errors.bad_argument(flag, f"{flag} must be True or False, not {value!r}")
        self.path = name
        self.synchronous = level
        self.busy_timeout_ms = busy_timeout_ms
        self.read_only = read_only
        self.create = create and not read_only
        self._lock = threading.Lock()
        self._connections: dict[int, sqlite3.Connection] = {}
        # How many blocks of this store's own calls use each connection right now
        # (see `_held`): `close` leaves those to be closed by the block that ends last.
        self._in_use: dict[sqlite3.Connection, int] = {}
        self._pid = os.getpid()
        self._closed = False
        self._wake_ups = LocalWakeUps()
        try:
            self._create_schema()
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}, synchronous={self.synchronous!r})"

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- connections -------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        # A URI, so that SQLite itself refuses to create the file (mode=rw) or
        # to write it (mode=ro): no window between a check and the open.
        access = "ro" if self.read_only else "rwc" if self.create else "rw"
        with self._failures(f"cannot open {self.path}"):
            uri = f"file://{quote(os.path.abspath(self.path))}?mode={access}"
            conn = self._connect(uri)
            if self.read_only:
                conn = self._readable(conn, uri)
            try:
                conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
                if self.read_only:
                    # A reader never changes the file, not even its journal mode.
                    conn.execute("PRAGMA query_only = ON")
                    return conn
                mode = self._use_wal(conn)
                if mode != "wal":
                    raise StoreFailure(
                        f"{self.path}: cannot use write-ahead logging (journal mode {mode})"
                    )
                conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            except BaseException:
                conn.close()
                raise
        return conn

    def _readable(self, conn: sqlite3.Connection, uri: str) -> sqlite3.Connection:
        """`conn`, or, where it cannot read the file, a connection that reads it as it is.

        A reader of a write-ahead-logged file needs its -shm file, which it
        cannot create in a directory it may not write (SQLite says
        `SQLITE_CANTOPEN`, or `SQLITE_READONLY_DIRECTORY`). With no -wal file
        no write is under way, so the file is read as it stands (`immutable`).
        """
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.OperationalError as exc:
            if not (
                str(getattr(exc, "sqlite_errorname", "")).startswith(
                    ("SQLITE_CANTOPEN", "SQLITE_READONLY_DIRECTORY")
                )
                and os.path.isfile(self.path)
                and not os.path.exists(self.path + "-wal")
            ):
                conn.close()
                raise
            conn.close()
            return self._connect(uri + "&immutable=1")
        return conn

    def _connect(self, uri: str) -> sqlite3.Connection:
        return sqlite3.connect(
            uri,
            timeout=self.busy_timeout_ms / 1000,
            isolation_level=None,
            check_same_thread=False,
            uri=True,
        )

    def _use_wal(self, conn: sqlite3.Connection) -> str:
        """Switch the file to write-ahead logging (once per file); returns the journal mode.

        The switch needs the file to itself, and SQLite reports a competing
        opener as busy at once instead of waiting: retry within the busy
        timeout.
        """
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        while True:
            try:
                return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower()
            except sqlite3.OperationalError as exc:
                if not _locked(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(0.002)

    def _connection(self) -> sqlite3.Connection:
        ident = threading.get_ident()
        with self._lock:
            if self._closed:
                raise StoreFailure(f"{self.path}: the store is closed")
            if self._pid != os.getpid():
                # A forked child must not use its parent's connections; they
                # are left to the parent.
                self._connections = {}
                self._pid = os.getpid()
            conn = self._connections.get(ident)
        if conn is None:
            conn = self._open()
            with self._lock:
                if self._closed:
                    conn.close()
                    raise StoreFailure(f"{self.path}: the store is closed")
                # A thread id is reused only after its thread ended, and every
                # call finishes its transaction, so a reused connection is idle.
                self._connections[ident] = conn
        return conn

    @contextmanager
    def _held(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection, in use until the block ends.

        A `close` from another thread while a statement runs on it must not
        close it under the statement (SQLite's connection is not safe for
        that: the process can crash). `close` closes the idle connections
        and leaves the ones in use to the block using them, which closes
        its connection as it ends; the statement's caller then meets the
        closed store on its next call.
        """
        conn = self._connection()
        with self._lock:
            if self._closed:  # closed since `_connection`: `close` closed it, idle then
                raise StoreFailure(f"{self.path}: the store is closed")
            self._in_use[conn] = self._in_use.get(conn, 0) + 1
        try:
            yield conn
        finally:
            with self._lock:
                left = self._in_use[conn] - 1
                if left:
                    self._in_use[conn] = left
                else:
                    del self._in_use[conn]
                late = self._closed and not left
            if late:
                conn.close()

    def _discard(self, conn: sqlite3.Connection) -> None:
        ident = threading.get_ident()
        with self._lock:
            if self._connections.get(ident) is conn:
                del self._connections[ident]
        conn.close()

    @contextmanager
    def _failures(self, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.IntegrityError as exc:
            if getattr(exc, "sqlite_errorname", "") in (
                "SQLITE_CONSTRAINT_UNIQUE",
                "SQLITE_CONSTRAINT_PRIMARYKEY",
            ):
                raise StoreConflict(f"{what}: {exc}") from exc
            raise StoreFailure(f"{what}: {exc}") from exc
        except sqlite3.OperationalError as exc:
            if _locked(exc):
                raise StoreFailure(
                    f"{what}: {self.path} stayed locked by another connection for longer than"
                    f" the busy timeout ({self.busy_timeout_ms} ms); nothing was written ({exc})"
                ) from exc
            raise StoreFailure(f"{what}: {exc}") from exc
        except (sqlite3.Error, OverflowError, UnicodeError) as exc:
            raise StoreFailure(f"{what}: {exc}") from exc

    @contextmanager
    def _transaction(self, what: str) -> Iterator[sqlite3.Connection]:
        """`BEGIN IMMEDIATE` ... `COMMIT`, rolled back entirely on any error."""
        with self._held() as conn, self._failures(what):
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                self._rollback(conn)
                raise

    def _rollback(self, conn: sqlite3.Connection) -> None:
        if not conn.in_transaction:
            return
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            # The connection is unusable; the error that led here is the one
            # to report. A fresh connection replaces it on the next call.
            self._discard(conn)

    def _query(self, what: str, sql: str, params: Mapping[str, Any]) -> list[Any]:
        with self._held() as conn, self._failures(what):
            return conn.execute(sql, params).fetchall()

    def _create_schema(self) -> None:
        if not self.create:
            self._check_schema()
            if self.read_only:
                return
        with self._transaction(f"cannot create the schema in {self.path}") as conn:
            _ensure_schema(conn, self.path)

    def _check_schema(self) -> None:
        """Refuse a file this store did not create: not a workwarden store, or a newer one."""
        with self._held() as conn, self._failures(f"cannot read {self.path}"):
            _verify_schema(conn, self.path, read_only=self.read_only)

    # -- the Store protocol ---------------------------------------------------

    def read(self, key: str) -> StoredDocument | None:
        """The committed document under `key`, or None."""
        rows = self._query(f"read {key}", _READ, {"key": key})
        return _document(rows[0]) if rows else None

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        """Compare-and-swap `document` and append `audit`, or raise `StoreConflict`.

        The version check, the document and the audit record are one
        transaction under the write lock; a conflict rolls all of it back.
        The check is the write itself: the insert of a key that exists
        breaks the primary key, the update names the expected version in
        its `WHERE`, and a result id held by another key breaks the unique
        index; each is a conflict. A key purged before is created again
        only by a write expecting its tombstone's version, at the next one.
        """
        values = _document_params(key, document, index, expected_version)
        with self._transaction(f"write {key}") as conn:
            mark = _check_limit(conn, key, index, audit.at, expected_version)
            conflict = _compare_and_swap(conn, key, values, expected_version)
            if conflict is not None:
                raise conflict
            _keep_rate_mark(conn, index, mark)
            version: int = values["version"]
            conn.execute(_APPEND_AUDIT, _audit_params(audit, key, version))
        if wakes_claimers(index):
            self._wake_ups.notify(index.tenant, index.application)
        return version

    # -- BatchStore ---------------------------------------------------------------

    def read_many(self, keys: Sequence[str]) -> dict[str, StoredDocument]:
        """The committed documents under `keys`, read in one transaction, in chunks of keys.

        A missing key is absent from the answer.
        """
        wanted = list(dict.fromkeys(keys))
        found: dict[str, StoredDocument] = {}
        if not wanted:
            return found
        with self._held() as conn, self._failures(f"read {len(wanted)} documents"):
            # One read transaction: every chunk sees the same commit.
            conn.execute("BEGIN")
            try:
                for start in range(0, len(wanted), _READ_MANY_CHUNK):
                    chunk = wanted[start : start + _READ_MANY_CHUNK]
                    for row in conn.execute(_read_many(len(chunk)), chunk):
                        found[row[0]] = _document(row)
            finally:
                self._rollback(conn)
        return found

    def write_many(self, writes: Sequence[Write]) -> list[WriteOutcome]:
        """Each write's compare-and-swap in one `BEGIN IMMEDIATE` transaction; outcomes in order.

        A conflicting write (version, existing key, result id) is its
        statement alone, which SQLite rolls back by itself before its audit
        record would be appended; the other writes go on. Any other error
        rolls the whole batch back (`StoreFailure`, nothing written).
        """
        distinct_keys(writes)
        if not writes:
            return []
        with self._transaction(f"write {len(writes)} documents") as conn:
            outcomes = [self._swap(conn, write) for write in writes]
        self._wake(writes, outcomes)
        return outcomes

    def claim_batch(
        self,
        tenant: str,
        application: str,
        now: int,
        limit: int,
        choose: ChooseClaims,
    ) -> list[tuple[Write, WriteOutcome]]:
        """Pages of candidates offered to `choose` and its claims written, under the write lock.

        One `BEGIN IMMEDIATE` transaction: no other writer, in this process
        or another, commits between the pages read and the claims written.
        """
        params: dict[str, Any] = {
            "tenant": tenant,
            "application": application,
            "now": now,
            "limit": _limit(limit),
        }
        chosen: list[Write] = []
        with self._transaction(f"claim in {tenant}/{application}") as conn:
            sql = _CLAIM_CANDIDATES
            for _ in range(CLAIM_PAGES):
                page = [_document(row) for row in conn.execute(sql, params)]
                if page:
                    chosen.extend(choose(page))
                if len(chosen) >= limit or len(page) < limit:
                    break
                last = page[-1]
                sql = _CLAIM_CANDIDATES_AFTER
                params.update(
                    priority=last.index.priority, created_at=last.index.created_at, key=last.key
                )
            distinct_keys(chosen)
            outcomes = [self._swap(conn, write) for write in chosen]
        self._wake(chosen, outcomes)
        return list(zip(chosen, outcomes, strict=True))

    def _swap(self, conn: sqlite3.Connection, write: Write) -> WriteOutcome:
        """One write's compare-and-swap and audit record, inside the caller's transaction."""
        key, expected_version = write.key, write.expected_version
        values = _document_params(key, write.document, write.index, expected_version)
        try:
            mark = _check_limit(conn, key, write.index, write.audit.at, expected_version)
        except StoreLimited as limited:
            return limited
        try:
            conflict = _compare_and_swap(conn, key, values, expected_version)
            if conflict is not None:
                return conflict
        except sqlite3.IntegrityError as exc:
            # The failed statement alone is undone; the transaction goes on.
            if getattr(exc, "sqlite_errorname", "") == "SQLITE_CONSTRAINT_PRIMARYKEY":
                return StoreConflict(f"{key} already exists")
            if getattr(exc, "sqlite_errorname", "") == "SQLITE_CONSTRAINT_UNIQUE":
                return StoreConflict(f"result id {write.index.result_id} belongs to another key")
            raise
        _keep_rate_mark(conn, write.index, mark)
        version: int = values["version"]
        conn.execute(_APPEND_AUDIT, _audit_params(write.audit, key, version))
        return version

    def _wake(self, writes: Sequence[Write], outcomes: Sequence[WriteOutcome]) -> None:
        """Wake the signals of every scope a committed write left work READY in."""
        scopes = {
            (write.index.tenant, write.index.application)
            for write, outcome in zip(writes, outcomes, strict=True)
            if wakes_claimers(write.index) and isinstance(outcome, int)
        }
        for tenant, application in sorted(scopes):
            self._wake_ups.notify(tenant, application)

    def find_result(self, result_id: str) -> str | None:
        """The key holding `result_id`, or None."""
        rows = self._query(f"find result {result_id}", _FIND_RESULT, {"result_id": result_id})
        return str(rows[0][0]) if rows else None

    def claim_candidates(
        self,
        tenant: str,
        application: str,
        now: int,
        limit: int,
        after: CandidateCursor | None = None,
    ) -> Sequence[StoredDocument]:
        """READY, eligible documents of a tenant and application, by priority then age."""
        params: dict[str, Any] = {
            "tenant": tenant,
            "application": application,
            "now": now,
            "limit": _limit(limit),
        }
        sql = _CLAIM_CANDIDATES
        if after is not None:
            sql = _CLAIM_CANDIDATES_AFTER
            params.update(priority=after.priority, created_at=after.created_at, key=after.key)
        return [_document(row) for row in self._query("claim candidates", sql, params)]

    def _due(
        self, sql: str, now: int, limit: int, tenant: str | None, application: str | None
    ) -> list[str]:
        params = {"now": now, "limit": _limit(limit), "tenant": tenant, "application": application}
        return [str(row[0]) for row in self._query("due query", sql, params)]

    def expired_leases(
        self, now: int, limit: int, tenant: str | None = None, application: str | None = None
    ) -> Sequence[str]:
        """Keys whose lease expired at or before `now`, earliest first."""
        return self._due(_EXPIRED_LEASES, now, limit, tenant, application)

    def deadlines_due(
        self, now: int, limit: int, tenant: str | None = None, application: str | None = None
    ) -> Sequence[str]:
        """Keys whose next deadline falls at or before `now`, earliest first."""
        return self._due(_DEADLINES_DUE, now, limit, tenant, application)

    def held_claims(
        self, tenant: str, application: str, worker_id: str
    ) -> Sequence[StoredDocument]:
        """Documents of a tenant and application whose claim `worker_id` holds, by key."""
        params = {"tenant": tenant, "application": application, "worker": worker_id}
        return [_document(row) for row in self._query("held claims", _HELD_CLAIMS, params)]

    def find_request(self, request_id: str) -> AuditRecord | None:
        """The first audit record made for `request_id`, or None."""
        params = {"request_id": request_id}
        rows = self._query(f"find request {request_id}", _FIND_REQUEST, params)
        return _audit(rows[0]) if rows else None

    def list(self, tenant: str, application: str) -> Sequence[StoredDocument]:
        """Every document of a tenant and application, by priority then age."""
        params = {"tenant": tenant, "application": application}
        return [_document(row) for row in self._query("list", _LIST, params)]

    def list_page(
        self, tenant: str, application: str, limit: int, after: CandidateCursor | None = None
    ) -> Sequence[StoredDocument]:
        """The next `limit` documents of a tenant and application after `after` (`ListPages`)."""
        params: dict[str, Any] = {
            "tenant": tenant,
            "application": application,
            "limit": _limit(limit),
        }
        sql = _LIST_PAGE
        if after is not None:
            sql = _LIST_PAGE_AFTER
            params.update(priority=after.priority, created_at=after.created_at, key=after.key)
        return [_document(row) for row in self._query("list page", sql, params)]

    def scan(self) -> Iterator[StoredDocument]:
        """Every document, by key, read a page at a time.

        Each page is read at one instant; a document written while the scan
        runs appears in the version committed when its page was read.
        """
        after = ""
        while True:
            rows = self._query("scan", _SCAN, {"after": after, "limit": _SCAN_PAGE})
            for row in rows:
                yield _document(row)
            if len(rows) < _SCAN_PAGE:
                return
            after = rows[-1][0]

    def audit_log(self, after: int = 0, limit: int | None = None) -> Sequence[AuditRecord]:
        """Audit records with sequence greater than `after`, in commit order, at most `limit`.

        A bound that is not a whole number from 0 is `WORKLOAD_INVALID`
        (`check_audit_bounds`).
        """
        check_audit_bounds(after, limit)
        params = {"after": after, "limit": _limit(limit)}
        return [_audit(row) for row in self._query("audit log", _AUDIT_LOG, params)]

    def audit_of(self, key: str) -> Sequence[AuditRecord]:
        """Every audit record of `key`, in commit order (`KeyedAudit`)."""
        return [_audit(row) for row in self._query("audit of a key", _AUDIT_OF, {"key": key})]

    def audit_tail(self, limit: int) -> Sequence[AuditRecord]:
        """The last `limit` audit records, newest first (`RecentAudit`)."""
        check_audit_bounds(0, limit)
        return [_audit(row) for row in self._query("audit tail", _AUDIT_TAIL, {"limit": limit})]

    def audit_since(self, at: int) -> Sequence[AuditRecord]:
        """Every audit record at `at` or later, in commit order (`RecentAudit`)."""
        check_audit_since(at)
        return [_audit(row) for row in self._query("recent audit", _AUDIT_SINCE, {"at": at})]

    def close(self) -> None:
        """Close every connection; later calls raise `StoreFailure`. Closing twice is harmless.

        A connection another thread is running a statement on is closed by
        that thread as its call ends, never under the statement (see `_held`).
        """
        with self._lock:
            self._closed = True
            connections = [c for c in self._connections.values() if c not in self._in_use]
            self._connections = {}
        with self._failures(f"close {self.path}"):
            for conn in connections:
                conn.close()

    # -- optional capabilities (`DueInstants`, `WakeUps`) ---------------------------

    def next_instants(
        self, after: int, tenant: str | None = None, application: str | None = None
    ) -> NextInstants:
        """The earliest eligibility, lease expiry and deadline after `after` in the scope."""
        params = {"after": after, "tenant": tenant, "application": application}
        row = self._query("next instants", _NEXT_INSTANTS, params)[0]
        return NextInstants(eligible_at=row[0], lease_expires_at=row[1], deadline_at=row[2])

    def claimable_scopes(self, now: int) -> builtins.list[tuple[str, str]]:
        """The (tenant, application) pairs with a document eligible at `now`, sorted."""
        rows = self._query("claimable scopes", _CLAIMABLE_SCOPES, {"now": now})
        return [(str(row[0]), str(row[1])) for row in rows]

    def work_signal(self, tenant: str, application: str) -> WorkSignal:
        """Woken by this store's writes that leave work READY, and by other connections' commits.

        Commits by other processes are seen by polling `PRAGMA data_version`
        every 50 ms on a connection of the signal's own; any commit wakes
        it, so the caller looks for work and may find none.
        """
        return _SQLiteSignal(self, self._wake_ups.signal(tenant, application))

    # -- optional capabilities (`Pauses`, `Purges`) --------------------------------

    def set_pause(self, scope: PauseScope, pause: PauseRecord | None, audit: AuditRecord) -> bool:
        """Pause or resume `scope` with its audit record, in one transaction; False if no change.

        The audit record's version counts the scope's pauses and resumes.
        A resume wakes this store's work signals at once (other processes'
        signals see the commit by `PRAGMA data_version`).
        """
        key = {"scope_key": scope.key}
        with self._transaction(f"pause {scope.key}") as conn:
            if pause is None:
                changed = conn.execute(_REMOVE_PAUSE, key).rowcount == 1
            else:
                values = {
                    **key,
                    "tenant": scope.tenant,
                    "application": scope.application,
                    "definition": scope.definition,
                    "concurrency_key": scope.concurrency_key,
                    "since": pause.since,
                    "actor": pause.actor,
                    "reason": pause.reason,
                    "request_id": pause.request_id,
                }
                changed = conn.execute(_ADD_PAUSE, values).rowcount == 1
            if changed:
                row = conn.execute(_PAUSE_VERSION, key).fetchone()
                version = 1 if row is None else int(row[0]) + 1
                conn.execute(_COUNT_PAUSE, {**key, "version": version})
                conn.execute(_APPEND_AUDIT, _audit_params(audit, audit.key, version))
        if changed and pause is None:
            self._wake_ups.notify_all()
        return changed

    def paused(self, tenant: str | None = None) -> builtins.list[PauseRecord]:
        """The pauses in force, of `tenant` or of all, by scope key."""
        rows = self._query("paused", _PAUSED, {"tenant": tenant})
        return [pause_from_row(row) for row in rows]

    def purgeable(
        self, states: Sequence[str], after: str | None, limit: int
    ) -> Sequence[StoredDocument]:
        """Up to `limit` documents whose index state is one of `states`, by key, after `after`."""
        wanted = list(dict.fromkeys(states))
        if not wanted:
            return []
        params: dict[str, Any] = {f"s{number}": state for number, state in enumerate(wanted)}
        params.update(after=after, limit=_limit(limit))
        sql = _purgeable(len(wanted), first=after is None)
        return [_document(row) for row in self._query("purgeable", sql, params)]

    def tombstone(self, key: str) -> int | None:
        """The version the last purge of `key` wrote, or None (`Tombstones`)."""
        rows = self._query(f"tombstone {key}", _TOMBSTONE, {"key": key})
        return int(rows[0][0]) if rows else None

    def purge(self, key: str, expected_version: int, audit: AuditRecord) -> bool:
        """Delete `key` at `expected_version` with its audit record, in one transaction.

        The purge's version (the deleted one + 1) stays as the key's
        tombstone, which a document created again under the key follows.
        Returns False, writing nothing, when the version does not hold.
        """
        version = expected_version + 1
        with self._transaction(f"purge {key}") as conn:
            gone = conn.execute(_PURGE, {"key": key, "expected": expected_version}).rowcount == 1
            if gone:
                conn.execute(_BURY, {"key": key, "version": version})
                conn.execute(_APPEND_AUDIT, _audit_params(audit, key, version))
        return gone

    # -- operations --------------------------------------------------------

    def query_plans(self) -> dict[str, tuple[str, ...]]:
        """How SQLite runs each query of the store (`EXPLAIN QUERY PLAN`), by query name.

        For operators and tests checking that every index query reads an
        index rather than the whole table. Each step is one read of a table
        or an index; the heading SQLite puts before a subquery's steps
        ("SCALAR SUBQUERY 1") is left out.
        """
        plans: dict[str, tuple[str, ...]] = {}
        for name, sql in _EXPLAINED.items():
            rows = self._query(f"explain {name}", "EXPLAIN QUERY PLAN " + sql, _EXAMPLE)
            plans[name] = tuple(str(row[-1]) for row in rows if not _HEADING.search(str(row[-1])))
        return plans


class _SQLiteSignal:
    """A work signal over one file: this store's writes, and other connections' commits."""

    def __init__(self, store: SQLiteStore, local: WorkSignal) -> None:
        self._store = store
        self._local = local
        self._conn: sqlite3.Connection | None = None
        # A close from another thread waits for a statement on the connection to end.
        self._guard = threading.Lock()
        self._version = self._data_version()

    def _data_version(self) -> int | None:
        with self._guard:
            try:
                if self._conn is None:
                    self._conn = sqlite3.connect(
                        self._store.path, isolation_level=None, check_same_thread=False
                    )
                return int(self._conn.execute("PRAGMA data_version").fetchone()[0])
            except sqlite3.Error:
                self._close()
                return None

    def wait(self, timeout_s: float) -> bool:
        """Until a write may have made work claimable, or `timeout_s` passed; True when woken."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            remaining = deadline - time.monotonic()
            if self._local.wait(min(max(remaining, 0.0), _SIGNAL_POLL_S)):
                self._version = self._data_version()
                return True
            version = self._data_version()
            if version is None or version != self._version:
                self._version = version
                return True
            if remaining <= 0:
                return False

    def close(self) -> None:
        """Close the signal's connection."""
        with self._guard:
            self._close()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
