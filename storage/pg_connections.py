"""The PostgreSQL store's connections: opening them, checking them, and the wake-up signal.

How `PostgresStore` (`workwarden.storage.postgres`) gets a connection it can
use and tells a broken one from a working one: `_connect` opens one, waiting
for a server that does not answer yet and failing at once on one that
answers and refuses; `_answers` checks one just before it is used;
`_broken` says whether a connection was lost under a statement; `_ping` asks
libpq whether the server answers; `_failures` names database errors as
`StoreFailure`; `READ_TRIES` bounds how often a read is run again. `_PostgresSignal` is the
store's work signal: `LISTEN` on `WORK_CHANNEL`, on a connection of its own
that it opens again after it breaks.
"""

from __future__ import annotations

import contextlib
import json
import math
import select
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from workwarden.storage.base import StoreFailure
from workwarden.storage.pg_extra import extra_missing
from workwarden.storage.pg_schema import WORK_CHANNEL

try:
    import psycopg
    from psycopg import conninfo, pq
    from psycopg.rows import TupleRow
    from psycopg_pool import ConnectionPool
except ImportError as exc:  # pragma: no cover - depends on the environment
    # psycopg is the `postgres` extra: a SQLite-only install does not have it.
    raise extra_missing(exc) from None

__all__ = ["READ_TRIES"]

READ_TRIES: Final = 3
"""How many times a read is run when its connection keeps breaking under it."""

_Connection = psycopg.Connection[TupleRow]


@contextmanager
def _failures(what: str) -> Iterator[None]:
    """Database errors as `StoreFailure` (text PostgreSQL cannot hold included)."""
    try:
        yield
    except (psycopg.Error, UnicodeError) as exc:
        raise StoreFailure(f"{what}: {exc}") from exc


#: The attribute a connection keeps its statement cursor under (see `_cursor`).
_CURSOR = "_workwarden_cursor"


def _cursor(conn: _Connection) -> psycopg.Cursor[TupleRow]:
    """The cursor the store sends its one-statement calls through on `conn`, made once.

    `Connection.execute` makes a new cursor for every statement, and with it
    a new adaptation context that looks up again how to send each parameter's
    type: on a compare-and-swap of about thirty parameters, about 50 of the
    statement's 120 microseconds of client CPU. A connection is used by one
    thread at a time (lent by the pool, or under the offers' lock), and a
    statement's rows are read before the next is sent, so one cursor serves
    them all; it goes with its connection.
    """
    cursor: psycopg.Cursor[TupleRow] | None = getattr(conn, _CURSOR, None)
    if cursor is None or cursor.closed:
        cursor = conn.cursor()
        setattr(conn, _CURSOR, cursor)
    return cursor


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


class _PostgresSignal:
    """A work signal: `LISTEN` on `WORK_CHANNEL`, filtered to one scope (or its tenant's)."""

    def __init__(self, dsn: str, tenant: str, application: str, timeout_s: float) -> None:
        self._dsn = dsn
        self._scope = [tenant, application]
        self._timeout_s = timeout_s
        self._conn: psycopg.Connection[TupleRow] | None = None
        self._listen()

    def _listen(self) -> bool:
        try:
            conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=10)
            conn.execute("LISTEN " + WORK_CHANNEL)
        except psycopg.Error:
            return False
        self._conn = conn
        return True

    def _ours(self, payload: str) -> bool:
        # [tenant, application], or [tenant, null] for every application of
        # the tenant (a tenant's pause resumed).
        try:
            scope = json.loads(payload)
        except ValueError:
            return False
        return bool(scope == self._scope or scope == [self._scope[0], None])

    def wait(self, timeout_s: float) -> bool:
        """Until a write of the scope commits, or `timeout_s` passed; True when woken."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        if self._conn is None:
            if self._listen():
                return True
            time.sleep(min(max(timeout_s, 0.0), 1.0))
            return True
        conn = self._conn
        try:
            while (remaining := deadline - time.monotonic()) > 0:
                for note in conn.notifies(timeout=remaining, stop_after=1):
                    if self._ours(note.payload):
                        return True
            return False
        except psycopg.Error:
            self.close()
            return True

    def close(self) -> None:
        """Close the signal's connection."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()
