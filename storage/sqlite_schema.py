"""The SQLite store's schema, its migration, and the text of its statements.

What `SQLiteStore` (`workwarden.storage.sqlite`) keeps in its file and runs
on it: the tables and indexes (`_SCHEMA`; the index queries each name the
partial index they read, `INDEXED BY`), the columns and indexes schema
versions 2 and 3 added (`_ADDED_COLUMNS`, `_ADDED_INDEXES`), `_ensure_schema`,
which creates the schema or brings an older file up to `SCHEMA_VERSION`, and
`_verify_schema`, which refuses a file that is not a workwarden store or is
newer; then the statements of every read and write, the queries
`query_plans` explains, and the decoding of the rows they return
(`_audit`; documents by `storage.base.document_from_row`), and the parameters
of a write (`_document_params`, `_audit_params`). Nothing here opens a file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any, Final

from workwarden.storage.base import (
    AuditRecord,
    IndexFields,
    StoreFailure,
    StoreLimited,
    over_limit,
    spend_rate,
)

__all__ = ["SCHEMA_VERSION"]

SCHEMA_VERSION: Final = 5
"""The schema this release writes and reads.

Version 2 adds `documents.claim_worker` (filled in from each document when a
version 1 file is opened for writing) and `audit.request_id`, each with its
partial index. Version 3 adds `documents.definition` (filled in from each
document's `definition_id` when an older file is opened for writing), the
pauses in force (`pauses`, with `pause_versions` counting each scope's pauses
and resumes) and the versions of purged keys (`tombstones`). Version 4 adds
`documents.concurrency_key` and `documents.concurrency_limit` (empty in an older
file's documents, which carry no concurrency key) and their partial index of the
documents that hold a claim. Version 5 adds `documents.rate_every_ms` and
`documents.rate_burst` (empty in an older file's documents), each rated key's
rate mark (`key_rates`) and the concurrency key of a key's pause
(`pauses.concurrency_key`)."""

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
    result_id TEXT UNIQUE,
    claim_worker TEXT,
    definition TEXT,
    concurrency_key TEXT,
    concurrency_limit INTEGER,
    rate_every_ms INTEGER,
    rate_burst INTEGER
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
    fencing_token INTEGER,
    request_id TEXT
);
CREATE TABLE IF NOT EXISTS pauses (
    scope_key TEXT PRIMARY KEY NOT NULL,
    tenant TEXT NOT NULL,
    application TEXT,
    definition TEXT,
    since INTEGER NOT NULL,
    actor TEXT NOT NULL,
    reason TEXT,
    request_id TEXT,
    concurrency_key TEXT
);
CREATE INDEX IF NOT EXISTS pauses_by_scope ON pauses (tenant, application, definition);
CREATE TABLE IF NOT EXISTS pause_versions (
    scope_key TEXT PRIMARY KEY NOT NULL,
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS key_rates (
    concurrency_key TEXT PRIMARY KEY NOT NULL,
    mark INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS tombstones (
    key TEXT PRIMARY KEY NOT NULL,
    version INTEGER NOT NULL
);
"""

# Schema versions 2 to 5: the columns an older file lacks (table, column, its
# type, how an existing row fills it in), then their indexes. (Version 3's
# tables are in `_SCHEMA`, created where missing.)
_ADDED_COLUMNS = (
    (
        "documents",
        "claim_worker",
        "TEXT",
        "json_extract(document, '$.current_claim.worker_id')",
    ),
    ("audit", "request_id", "TEXT", None),
    ("documents", "definition", "TEXT", "json_extract(document, '$.definition_id')"),
    ("documents", "concurrency_key", "TEXT", None),
    ("documents", "concurrency_limit", "INTEGER", None),
    ("documents", "rate_every_ms", "INTEGER", None),
    ("documents", "rate_burst", "INTEGER", None),
    ("pauses", "concurrency_key", "TEXT", None),
)
_ADDED_INDEXES = (
    "CREATE INDEX IF NOT EXISTS documents_by_claim_worker"
    " ON documents (tenant, application, claim_worker, key) WHERE claim_worker IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS audit_by_request"
    " ON audit (request_id, sequence) WHERE request_id IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS documents_by_concurrency"
    " ON documents (concurrency_key, key) WHERE claim_worker IS NOT NULL",
)

_DOCUMENT = (
    "key, version, document, tenant, application, state, priority, created_at,"
    " eligible_at, lease_expires_at, next_deadline_at, result_id, claim_worker, definition,"
    " concurrency_key, concurrency_limit, rate_every_ms, rate_burst"
)
_AUDIT = (
    "sequence, transaction_id, key, version, actor, operation, tenant, application, at,"
    " digest, worker, attempt, result, fencing_token, request_id"
)

_READ = f"SELECT {_DOCUMENT} FROM documents WHERE key = :key"
_FIND_RESULT = "SELECT key FROM documents WHERE result_id = :result_id"
# Paused scopes are left out in the query itself (`Pauses`): a pause of the
# tenant or the application is one uncorrelated test (run once, however many
# rows), a pause of a definition or of a concurrency key a lookup per row in
# `pauses_by_scope`.
_NOT_PAUSED = (
    " AND NOT EXISTS (SELECT 1 FROM pauses INDEXED BY pauses_by_scope"
    " WHERE tenant = :tenant AND (application IS NULL OR application = :application)"
    " AND definition IS NULL AND concurrency_key IS NULL)"
    " AND NOT EXISTS (SELECT 1 FROM pauses INDEXED BY pauses_by_scope"
    " WHERE tenant = :tenant AND application = :application"
    " AND definition = documents.definition AND concurrency_key IS NULL)"
    " AND (documents.concurrency_key IS NULL OR NOT EXISTS (SELECT 1 FROM pauses"
    " INDEXED BY pauses_by_scope WHERE tenant = :tenant"
    " AND (application IS NULL OR application = :application)"
    " AND (definition IS NULL OR definition = documents.definition)"
    " AND concurrency_key = documents.concurrency_key))"
)
_CLAIMABLE = (
    f"SELECT {_DOCUMENT} FROM documents INDEXED BY documents_claimable"
    " WHERE tenant = :tenant AND application = :application"
    " AND eligible_at IS NOT NULL AND eligible_at <= :now" + _NOT_PAUSED
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
_LIST_PAGE = _LIST + " LIMIT :limit"
# `list`'s keyset paging, as `_CLAIM_CANDIDATES_AFTER` pages the claimable rows.
_LIST_PAGE_AFTER = (
    f"SELECT {_DOCUMENT} FROM documents INDEXED BY documents_by_scope"
    " WHERE tenant = :tenant AND application = :application AND priority <= :priority"
    " AND (priority < :priority OR (priority = :priority"
    " AND (created_at > :created_at OR (created_at = :created_at AND key > :key))))"
    " ORDER BY priority DESC, created_at, key LIMIT :limit"
)
_SCAN = f"SELECT {_DOCUMENT} FROM documents WHERE key > :after ORDER BY key LIMIT :limit"
_HELD_CLAIMS = (
    f"SELECT {_DOCUMENT} FROM documents INDEXED BY documents_by_claim_worker"
    " WHERE tenant = :tenant AND application = :application"
    " AND claim_worker IS NOT NULL AND claim_worker = :worker ORDER BY key"
)
# The concurrency check of a claim's write (`IndexFields.concurrency_limit`), run in
# the write's transaction: the other documents of the key holding a claim, and
# whether the written document held one already.
_HOLDERS = (
    "SELECT count(*) FROM documents INDEXED BY documents_by_concurrency"
    " WHERE claim_worker IS NOT NULL AND concurrency_key = :concurrency_key AND key <> :key"
)
_HELD = "SELECT version, claim_worker IS NOT NULL FROM documents WHERE key = :key"
# The rate check of a claim's write (`IndexFields.rate_every_ms`): the key's mark.
_RATE_MARK = "SELECT mark FROM key_rates WHERE concurrency_key = :concurrency_key"
_SET_RATE_MARK = (
    "INSERT INTO key_rates (concurrency_key, mark) VALUES (:concurrency_key, :mark)"
    " ON CONFLICT (concurrency_key) DO UPDATE SET mark = excluded.mark"
)
_FIND_REQUEST = (
    f"SELECT {_AUDIT} FROM audit INDEXED BY audit_by_request"
    " WHERE request_id IS NOT NULL AND request_id = :request_id ORDER BY sequence LIMIT 1"
)
_AUDIT_LOG = f"SELECT {_AUDIT} FROM audit WHERE sequence > :after ORDER BY sequence LIMIT :limit"
# One key's records: no index holds them by key, so SQLite scans the log, in C,
# without handing the caller a row of another key.
_AUDIT_OF = f"SELECT {_AUDIT} FROM audit WHERE key = :key ORDER BY sequence"
_AUDIT_TAIL = f"SELECT {_AUDIT} FROM audit ORDER BY sequence DESC LIMIT :limit"
# No index holds the records by instant: SQLite scans the log, in C.
_AUDIT_SINCE = f"SELECT {_AUDIT} FROM audit WHERE at >= :at ORDER BY sequence"

#: How many keys one `read_many` query names (SQLite allows 32766 parameters).
_READ_MANY_CHUNK: Final = 500


def _read_many(count: int) -> str:
    """The query reading `count` keys at once (positional parameters, one per key)."""
    return f"SELECT {_DOCUMENT} FROM documents WHERE key IN ({', '.join('?' * count)})"


_INSERT = (
    f"INSERT INTO documents ({_DOCUMENT}) VALUES (:key, :version, :document, :tenant,"
    " :application, :state, :priority, :created_at, :eligible_at, :lease_expires_at,"
    " :next_deadline_at, :result_id, :claim_worker, :definition, :concurrency_key,"
    " :concurrency_limit, :rate_every_ms, :rate_burst)"
)
#: The version a purged key's next document follows (a create of a key purged
#: before expects it and is inserted at this + 1), read under the write lock.
_TOMBSTONE = "SELECT version FROM tombstones WHERE key = :key"
_UPDATE = (
    "UPDATE documents SET version = :version, document = :document, tenant = :tenant,"
    " application = :application, state = :state, priority = :priority,"
    " created_at = :created_at, eligible_at = :eligible_at,"
    " lease_expires_at = :lease_expires_at, next_deadline_at = :next_deadline_at,"
    " result_id = :result_id, claim_worker = :claim_worker, definition = :definition,"
    " concurrency_key = :concurrency_key, concurrency_limit = :concurrency_limit,"
    " rate_every_ms = :rate_every_ms, rate_burst = :rate_burst"
    " WHERE key = :key AND version = :expected"
)
_APPEND_AUDIT = (
    "INSERT INTO audit (transaction_id, key, version, actor, operation, tenant, application,"
    " at, digest, worker, attempt, result, fencing_token, request_id) VALUES (:transaction_id,"
    " :key, :version, :actor, :operation, :tenant, :application, :at, :digest, :worker,"
    " :attempt, :result, :fencing_token, :request_id)"
)

# Pauses (`Pauses`): the pause in force is a row of `pauses`; each pause and
# resume counts one more in `pause_versions` (its audit record's version).
_PAUSE_COLUMNS = (
    "scope_key, tenant, application, definition, since, actor, reason, request_id, concurrency_key"
)
_ADD_PAUSE = (
    f"INSERT INTO pauses ({_PAUSE_COLUMNS}) VALUES (:scope_key, :tenant, :application,"
    " :definition, :since, :actor, :reason, :request_id, :concurrency_key)"
    " ON CONFLICT (scope_key) DO NOTHING"
)
_REMOVE_PAUSE = "DELETE FROM pauses WHERE scope_key = :scope_key"
_PAUSE_VERSION = "SELECT version FROM pause_versions WHERE scope_key = :scope_key"
_COUNT_PAUSE = (
    "INSERT INTO pause_versions (scope_key, version) VALUES (:scope_key, :version)"
    " ON CONFLICT (scope_key) DO UPDATE SET version = excluded.version"
)
_PAUSED = (
    f"SELECT {_PAUSE_COLUMNS} FROM pauses"
    " WHERE (:tenant IS NULL OR tenant = :tenant) ORDER BY scope_key"
)


# Purges (`Purges`): terminal documents by key, and the delete that leaves a
# tombstone (the purge's version, which the key's next document follows).
def _purgeable(count: int, *, first: bool) -> str:
    """The query of a page of documents in one of `count` states (`:s0`, `:s1`...), by key."""
    states = ", ".join(f":s{number}" for number in range(count))
    after = "" if first else "key > :after AND "
    return (
        f"SELECT {_DOCUMENT} FROM documents WHERE {after}state IN ({states})"
        " ORDER BY key LIMIT :limit"
    )


_PURGE = "DELETE FROM documents WHERE key = :key AND version = :expected"
_BURY = (
    "INSERT INTO tombstones (key, version) VALUES (:key, :version)"
    " ON CONFLICT (key) DO UPDATE SET version = excluded.version"
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
    "list_page": _LIST_PAGE,
    "list_page_after": _LIST_PAGE_AFTER,
    "scan": _SCAN,
    "audit_log": _AUDIT_LOG,
    "held_claims": _HELD_CLAIMS,
    "find_request": _FIND_REQUEST,
    "concurrency_holders": _HOLDERS,
    "purgeable": _purgeable(2, first=False),
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
    "worker": "w",
    "request_id": "q",
    "concurrency_key": "c",
    "s0": "DONE",
    "s1": "FAILED",
}

# The scopes with work claimable now (`ScopeListing`), read off the claimable index.
_CLAIMABLE_SCOPES = (
    "SELECT DISTINCT tenant, application FROM documents INDEXED BY documents_claimable"
    " WHERE eligible_at IS NOT NULL AND eligible_at <= :now ORDER BY tenant, application"
)
_NEXT_INSTANTS = (
    "SELECT (SELECT min(eligible_at) FROM documents"
    " WHERE eligible_at IS NOT NULL AND eligible_at > :after" + _SCOPE + "),"
    " (SELECT min(lease_expires_at) FROM documents"
    " WHERE lease_expires_at IS NOT NULL AND lease_expires_at > :after" + _SCOPE + "),"
    " (SELECT min(next_deadline_at) FROM documents"
    " WHERE next_deadline_at IS NOT NULL AND next_deadline_at > :after" + _SCOPE + ")"
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
        request_id=row[14],
    )


def _document_params(
    key: str, document: str, index: IndexFields, expected_version: int | None
) -> dict[str, Any]:
    """The parameters of `_INSERT` or `_UPDATE` for one write (its new version included)."""
    return {
        "key": key,
        "version": 1 if expected_version is None else expected_version + 1,
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
        "claim_worker": index.claim_worker,
        "definition": index.definition,
        "concurrency_key": index.concurrency_key,
        "concurrency_limit": index.concurrency_limit,
        "rate_every_ms": index.rate_every_ms,
        "rate_burst": index.rate_burst,
    }


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
        "request_id": audit.request_id,
    }


def _add_columns(conn: sqlite3.Connection) -> None:
    """Bring an older file to this version (in the schema transaction): add, fill, index."""
    for table, column, kind, fill in _ADDED_COLUMNS:
        present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if column not in present:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            if fill is not None:
                conn.execute(f"UPDATE {table} SET {column} = {fill}")
    for statement in _ADDED_INDEXES:
        conn.execute(statement)
    conn.execute(
        "UPDATE schema_version SET version = :version WHERE version < :version",
        {"version": SCHEMA_VERSION},
    )


def _check_limit(
    conn: sqlite3.Connection, key: str, index: IndexFields, at: int, expected: int | None
) -> int | None:
    """Refuse a claim's write past its key's limit or rate, in the write's transaction.

    `StoreLimited` past the limit, `StoreRateLimited` with no token left at
    `at`. Counted only for a write that holds a claim with a limit or a rate;
    the document's committed version is read only when a check would refuse
    or spend (a holder already counted may go on: a heartbeat, a start; a
    write expecting another version than the committed one is left to fail
    its compare-and-swap, a conflict rather than a limit). Returns the key's
    new rate mark, for `_keep_rate_mark` once the write is made (None when
    the write spends no token).
    """
    if not index.gated:
        return None
    refusal: StoreLimited | None = None
    mark: int | None = None
    if index.limited and index.concurrency_limit is not None:
        params = {"concurrency_key": index.concurrency_key, "key": key}
        holders: int = conn.execute(_HOLDERS, params).fetchone()[0]
        if holders >= index.concurrency_limit:
            refusal = over_limit(index, holders)
    if refusal is None and index.rated:
        row = conn.execute(_RATE_MARK, {"concurrency_key": index.concurrency_key}).fetchone()
        try:
            mark = spend_rate(index, None if row is None else row[0], at)
        except StoreLimited as exc:
            refusal = exc
    if refusal is None and mark is None:
        return None
    held = conn.execute(_HELD, {"key": key}).fetchone()
    if (None if held is None else held[0]) != expected or (held is not None and held[1]):
        return None
    if refusal is not None:
        raise refusal
    return mark


def _keep_rate_mark(conn: sqlite3.Connection, index: IndexFields, mark: int | None) -> None:
    """Keep the rate mark `_check_limit` gave, once its write is made."""
    if mark is not None:
        conn.execute(_SET_RATE_MARK, {"concurrency_key": index.concurrency_key, "mark": mark})


def _newer_schema(path: str, found: int) -> StoreFailure:
    """The refusal of the file at `path`, whose schema version `found` is newer than this one."""
    return StoreFailure(
        f"{path} has schema version {found}; this release reads"
        f" schema version {SCHEMA_VERSION} (upgrade workwarden)"
    )


def _ensure_schema(conn: sqlite3.Connection, path: str) -> None:
    """Create the tables if missing, bring an older file to this version, refuse a newer one.

    Run inside the caller's write transaction, which a refusal rolls back.
    """
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    _add_columns(conn)
    rows = conn.execute("SELECT version FROM schema_version").fetchall()
    if not rows:
        conn.execute(
            "INSERT INTO schema_version (version) VALUES (:version)",
            {"version": SCHEMA_VERSION},
        )
        return
    found = max(row[0] for row in rows)
    if found > SCHEMA_VERSION:
        raise _newer_schema(path, found)


def _verify_schema(conn: sqlite3.Connection, path: str, *, read_only: bool = False) -> None:
    """Refuse a file this store did not create: not a workwarden store, or a newer one.

    Opened `read_only`, an older file is refused too: it is brought up to this
    version only when opened for writing, and this release's reads name the
    columns it lacks.
    """
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "schema_version" not in tables or "documents" not in tables:
        raise StoreFailure(f"{path} is not a workwarden store (it has no schema)")
    found = max((row[0] for row in conn.execute("SELECT version FROM schema_version")), default=0)
    if found > SCHEMA_VERSION:
        raise _newer_schema(path, found)
    if read_only and found < SCHEMA_VERSION:
        raise StoreFailure(
            f"{path} has schema version {found}, older than this release's"
            f" {SCHEMA_VERSION}: a command that writes to it (worker, sweeper, import...)"
            " brings it up to date; until then it cannot be read"
        )
