"""Claim spreading for the PostgreSQL store: which candidate each claimer is offered first.

`_Offers` hands each claimer (a thread of this process, or another process's
store) a different first claim candidate, so that concurrent claimers do not
all try the same row's compare-and-swap; see `PostgresStore.claim_candidates`
(`workwarden.storage.postgres`). An offer is an advisory lock on
(`_OFFER_SPACE`, the hash of the key), held on a connection of its own and
ending, at the latest, with that connection; it changes nothing about the row.
"""

from __future__ import annotations

import threading
from typing import Any

from workwarden.storage.base import StoredDocument, StoreFailure
from workwarden.storage.base import document_from_row as _document
from workwarden.storage.pg_connections import (
    READ_TRIES,
    _answers,
    _broken,
    _connect,
    _Connection,
)
from workwarden.storage.pg_extra import extra_missing

try:
    import psycopg
except ImportError as exc:  # pragma: no cover - depends on the environment
    # psycopg is the `postgres` extra: a SQLite-only install does not have it.
    raise extra_missing(exc) from None

# Offers on claim candidates are advisory locks on (this number, hashtext(key)).
# Two keys that hash alike only make each other look busy.
_OFFER_SPACE = 0x776F726B  # "work"

_UNLOCK = "SELECT count(pg_advisory_unlock(%s::int4, hashtext(k))) FROM unnest(%s::text[]) AS k"

# One statement tries the probed rows in page order and takes an offer on the
# first one it can lock that is still at the version the page read: a row
# claimed since by another claimer (which then let its offer go) would only
# fail its compare-and-swap after a decision made for nothing. Each row is
# locked first, then checked; a lock on a row found changed is let go at once
# (`IS NULL` keeps the unlock from being folded away: it is never null). The
# scan of `unnest` yields the rows in array order and `LIMIT 1` stops it at
# the first taken, so no row after it is locked. The answer is the position
# (from 1) of the row offered, or no row when none could be.
_TRY_LOCK = """
    SELECT n FROM unnest(%(keys)s::text[], %(versions)s::bigint[]) WITH ORDINALITY AS c(k, v, n)
    WHERE CASE
        WHEN NOT pg_try_advisory_lock(%(space)s::int4, hashtext(k)) THEN false
        WHEN EXISTS (SELECT 1 FROM workwarden_documents AS d
                     WHERE d.key = c.k AND d.version = c.v) THEN true
        ELSE pg_advisory_unlock(%(space)s::int4, hashtext(k)) IS NULL
    END
    LIMIT 1
"""


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
    ends. The first rows of a page are tried in order, in one statement,
    until one can be offered; rows offered to another thread of this store,
    and rows found locked by another process's store or changed since the
    page was read (most likely claimed meanwhile) on the way, are busy. The lock changes
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
        probes = [doc for doc in rows[: self._PROBES] if doc.key not in busy]
        if probes:
            offered = conn.execute(
                _TRY_LOCK,
                {
                    "space": _OFFER_SPACE,
                    "keys": [doc.key for doc in probes],
                    "versions": [doc.version for doc in probes],
                },
            ).fetchone()
            taken = len(probes) if offered is None else int(offered[0]) - 1
            busy.update(doc.key for doc in probes[:taken])
            if offered is not None:
                key = probes[taken].key
                self._offered[me] = key
                self._holder[key] = me
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
