"""The PostgreSQL store's tables, the text of its statements, and its schema's creation.

What `PostgresStore` (`workwarden.storage.postgres`) runs, as text: the
tables and indexes (`_SCHEMA`, created or brought up to `SCHEMA_VERSION` by
`_ensure_schema`, under an advisory lock), the statements of every read and
write (each write one data-modifying CTE: the compare-and-swap of the
document and the insert of its audit record; those that leave work
claimable also notify `WORK_CHANNEL`), and the decoding of the rows they
return (`_audit`; documents by `storage.base.document_from_row`). Nothing here connects to a server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Final

from workwarden.storage.base import (
    AuditRecord,
    IndexFields,
    StoreAbsent,
    StoreFailure,
    Write,
    wakes_claimers,
)
from workwarden.storage.pg_extra import extra_missing

try:
    import psycopg
    import psycopg.errors
    from psycopg.rows import TupleRow
except ImportError as exc:  # pragma: no cover - depends on the environment
    # psycopg is the `postgres` extra: a SQLite-only install does not have it.
    raise extra_missing(exc) from None

__all__ = ["SCHEMA_VERSION", "WORK_CHANNEL"]

SCHEMA_VERSION = 5
"""The version of the tables the PostgreSQL store reads and writes.

Version 2 adds `claim_worker` to the documents (filled in from each document
when a version 1 database is opened) and `request_id` to the audit log, each
with its partial index. Version 3 adds `definition` to the documents (filled
in from each document's `definition_id` when an older database is opened),
the pauses in force (`workwarden_pauses`, with `workwarden_pause_versions`
counting each scope's pauses and resumes) and the versions of purged keys
(`workwarden_tombstones`). Version 4 adds `concurrency_key` and
`concurrency_limit` to the documents (empty in an older database's documents,
which carry no concurrency key), with a partial index of the documents that
hold a claim, for the concurrency check of a claim's write. Version 5 adds
`rate_every_ms` and `rate_burst` to the documents (empty in an older database's
documents), each rated concurrency key's rate mark (`workwarden_key_rates`) and
the concurrency key of a key's pause (`workwarden_pauses.concurrency_key`)."""

# The key of the advisory lock held while the schema is created (any fixed
# number; advisory locks are scoped to one database).
_SCHEMA_LOCK = 0x776F726B77617264  # "workward"

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS workwarden_schema_version (
        version INTEGER PRIMARY KEY
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS workwarden_documents (
        key TEXT COLLATE "C" PRIMARY KEY,
        version BIGINT NOT NULL CHECK (version >= 1),
        document TEXT NOT NULL,
        tenant TEXT COLLATE "C" NOT NULL,
        application TEXT COLLATE "C" NOT NULL,
        state TEXT NOT NULL,
        -- Ordered by -priority, which must not overflow.
        priority BIGINT NOT NULL CHECK (priority > -9223372036854775808),
        created_at BIGINT NOT NULL,
        eligible_at BIGINT,
        lease_expires_at BIGINT,
        next_deadline_at BIGINT,
        result_id TEXT COLLATE "C" UNIQUE
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS workwarden_audit (
        sequence BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        transaction_id TEXT NOT NULL,
        key TEXT COLLATE "C" NOT NULL,
        version BIGINT NOT NULL,
        actor TEXT NOT NULL,
        operation TEXT NOT NULL,
        tenant TEXT NOT NULL,
        application TEXT NOT NULL,
        at BIGINT NOT NULL,
        digest TEXT NOT NULL,
        worker TEXT,
        attempt TEXT,
        result TEXT,
        fencing_token BIGINT
    )
    """,
    # "Every document of a tenant and application, by priority then age."
    """
    CREATE INDEX IF NOT EXISTS workwarden_documents_by_scope
        ON workwarden_documents (tenant, application, (-priority), created_at, key)
    """,
    # "Claimable now": only READY rows carry eligible_at, so the index stays small.
    """
    CREATE INDEX IF NOT EXISTS workwarden_documents_claimable
        ON workwarden_documents (tenant, application, (-priority), created_at, key)
        INCLUDE (eligible_at)
        WHERE eligible_at IS NOT NULL
    """,
    """
    CREATE INDEX IF NOT EXISTS workwarden_documents_leases
        ON workwarden_documents (lease_expires_at, key)
        WHERE lease_expires_at IS NOT NULL
    """,
    """
    CREATE INDEX IF NOT EXISTS workwarden_documents_deadlines
        ON workwarden_documents (next_deadline_at, key)
        WHERE next_deadline_at IS NOT NULL
    """,
    # Schema version 2: a version 1 database gains these columns, filled in.
    'ALTER TABLE workwarden_documents ADD COLUMN IF NOT EXISTS claim_worker TEXT COLLATE "C"',
    """
    UPDATE workwarden_documents SET claim_worker = document::jsonb #>> '{current_claim,worker_id}'
    WHERE claim_worker IS NULL AND document::jsonb #>> '{current_claim,worker_id}' IS NOT NULL
    """,
    'ALTER TABLE workwarden_audit ADD COLUMN IF NOT EXISTS request_id TEXT COLLATE "C"',
    # "The claims a worker holds", for a claim repeated after its reply was lost.
    """
    CREATE INDEX IF NOT EXISTS workwarden_documents_by_claim_worker
        ON workwarden_documents (tenant, application, claim_worker, key)
        WHERE claim_worker IS NOT NULL
    """,
    # "The first write made for a request id", for an operator request repeated.
    """
    CREATE INDEX IF NOT EXISTS workwarden_audit_by_request
        ON workwarden_audit (request_id, sequence)
        WHERE request_id IS NOT NULL
    """,
    # Schema version 3: the definition of each document, for definition pauses.
    'ALTER TABLE workwarden_documents ADD COLUMN IF NOT EXISTS definition TEXT COLLATE "C"',
    """
    UPDATE workwarden_documents SET definition = document::jsonb ->> 'definition_id'
    WHERE definition IS NULL AND document::jsonb ->> 'definition_id' IS NOT NULL
    """,
    # The pauses in force, one row per scope (application and definition NULL:
    # every one); the claim queries look them up by (tenant, application, definition).
    """
    CREATE TABLE IF NOT EXISTS workwarden_pauses (
        scope_key TEXT COLLATE "C" PRIMARY KEY,
        tenant TEXT COLLATE "C" NOT NULL,
        application TEXT COLLATE "C",
        definition TEXT COLLATE "C",
        since BIGINT NOT NULL,
        actor TEXT NOT NULL,
        reason TEXT,
        request_id TEXT
    )
    """,
    """
    CREATE INDEX IF NOT EXISTS workwarden_pauses_by_scope
        ON workwarden_pauses (tenant, application, definition)
    """,
    # How many times each scope was paused or resumed: its audit records' versions.
    """
    CREATE TABLE IF NOT EXISTS workwarden_pause_versions (
        scope_key TEXT COLLATE "C" PRIMARY KEY,
        version BIGINT NOT NULL
    )
    """,
    # Schema version 4: each document's concurrency key and the limit in force for it.
    'ALTER TABLE workwarden_documents ADD COLUMN IF NOT EXISTS concurrency_key TEXT COLLATE "C"',
    "ALTER TABLE workwarden_documents ADD COLUMN IF NOT EXISTS concurrency_limit BIGINT",
    # "The documents of a key that hold a claim", counted by a claim's write.
    """
    CREATE INDEX IF NOT EXISTS workwarden_documents_by_concurrency
        ON workwarden_documents (concurrency_key, key)
        WHERE claim_worker IS NOT NULL
    """,
    # Schema version 5: each document's key rate, and each rated key's rate mark.
    "ALTER TABLE workwarden_documents ADD COLUMN IF NOT EXISTS rate_every_ms BIGINT",
    "ALTER TABLE workwarden_documents ADD COLUMN IF NOT EXISTS rate_burst BIGINT",
    'ALTER TABLE workwarden_pauses ADD COLUMN IF NOT EXISTS concurrency_key TEXT COLLATE "C"',
    """
    CREATE TABLE IF NOT EXISTS workwarden_key_rates (
        concurrency_key TEXT COLLATE "C" PRIMARY KEY,
        mark BIGINT NOT NULL
    )
    """,
    # Documents outgrow the inline limit once claimed (3 to 5 KiB of JSON): lz4
    # compresses and decompresses them several times faster than the default
    # pglz, on every write and every candidate page. A server built without
    # lz4 (or older than 14) keeps its default; nothing else depends on it.
    """
    DO $$
    BEGIN
        EXECUTE 'ALTER TABLE workwarden_documents ALTER COLUMN document SET COMPRESSION lz4';
    EXCEPTION WHEN feature_not_supported OR syntax_error THEN
        NULL;
    END
    $$
    """,
    # The version of each purged key's purge, which its next document follows.
    """
    CREATE TABLE IF NOT EXISTS workwarden_tombstones (
        key TEXT COLLATE "C" PRIMARY KEY,
        version BIGINT NOT NULL
    )
    """,
)


class NewerSchema(StoreFailure):
    """The database holds the schema of a newer release: no retry makes it readable."""


class OlderSchema(StoreFailure):
    """The database holds the schema of an older release, and the store was opened not to
    change it (`PostgresStore(..., upgrade=False)`): a store that writes brings it up to date."""


#: The store's tables, as `_SCHEMA` creates them.
TABLES: Final = tuple(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", "".join(_SCHEMA)))


def drop_schema_written_only_by(conn: psycopg.Connection[TupleRow], operation: str) -> bool:
    """Drop the store's tables when nothing but `operation` ever wrote to them; whether it did.

    For a command that created the store and then was refused or stopped
    (`workwarden import --create`): the schema it created goes with it. Under
    the schema's lock and with every table locked, so that no writer comes in
    between the look and the drop: a store another writer wrote to (a record
    of another operation, a pause, a tombstone, a rate mark) is left as it is.
    """
    with conn.transaction():
        # A session still holding a lock (one the stop interrupted) keeps the tables: the
        # drop gives up (an error) rather than wait for it.
        conn.execute("SET LOCAL lock_timeout = '5s'")
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        conn.execute(f"LOCK TABLE {', '.join(TABLES)} IN ACCESS EXCLUSIVE MODE")
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM workwarden_audit WHERE operation <> %s)"
            " OR EXISTS (SELECT 1 FROM workwarden_pauses)"
            " OR EXISTS (SELECT 1 FROM workwarden_pause_versions)"
            " OR EXISTS (SELECT 1 FROM workwarden_tombstones)"
            " OR EXISTS (SELECT 1 FROM workwarden_key_rates)",
            (operation,),
        ).fetchone()
        if row is None or row[0]:
            return False
        conn.execute(f"DROP TABLE {', '.join(TABLES)}")
    return True


_COLUMNS = (
    "key, version, document, tenant, application, state, priority, created_at,"
    " eligible_at, lease_expires_at, next_deadline_at, result_id, claim_worker, definition,"
    " concurrency_key, concurrency_limit, rate_every_ms, rate_burst"
)

_READ = f"SELECT {_COLUMNS} FROM workwarden_documents WHERE key = %s"

_READ_MANY = f"SELECT {_COLUMNS} FROM workwarden_documents WHERE key = ANY(%s)"

_AUDIT_INSERT = """
    INSERT INTO workwarden_audit (
        transaction_id, key, version, actor, operation, tenant, application, at, digest,
        worker, attempt, result, fencing_token, request_id
    )
    SELECT %(tx)s::text, %(audit_key)s::text, changed.version, %(actor)s::text,
        %(operation)s::text, %(audit_tenant)s::text, %(audit_application)s::text,
        %(at)s::bigint, %(digest)s::text, %(worker)s::text, %(attempt)s::text,
        %(result)s::text, %(fencing_token)s::bigint, %(request_id)s::text
    FROM changed
    RETURNING version, sequence
"""

# A create starts at version 1, and only if the key was never purged: a key
# purged before is created again by a write expecting its tombstone's version
# (`_UPDATE`'s `reborn`). Both looked up in the statement itself, so an
# admission costs no extra round trip.
# (Typed: in a SELECT, unlike VALUES, a parameter takes no type from its column.)
_VALUES = """%(document)s::text, %(tenant)s::text, %(application)s::text, %(state)s::text,
            %(priority)s::bigint, %(created_at)s::bigint, %(eligible_at)s::bigint,
            %(lease_expires_at)s::bigint, %(next_deadline_at)s::bigint, %(result_id)s::text,
            %(claim_worker)s::text, %(definition)s::text, %(concurrency_key)s::text,
            %(concurrency_limit)s::bigint, %(rate_every_ms)s::bigint, %(rate_burst)s::bigint"""

# A create inserts only where its statement's snapshot holds neither a tombstone nor a
# document of the key. The second test closes a race with the key's purge: a create
# whose snapshot still holds the document waits on the purge's row lock, and once the
# purge commits the insert would go ahead (its tombstone test read the old snapshot),
# at version 1. With it, a snapshot taken before the purge committed holds the
# document (no insert: a conflict), and one taken after holds the tombstone.
_CREATE = f"""
    WITH changed AS (
        INSERT INTO workwarden_documents ({_COLUMNS})
        SELECT %(key)s::text, 1, {_VALUES}
        WHERE NOT EXISTS (SELECT 1 FROM workwarden_tombstones WHERE key = %(key)s)
            AND NOT EXISTS (SELECT 1 FROM workwarden_documents WHERE key = %(key)s)
        ON CONFLICT (key) DO NOTHING
        RETURNING version
    )
    {_AUDIT_INSERT}
"""

_UPDATE = f"""
    WITH updated AS (
        UPDATE workwarden_documents SET
            version = version + 1, document = %(document)s, tenant = %(tenant)s,
            application = %(application)s, state = %(state)s, priority = %(priority)s,
            created_at = %(created_at)s, eligible_at = %(eligible_at)s,
            lease_expires_at = %(lease_expires_at)s, next_deadline_at = %(next_deadline_at)s,
            result_id = %(result_id)s, claim_worker = %(claim_worker)s,
            definition = %(definition)s, concurrency_key = %(concurrency_key)s,
            concurrency_limit = %(concurrency_limit)s, rate_every_ms = %(rate_every_ms)s,
            rate_burst = %(rate_burst)s
        WHERE key = %(key)s AND version = %(expected)s
        RETURNING version
    ), reborn AS (
        -- Absent and purged at exactly the expected version: created again after it.
        INSERT INTO workwarden_documents ({_COLUMNS})
        SELECT %(key)s::text, t.version + 1, {_VALUES}
        FROM workwarden_tombstones AS t
        WHERE t.key = %(key)s::text AND t.version = %(expected)s::bigint
        ON CONFLICT (key) DO NOTHING
        RETURNING version
    ), changed AS (
        SELECT version FROM updated UNION ALL SELECT version FROM reborn
    )
    {_AUDIT_INSERT}
"""

# Paused scopes are left out by the claim queries themselves (`Pauses`): a
# pause of the tenant or the application is an uncorrelated test, run once per
# query; a pause of a definition or of a concurrency key, a lookup per row in
# the pauses' index.
_NOT_PAUSED = """
        AND NOT EXISTS (SELECT 1 FROM workwarden_pauses AS p
            WHERE p.tenant = %(tenant)s
                AND (p.application IS NULL OR p.application = %(application)s)
                AND p.definition IS NULL AND p.concurrency_key IS NULL)
        AND NOT EXISTS (SELECT 1 FROM workwarden_pauses AS p
            WHERE p.tenant = %(tenant)s AND p.application = %(application)s
                AND p.definition = workwarden_documents.definition
                AND p.concurrency_key IS NULL)
        AND (workwarden_documents.concurrency_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM workwarden_pauses AS p
            WHERE p.tenant = %(tenant)s
                AND (p.application IS NULL OR p.application = %(application)s)
                AND (p.definition IS NULL OR p.definition = workwarden_documents.definition)
                AND p.concurrency_key = workwarden_documents.concurrency_key))
"""

_CANDIDATES = f"""
    SELECT {_COLUMNS} FROM workwarden_documents
    WHERE tenant = %(tenant)s AND application = %(application)s
        AND eligible_at IS NOT NULL AND eligible_at <= %(now)s {_NOT_PAUSED}
        AND (-priority, created_at, key) > (%(neg_priority)s, %(created_at)s, %(key)s)
    ORDER BY -priority, created_at, key
    LIMIT %(limit)s
"""

_CANDIDATES_FIRST = f"""
    SELECT {_COLUMNS} FROM workwarden_documents
    WHERE tenant = %(tenant)s AND application = %(application)s
        AND eligible_at IS NOT NULL AND eligible_at <= %(now)s {_NOT_PAUSED}
    ORDER BY -priority, created_at, key
    LIMIT %(limit)s
"""

# `claim_batch`: the same pages, each row locked until the batch commits;
# rows another batch holds are skipped, not waited for.
_LOCK_CANDIDATES_FIRST = _CANDIDATES_FIRST + " FOR UPDATE SKIP LOCKED"
_LOCK_CANDIDATES = _CANDIDATES + " FOR UPDATE SKIP LOCKED"

_LIST = f"""
    SELECT {_COLUMNS} FROM workwarden_documents
    WHERE tenant = %s AND application = %s
    ORDER BY -priority, created_at, key
"""

_LIST_PAGE_FIRST = f"""
    SELECT {_COLUMNS} FROM workwarden_documents
    WHERE tenant = %(tenant)s AND application = %(application)s
    ORDER BY -priority, created_at, key
    LIMIT %(limit)s
"""
_LIST_PAGE = f"""
    SELECT {_COLUMNS} FROM workwarden_documents
    WHERE tenant = %(tenant)s AND application = %(application)s
        AND (-priority, created_at, key) > (%(neg_priority)s, %(created_at)s, %(key)s)
    ORDER BY -priority, created_at, key
    LIMIT %(limit)s
"""

_SCAN_FIRST = f"SELECT {_COLUMNS} FROM workwarden_documents ORDER BY key LIMIT %s"

_SCAN = f"SELECT {_COLUMNS} FROM workwarden_documents WHERE key > %s ORDER BY key LIMIT %s"

_HELD_CLAIMS = f"""
    SELECT {_COLUMNS} FROM workwarden_documents
    WHERE tenant = %s AND application = %s AND claim_worker IS NOT NULL AND claim_worker = %s
    ORDER BY key
"""


def _due_query(column: str, tenant: bool, application: bool) -> str:
    # `column` is one of two constants below; the filters are fixed fragments.
    where = [f"{column} <= %(now)s"]
    if tenant:
        where.append("tenant = %(tenant)s")
    if application:
        where.append("application = %(application)s")
    return (
        f"SELECT key FROM workwarden_documents WHERE {column} IS NOT NULL"
        f" AND {' AND '.join(where)} ORDER BY {column}, key LIMIT %(limit)s"
    )


_DUE = {
    (column, tenant, application): _due_query(column, tenant, application)
    for column in ("lease_expires_at", "next_deadline_at")
    for tenant in (False, True)
    for application in (False, True)
}

# Wake-ups: a write that leaves work claimable (an admission, a re-arm, a
# recovery, a retry) notifies this channel in its own statement, so the
# notification is sent exactly when the write commits. The payload is the
# JSON array [tenant, application].
WORK_CHANNEL: Final = "workwarden_work"

_NOTIFYING = (
    ", audited AS (" + _AUDIT_INSERT + ")"
    " SELECT version, sequence,"
    " pg_notify('" + WORK_CHANNEL + "', json_build_array(%(tenant)s::text,"
    " %(application)s::text)::text)::text FROM audited"
)
_CREATE_NOTIFYING = _CREATE.replace(_AUDIT_INSERT, _NOTIFYING)
_UPDATE_NOTIFYING = _UPDATE.replace(_AUDIT_INSERT, _NOTIFYING)


# Pauses (`Pauses`): a pause or a resume is one statement, the row of the pause
# in force added or removed, the scope's count of pauses and resumes taken one
# further, and its audit record (of that version) inserted; none of it when
# the scope already was in that condition. A resume notifies `WORK_CHANNEL`
# with [tenant, application] (application null for a tenant's pause): every
# signal of the scope wakes.
_COUNT_PAUSE = """
    INSERT INTO workwarden_pause_versions (scope_key, version)
    SELECT scope_key, 1 FROM toggled
    ON CONFLICT (scope_key)
        DO UPDATE SET version = workwarden_pause_versions.version + 1
    RETURNING version
"""

_PAUSE = f"""
    WITH toggled AS (
        INSERT INTO workwarden_pauses (
            scope_key, tenant, application, definition, since, actor, reason, request_id,
            concurrency_key
        )
        VALUES (%(scope_key)s, %(scope_tenant)s, %(scope_application)s, %(scope_definition)s,
            %(since)s, %(pause_actor)s, %(reason)s, %(pause_request_id)s,
            %(scope_concurrency_key)s)
        ON CONFLICT (scope_key) DO NOTHING
        RETURNING scope_key
    ), changed AS ({_COUNT_PAUSE})
    {_AUDIT_INSERT}
"""

_RESUME = f"""
    WITH toggled AS (
        DELETE FROM workwarden_pauses WHERE scope_key = %(scope_key)s RETURNING scope_key
    ), changed AS ({_COUNT_PAUSE}), audited AS ({_AUDIT_INSERT})
    SELECT version, sequence, pg_notify('{WORK_CHANNEL}',
        json_build_array(%(scope_tenant)s::text, %(scope_application)s::text)::text)::text
    FROM audited
"""

_PAUSED = """
    SELECT scope_key, tenant, application, definition, since, actor, reason, request_id,
        concurrency_key
    FROM workwarden_pauses
    WHERE %(tenant)s::text IS NULL OR tenant = %(tenant)s::text
    ORDER BY scope_key
"""

# Purges (`Purges`): documents in terminal states by key, and the delete that
# keeps the purge's version (the deleted one + 1) as the key's tombstone, in
# one statement with the purge's audit record.
_PURGEABLE_FIRST = f"""
    SELECT {_COLUMNS} FROM workwarden_documents
    WHERE state = ANY(%(states)s::text[]) ORDER BY key LIMIT %(limit)s
"""

_PURGEABLE = f"""
    SELECT {_COLUMNS} FROM workwarden_documents
    WHERE key > %(after)s AND state = ANY(%(states)s::text[]) ORDER BY key LIMIT %(limit)s
"""

_TOMBSTONE = "SELECT version FROM workwarden_tombstones WHERE key = %s"

_PURGE = f"""
    WITH gone AS (
        DELETE FROM workwarden_documents WHERE key = %(key)s AND version = %(expected)s
        RETURNING key, version
    ), changed AS (
        INSERT INTO workwarden_tombstones (key, version)
        SELECT key, version + 1 FROM gone
        ON CONFLICT (key) DO UPDATE SET version = EXCLUDED.version
        RETURNING version
    )
    {_AUDIT_INSERT}
"""


def _audit_params(audit: AuditRecord) -> dict[str, Any]:
    """The parameters `_AUDIT_INSERT` takes for `audit` (its version comes from the statement)."""
    return {
        "tx": audit.transaction_id,
        "audit_key": audit.key,
        "actor": audit.actor,
        "operation": audit.operation,
        "audit_tenant": audit.tenant,
        "audit_application": audit.application,
        "at": audit.at,
        "digest": audit.digest,
        "worker": audit.worker,
        "attempt": audit.attempt,
        "result": audit.result,
        "fencing_token": audit.fencing_token,
        "request_id": audit.request_id,
    }


# The concurrency check of claims' writes (`IndexFields.concurrency_limit`): a
# transaction-scoped advisory lock per concurrency key (taken in key order, so
# two claimers never wait on each other in a circle), then the documents of
# those keys that hold a claim, read after the locks were granted.
_CONCURRENCY_LOCK = (
    "SELECT pg_advisory_xact_lock(hashtextextended('workwarden concurrency ' || k, 0))"
    " FROM unnest(%(keys)s::text[]) AS k ORDER BY k"
)
_CONCURRENCY_HOLDERS = (
    "SELECT concurrency_key, key FROM workwarden_documents"
    " WHERE claim_worker IS NOT NULL AND concurrency_key = ANY(%(keys)s::text[])"
)
# The committed versions of the keys a batch's gated writes expect (a write expecting
# another version fails its compare-and-swap: a conflict, not a limit).
_GATED_VERSIONS = "SELECT key, version FROM workwarden_documents WHERE key = ANY(%(keys)s::text[])"
# The rate check (`IndexFields.rate_every_ms`), under the same locks: the marks of
# the keys, and the marks the batch's claims moved them to.
_RATE_MARKS = (
    "SELECT concurrency_key, mark FROM workwarden_key_rates"
    " WHERE concurrency_key = ANY(%(keys)s::text[])"
)
_SET_RATE_MARKS = (
    "INSERT INTO workwarden_key_rates (concurrency_key, mark)"
    " SELECT * FROM unnest(%(keys)s::text[], %(marks)s::bigint[])"
    " ON CONFLICT (concurrency_key) DO UPDATE SET mark = EXCLUDED.mark"
)


# `write_many`: every write of a batch in one statement, its fields (these,
# typed as listed) passed as the rows of one JSON array and its documents as
# a text array, zipped in batch order (`ord` is each write's place in it). Creates and
# updates compare-and-swap as `_CREATE` and `_UPDATE` do; the audit records
# are inserted in batch order, so their sequences follow it; a write that
# leaves work claimable notifies as `_NOTIFYING` does. A write whose
# compare-and-swap did not hold returns no row.
_BATCH_FIELDS = (
    ("ord", "int"),
    ("key", "text"),
    ("expected", "bigint"),
    ("tenant", "text"),
    ("application", "text"),
    ("state", "text"),
    ("priority", "bigint"),
    ("created_at", "bigint"),
    ("eligible_at", "bigint"),
    ("lease_expires_at", "bigint"),
    ("next_deadline_at", "bigint"),
    ("result_id", "text"),
    ("claim_worker", "text"),
    ("definition", "text"),
    ("concurrency_key", "text"),
    ("concurrency_limit", "bigint"),
    ("rate_every_ms", "bigint"),
    ("rate_burst", "bigint"),
    ("tx", "text"),
    ("audit_key", "text"),
    ("actor", "text"),
    ("operation", "text"),
    ("audit_tenant", "text"),
    ("audit_application", "text"),
    ("at", "bigint"),
    ("digest", "text"),
    ("worker", "text"),
    ("attempt", "text"),
    ("result", "text"),
    ("fencing_token", "bigint"),
    ("request_id", "text"),
)


_WRITE_MANY = f"""
    WITH input AS (
        SELECT * FROM ROWS FROM (
            json_to_recordset(%(rows)s::json)
                AS ({", ".join(f"{name} {kind}" for name, kind in _BATCH_FIELDS)}),
            unnest(%(documents)b::text[])
        ) AS i({", ".join(name for name, _ in _BATCH_FIELDS)}, document)
    ), created AS (
        -- A create of a key never purged; one purged before is `reborn`.
        INSERT INTO workwarden_documents ({_COLUMNS})
        SELECT i.key, 1, i.document, i.tenant, i.application,
            i.state, i.priority, i.created_at, i.eligible_at, i.lease_expires_at,
            i.next_deadline_at, i.result_id, i.claim_worker, i.definition,
            i.concurrency_key, i.concurrency_limit, i.rate_every_ms, i.rate_burst
        FROM input AS i LEFT JOIN workwarden_tombstones AS t ON t.key = i.key
        WHERE i.expected IS NULL AND t.key IS NULL
            -- As in `_CREATE`: not while the key's purge is uncommitted.
            AND NOT EXISTS (SELECT 1 FROM workwarden_documents AS d WHERE d.key = i.key)
        -- In key order, as every batch creates: two batches creating some of the same
        -- keys wait for one another in one order, never each for the other.
        ORDER BY i.key COLLATE "C"
        ON CONFLICT (key) DO NOTHING
        RETURNING key, version
    ), reborn AS (
        -- Absent and purged at exactly the expected version: created again after it.
        INSERT INTO workwarden_documents ({_COLUMNS})
        SELECT i.key, t.version + 1, i.document, i.tenant, i.application,
            i.state, i.priority, i.created_at, i.eligible_at, i.lease_expires_at,
            i.next_deadline_at, i.result_id, i.claim_worker, i.definition,
            i.concurrency_key, i.concurrency_limit, i.rate_every_ms, i.rate_burst
        FROM input AS i JOIN workwarden_tombstones AS t
            ON t.key = i.key AND t.version = i.expected
        ORDER BY i.key COLLATE "C"
        ON CONFLICT (key) DO NOTHING
        RETURNING key, version
    ), updated AS (
        UPDATE workwarden_documents AS d SET
            version = d.version + 1, document = i.document, tenant = i.tenant,
            application = i.application, state = i.state, priority = i.priority,
            created_at = i.created_at, eligible_at = i.eligible_at,
            lease_expires_at = i.lease_expires_at, next_deadline_at = i.next_deadline_at,
            result_id = i.result_id, claim_worker = i.claim_worker, definition = i.definition,
            concurrency_key = i.concurrency_key, concurrency_limit = i.concurrency_limit,
            rate_every_ms = i.rate_every_ms, rate_burst = i.rate_burst
        FROM input AS i
        WHERE i.expected IS NOT NULL AND d.key = i.key AND d.version = i.expected
        RETURNING d.key, d.version
    ), changed AS (
        SELECT key, version FROM created UNION ALL SELECT key, version FROM updated
        UNION ALL SELECT key, version FROM reborn
    ), audited AS (
        INSERT INTO workwarden_audit (
            transaction_id, key, version, actor, operation, tenant, application, at, digest,
            worker, attempt, result, fencing_token, request_id
        )
        SELECT i.tx, i.audit_key, c.version, i.actor, i.operation, i.audit_tenant,
            i.audit_application, i.at, i.digest, i.worker, i.attempt, i.result,
            i.fencing_token, i.request_id
        FROM changed AS c JOIN input AS i ON i.key = c.key
        ORDER BY i.ord
        RETURNING key, version
    ), notified AS (
        SELECT count(pg_notify('{WORK_CHANNEL}',
            json_build_array(i.tenant, i.application)::text)) AS sent
        FROM changed AS c JOIN input AS i ON i.key = c.key
        WHERE i.eligible_at IS NOT NULL OR (i.concurrency_limit IS NOT NULL
            AND i.concurrency_key IS NOT NULL AND i.claim_worker IS NULL)
    )
    SELECT c.key, c.version, n.sent FROM changed AS c CROSS JOIN notified AS n
"""


def _write_many_params(writes: Sequence[Write]) -> dict[str, Any]:
    """What `_WRITE_MANY` takes: every write's fields but its document as one JSON array of
    objects, in batch order, and the documents as one text array.

    Two parameters rather than one array per column: psycopg dumps each
    array's elements in Python, and 31 arrays cost more than the statement's
    own work (18 µs a write against 8 with one JSON text, 10 writes of 3 KiB
    documents); the documents stay a text array in psycopg's binary format,
    each sent as it is, where as JSON strings each quote in them would be
    escaped.
    """
    rows: list[dict[str, Any]] = []
    documents: list[str] = []
    for number, write in enumerate(writes):
        fields = _write_params(
            write.key, write.document, write.index, write.expected_version, write.audit
        )
        documents.append(fields.pop("document"))
        fields["ord"] = number
        rows.append(fields)
    return {
        "rows": json.dumps(rows, ensure_ascii=False, separators=(",", ":")),
        "documents": documents,
    }


def _write_statement(index: IndexFields, expected_version: int | None) -> str:
    """The compare-and-swap statement of one write: create or update, notifying when READY."""
    if wakes_claimers(index):
        return _CREATE_NOTIFYING if expected_version is None else _UPDATE_NOTIFYING
    return _CREATE if expected_version is None else _UPDATE


def _write_params(
    key: str,
    document: str,
    index: IndexFields,
    expected_version: int | None,
    audit: AuditRecord,
) -> dict[str, Any]:
    """The parameters of `_write_statement` for one write."""
    return {
        "key": key,
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
        "expected": expected_version,
        "tx": audit.transaction_id,
        "audit_key": audit.key,
        "actor": audit.actor,
        "operation": audit.operation,
        "audit_tenant": audit.tenant,
        "audit_application": audit.application,
        "at": audit.at,
        "digest": audit.digest,
        "worker": audit.worker,
        "attempt": audit.attempt,
        "result": audit.result,
        "fencing_token": audit.fencing_token,
        "request_id": audit.request_id,
    }


def _next_instant(column: str) -> str:
    return (
        f"(SELECT min({column}) FROM workwarden_documents WHERE {column} IS NOT NULL"
        f" AND {column} > %(after)s"
        " AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)"
        " AND (%(application)s::text IS NULL OR application = %(application)s::text))"
    )


# The scopes with work claimable now (`ScopeListing`), read off the claimable index.
_CLAIMABLE_SCOPES = """
    SELECT DISTINCT tenant, application FROM workwarden_documents
    WHERE eligible_at IS NOT NULL AND eligible_at <= %(now)s
    ORDER BY tenant, application
"""

_NEXT_INSTANTS = "SELECT " + ", ".join(
    _next_instant(column) for column in ("eligible_at", "lease_expires_at", "next_deadline_at")
)

_AUDIT_COLUMNS = """
    transaction_id, key, version, actor, operation, tenant, application, at, digest,
        worker, attempt, result, fencing_token, sequence, request_id
"""

_AUDIT = f"""
    SELECT {_AUDIT_COLUMNS}
    FROM workwarden_audit WHERE sequence > %s ORDER BY sequence LIMIT %s
"""

# One key's records: no index holds them by key, so the server scans the log.
_AUDIT_OF = f"""
    SELECT {_AUDIT_COLUMNS}
    FROM workwarden_audit WHERE key = %s ORDER BY sequence
"""

_AUDIT_TAIL = f"""
    SELECT {_AUDIT_COLUMNS}
    FROM workwarden_audit ORDER BY sequence DESC LIMIT %s
"""

# No index holds the records by instant: the server scans the log.
_AUDIT_SINCE = f"""
    SELECT {_AUDIT_COLUMNS}
    FROM workwarden_audit WHERE at >= %s ORDER BY sequence
"""

_FIND_REQUEST = f"""
    SELECT {_AUDIT_COLUMNS}
    FROM workwarden_audit WHERE request_id IS NOT NULL AND request_id = %s
    ORDER BY sequence LIMIT 1
"""


def _audit(row: TupleRow) -> AuditRecord:
    return AuditRecord(
        transaction_id=row[0],
        key=row[1],
        version=row[2],
        actor=row[3],
        operation=row[4],
        tenant=row[5],
        application=row[6],
        at=row[7],
        digest=row[8],
        worker=row[9],
        attempt=row[10],
        result=row[11],
        fencing_token=row[12],
        sequence=row[13],
        request_id=row[14],
    )


def _ensure_schema(
    conn: psycopg.Connection[TupleRow], *, create: bool = True, upgrade: bool = True
) -> None:
    """Create the tables if missing (`StoreAbsent` instead, without `create`); upgrade older
    ones (`OlderSchema` instead, without `upgrade`); refuse a schema newer than this code."""
    try:
        row = conn.execute("SELECT max(version) FROM workwarden_schema_version").fetchone()
    except psycopg.errors.UndefinedTable:
        row = None
        if not create:
            raise StoreAbsent(
                "the database holds no workwarden store (no workwarden_schema_version table)"
            ) from None
    if not upgrade and row is not None and (row[0] or 0) < SCHEMA_VERSION:
        raise OlderSchema(
            f"the database holds schema version {row[0] or 0}, older than this release's"
            f" {SCHEMA_VERSION}: a command that writes to it (worker, sweeper, import...)"
            " brings it up to date; until then it cannot be read"
        )
    if row is None or row[0] is None or row[0] < SCHEMA_VERSION:
        # Several processes may get here at once on a fresh database; the
        # lock makes them create the tables one after the other.
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO workwarden_schema_version (version) VALUES (%s)"
                " ON CONFLICT DO NOTHING",
                (SCHEMA_VERSION,),
            )
            row = conn.execute("SELECT max(version) FROM workwarden_schema_version").fetchone()
    found = None if row is None else row[0]
    if found is not None and found > SCHEMA_VERSION:
        raise NewerSchema(
            f"the database holds schema version {found}; this release reads schema version"
            f" {SCHEMA_VERSION} (upgrade workwarden)"
        )
    if found != SCHEMA_VERSION:
        raise StoreFailure(
            f"the database holds schema version {found}; this code reads version {SCHEMA_VERSION}"
        )
