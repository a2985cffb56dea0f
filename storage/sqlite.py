"""`SQLiteStore`: the `Store` protocol in one SQLite file, for one machine.

The embedded default. Documents are JSON text beside their index columns;
the three index queries ("claimable now", "lease expired", "deadline due")
each read a partial index named in the query (`INDEXED BY`), so a schema that
lost one fails loudly instead of scanning. The file is in WAL mode: readers
never wait for the writer. A write runs under `BEGIN IMMEDIATE`, so the
version check, the document and its audit record are one transaction under
the write lock; a competing writer, in this process or another, waits up to
the busy timeout. Every thread gets its own connection.

The file records its schema version (table `schema_version`) so that a later
release can migrate it; a file from a newer release is refused.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Final, Literal

from workwarden.storage.base import (
    AuditRecord,
    CandidateCursor,
    IndexFields,
    StoreConflict,
    StoredDocument,
    StoreFailure,
)

__all__ = ["SCHEMA_VERSION", "SQLiteStore", "Synchronous"]

SCHEMA_VERSION: Final = 1
"""The schema this release writes and reads."""

Synchronous = Literal["FULL", "EXTRA", "NORMAL"]
"""The `PRAGMA synchronous` levels a store may run at (`OFF` is never offered)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS documents (
    key TEXT PRIMARY KEY NOT NULL,
    version INTEGER NOT NULL CHECK (version >= 1),
    document TEXT NOT NULL,
    tenant TEXT NOT NULL,
    application TEXT NOT NULL,
    state TEXT NOT NULL,
    priority INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    eligible_at INTEGER,
    lease_expires_at INTEGER,
    next_deadline_at INTEGER,
    result_id TEXT UNIQUE
);
CREATE INDEX IF NOT EXISTS documents_by_scope
    ON documents (tenant, application, priority DESC, created_at, key);
CREATE INDEX IF NOT EXISTS documents_claimable
    ON documents (tenant, application, priority DESC, created_at, key, eligible_at)
    WHERE eligible_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS documents_by_lease
    ON documents (lease_expires_at, key, tenant, application)
    WHERE lease_expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS documents_by_deadline
    ON documents (next_deadline_at, key, tenant, application)
    WHERE next_deadline_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS audit (
    sequence INTEGER PRIMARY KEY,
    transaction_id TEXT NOT NULL,
    key TEXT NOT NULL,
    version INTEGER NOT NULL,
    actor TEXT NOT NULL,
    operation TEXT NOT NULL,
    tenant TEXT NOT NULL,
    application TEXT NOT NULL,
    at INTEGER NOT NULL,
    digest TEXT NOT NULL,
    worker TEXT,
    attempt TEXT,
    result TEXT,
    fencing_token INTEGER
);
"""

_DOCUMENT = (
    "key, version, document, tenant, application, state, priority, created_at,"
    " eligible_at, lease_expires_at, next_deadline_at, result_id"
)
_AUDIT = (
    "sequence, transaction_id, key, version, actor, operation, tenant, application, at,"
    " digest, worker, attempt, result, fencing_token"
)

_READ = f"SELECT {_DOCUMENT} FROM documents WHERE key = :key"
_FIND_RESULT = "SELECT key FROM documents WHERE result_id = :result_id"
_CLAIMABLE = (
    f"SELECT {_DOCUMENT} FROM documents INDEXED BY documents_claimable"
    " WHERE tenant = :tenant AND application = :application"
    " AND eligible_at IS NOT NULL AND eligible_at <= :now"
)
_CLAIM_ORDER = " ORDER BY priority DESC, created_at, key LIMIT :limit"
_CLAIM_CANDIDATES = _CLAIMABLE + _CLAIM_ORDER
# Keyset paging in (priority DESC, created_at, key) order; the leading
# `priority <= :priority` lets the index range start at the cursor.
_CLAIM_CANDIDATES_AFTER = (
    _CLAIMABLE + " AND priority <= :priority AND (priority < :priority OR (priority = :priority"
    " AND (created_at > :created_at OR (created_at = :created_at AND key > :key))))" + _CLAIM_ORDER
)
_SCOPE = (
    " AND (:tenant IS NULL OR tenant = :tenant)"
    " AND (:application IS NULL OR application = :application)"
)
_EXPIRED_LEASES = (
    "SELECT key FROM documents INDEXED BY documents_by_lease"
    " WHERE lease_expires_at IS NOT NULL AND lease_expires_at <= :now"
    + _SCOPE
    + " ORDER BY lease_expires_at, key LIMIT :limit"
)
_DEADLINES_DUE = (
    "SELECT key FROM documents INDEXED BY documents_by_deadline"
    " WHERE next_deadline_at IS NOT NULL AND next_deadline_at <= :now"
    + _SCOPE
    + " ORDER BY next_deadline_at, key LIMIT :limit"
)
_LIST = (
    f"SELECT {_DOCUMENT} FROM documents INDEXED BY documents_by_scope"
    " WHERE tenant = :tenant AND application = :application"
    " ORDER BY priority DESC, created_at, key"
)
_SCAN = f"SELECT {_DOCUMENT} FROM documents WHERE key > :after ORDER BY key LIMIT :limit"
_AUDIT_LOG = f"SELECT {_AUDIT} FROM audit WHERE sequence > :after ORDER BY sequence LIMIT :limit"

_INSERT = (
    f"INSERT INTO documents ({_DOCUMENT}) VALUES (:key, :version, :document, :tenant,"
    " :application, :state, :priority, :created_at, :eligible_at, :lease_expires_at,"
    " :next_deadline_at, :result_id)"
)
_UPDATE = (
    "UPDATE documents SET version = :version, document = :document, tenant = :tenant,"
    " application = :application, state = :state, priority = :priority,"
    " created_at = :created_at, eligible_at = :eligible_at,"
    " lease_expires_at = :lease_expires_at, next_deadline_at = :next_deadline_at,"
    " result_id = :result_id WHERE key = :key AND version = :expected"
)
_APPEND_AUDIT = (
    "INSERT INTO audit (transaction_id, key, version, actor, operation, tenant, application,"
    " at, digest, worker, attempt, result, fencing_token) VALUES (:transaction_id, :key,"
    " :version, :actor, :operation, :tenant, :application, :at, :digest, :worker, :attempt,"
    " :result, :fencing_token)"
)

#: The queries `query_plans` explains, and parameters of the right types for
#: them (SQLite ignores the names a query does not use).
_EXPLAINED: Mapping[str, str] = {
    "read": _READ,
    "find_result": _FIND_RESULT,
    "claim_candidates": _CLAIM_CANDIDATES,
    "claim_candidates_after": _CLAIM_CANDIDATES_AFTER,
    "expired_leases": _EXPIRED_LEASES,
    "deadlines_due": _DEADLINES_DUE,
    "list": _LIST,
    "scan": _SCAN,
    "audit_log": _AUDIT_LOG,
}
_EXAMPLE: Mapping[str, Any] = {
    "key": "k",
    "result_id": "r",
    "tenant": "t",
    "application": "a",
    "now": 0,
    "limit": 1,
    "priority": 0,
    "created_at": 0,
    "after": 0,
}

_SCAN_PAGE = 256
_SYNCHRONOUS: frozenset[str] = frozenset({"FULL", "EXTRA", "NORMAL"})


def _document(row: Sequence[Any]) -> StoredDocument:
    return StoredDocument(
        key=row[0],
        version=row[1],
        document=row[2],
        index=IndexFields(
            tenant=row[3],
            application=row[4],
            state=row[5],
            priority=row[6],
            created_at=row[7],
            eligible_at=row[8],
            lease_expires_at=row[9],
            next_deadline_at=row[10],
            result_id=row[11],
        ),
    )


def _audit(row: Sequence[Any]) -> AuditRecord:
    return AuditRecord(
        sequence=row[0],
        transaction_id=row[1],
        key=row[2],
        version=row[3],
        actor=row[4],
        operation=row[5],
        tenant=row[6],
        application=row[7],
        at=row[8],
        digest=row[9],
        worker=row[10],
        attempt=row[11],
        result=row[12],
        fencing_token=row[13],
    )


def _audit_params(audit: AuditRecord, key: str, version: int) -> dict[str, Any]:
    # Spelled out: `dataclasses.asdict` deep-copies every field, which costs
    # more than the statement that uses them.
    return {
        "transaction_id": audit.transaction_id,
        "key": key,
        "version": version,
        "actor": audit.actor,
        "operation": audit.operation,
        "tenant": audit.tenant,
        "application": audit.application,
        "at": audit.at,
        "digest": audit.digest,
        "worker": audit.worker,
        "attempt": audit.attempt,
        "result": audit.result,
        "fencing_token": audit.fencing_token,
    }


def _locked(exc: sqlite3.Error) -> bool:
    """Whether `exc` says the file stayed locked by another connection (busy timeout exceeded)."""
    return str(getattr(exc, "sqlite_errorname", "")).startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))


def _limit(limit: int | None) -> int:
    # SQLite reads a negative LIMIT as "no limit".
    return -1 if limit is None else max(limit, 0)


class SQLiteStore:
    """A CAS document store with index columns and an audit log in one SQLite file.

    `path` is the database file (created when absent; its directory must
    exist). Several threads may share one store, and several processes may
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
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "FULL",
        busy_timeout_ms: int = 10_000,
    ) -> None:
        name = os.fspath(path)
        if name == "" or name == ":memory:" or name.startswith("file:"):
            raise ValueError(
                f"SQLiteStore needs a file path, not {name!r}"
                " (for a store in memory use MemoryStore)"
            )
        level = str(synchronous).upper()
        if level not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of FULL, EXTRA, NORMAL, not {synchronous!r}")
        if isinstance(busy_timeout_ms, bool) or not isinstance(busy_timeout_ms, int):
            raise ValueError("busy_timeout_ms must be an integer number of milliseconds")
        if busy_timeout_ms < 0:
            raise ValueError("busy_timeout_ms must not be negative")
        self.path = name
        self.synchronous = level
        self.busy_timeout_ms = busy_timeout_ms
        self._lock = threading.Lock()
        self._connections: dict[int, sqlite3.Connection] = {}
        self._pid = os.getpid()
        self._closed = False
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
        with self._failures(f"cannot open {self.path}"):
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout_ms / 1000,
                isolation_level=None,
                check_same_thread=False,
            )
            try:
                conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
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
        conn = self._connection()
        with self._failures(what):
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
        conn = self._connection()
        with self._failures(what):
            return conn.execute(sql, params).fetchall()

    def _create_schema(self) -> None:
        with self._transaction(f"cannot create the schema in {self.path}") as conn:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            rows = conn.execute("SELECT version FROM schema_version").fetchall()
            if not rows:
                conn.execute(
                    "INSERT INTO schema_version (version) VALUES (:version)",
                    {"version": SCHEMA_VERSION},
                )
                return
            found = max(row[0] for row in rows)
            if found > SCHEMA_VERSION:
                raise StoreFailure(
                    f"{self.path} has schema version {found}; this release reads"
                    f" schema version {SCHEMA_VERSION} (upgrade workwarden)"
                )

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
        index; each is a conflict.
        """
        version = 1 if expected_version is None else expected_version + 1
        values = {
            "key": key,
            "version": version,
            "expected": expected_version,
            "document": document,
            "tenant": index.tenant,
            "application": index.application,
            "state": index.state,
            "priority": index.priority,
            "created_at": index.created_at,
            "eligible_at": index.eligible_at,
            "lease_expires_at": index.lease_expires_at,
            "next_deadline_at": index.next_deadline_at,
            "result_id": index.result_id,
        }
        record = _audit_params(audit, key, version)
        with self._transaction(f"write {key}") as conn:
            if expected_version is None:
                conn.execute(_INSERT, values)
            elif conn.execute(_UPDATE, values).rowcount != 1:
                raise StoreConflict(f"{key}: expected version {expected_version} does not hold")
            conn.execute(_APPEND_AUDIT, record)
        return version

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

    def list(self, tenant: str, application: str) -> Sequence[StoredDocument]:
        """Every document of a tenant and application, by priority then age."""
        params = {"tenant": tenant, "application": application}
        return [_document(row) for row in self._query("list", _LIST, params)]

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
        """Audit records with sequence greater than `after`, in commit order."""
        params = {"after": after, "limit": _limit(limit)}
        return [_audit(row) for row in self._query("audit log", _AUDIT_LOG, params)]

    def close(self) -> None:
        """Close every connection; later calls raise `StoreFailure`. Closing twice is harmless."""
        with self._lock:
            self._closed = True
            connections = list(self._connections.values())
            self._connections = {}
        with self._failures(f"close {self.path}"):
            for conn in connections:
                conn.close()

    # -- operations --------------------------------------------------------

    def query_plans(self) -> dict[str, tuple[str, ...]]:
        """How SQLite runs each query of the store (`EXPLAIN QUERY PLAN`), by query name.

        For operators and tests checking that every index query reads an
        index rather than the whole table.
        """
        plans: dict[str, tuple[str, ...]] = {}
        for name, sql in _EXPLAINED.items():
            rows = self._query(f"explain {name}", "EXPLAIN QUERY PLAN " + sql, _EXAMPLE)
            plans[name] = tuple(str(row[-1]) for row in rows)
        return plans
