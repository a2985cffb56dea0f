"""A writer killed between its document write and its commit leaves nothing behind.

A child process opens the store with a pausing subclass (below), makes one
authority call, and stops inside the write's transaction after the
document and audit statements have run and before `COMMIT`: it reads its
own uncommitted rows back on the same connection, tells the parent what it
saw through a pipe, and waits. The parent checks that nothing is visible to
anyone else yet, kills the child with SIGKILL, and checks that neither the
document nor its audit record was committed, and that the store is still
usable: the next write with the old expected version succeeds, as if the
killed write had never been attempted. Both write paths are covered (the
insert of an admission, the compare-and-swap update of a claim), on SQLite
and on PostgreSQL.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from psycopg.rows import TupleRow

from pg import postgres_database
from support import CAPS, request, store_snapshot
from support import authority as make_authority
from workwarden.statemachine import Authority, workload_id_for
from workwarden.storage import SQLiteStore, Store
from workwarden.storage.postgres import PostgresStore

ADMITTED = 10_000
CLAIMED = 20_000
LEASE_MS = 60_000
HANG_S = 600.0
SIGNAL_TIMEOUT_S = 60.0

Seen = tuple[str, int | None, int]
"""What the paused writer read inside its transaction: key, version, audit records of the key."""


class PausingSQLiteStore(SQLiteStore):
    """A `SQLiteStore` whose writes stop after their statements, before `COMMIT`. For tests.

    On each write it runs the store's own statements, then calls
    `on_pause(connection, key)` with the still-open transaction's
    connection, and never commits while `on_pause` does not return. Schema
    creation and reads are unchanged.
    """

    def __init__(self, path: Path, on_pause: Callable[[Any, str], None]) -> None:
        self._on_pause = on_pause
        self._pausing: str | None = None
        super().__init__(path)

    def write(self, key: str, *args: Any, **kwargs: Any) -> int:
        self._pausing = key
        try:
            return super().write(key, *args, **kwargs)
        finally:
            self._pausing = None

    @contextmanager
    def _transaction(self, what: str) -> Iterator[Any]:
        with super()._transaction(what) as conn:
            yield conn
            if self._pausing is not None:
                self._on_pause(conn, self._pausing)


class _PausingPool:
    """Lends connections of `pool` inside an explicit transaction, pausing before `COMMIT`."""

    def __init__(self, pool: Any, key: str, on_pause: Callable[[Any, str], None]) -> None:
        self._pool = pool
        self._key = key
        self._on_pause = on_pause

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[TupleRow]]:
        with self._pool.connection() as conn:
            conn.execute("BEGIN")
            yield conn
            self._on_pause(conn, self._key)
            conn.execute("COMMIT")


class PausingPostgresStore(PostgresStore):
    """A `PostgresStore` whose writes stop after their statement, before `COMMIT`. For tests.

    The store writes with one statement in autocommit mode; here that
    statement runs inside `BEGIN` ... `COMMIT` on the same pooled
    connection, and `on_pause(connection, key)` is called between the
    statement and the `COMMIT`. Reads are unchanged.
    """

    def __init__(self, dsn: str, on_pause: Callable[[Any, str], None]) -> None:
        self._on_pause = on_pause
        super().__init__(dsn, pool_size=1)

    def write(self, key: str, *args: Any, **kwargs: Any) -> int:
        pool = self._pool
        self._pool = cast(Any, _PausingPool(pool, key, self._on_pause))
        try:
            return super().write(key, *args, **kwargs)
        finally:
            self._pool = pool


def _report_and_hang(
    pipe: Connection, documents: str, audit: str, placeholder: str
) -> Callable[[Any, str], None]:
    """A pause that reads the transaction's own rows, reports them, and waits to be killed."""

    def pause(conn: Any, key: str) -> None:
        row = conn.execute(
            f"SELECT version FROM {documents} WHERE key = {placeholder}", (key,)
        ).fetchone()
        count = conn.execute(
            f"SELECT count(*) FROM {audit} WHERE key = {placeholder}", (key,)
        ).fetchone()
        pipe.send((key, None if row is None else int(row[0]), int(count[0])))
        time.sleep(HANG_S)

    return pause


def write_and_hang(backend: str, where: str, operation: str, pipe: Connection) -> None:
    """The child: open the store with a pausing write, then make one call that writes."""
    store: Store
    if backend == "sqlite":
        store = PausingSQLiteStore(Path(where), _report_and_hang(pipe, "documents", "audit", "?"))
    else:
        store = PausingPostgresStore(
            where, _report_and_hang(pipe, "workwarden_documents", "workwarden_audit", "%s")
        )
    authority = make_authority(store)
    if operation == "admit":
        authority.admit(request(idempotency_key="doomed"), ADMITTED)
    else:
        workload_id = workload_id_for(request())
        authority.claim(workload_id, "doomed-worker", CAPS, CLAIMED, LEASE_MS)
    pipe.send("committed")  # never reached: the parent kills this process first


def _child_entry() -> Callable[..., None]:
    # A spawned child finds its target by module name; `tests/` is on the
    # path, so it imports this file as a top-level module.
    entry: Callable[..., None] = importlib.import_module("test_crash_atomicity").write_and_hang
    return entry


def _kill_mid_write(backend: str, where: str, operation: str) -> Seen:
    """Run the child to its pause, kill it with SIGKILL; returns what it saw in its transaction."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe(duplex=False)
    child = context.Process(target=_child_entry(), args=(backend, where, operation, theirs))
    child.start()
    theirs.close()
    try:
        assert ours.poll(SIGNAL_TIMEOUT_S), "the writer never reached its pause"
        seen = ours.recv()
        assert child.is_alive()
        return cast(Seen, seen)
    finally:
        if child.pid is not None and child.exitcode is None:
            os.kill(child.pid, signal.SIGKILL)
        child.join(SIGNAL_TIMEOUT_S)
        assert child.exitcode == -signal.SIGKILL


def _check_update_killed(store: Store, backend: str, where: str) -> None:
    authority = make_authority(store)
    workload_id = authority.admit(request(), ADMITTED).workload.workload_id
    before = store_snapshot(store)

    seen = _kill_mid_write(backend, where, "claim")

    # Inside its transaction the writer had written version 2 and its record.
    assert seen == (workload_id, 2, 2)
    assert store_snapshot(store) == before
    _check_still_usable(authority, store, workload_id)


def _check_still_usable(authority: Authority, store: Store, workload_id: str) -> None:
    # The next write with the old expected version (1) goes ahead; the killed
    # claim left no token, no attempt and no audit record behind.
    claim = authority.claim(workload_id, "survivor", CAPS, CLAIMED, LEASE_MS)
    assert claim.fencing_token == 1
    doc = store.read(workload_id)
    assert doc is not None
    assert doc.version == 2
    records = [record for record in store.audit_log() if record.key == workload_id]
    assert [(r.version, r.actor) for r in records] == [(1, "a1"), (2, "survivor")]
    assert [a.worker_id for a in authority.get(workload_id).attempts] == ["survivor"]


def _check_insert_killed(store: Store, backend: str, where: str) -> None:
    authority = make_authority(store)
    before = store_snapshot(store)
    doomed = request(idempotency_key="doomed")

    seen = _kill_mid_write(backend, where, "admit")

    assert seen == (workload_id_for(doomed), 1, 1)
    assert store_snapshot(store) == before
    # The same admission, made again, creates the workload: nothing of the
    # killed one stands in its way.
    assert authority.admit(doomed, ADMITTED).created is True
    assert [r.version for r in store.audit_log() if r.key == workload_id_for(doomed)] == [1]


def test_a_sqlite_writer_killed_before_commit_leaves_no_document_version_or_audit_record(
    tmp_path: Path,
) -> None:
    path = tmp_path / "crash.db"
    with closing(SQLiteStore(path)) as store:
        _check_update_killed(store, "sqlite", str(path))


def test_a_sqlite_admission_killed_before_commit_leaves_no_document_or_audit_record(
    tmp_path: Path,
) -> None:
    path = tmp_path / "crash.db"
    with closing(SQLiteStore(path)) as store:
        _check_insert_killed(store, "sqlite", str(path))


@pytest.mark.postgres
def test_a_postgresql_writer_killed_before_commit_leaves_no_document_version_or_audit_record() -> (
    None
):
    with postgres_database() as dsn, closing(PostgresStore(dsn)) as store:
        _check_update_killed(store, "postgres", dsn)
        _check_no_session_left(dsn)


@pytest.mark.postgres
def test_a_postgresql_admission_killed_before_commit_leaves_no_document_or_audit_record() -> None:
    with postgres_database() as dsn, closing(PostgresStore(dsn)) as store:
        _check_insert_killed(store, "postgres", dsn)
        _check_no_session_left(dsn)


def _check_no_session_left(dsn: str) -> None:
    """The server ended the killed writer's connection, and its transaction with it."""
    deadline = time.monotonic() + SIGNAL_TIMEOUT_S
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND state LIKE 'idle in transaction%'"
            ).fetchone()
            assert row is not None
            if row[0] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert row[0] == 0
