"""`PostgresStore`: the `Store` protocol on PostgreSQL, for many processes and machines.

Its tables, created on first use (idempotently, under an advisory lock, so
several processes may construct stores on one fresh database at once):

- `workwarden_documents`: one row per key with its version (from 1), the
  document text exactly as written, and the index columns (tenant,
  application, state, priority, created_at, eligible_at, lease_expires_at,
  next_deadline_at, and a unique result_id). Keys, tenants and applications
  use the "C" collation, so "by key" means by code point, as in every backend.
- `workwarden_audit`: one record per committed write, numbered by an identity
  column `sequence`.
- `workwarden_schema_version`: the schema's version, refused when newer than
  this code (an older one is brought up to it).
- `workwarden_pauses` and `workwarden_pause_versions` (`Pauses`): the pauses
  in force, which the claim queries leave out themselves, and each scope's
  count of pauses and resumes; `workwarden_tombstones` (`Purges`): the
  version of each purged key's purge, which a document created again under
  the key follows (looked up by the write statements themselves: a create
  requires none, a write expecting the tombstone's version creates the key
  again after it).

Every write is one statement in autocommit mode: a data-modifying CTE that
compare-and-swaps the document (`UPDATE ... WHERE key = ... AND version =
...`, or `INSERT ... ON CONFLICT (key) DO NOTHING` to require absence) and
inserts the audit record from the rows it changed. It either commits both or
neither; when the expected version does not hold, no row changes, nothing is
inserted, and the call raises `StoreConflict`. A result id already held by
another key also raises `StoreConflict`; any other database error raises
`StoreFailure`.

Batches (`BatchStore`): `write_many` is one statement too, every write's
compare-and-swap and audit record over the batch's rows (its fields as one JSON
text, its documents as one text array); `claim_batch`
is one transaction that locks its pages of candidates `FOR UPDATE SKIP
LOCKED`, then writes its claims the same way and commits in the same round
trip. A result id clash fails such a statement whole, so the batch is then
written one write at a time under savepoints, still in one transaction.

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

Where the parts are: `workwarden.storage.pg_schema` holds the tables, the
text of every statement and the schema's creation; `pg_connections`
connecting, checking and healing connections, and the `LISTEN` wake-up
signal; `pg_offers` the advisory-lock offers that spread claimers over the
candidates. This module is `PostgresStore` itself, and the one to import:
the names of those modules remain importable from it.
"""

from __future__ import annotations

import builtins
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from typing import Any, Final, TypeVar

from workwarden.statemachine.errors import bad_argument
from workwarden.storage.pg_extra import extra_missing

try:
    import psycopg
    import psycopg.errors
    from psycopg import pq
    from psycopg.rows import TupleRow
    from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout
except ImportError as exc:  # pragma: no cover - depends on the environment
    # psycopg is the `postgres` extra: a SQLite-only install does not have it.
    raise extra_missing(exc) from None

from workwarden.storage.base import (
    CLAIM_PAGES,
    AuditRecord,
    CandidateCursor,
    ChooseClaims,
    IndexFields,
    NextInstants,
    PauseRecord,
    PauseScope,
    StoreConflict,
    StoredDocument,
    StoreFailure,
    StoreOutcomeUnknown,
    WorkSignal,
    Write,
    WriteOutcome,
    check_audit_bounds,
    check_audit_since,
    distinct_keys,
    pause_from_row,
)
from workwarden.storage.base import document_from_row as _document

# The store's parts, each importable from here as well as from its own module.
from workwarden.storage.pg_connections import (  # noqa: F401
    READ_TRIES,
    _answers,
    _broken,
    _connect,
    _Connection,
    _cursor,
    _failures,
    _has_input,
    _ping,
    _PostgresSignal,
)
from workwarden.storage.pg_limits import over_limit_writes
from workwarden.storage.pg_offers import (  # noqa: F401
    _OFFER_SPACE,
    _arrange,
    _Offers,
)
from workwarden.storage.pg_schema import (  # noqa: F401
    _AUDIT,
    _AUDIT_COLUMNS,
    _AUDIT_INSERT,
    _AUDIT_OF,
    _AUDIT_SINCE,
    _AUDIT_TAIL,
    _CANDIDATES,
    _CANDIDATES_FIRST,
    _CLAIMABLE_SCOPES,
    _COLUMNS,
    _CREATE,
    _CREATE_NOTIFYING,
    _DUE,
    _FIND_REQUEST,
    _HELD_CLAIMS,
    _LIST,
    _LIST_PAGE,
    _LIST_PAGE_FIRST,
    _LOCK_CANDIDATES,
    _LOCK_CANDIDATES_FIRST,
    _NEXT_INSTANTS,
    _NOT_PAUSED,
    _NOTIFYING,
    _PAUSE,
    _PAUSED,
    _PURGE,
    _PURGEABLE,
    _PURGEABLE_FIRST,
    _READ,
    _READ_MANY,
    _RESUME,
    _SCAN,
    _SCAN_FIRST,
    _SCHEMA,
    _SCHEMA_LOCK,
    _TOMBSTONE,
    _UPDATE,
    _UPDATE_NOTIFYING,
    _WRITE_MANY,
    SCHEMA_VERSION,
    WORK_CHANNEL,
    _audit,
    _audit_params,
    _due_query,
    _ensure_schema,
    _next_instant,
    _write_many_params,
    _write_params,
    _write_statement,
)

__all__ = ["CONNECT_TIMEOUT_S", "DEADLOCK_TRIES", "READ_TRIES", "SCHEMA_VERSION", "PostgresStore"]

CONNECT_TIMEOUT_S: Final = 10.0
"""How long a store waits for an unreachable server, unless told otherwise."""

_T = TypeVar("_T")

_SCAN_PAGE = 500

DEADLOCK_TRIES: Final = 3
"""How many times a statement is run when the server keeps ending it to break a deadlock."""


def _outcome(key: str, expected_version: int | None, row: TupleRow | None) -> WriteOutcome:
    """What a write statement's answer means: its new version, or why nothing changed."""
    if row is not None:
        version: int = row[0]
        return version
    if expected_version is None:
        return StoreConflict(f"{key} already exists or was purged")
    return StoreConflict(f"{key}: expected version {expected_version} does not hold")


def _abandon(conn: _Connection) -> None:
    """Roll back the transaction `conn` is in, if it can still answer."""
    if not _broken(conn):
        # A rollback that fails leaves the connection broken, which the
        # caller sees; the error that led here is the one to report.
        with suppress(psycopg.Error):
            conn.rollback()


def _commit_writes(
    conn: _Connection, writes: Sequence[Write], *, begun: bool
) -> list[WriteOutcome]:
    """Every write of the batch in one statement (`_WRITE_MANY`), and its commit, in one round trip.

    Outside a transaction (`begun` False) the statement commits by itself;
    inside one, the COMMIT is pipelined after it. Why one statement over
    the batch's rows rather than a pipeline of the single-write statements (one
    round trip too): on 100 writes of 4 KiB it took 18 ms where the
    pipeline took 25 ms, with fsync on or off (one statement for the
    server to plan and run instead of a hundred).

    A result id held by another key fails the statement and, with it, the
    transaction; the batch is then written again one write at a time in a
    new transaction, each under a savepoint, so that a clash is the
    conflict of its write alone.
    """
    if not writes:
        if begun:
            conn.execute("COMMIT")
        return []
    params = _write_many_params(writes)
    try:
        if begun:
            with conn.pipeline():
                cursor = conn.execute(_WRITE_MANY, params)
                conn.execute("COMMIT")
        else:
            cursor = conn.execute(_WRITE_MANY, params)
        versions: dict[str, int] = {row[0]: row[1] for row in cursor.fetchall()}
    except psycopg.errors.UniqueViolation:
        _abandon(conn)
        return _commit_one_at_a_time(conn, writes)
    except BaseException:
        _abandon(conn)
        raise
    return [
        _outcome(write.key, write.expected_version, None)
        if write.key not in versions
        else versions[write.key]
        for write in writes
    ]


def _commit_checked(
    conn: _Connection, writes: Sequence[Write], *, begun: bool
) -> list[WriteOutcome]:
    """`_commit_writes`, after the concurrency check of the claims among `writes`.

    A batch with no claim of a limited or rated key is `_commit_writes` itself. Else
    the check (`over_limit_writes`) runs in the batch's transaction (begun
    here when `begun` is False), and the writes it refuses are left out of
    the statement, each with its `StoreLimited` as its outcome.
    """
    if not any(write.index.gated for write in writes):
        return _commit_writes(conn, writes, begun=begun)
    try:
        if not begun:
            conn.execute("BEGIN")
        refused = over_limit_writes(conn, writes)
    except BaseException:
        _abandon(conn)
        raise
    kept = [write for write in writes if write.key not in refused]
    outcomes = iter(_commit_writes(conn, kept, begun=True))
    return [refused[write.key] if write.key in refused else next(outcomes) for write in writes]


def _commit_one_at_a_time(conn: _Connection, writes: Sequence[Write]) -> list[WriteOutcome]:
    """The writes in one transaction, each under a savepoint: a unique clash is its conflict.

    The concurrency check is made again in this transaction (the batch's
    was rolled back with its locks).
    """
    outcomes: list[WriteOutcome] = []
    with conn.transaction():
        refused = over_limit_writes(conn, writes)
        for write in writes:
            if write.key in refused:
                outcomes.append(refused[write.key])
                continue
            try:
                with conn.transaction():
                    row = conn.execute(
                        _write_statement(write.index, write.expected_version),
                        _write_params(
                            write.key,
                            write.document,
                            write.index,
                            write.expected_version,
                            write.audit,
                        ),
                    ).fetchone()
            except psycopg.errors.UniqueViolation:
                outcomes.append(
                    StoreConflict(f"result id {write.index.result_id} belongs to another key")
                )
            else:
                outcomes.append(_outcome(write.key, write.expected_version, row))
    return outcomes


def _locked_pages(
    conn: _Connection, params: dict[str, Any], limit: int, choose: ChooseClaims
) -> list[Write]:
    """BEGIN, then pages of candidates locked `FOR UPDATE SKIP LOCKED`, offered to `choose`."""
    chosen: list[Write] = []
    for number in range(CLAIM_PAGES):
        if number == 0:
            with conn.pipeline():
                conn.execute("BEGIN")
                cursor = conn.execute(_LOCK_CANDIDATES_FIRST, params)
        else:
            cursor = conn.execute(_LOCK_CANDIDATES, params)
        page = [_document(row) for row in cursor.fetchall()]
        if page:
            chosen.extend(choose(page))
        if len(chosen) >= limit or len(page) < limit:
            break
        last = page[-1]
        params.update(
            neg_priority=-last.index.priority, created_at=last.index.created_at, key=last.key
        )
    distinct_keys(chosen)
    return chosen


class PostgresStore:
    """A CAS document store with index columns and an audit log, on PostgreSQL.

    `dsn` is a libpq connection string or URI. Connections come from a pool
    of up to `pool_size`, each in autocommit mode: every read and every write
    is one statement (`scan` is one statement per page). Claim candidates
    are read through one more connection, the store's own; see below.

    `create` (the default) creates the store's tables in a database that
    holds none; with `create=False` such a database is `StoreAbsent`, so a
    mistyped database name is not taken for a new, empty store. Tables of an
    older release's schema are brought up to date, unless `upgrade=False`
    (what `open_store(url, mode="read")` passes): then such a database is
    `OlderSchema`, left as it was, so that reading it never changes what the
    older release's processes still running on it use.

    `synchronous_commit` stays on unless asked otherwise: a write is
    acknowledged only once it is durable. Turning it off makes writes faster,
    at a real cost: after a server crash, writes acknowledged in the last
    moments can be lost. A lost claim means the same fencing token is issued
    again to another worker, while the first worker, told it holds the lease,
    still runs; only turn it off when the work tolerates that.

    Claim spreading: concurrent claimers, threads sharing this store or
    other processes with stores of their own, are each handed a different
    first candidate, so they do not all race for the best workload and lose
    the compare-and-swap to one another; see `claim_candidates`. The
    store's own connection creates a temporary function of its session
    (`pg_temp`, nothing in the schema) to look at a candidate again before
    offering it; a role without the database's TEMPORARY privilege (every
    role has it unless revoked) gets the spreading without that second look,
    and more of its first compare-and-swaps fail. Share one
    store among a process's threads: every call borrows a pooled connection for
    its own statement, so any number of threads may share one store, and any
    number of processes and machines may use one database.

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
    - `StoreFailure` when the server ended a call's transaction to break
      a deadlock `DEADLOCK_TRIES` (3) times in a row (each time it wrote
      nothing and ran again: two batches writing the same keys in
      different orders deadlock, and one of them is ended).
    """

    def __init__(
        self,
        dsn: str,
        *,
        synchronous_commit: bool = True,
        pool_size: int = 8,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        create: bool = True,
        upgrade: bool = True,
    ) -> None:
        if not isinstance(dsn, str) or "\x00" in dsn:
            raise bad_argument("dsn", "dsn must be a libpq connection string or URL")
        if not isinstance(create, bool):
            raise bad_argument("create", "create must be True or False")
        if not isinstance(upgrade, bool):
            raise bad_argument("upgrade", "upgrade must be True or False")
        if not isinstance(synchronous_commit, bool):
            raise bad_argument("synchronous_commit", "synchronous_commit must be True or False")
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise bad_argument("pool_size", "pool_size must be a whole number, at least 1")
        if (
            isinstance(connect_timeout_s, bool)
            or not isinstance(connect_timeout_s, int | float)
            or not 0 < connect_timeout_s < math.inf
        ):
            raise bad_argument(
                "connect_timeout_s", "connect_timeout_s must be a positive number of seconds"
            )
        self.synchronous_commit = synchronous_commit
        self.connect_timeout_s = float(connect_timeout_s)
        self._setting = "on" if synchronous_commit else "off"
        self._pool_size = pool_size
        # A first, direct connection creates the schema, so that a wrong
        # `dsn` or a newer schema fails here (at once, unless no server
        # answers yet: that is waited for).
        first = _connect(dsn, self.connect_timeout_s, "cannot open the database")
        with _failures("cannot open the database"), first:
            _ensure_schema(first, create=create, upgrade=upgrade)
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

    def _attempt(
        self, what: str, run: Callable[[_Connection], _T], *, write: bool | Callable[[], bool]
    ) -> _T:
        """`run` on a checked pooled connection, tried again where that is safe.

        A read whose connection breaks under it runs again on a fresh one,
        `READ_TRIES` times in all. A write whose connection breaks has been
        sent and may have committed: `StoreOutcomeUnknown`. `write` may be a
        callable saying whether `run` has sent its write yet: until it has,
        a broken connection is tried again as a read's is. A transaction the
        server ended to break a deadlock wrote nothing: it runs again,
        `DEADLOCK_TRIES` times in all. Other database errors are raised as
        they are, for the caller to name.
        """
        deadline = self._deadline()
        tries = 0
        deadlocks = 0
        while True:
            tries += 1
            with self._lend(what, deadline) as conn:
                try:
                    return run(conn)
                except psycopg.errors.DeadlockDetected:
                    # Two batches taking rows in different orders: the server
                    # rolled this one back whole, and the other goes on.
                    deadlocks += 1
                    tries -= 1
                    if deadlocks >= DEADLOCK_TRIES or _broken(conn):
                        raise
                except psycopg.Error as exc:
                    if not _broken(conn):
                        raise
                    if write() if callable(write) else write:
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
                what, lambda conn: _cursor(conn).execute(query, params).fetchone(), write=False
            )

    def _fetchall(self, what: str, query: str, params: Any) -> list[TupleRow]:
        with _failures(what):
            return self._attempt(
                what, lambda conn: _cursor(conn).execute(query, params).fetchall(), write=False
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
        what = f"cannot write {key}"
        if index.gated:
            # A claim of a limited or rated key: checked and written in one transaction.
            checked = Write(key, document, index, expected_version, audit)
            with _failures(what):
                limited = self._attempt(
                    what, lambda conn: _commit_checked(conn, [checked], begun=False), write=True
                )[0]
            if isinstance(limited, StoreConflict):
                raise limited
            return limited
        params = _write_params(key, document, index, expected_version, audit)
        query = _write_statement(index, expected_version)
        try:
            row = self._attempt(
                what, lambda conn: _cursor(conn).execute(query, params).fetchone(), write=True
            )
        except psycopg.errors.UniqueViolation as exc:
            raise StoreConflict(f"result id {index.result_id} belongs to another key") from exc
        except (psycopg.Error, UnicodeError) as exc:
            raise StoreFailure(f"{what}: {exc}") from exc
        outcome = _outcome(key, expected_version, row)
        if isinstance(outcome, StoreConflict):
            raise outcome
        return outcome

    # -- BatchStore ---------------------------------------------------------------

    def read_many(self, keys: Sequence[str]) -> dict[str, StoredDocument]:
        """The committed documents under `keys`, in one statement (`key = ANY(...)`).

        A missing key is absent from the answer.
        """
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        rows = self._fetchall(f"cannot read {len(wanted)} documents", _READ_MANY, (wanted,))
        return {row[0]: _document(row) for row in rows}

    def write_many(self, writes: Sequence[Write]) -> list[WriteOutcome]:
        """Every write's compare-and-swap in one transaction, in one round trip; outcomes in order.

        One statement: each write's compare-and-swap and audit record over
        the batch's rows, its fields sent as one JSON text and its documents as
        one text array (after a result id clash, one write
        at a time under savepoints, still in one transaction). Raises `StoreOutcomeUnknown` when the
        connection broke after the batch was sent: it committed as a whole
        or not at all. Any other database error is a `StoreFailure`, and
        nothing was written.
        """
        distinct_keys(writes)
        if not writes:
            return []
        what = f"cannot write {len(writes)} documents"
        with _failures(what):
            return self._attempt(
                what, lambda conn: _commit_checked(conn, writes, begun=False), write=True
            )

    def claim_batch(
        self,
        tenant: str,
        application: str,
        now: int,
        limit: int,
        choose: ChooseClaims,
    ) -> list[tuple[Write, WriteOutcome]]:
        """Pages locked `FOR UPDATE SKIP LOCKED` offered to `choose`, its claims written, in one go.

        One transaction on one connection. A row another batch claimer holds
        is skipped, not waited for; the locks end with the commit. A
        connection that breaks while the pages are read wrote nothing, and
        the batch starts again on a fresh one (as a read would; `choose` is
        then offered its pages afresh, without the rows the broken session
        still holds until the server notices it ended); once the claims were
        sent, it is `StoreOutcomeUnknown` (the batch committed as a whole or
        not at all).
        """
        if limit <= 0:
            return []
        scope = {"tenant": tenant, "application": application, "now": now, "limit": limit}
        sent = False

        def run(conn: _Connection) -> list[tuple[Write, WriteOutcome]]:
            nonlocal sent
            sent = False
            try:
                chosen = _locked_pages(conn, dict(scope), limit, choose)
            except BaseException:
                _abandon(conn)
                raise
            sent = True
            return list(zip(chosen, _commit_checked(conn, chosen, begun=True), strict=True))

        what = f"cannot claim in {tenant}/{application}"
        if self._closed:
            raise StoreFailure(f"{what}: the store is closed")
        with _failures(what):
            return self._attempt(what, run, write=lambda: sent)

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
        the first row no other claimer holds an offer on and that is still
        at the version the page read: an advisory lock,
        kept (by the store's own connection) until the thread asks for
        candidates again or ends; it does not lock the row, which stays
        readable and writable by everyone. Rows on offer to other threads of
        this store, and rows found on offer to other processes or changed
        since the page was read while looking for a free one (all looked at
        in one statement), are moved behind the others, so that each claimer's
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

    def held_claims(
        self, tenant: str, application: str, worker_id: str
    ) -> Sequence[StoredDocument]:
        """Documents of one tenant and application whose claim `worker_id` holds, by key."""
        params = (tenant, application, worker_id)
        rows = self._fetchall("cannot look up held claims", _HELD_CLAIMS, params)
        return [_document(row) for row in rows]

    def find_request(self, request_id: str) -> AuditRecord | None:
        """The first audit record made for `request_id`, or None."""
        row = self._fetchone("cannot look up a request", _FIND_REQUEST, (request_id,))
        return None if row is None else _audit(row)

    def list(self, tenant: str, application: str) -> Sequence[StoredDocument]:
        """Every document of one tenant and application, by priority then age."""
        rows = self._fetchall("cannot list documents", _LIST, (tenant, application))
        return [_document(row) for row in rows]

    def list_page(
        self, tenant: str, application: str, limit: int, after: CandidateCursor | None = None
    ) -> Sequence[StoredDocument]:
        """The next `limit` documents of one tenant and application after `after` (`ListPages`)."""
        params: dict[str, Any] = {"tenant": tenant, "application": application, "limit": limit}
        query = _LIST_PAGE_FIRST
        if after is not None:
            query = _LIST_PAGE
            params.update(neg_priority=-after.priority, created_at=after.created_at, key=after.key)
        rows = self._fetchall("cannot list documents", query, params)
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
        """Audit records with sequence greater than `after`, by sequence, at most `limit`.

        A bound that is not a whole number from 0 is `WORKLOAD_INVALID`
        (`check_audit_bounds`), refused before the database is asked.
        """
        check_audit_bounds(after, limit)
        rows = self._fetchall("cannot read the audit log", _AUDIT, (after, limit))
        return [_audit(row) for row in rows]

    def audit_of(self, key: str) -> Sequence[AuditRecord]:
        """Every audit record of `key`, in commit order (`KeyedAudit`)."""
        rows = self._fetchall(f"cannot read the audit records of {key}", _AUDIT_OF, (key,))
        return [_audit(row) for row in rows]

    def audit_tail(self, limit: int) -> Sequence[AuditRecord]:
        """The last `limit` audit records, newest first (`RecentAudit`)."""
        check_audit_bounds(0, limit)
        rows = self._fetchall("cannot read the audit log", _AUDIT_TAIL, (limit,))
        return [_audit(row) for row in rows]

    def audit_since(self, at: int) -> Sequence[AuditRecord]:
        """Every audit record at `at` or later, in commit order (`RecentAudit`)."""
        check_audit_since(at)
        rows = self._fetchall("cannot read the audit log", _AUDIT_SINCE, (at,))
        return [_audit(row) for row in rows]

    # -- optional capabilities (`DueInstants`, `ScopeListing`, `WakeUps`) -----------------------

    def next_instants(
        self, after: int, tenant: str | None = None, application: str | None = None
    ) -> NextInstants:
        """The earliest eligibility, lease expiry and deadline after `after` in the scope."""
        params = {"after": after, "tenant": tenant, "application": application}
        row = self._fetchone("cannot query the next instants", _NEXT_INSTANTS, params)
        if row is None:
            return NextInstants()
        return NextInstants(eligible_at=row[0], lease_expires_at=row[1], deadline_at=row[2])

    def claimable_scopes(self, now: int) -> builtins.list[tuple[str, str]]:
        """The (tenant, application) pairs with a document eligible at `now`, sorted."""
        rows = self._fetchall("cannot list the claimable scopes", _CLAIMABLE_SCOPES, {"now": now})
        return [(str(row[0]), str(row[1])) for row in rows]

    def work_signal(self, tenant: str, application: str) -> WorkSignal:
        """`LISTEN` on the work channel, on a connection of the signal's own, from now on.

        Woken by every committed write, from any process, that leaves work
        of the scope claimable. When its connection breaks, the next wait
        reconnects and answers True at once (a notification may have been
        missed); while the server cannot be reached, a wait sleeps out its
        timeout (at most a second at a time) and answers True.
        """
        return _PostgresSignal(self._dsn, tenant, application, self.connect_timeout_s)

    # -- optional capabilities (`Pauses`, `Purges`, `Tombstones`) --------------------------------

    def set_pause(self, scope: PauseScope, pause: PauseRecord | None, audit: AuditRecord) -> bool:
        """Pause or resume `scope` with its audit record, in one statement; False if no change.

        The audit record's version counts the scope's pauses and resumes. A
        resume notifies the work channel for the scope's tenant and
        application (or every application of a tenant's pause), waking
        every signal it covers, in every process. Raises
        `StoreOutcomeUnknown` when the connection broke after the
        statement was sent.
        """
        params: dict[str, Any] = {
            **_audit_params(audit),
            "scope_key": scope.key,
            "scope_tenant": scope.tenant,
            "scope_application": scope.application,
            "scope_definition": scope.definition,
            "scope_concurrency_key": scope.concurrency_key,
        }
        if pause is not None:
            params.update(
                since=pause.since,
                pause_actor=pause.actor,
                reason=pause.reason,
                pause_request_id=pause.request_id,
            )
        query = _RESUME if pause is None else _PAUSE
        what = f"cannot {'resume' if pause is None else 'pause'} {scope.key}"
        with _failures(what):
            row = self._attempt(
                what, lambda conn: _cursor(conn).execute(query, params).fetchone(), write=True
            )
        return row is not None

    def paused(self, tenant: str | None = None) -> builtins.list[PauseRecord]:
        """The pauses in force, of `tenant` or of all, by scope key."""
        rows = self._fetchall("cannot read the pauses", _PAUSED, {"tenant": tenant})
        return [pause_from_row(row) for row in rows]

    def purgeable(
        self, states: Sequence[str], after: str | None, limit: int
    ) -> Sequence[StoredDocument]:
        """Up to `limit` documents whose index state is one of `states`, by key, after `after`."""
        params = {"states": list(states), "after": after, "limit": max(limit, 0)}
        query = _PURGEABLE_FIRST if after is None else _PURGEABLE
        rows = self._fetchall("cannot read purgeable documents", query, params)
        return [_document(row) for row in rows]

    def tombstone(self, key: str) -> int | None:
        """The version the last purge of `key` wrote, or None (`Tombstones`)."""
        row = self._fetchone(f"cannot read the tombstone of {key}", _TOMBSTONE, (key,))
        return None if row is None else int(row[0])

    def purge(self, key: str, expected_version: int, audit: AuditRecord) -> bool:
        """Delete `key` at `expected_version` with its audit record, in one statement.

        The purge's version (the deleted one + 1) stays as the key's
        tombstone, which a document created again under the key follows.
        Returns False, writing nothing, when the version does not hold.
        Raises `StoreOutcomeUnknown` when the connection broke after the
        statement was sent.
        """
        params = {**_audit_params(audit), "key": key, "expected": expected_version}
        what = f"cannot purge {key}"
        with _failures(what):
            row = self._attempt(
                what, lambda conn: _cursor(conn).execute(_PURGE, params).fetchone(), write=True
            )
        return row is not None

    def close(self) -> None:
        """Close every pooled connection; the store cannot be used afterwards."""
        if not self._closed:
            self._closed = True
            self._offers.close()
            self._pool.close()
