"""`PostgresStore`: the `Store` protocol on PostgreSQL, for many processes and machines.

Three tables, created on first use (idempotently, under an advisory lock, so
several processes may construct stores on one fresh database at once):

- `workwarden_documents`: one row per key with its version (from 1), the
  document text exactly as written, and the index columns (tenant,
  application, state, priority, created_at, eligible_at, lease_expires_at,
  next_deadline_at, and a unique result_id). Keys, tenants and applications
  use the "C" collation, so "by key" means by code point, as in every backend.
- `workwarden_audit`: one record per committed write, numbered by an identity
  column `sequence`.
- `workwarden_schema_version`: the schema's version, refused when newer than
  this code.

Every write is one statement in autocommit mode: a data-modifying CTE that
compare-and-swaps the document (`UPDATE ... WHERE key = ... AND version =
...`, or `INSERT ... ON CONFLICT (key) DO NOTHING` to require absence) and
inserts the audit record from the rows it changed. It either commits both or
neither; when the expected version does not hold, no row changes, nothing is
inserted, and the call raises `StoreConflict`. A result id already held by
another key also raises `StoreConflict`; any other database error raises
`StoreFailure`.

What "commit order" means for the audit log: `sequence` is taken when the
record is inserted, inside its write's statement. Writes to one key are
serialised by the compare-and-swap, so their records are numbered exactly in
commit order. Concurrent writes to different keys may commit in an order
other than their numbers' (and a failed statement may leave a gap), so a
reader tailing the log with `audit_log(after=...)` while writes are in flight
can see a number before a smaller one has committed. `audit_log` always
returns records by `sequence`.

Connections that heal: a server restart, or `pg_terminate_backend`, ends
the sessions the store holds. Every connection is checked just before it
is used (`ConnectionPool.check_connection`, an empty query, whenever its
socket shows the session may have ended); one that fails is thrown away
and another taken, and since nothing but the check was sent on it, that is
safe for writes too. A read whose connection breaks while its statement
runs is tried again on a fresh one (`READ_TRIES`, 3, in all). A write whose
connection breaks after its statement was sent is never tried again: it
raises `StoreOutcomeUnknown`, since it may have committed. While the server
cannot be reached, a call waits for it up to `connect_timeout_s`; see
`PostgresStore`.
"""

from __future__ import annotations

import math
import select
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, Final, TypeVar

import psycopg
import psycopg.errors
from psycopg import conninfo, pq
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from workwarden.storage.base import (
    AuditRecord,
    CandidateCursor,
    IndexFields,
    StoreConflict,
    StoredDocument,
    StoreFailure,
    StoreOutcomeUnknown,
)

__all__ = ["CONNECT_TIMEOUT_S", "READ_TRIES", "SCHEMA_VERSION", "PostgresStore"]

SCHEMA_VERSION = 1
"""The version of the tables this module reads and writes."""

CONNECT_TIMEOUT_S: Final = 10.0
"""How long a store waits for an unreachable server, unless told otherwise."""

READ_TRIES: Final = 3
"""How many times a read is run when its connection keeps breaking under it."""

_T = TypeVar("_T")

_Connection = psycopg.Connection[TupleRow]

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
)

_COLUMNS = (
    "key, version, document, tenant, application, state, priority, created_at,"
    " eligible_at, lease_expires_at, next_deadline_at, result_id"
)

_READ = f"SELECT {_COLUMNS} FROM workwarden_documents WHERE key = %s"

_AUDIT_INSERT = """
    INSERT INTO workwarden_audit (
        transaction_id, key, version, actor, operation, tenant, application, at, digest,
        worker, attempt, result, fencing_token
    )
    SELECT %(tx)s::text, %(audit_key)s::text, changed.version, %(actor)s::text,
        %(operation)s::text, %(audit_tenant)s::text, %(audit_application)s::text,
        %(at)s::bigint, %(digest)s::text, %(worker)s::text, %(attempt)s::text,
        %(result)s::text, %(fencing_token)s::bigint
    FROM changed
    RETURNING version, sequence
"""

_CREATE = f"""
    WITH changed AS (
        INSERT INTO workwarden_documents ({_COLUMNS})
        VALUES (%(key)s, 1, %(document)s, %(tenant)s, %(application)s, %(state)s,
            %(priority)s, %(created_at)s, %(eligible_at)s, %(lease_expires_at)s,
            %(next_deadline_at)s, %(result_id)s)
        ON CONFLICT (key) DO NOTHING
        RETURNING version
    )
    {_AUDIT_INSERT}
"""

_UPDATE = f"""
    WITH changed AS (
        UPDATE workwarden_documents SET
            version = version + 1, document = %(document)s, tenant = %(tenant)s,
            application = %(application)s, state = %(state)s, priority = %(priority)s,
            created_at = %(created_at)s, eligible_at = %(eligible_at)s,
            lease_expires_at = %(lease_expires_at)s, next_deadline_at = %(next_deadline_at)s,
            result_id = %(result_id)s
        WHERE key = %(key)s AND version = %(expected)s
        RETURNING version
    )
    {_AUDIT_INSERT}
"""

# Offers on claim candidates are advisory locks on (this number, hashtext(key)).
# Two keys that hash alike only make each other look busy.
_OFFER_SPACE = 0x776F726B  # "work"

_UNLOCK = "SELECT count(pg_advisory_unlock(%s::int4, hashtext(k))) FROM unnest(%s::text[]) AS k"

_TRY_LOCK = "SELECT pg_try_advisory_lock(%s::int4, hashtext(%s))"

_CANDIDATES = f"""
    SELECT {_COLUMNS} FROM workwarden_documents
    WHERE tenant = %(tenant)s AND application = %(application)s
        AND eligible_at IS NOT NULL AND eligible_at <= %(now)s
        AND (-priority, created_at, key) > (%(neg_priority)s, %(created_at)s, %(key)s)
    ORDER BY -priority, created_at, key
    LIMIT %(limit)s
"""

_CANDIDATES_FIRST = f"""
    SELECT {_COLUMNS} FROM workwarden_documents
    WHERE tenant = %(tenant)s AND application = %(application)s
        AND eligible_at IS NOT NULL AND eligible_at <= %(now)s
    ORDER BY -priority, created_at, key
    LIMIT %(limit)s
"""

_LIST = f"""
    SELECT {_COLUMNS} FROM workwarden_documents
    WHERE tenant = %s AND application = %s
    ORDER BY -priority, created_at, key
"""

_SCAN_FIRST = f"SELECT {_COLUMNS} FROM workwarden_documents ORDER BY key LIMIT %s"

_SCAN = f"SELECT {_COLUMNS} FROM workwarden_documents WHERE key > %s ORDER BY key LIMIT %s"

_SCAN_PAGE = 500


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

_AUDIT = """
    SELECT transaction_id, key, version, actor, operation, tenant, application, at, digest,
        worker, attempt, result, fencing_token, sequence
    FROM workwarden_audit WHERE sequence > %s ORDER BY sequence LIMIT %s
"""


def _document(row: TupleRow) -> StoredDocument:
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
    )


@contextmanager
def _failures(what: str) -> Iterator[None]:
    """Database errors as `StoreFailure` (text PostgreSQL cannot hold included)."""
    try:
        yield
    except (psycopg.Error, UnicodeError) as exc:
        raise StoreFailure(f"{what}: {exc}") from exc


def _broken(conn: _Connection) -> bool:
    """Whether the session of `conn` has ended (closed, or lost by the server or network)."""
    return conn.closed or conn.broken


if sys.platform == "win32":

    def _has_input(fd: int) -> bool:
        return bool(select.select([fd], [], [], 0)[0])

else:

    def _has_input(fd: int) -> bool:
        # poll, not select: no limit on the descriptor's number.
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))


def _answers(conn: _Connection) -> bool:
    """Whether `conn` is fit to send a statement on now; a failed check leaves it broken.

    The check is `ConnectionPool.check_connection` (an empty query), run
    whenever the session may have ended. A session the server ended while
    it sat idle (`pg_terminate_backend`, a shutdown, a crash) has left its
    goodbye on the socket, a FATAL message or the end of the stream, so a
    connection in good order with nothing to read skips the round trip
    (about 1 microsecond instead of 50; the check would add about 40% to a
    read). Either way, what ends the session after this moment is seen by
    the statement itself.
    """
    if conn.closed:
        return False
    if conn.pgconn.status == pq.ConnStatus.OK and not _has_input(conn.fileno()):
        return True
    try:
        ConnectionPool.check_connection(conn)
    except psycopg.Error:
        return False
    return True


def _ping(dsn: str) -> pq.Ping:
    """libpq's ping of the server at `dsn`, waiting at most 2 s for an answer.

    OK: it accepts connections (even if it would refuse ours: a wrong
    password, a database that does not exist); REJECT: it is starting or
    stopping; NO_RESPONSE: nothing answered; NO_ATTEMPT: `dsn` is malformed.
    """
    try:
        probe = conninfo.make_conninfo(dsn, connect_timeout=2)
    except psycopg.Error:
        return pq.Ping.NO_ATTEMPT
    return pq.Ping(pq.PGconn.ping(probe.encode()))


def _connect(dsn: str, timeout_s: float, what: str) -> _Connection:
    """A new autocommit connection, waiting up to `timeout_s` for a server that does not answer.

    A server that answers and refuses fails at once. Raises `StoreFailure`
    saying which, never a psycopg error.
    """
    deadline = time.monotonic() + timeout_s
    pause = 0.02
    refused = False
    while True:
        remaining = deadline - time.monotonic()
        try:
            # libpq counts whole seconds, and at least 2.
            return psycopg.connect(
                dsn, autocommit=True, connect_timeout=max(2, math.ceil(remaining))
            )
        except psycopg.Error as exc:
            ping = _ping(dsn)
            # A server that accepts connections and refused ours twice will
            # not change its mind (once may be a server that just finished
            # starting up between the attempt and the ping).
            if ping == pq.Ping.NO_ATTEMPT or (ping == pq.Ping.OK and refused):
                raise StoreFailure(f"{what}: {exc}") from exc
            refused = ping == pq.Ping.OK
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if refused:
                    raise StoreFailure(f"{what}: {exc}") from exc
                raise StoreFailure(
                    f"{what}: the PostgreSQL server could not be reached within"
                    f" {timeout_s:g} s ({exc})"
                ) from exc
        if not refused:
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, 0.5)


def _arrange(rows: list[StoredDocument], busy: set[str]) -> list[StoredDocument]:
    """`rows` with the busy ones moved behind the others; the last row stays last."""
    if not busy or len(rows) < 2:
        return rows
    body = rows[:-1]
    return (
        [doc for doc in body if doc.key not in busy]
        + [doc for doc in body if doc.key in busy]
        + rows[-1:]
    )


class _Offers:
    """Which candidate each claimer was handed first, so that claimers start apart.

    An offer is an advisory lock on the candidate's key, held by one
    connection of the store's own (opened on first use, apart from the pool)
    on behalf of one thread, until that thread asks for candidates again or
    ends. The first rows of a page are tried in order until one can be
    offered; rows offered to another thread of this store, and rows found
    locked by another process's store on the way, are busy. The lock changes
    nothing about the row: a busy row is only tried later, never hidden, and
    the compare-and-swap still decides who claims it.
    """

    _PROBES = 8

    def __init__(self, dsn: str, connect_timeout_s: float) -> None:
        self._dsn = dsn
        self._connect_timeout_s = connect_timeout_s
        self._mutex = threading.Lock()
        self._conn: _Connection | None = None
        self._offered: dict[threading.Thread, str] = {}
        self._holder: dict[str, threading.Thread] = {}

    def _lapse(self, me: threading.Thread) -> list[str]:
        """Forget the offers of `me` and of threads that ended; their keys, to unlock."""
        gone = [thread for thread in self._offered if thread is me or not thread.is_alive()]
        keys = [self._offered.pop(thread) for thread in gone]
        for key in keys:
            del self._holder[key]
        return keys

    def page(self, query: str, params: dict[str, Any]) -> list[StoredDocument]:
        """Run the candidate `query`, take an offer on the first free row, move busy rows back.

        Healed like a read: a connection that fails its check is replaced,
        and a page whose connection breaks under it is read again on a fresh
        one (`READ_TRIES` in all); the broken session's offers ended with it.
        """
        me = threading.current_thread()
        with self._mutex:
            tries = 0
            while True:
                tries += 1
                if self._conn is None or not _answers(self._conn):
                    self._close()
                    self._conn = _connect(
                        self._dsn, self._connect_timeout_s, "cannot read claim candidates"
                    )
                conn = self._conn
                try:
                    return self._page(conn, me, query, params)
                except (psycopg.Error, UnicodeError) as exc:
                    self._close()  # the session's locks end with it
                    if not isinstance(exc, psycopg.Error) or not _broken(conn):
                        raise
                    if tries >= READ_TRIES:
                        raise StoreFailure(
                            f"cannot read claim candidates: the connection broke {tries} times"
                            f" ({exc})"
                        ) from exc

    def _page(
        self, conn: _Connection, me: threading.Thread, query: str, params: dict[str, Any]
    ) -> list[StoredDocument]:
        lapsed = self._lapse(me)
        with conn.pipeline():
            if lapsed:
                conn.execute(_UNLOCK, (_OFFER_SPACE, lapsed))
            cursor = conn.execute(query, params)
        rows = [_document(row) for row in cursor.fetchall()]
        busy = {doc.key for doc in rows if doc.key in self._holder}
        for doc in rows[: self._PROBES]:
            if doc.key in busy:
                continue
            locked = conn.execute(_TRY_LOCK, (_OFFER_SPACE, doc.key)).fetchone()
            if locked is not None and locked[0]:
                self._offered[me] = doc.key
                self._holder[doc.key] = me
                break
            busy.add(doc.key)
        return _arrange(rows, busy)

    def _close(self) -> None:
        self._offered.clear()
        self._holder.clear()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        """Drop every offer."""
        with self._mutex:
            self._close()


class PostgresStore:
    """A CAS document store with index columns and an audit log, on PostgreSQL.

    `dsn` is a libpq connection string or URI. Connections come from a pool
    of up to `pool_size`, each in autocommit mode: every read and every write
    is one statement (`scan` is one statement per page). Claim candidates
    are read through one more connection, the store's own; see below.

    `synchronous_commit` stays on unless asked otherwise: a write is
    acknowledged only once it is durable. Turning it off makes writes faster,
    at a real cost: after a server crash, writes acknowledged in the last
    moments can be lost. A lost claim means the same fencing token is issued
    again to another worker, while the first worker, told it holds the lease,
    still runs; only turn it off when the work tolerates that.

    Claim spreading: concurrent claimers, threads sharing this store or
    other processes with stores of their own, are each handed a different
    first candidate, so they do not all race for the best workload and lose
    the compare-and-swap to one another; see `claim_candidates`. Share one
    store among a process's threads.

    Healing (see the module docstring): a call never fails because the
    server restarted or ended the store's sessions since the last call.
    What a caller can see:

    - `StoreFailure` saying the server could not be reached within
      `connect_timeout_s`, when it stays unreachable that long. The
      constructor waits up to `connect_timeout_s` for the server too
      (a server that answers and refuses, such as a wrong password or a
      missing database, fails at once). A call waits for a connection
      up to `connect_timeout_s`, and once more only if the server answers
      by then (the pool may have given up on it just before it came
      back); no read is tried again once `connect_timeout_s` has passed
      since the call began. So a call gives up within twice
      `connect_timeout_s` (and the time its statements took).
    - `StoreFailure` when a read's connection broke under it `READ_TRIES`
      (3) times in a row.
    - `StoreOutcomeUnknown` when a write's connection broke after the
      write was sent: it may have committed. Call again with the same
      arguments.
    """

    def __init__(
        self,
        dsn: str,
        *,
        synchronous_commit: bool = True,
        pool_size: int = 8,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        if (
            isinstance(connect_timeout_s, bool)
            or not isinstance(connect_timeout_s, int | float)
            or not 0 < connect_timeout_s < math.inf
        ):
            raise ValueError("connect_timeout_s must be a positive number of seconds")
        self.synchronous_commit = synchronous_commit
        self.connect_timeout_s = float(connect_timeout_s)
        self._setting = "on" if synchronous_commit else "off"
        self._pool_size = pool_size
        # A first, direct connection creates the schema, so that a wrong
        # `dsn` or a newer schema fails here (at once, unless no server
        # answers yet: that is waited for).
        first = _connect(dsn, self.connect_timeout_s, "cannot open the database")
        with _failures("cannot open the database"), first:
            _ensure_schema(first)
        # The pool is given no `check`: the store checks each connection it
        # is lent itself (see `_lend`), because the pool's own check loop
        # sleeps after every dead connection it finds (1 s, then 2 s, 4 s...:
        # 6 s to get past 4 dead connections after a restart).
        self._pool: ConnectionPool[_Connection] = ConnectionPool(
            dsn,
            kwargs={"autocommit": True},
            min_size=1,
            max_size=pool_size,
            configure=self._configure,
            open=True,
            name="workwarden",
            timeout=self.connect_timeout_s,
            # The pool retries a failed connection with a doubling pause (1 s,
            # 2 s, 4 s...) until this much time has passed, then gives up
            # until a caller asks again: kept short, so that a server back
            # after a long outage is used within seconds, not minutes.
            reconnect_timeout=self.connect_timeout_s,
        )
        self._dsn = dsn
        self._offers = _Offers(dsn, self.connect_timeout_s)
        self._closed = False

    def _configure(self, conn: _Connection) -> None:
        conn.execute("SELECT set_config('synchronous_commit', %s, false)", (self._setting,))

    @contextmanager
    def connection(self) -> Iterator[_Connection]:
        """Lend one of the store's pooled connections (autocommit, checked), for inspection."""
        with _failures("no connection"), self._lend("no connection", self._deadline()) as conn:
            yield conn

    def _deadline(self) -> float:
        return time.monotonic() + self.connect_timeout_s

    @contextmanager
    def _lend(self, what: str, deadline: float) -> Iterator[_Connection]:
        """A pooled connection fit to send a statement on, checked just now (see `_answers`).

        One that fails the check is handed back (the pool replaces a broken
        connection) and the next is taken: after a restart every pooled
        connection may be dead. When the pool waited `connect_timeout_s` in
        vain but the server answers now, the pool is asked once more: it
        may have given up reconnecting just before the server came back,
        and a new request makes it connect at once. Raises `StoreFailure`
        when no connection answers by `deadline`, or the pool's wait failed
        while the server does not answer (or failed twice).
        """
        tries = 0
        waited_in_vain = False
        while True:
            tries += 1
            with ExitStack() as stack:
                try:
                    conn = stack.enter_context(self._pool.connection())
                except PoolClosed:
                    raise StoreFailure(f"{what}: the store is closed") from None
                except PoolTimeout:
                    answers = _ping(self._dsn) == pq.Ping.OK
                    if waited_in_vain or not answers:
                        raise StoreFailure(self._unreachable(what, answers)) from None
                    waited_in_vain = True
                    continue
                if _answers(conn):
                    yield conn
                    return
            if time.monotonic() >= deadline or tries > self._pool_size + READ_TRIES:
                raise StoreFailure(
                    f"{what}: no connection to the PostgreSQL server stayed up for"
                    f" {tries} tries in {self.connect_timeout_s:g} s"
                )

    def _unreachable(self, what: str, answers: bool) -> str:
        """Why no pooled connection came within `connect_timeout_s`, for a `StoreFailure`."""
        waited = f"{self.connect_timeout_s:g} s"
        if answers:
            return (
                f"{what}: no connection to the PostgreSQL server within {waited} (the server"
                f" answers: all {self._pool_size} of the store's connections were in use,"
                " or it refused new ones)"
            )
        return f"{what}: the PostgreSQL server could not be reached within {waited}"

    def _attempt(self, what: str, run: Callable[[_Connection], _T], *, write: bool) -> _T:
        """`run` on a checked pooled connection, tried again where that is safe.

        A read whose connection breaks under it runs again on a fresh one,
        `READ_TRIES` times in all. A write whose connection breaks has been
        sent and may have committed: `StoreOutcomeUnknown`. Other database
        errors are raised as they are, for the caller to name.
        """
        deadline = self._deadline()
        tries = 0
        while True:
            tries += 1
            with self._lend(what, deadline) as conn:
                try:
                    return run(conn)
                except psycopg.Error as exc:
                    if not _broken(conn):
                        raise
                    if write:
                        raise StoreOutcomeUnknown(
                            f"{what}: the connection broke after the write was sent;"
                            f" it may or may not have committed ({exc})"
                        ) from exc
                    if tries >= READ_TRIES or time.monotonic() >= deadline:
                        raise StoreFailure(
                            f"{what}: the connection broke {tries} times ({exc})"
                        ) from exc

    def _fetchone(self, what: str, query: str, params: Any) -> TupleRow | None:
        with _failures(what):
            return self._attempt(
                what, lambda conn: conn.execute(query, params).fetchone(), write=False
            )

    def _fetchall(self, what: str, query: str, params: Any) -> list[TupleRow]:
        with _failures(what):
            return self._attempt(
                what, lambda conn: conn.execute(query, params).fetchall(), write=False
            )

    def read(self, key: str) -> StoredDocument | None:
        """The committed document under `key`, or None."""
        row = self._fetchone(f"cannot read {key}", _READ, (key,))
        return None if row is None else _document(row)

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        """Compare-and-swap `document` and append `audit` in one statement, or raise.

        Raises `StoreConflict` (nothing written) when the committed version is
        not `expected_version` (None: when the key exists) or `index.result_id`
        belongs to another key. Raises `StoreOutcomeUnknown` when the
        connection broke after the statement was sent: it may have committed.
        """
        params = {
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
        }
        query = _CREATE if expected_version is None else _UPDATE
        what = f"cannot write {key}"
        try:
            row = self._attempt(
                what, lambda conn: conn.execute(query, params).fetchone(), write=True
            )
        except psycopg.errors.UniqueViolation as exc:
            raise StoreConflict(f"result id {index.result_id} belongs to another key") from exc
        except (psycopg.Error, UnicodeError) as exc:
            raise StoreFailure(f"{what}: {exc}") from exc
        if row is None:
            if expected_version is None:
                raise StoreConflict(f"{key} already exists")
            raise StoreConflict(f"{key}: expected version {expected_version} does not hold")
        version: int = row[0]
        return version

    def find_result(self, result_id: str) -> str | None:
        """The key holding `result_id`, or None."""
        row = self._fetchone(
            "cannot look up a result",
            "SELECT key FROM workwarden_documents WHERE result_id = %s",
            (result_id,),
        )
        return None if row is None else str(row[0])

    def claim_candidates(
        self,
        tenant: str,
        application: str,
        now: int,
        limit: int,
        after: CandidateCursor | None = None,
    ) -> Sequence[StoredDocument]:
        """READY documents of one tenant and application eligible at `now`, spread among claimers.

        The page is the next `limit` rows by priority (highest first), then
        created_at, then key, after `after`. The calling thread is offered
        the first row no other claimer holds an offer on: an advisory lock,
        kept (by the store's own connection) until the thread asks for
        candidates again or ends; it does not lock the row, which stays
        readable and writable by everyone. Rows on offer to other threads of
        this store, and rows found on offer to other processes while looking
        for a free one, are moved behind the others, so that each claimer's
        first compare-and-swap is on a row no one else is trying and most
        succeed at the first try. The page keeps its last
        row last, so `after` taken from it skips nothing. Nothing is hidden
        or reordered across pages; a claimer alone sees the exact order.

        (Why not `FOR UPDATE SKIP LOCKED`: its row locks end with the
        transaction that read the page, before the claim is written by a
        separate compare-and-swap; an advisory lock outlives both.)
        """
        params: dict[str, Any] = {
            "tenant": tenant,
            "application": application,
            "now": now,
            "limit": limit,
        }
        if after is None:
            query = _CANDIDATES_FIRST
        else:
            query = _CANDIDATES
            params.update(neg_priority=-after.priority, created_at=after.created_at, key=after.key)
        if self._closed:
            raise StoreFailure("cannot read claim candidates: the store is closed")
        with _failures("cannot read claim candidates"):
            return self._offers.page(query, params)

    def _due(
        self,
        column: str,
        now: int,
        limit: int,
        tenant: str | None,
        application: str | None,
    ) -> list[str]:
        query = _DUE[(column, tenant is not None, application is not None)]
        params = {"now": now, "limit": limit, "tenant": tenant, "application": application}
        return [str(row[0]) for row in self._fetchall(f"cannot query {column}", query, params)]

    def expired_leases(
        self, now: int, limit: int, tenant: str | None = None, application: str | None = None
    ) -> Sequence[str]:
        """Keys whose lease expired at or before `now`, earliest first."""
        return self._due("lease_expires_at", now, limit, tenant, application)

    def deadlines_due(
        self, now: int, limit: int, tenant: str | None = None, application: str | None = None
    ) -> Sequence[str]:
        """Keys whose next deadline falls at or before `now`, earliest first."""
        return self._due("next_deadline_at", now, limit, tenant, application)

    def list(self, tenant: str, application: str) -> Sequence[StoredDocument]:
        """Every document of one tenant and application, by priority then age."""
        rows = self._fetchall("cannot list documents", _LIST, (tenant, application))
        return [_document(row) for row in rows]

    def scan(self) -> Iterator[StoredDocument]:
        """Every document, by key, read a page at a time (not one snapshot)."""
        rows = self._fetchall("cannot scan documents", _SCAN_FIRST, (_SCAN_PAGE,))
        while True:
            for row in rows:
                yield _document(row)
            if len(rows) < _SCAN_PAGE:
                return
            rows = self._fetchall("cannot scan documents", _SCAN, (rows[-1][0], _SCAN_PAGE))

    def audit_log(self, after: int = 0, limit: int | None = None) -> Sequence[AuditRecord]:
        """Audit records with sequence greater than `after`, by sequence."""
        rows = self._fetchall("cannot read the audit log", _AUDIT, (after, limit))
        return [_audit(row) for row in rows]

    def close(self) -> None:
        """Close every pooled connection; the store cannot be used afterwards."""
        if not self._closed:
            self._closed = True
            self._offers.close()
            self._pool.close()


def _ensure_schema(conn: _Connection) -> None:
    """Create the tables if missing; refuse a schema newer than this code."""
    try:
        row = conn.execute("SELECT max(version) FROM workwarden_schema_version").fetchone()
    except psycopg.errors.UndefinedTable:
        row = None
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
    if found != SCHEMA_VERSION:
        raise StoreFailure(
            f"the database holds schema version {found}; this code reads version {SCHEMA_VERSION}"
        )
