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
from functools import cache
from typing import Any

from workwarden.storage.base import StoredDocument, StoreFailure
from workwarden.storage.base import document_from_row as _document
from workwarden.storage.pg_connections import (
    READ_TRIES,
    _answers,
    _broken,
    _connect,
    _Connection,
    _cursor,
)
from workwarden.storage.pg_extra import extra_missing
from workwarden.storage.pg_schema import _COLUMNS

try:
    import psycopg
except ImportError as exc:  # pragma: no cover - depends on the environment
    # psycopg is the `postgres` extra: a SQLite-only install does not have it.
    raise extra_missing(exc) from None

# Offers on claim candidates are advisory locks on (this number, hashtext(key)).
# Two keys that hash alike only make each other look busy.
_OFFER_SPACE = 0x776F726B  # "work"

# A page and its offer in one statement (one round trip a claim): the
# offers the calling thread lets go are let go (`lapsed`, referenced below
# so that it runs even for an empty page), the page is read (`page`, the
# candidates query as given), and the first `probes` rows of it that no
# other thread of this store holds are tried in page order until one can be
# offered (`offer`). Every step is MATERIALIZED, so each runs once, and
# `offer`'s scan, which `LIMIT 1` stops at the first row taken, keeps no
# lock but the offered row's: a row is locked first, then looked at again
# (`_UNCHANGED`), and its lock is let go at once when it is no longer at the
# version the page read (`IS NULL` keeps the unlock from being folded away:
# it is never null). The page is the statement's snapshot, so without that
# second look a row that another claimer claimed after the snapshot, and
# whose offer it let go before the lock was tried, would be offered and its
# compare-and-swap fail; how often depends on how long the statement takes,
# nearly every claim on a server that takes a few milliseconds. One row per
# page row, in page order, each with the position (from 1) of the row
# offered, or null; one row of nulls for an empty page.
_OFFERED_PAGE = """
    WITH lapsed AS MATERIALIZED (
        SELECT count(pg_advisory_unlock(%(space)s::int4, hashtext(k))) AS n
        FROM unnest(%(lapsed)s::text[]) AS k
    ),
    page AS MATERIALIZED ({query}),
    numbered AS MATERIALIZED (SELECT page.*, row_number() OVER () AS n FROM page),
    probe AS MATERIALIZED (
        SELECT n, key, version FROM numbered WHERE NOT (key = ANY(%(held)s::text[]))
        ORDER BY n LIMIT %(probes)s
    ),
    offer AS MATERIALIZED (
        SELECT n FROM probe WHERE CASE
            WHEN NOT pg_try_advisory_lock(%(space)s::int4, hashtext(key)) THEN false
            WHEN {unchanged} THEN true
            ELSE pg_advisory_unlock(%(space)s::int4, hashtext(key)) IS NULL
        END
        LIMIT 1
    )
    SELECT o.n, {columns}
    FROM lapsed AS l LEFT JOIN offer AS o ON true LEFT JOIN numbered AS p ON true
    ORDER BY p.n
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


# The second look at a locked row, made by a function of the offers'
# session (`pg_temp`: nothing is added to the store's schema). Being VOLATILE
# it reads with a snapshot of its own, taken when it is called, in the READ
# COMMITTED of an autocommit session. PL/pgSQL, never inlined into the
# calling statement (and its snapshot), keeps its query's plan for the
# session: measured, the look costs about 20 us a page, against 100 us for
# the same function in SQL, planned again by every statement.
_UNCHANGED_FUNCTION = """
    CREATE OR REPLACE FUNCTION pg_temp.workwarden_offer_unchanged(k text, v bigint)
    RETURNS boolean LANGUAGE plpgsql VOLATILE
    AS $$ BEGIN
        RETURN EXISTS (SELECT FROM workwarden_documents WHERE key = k AND version = v);
    END $$
"""
_UNCHANGED = "pg_temp.workwarden_offer_unchanged(key, version)"


@cache
def _offered_page(query: str, look_again: bool) -> str:
    """`_OFFERED_PAGE` around the candidates `query` (`_CANDIDATES` or `_CANDIDATES_FIRST`).

    Without `look_again` (a session that may not create temporary
    functions) a locked row is offered as the page read it.
    """
    columns = ", ".join(f"p.{name.strip()}" for name in _COLUMNS.split(","))
    unchanged = _UNCHANGED if look_again else "true"
    return _OFFERED_PAGE.format(query=query, columns=columns, unchanged=unchanged)


class _Offers:
    """Which candidate each claimer was handed first, so that claimers start apart.

    An offer is an advisory lock on the candidate's key, held by one
    connection of the store's own (opened on first use, apart from the pool)
    on behalf of one thread, until that thread asks for candidates again or
    ends. The page is read, the thread's last offer let go and the first
    rows of the page tried in order until one can be offered, all in one
    statement (one round trip); rows offered to another thread of this
    store, and rows found locked by another process's store on the way, are
    busy. The lock changes nothing about the row: a busy row is only tried
    later, never hidden, and the compare-and-swap still decides who claims
    it.
    """

    _PROBES = 8

    def __init__(self, dsn: str, connect_timeout_s: float) -> None:
        self._dsn = dsn
        self._connect_timeout_s = connect_timeout_s
        self._mutex = threading.Lock()
        self._conn: _Connection | None = None
        self._look_again = True
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
                conn = self._conn
                fresh = conn is None or not _answers(conn)
                if conn is None or fresh:
                    self._close()
                    conn = self._conn = _connect(
                        self._dsn, self._connect_timeout_s, "cannot read claim candidates"
                    )
                try:
                    if fresh:
                        self._look_again = self._prepare(conn)
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

    @staticmethod
    def _prepare(conn: _Connection) -> bool:
        """Create the session's second-look function; False where temporary objects are refused."""
        try:
            conn.execute(_UNCHANGED_FUNCTION)
        except psycopg.errors.InsufficientPrivilege:
            return False
        return True

    def _page(
        self, conn: _Connection, me: threading.Thread, query: str, params: dict[str, Any]
    ) -> list[StoredDocument]:
        lapsed = self._lapse(me)
        held = list(self._holder)
        rows = (
            _cursor(conn)
            .execute(
                _offered_page(query, self._look_again),
                {
                    **params,
                    "space": _OFFER_SPACE,
                    "lapsed": lapsed,
                    "held": held,
                    "probes": self._PROBES,
                },
            )
            .fetchall()
        )
        if rows[0][1] is None:  # an empty page: its one row is nulls
            return []
        page = [_document(row[1:]) for row in rows]
        offered = None if rows[0][0] is None else page[int(rows[0][0]) - 1].key
        busy = set(held)
        probes = [doc.key for doc in page if doc.key not in busy][: self._PROBES]
        # The probes tried before the one offered (every probe, with none
        # offered) are on offer to other processes' claimers.
        busy.update(probes if offered is None else probes[: probes.index(offered)])
        if offered is not None:
            self._offered[me] = offered
            self._holder[offered] = me
        return _arrange(page, busy)

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
