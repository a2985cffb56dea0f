"""Connections that heal before they hurt: what a caller sees when the database goes away.

Against a real PostgreSQL, this module's own (restarted, its sessions
terminated, absent while a store is built), and through a fault-injecting
proxy that loses a write's answer or the write itself:

- sessions ended by `pg_terminate_backend`, or by a restart, cost the caller
  nothing: the next read and the next write succeed;
- a call made while the server is down waits for it, up to the store's
  `connect_timeout_s`, and then fails with a `StoreFailure` that says so;
  building a store works the same way;
- a read whose answer is lost is read again (`READ_TRIES` in all); a write
  whose answer is lost raises `StoreOutcomeUnknown`, whether it committed
  (it did, when the reply was lost) or not (when the request was lost);
- the authority's `claim_next` and operator calls whose answer is lost are
  answered again by the replay rules: the same claim, with its work, and the
  same state, with no second write.

And SQLite: a write blocked past the busy timeout is a `StoreFailure`, not
a `sqlite3.OperationalError`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from faultproxy import FaultProxy
from psycopg import conninfo, sql

from pg import REQUIRE_ENV
from support import VERIFIER, request
from workwarden.statemachine import Authority, WorkloadError, errors
from workwarden.storage import (
    AuditRecord,
    IndexFields,
    SQLiteStore,
    StoreConflict,
    StoreFailure,
    StoreOutcomeUnknown,
    open_store,
)
from workwarden.storage.pgserver import INSTALL_HINT, PrivateServer, find_bindir
from workwarden.storage.postgres import READ_TRIES, PostgresStore

_SETTINGS = {"fsync": "off", "full_page_writes": "off"}
CAPS = ("email:send",)
_names = itertools.count(1)


def index(**changes: Any) -> IndexFields:
    fields: dict[str, Any] = {
        "tenant": "t",
        "application": "app",
        "state": "READY",
        "priority": 0,
        "created_at": 1_000,
        "eligible_at": 0,
    }
    fields.update(changes)
    return IndexFields(**fields)


def audit(key: str, tx: str | None = None) -> AuditRecord:
    return AuditRecord(
        transaction_id=tx or f"tx-{key}-{next(_names)}",
        key=key,
        version=0,
        actor="test",
        operation="op",
        tenant="t",
        application="app",
        at=1,
        digest="d",
    )


def bindir() -> Path:
    """The server binaries; skips the test without them (fails it under the require flag)."""
    found = find_bindir()
    if found is None:
        reason = f"no PostgreSQL server binaries; {INSTALL_HINT}"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    return found


@pytest.fixture(scope="module")
def server() -> Iterator[PrivateServer]:
    """This module's own server: its tests restart it and terminate its sessions."""
    running = PrivateServer(bindir(), settings=_SETTINGS, prefix="workwarden-healing-")
    running.start()
    try:
        yield running
    finally:
        running.stop()


def admin(server: PrivateServer) -> psycopg.Connection[Any]:
    return psycopg.connect(server.dsn("postgres"), autocommit=True)


@pytest.fixture
def dbname(server: PrivateServer) -> Iterator[str]:
    """A new, empty database on the module's server (dropped afterwards)."""
    name = f"healing_{next(_names)}"
    with admin(server) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield name
    with admin(server) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def store(server: PrivateServer, dbname: str) -> Iterator[PostgresStore]:
    with contextlib.closing(PostgresStore(server.dsn(dbname), pool_size=4)) as opened:
        yield opened


def backends(server: PrivateServer, dbname: str) -> set[int]:
    """The process ids of the sessions on `dbname`, but the asker's."""
    with admin(server) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (dbname,),
        ).fetchall()
    return {int(row[0]) for row in rows}


def terminate_every_session(server: PrivateServer, dbname: str) -> set[int]:
    """`pg_terminate_backend` every session on `dbname` from an admin connection; wait till gone."""
    ended = backends(server, dbname)
    with admin(server) as conn:
        # One pid at a time: in a WHERE clause beside the filters, the
        # planner may call pg_terminate_backend before it filters.
        for pid in sorted(ended):
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    deadline = time.monotonic() + 10
    while ended & backends(server, dbname):
        assert time.monotonic() < deadline, "the terminated sessions did not end"
        time.sleep(0.01)
    return ended


def use_every_connection(store: PostgresStore) -> None:
    """Open all of the store's pooled connections and its claim connection."""
    with contextlib.ExitStack() as stack:
        for _ in range(4):
            stack.enter_context(store.connection())
    store.claim_candidates("t", "app", 0, 1)


def exercise(store: PostgresStore, key: str, version: int) -> int:
    """One of every kind of call; the document's new version."""
    doc = store.read(key)
    assert doc is not None
    assert doc.version == version
    version = store.write(key, '{"again": true}', index(), version, audit(key))
    assert [doc.key for doc in store.claim_candidates("t", "app", 0, 10)] == [key]
    assert [doc.key for doc in store.list("t", "app")] == [key]
    assert [doc.key for doc in store.scan()] == [key]
    assert [record.version for record in store.audit_log()] == list(range(1, version + 1))
    assert store.expired_leases(0, 10) == []
    return version


# -- sessions ended under the store -------------------------------------------------


@pytest.mark.postgres
def test_after_every_session_is_terminated_the_next_read_and_write_succeed(
    server: PrivateServer, dbname: str, store: PostgresStore
) -> None:
    store.write("a", "{}", index(), None, audit("a"))
    use_every_connection(store)

    for round_ in range(3):
        ended = terminate_every_session(server, dbname)
        assert len(ended) >= 2  # pooled connections and the claim connection
        assert exercise(store, "a", 1 + round_) == 2 + round_
        assert not ended & backends(server, dbname)  # the store is on new sessions


@pytest.mark.postgres
def test_after_a_server_restart_reads_and_writes_succeed_and_the_data_is_there(
    server: PrivateServer, store: PostgresStore
) -> None:
    store.write("a", "{}", index(), None, audit("a"))
    use_every_connection(store)
    pid = server.pid

    server.restart()

    assert server.pid != pid
    assert exercise(store, "a", 1) == 2


@pytest.mark.postgres
def test_calls_made_while_the_server_restarts_wait_for_it(
    server: PrivateServer, store: PostgresStore
) -> None:
    # A caller keeps reading and writing through a restart with the server
    # down for a second. Reads never fail: one in flight is read again, one
    # made while the server is down waits for it. A write made while the
    # server is down waits too; only a write in flight at the moment its
    # session ends may raise StoreOutcomeUnknown (and may have committed).
    version = store.write("a", "{}", index(), None, audit("a"))
    seen: Counter[str] = Counter()
    with ThreadPoolExecutor(1) as pool:
        restarted = pool.submit(server.restart, 1.0)
        while not restarted.done() or seen["write"] < 5:
            seen["read"] += 1
            doc = store.read("a")
            assert doc is not None
            version = doc.version
            try:
                version = store.write("a", "{}", index(), version, audit("a"))
                seen["write"] += 1
            except StoreOutcomeUnknown:
                seen["unknown"] += 1
        restarted.result()
    assert seen["unknown"] <= 1  # a single client has at most one write in flight
    doc = store.read("a")
    assert doc is not None
    assert doc.version >= 1 + seen["write"]


@pytest.mark.postgres
def test_a_call_while_the_server_stays_down_fails_within_its_bound_then_heals(
    server: PrivateServer, dbname: str
) -> None:
    with contextlib.closing(PostgresStore(server.dsn(dbname), connect_timeout_s=1.0)) as store:
        store.write("a", "{}", index(), None, audit("a"))
        with ThreadPoolExecutor(1) as pool:
            restarted = pool.submit(server.restart, 6.0)
            stopped_by = time.monotonic() + 20
            while any(server.socket_dir.glob(".s.PGSQL.*")):  # until the server has stopped
                assert time.monotonic() < stopped_by, "the server did not stop"
                time.sleep(0.01)
            started = time.monotonic()
            with pytest.raises(StoreFailure, match="could not be reached within 1 s") as failed:
                store.read("a")
            assert time.monotonic() - started < 2 * 1.0 + 1.0
            assert type(failed.value) is StoreFailure
            restarted.result()
        doc = store.read("a")
        assert doc is not None
        assert doc.version == 1


# -- building a store -----------------------------------------------------------------


def test_a_store_built_where_no_server_runs_fails_within_its_bound(tmp_path: Path) -> None:
    nowhere = conninfo.make_conninfo(host=str(tmp_path), user="postgres", dbname="postgres")
    started = time.monotonic()
    with pytest.raises(StoreFailure, match=r"could not be reached within 0\.5 s") as failed:
        PostgresStore(nowhere, connect_timeout_s=0.5)
    assert 0.4 < time.monotonic() - started < 3.0
    assert type(failed.value) is StoreFailure
    assert isinstance(failed.value.__cause__, psycopg.OperationalError)


def test_a_store_url_waits_as_long_as_its_connect_timeout_says(tmp_path: Path) -> None:
    # The URL's connect_timeout was checked, then ignored: the store waited its
    # default 10 s and said so, whatever the URL asked for.
    started = time.monotonic()
    with pytest.raises(WorkloadError, match=r"could not be reached within 2 s") as failed:
        open_store(f"postgresql://postgres@/postgres?host={tmp_path}&connect_timeout=2")
    assert 1.5 < time.monotonic() - started < 6.0
    assert failed.value.code == errors.STORAGE_FAILURE


@pytest.mark.parametrize("timeout", [0, -1.0, float("inf"), float("nan")])
def test_a_connect_timeout_that_is_not_a_positive_number_is_refused(timeout: float) -> None:
    with pytest.raises(ValueError, match="connect_timeout_s"):
        PostgresStore("host=/nonexistent", connect_timeout_s=timeout)


@pytest.mark.parametrize(
    ("field", "arguments"),
    [
        ("dsn", {"dsn": None}),
        ("dsn", {"dsn": "host=/x\x00y"}),
        ("synchronous_commit", {"synchronous_commit": "off"}),
        ("synchronous_commit", {"synchronous_commit": None}),
        ("pool_size", {"pool_size": "8"}),
        ("pool_size", {"pool_size": 2.5}),
        ("pool_size", {"pool_size": True}),
        ("pool_size", {"pool_size": 0}),
    ],
)
def test_a_store_argument_of_the_wrong_kind_is_invalid_before_any_connection(
    field: str, arguments: dict[str, Any]
) -> None:
    # "off" read by truth would have committed synchronously; "8" was a TypeError.
    given = {"dsn": "host=/nonexistent", **arguments}
    with pytest.raises(WorkloadError) as refused:
        PostgresStore(**given)
    assert refused.value.code == errors.INVALID
    assert refused.value.details is not None
    assert refused.value.details["field"] == field


@pytest.mark.postgres
def test_a_store_built_before_its_server_starts_waits_for_it() -> None:
    late = PrivateServer(bindir(), settings=_SETTINGS, prefix="workwarden-late-")
    try:
        with ThreadPoolExecutor(1) as pool:

            def start_later() -> None:
                time.sleep(1.0)
                late.start()

            starting = pool.submit(start_later)
            started = time.monotonic()
            store = PostgresStore(late.dsn("postgres"), connect_timeout_s=120.0)
            assert time.monotonic() - started >= 1.0
            starting.result()
        with contextlib.closing(store):
            store.write("a", "{}", index(), None, audit("a"))
            doc = store.read("a")
            assert doc is not None
            assert doc.version == 1
    finally:
        late.stop()


@pytest.mark.postgres
def test_a_server_that_answers_and_refuses_fails_at_once_without_waiting(
    server: PrivateServer,
) -> None:
    started = time.monotonic()
    with pytest.raises(StoreFailure, match="does not exist"):
        PostgresStore(server.dsn("no_such_database"), connect_timeout_s=60.0)
    assert time.monotonic() - started < 10.0


# -- answers lost on the way: a fault-injecting proxy -------------------------------


@pytest.fixture
def proxy(server: PrivateServer) -> Iterator[FaultProxy]:
    sockets = sorted(server.socket_dir.glob(".s.PGSQL.*[0-9]"))
    assert sockets, "the server has no Unix socket"
    with FaultProxy(sockets[0]) as relaying:
        yield relaying


@pytest.fixture
def proxied(proxy: FaultProxy, dbname: str) -> Iterator[PostgresStore]:
    """A store on the module's server, reached through the proxy."""
    with contextlib.closing(PostgresStore(proxy.dsn(dbname), pool_size=2)) as opened:
        yield opened


@pytest.mark.postgres
def test_a_write_whose_answer_is_lost_raises_outcome_unknown_and_did_commit(
    proxy: FaultProxy, proxied: PostgresStore
) -> None:
    proxied.write("a", "{}", index(), None, audit("a"))
    proxy.drop_reply(b"tx-lost-answer")

    with pytest.raises(StoreOutcomeUnknown, match="may or may not have committed"):
        proxied.write("a", '{"n": 2}', index(), 1, audit("a", tx="tx-lost-answer"))

    assert proxy.fired == 1
    doc = proxied.read("a")
    assert doc is not None
    assert (doc.version, doc.document) == (2, '{"n": 2}')
    assert [record.transaction_id for record in proxied.audit_log()][-1] == "tx-lost-answer"
    # Called again with the same arguments, the store's answer is a conflict:
    # the authority's replay rules read that as "already done".
    with pytest.raises(StoreConflict):
        proxied.write("a", '{"n": 2}', index(), 1, audit("a", tx="tx-lost-answer"))


@pytest.mark.postgres
def test_a_write_lost_on_its_way_raises_outcome_unknown_and_did_not_commit(
    proxy: FaultProxy, proxied: PostgresStore
) -> None:
    proxied.write("a", "{}", index(), None, audit("a"))
    proxy.drop_request(b"tx-lost-request")

    with pytest.raises(StoreOutcomeUnknown):
        proxied.write("a", '{"n": 2}', index(), 1, audit("a", tx="tx-lost-request"))

    assert proxy.fired == 1
    doc = proxied.read("a")
    assert doc is not None
    assert doc.version == 1
    # Called again with the same arguments, the write goes ahead, once.
    assert proxied.write("a", '{"n": 2}', index(), 1, audit("a", tx="tx-lost-request")) == 2
    assert [record.version for record in proxied.audit_log()] == [1, 2]


@pytest.mark.postgres
def test_a_read_whose_answer_is_lost_is_read_again_without_error(
    proxy: FaultProxy, proxied: PostgresStore
) -> None:
    proxied.write("read-me", "{}", index(), None, audit("read-me"))
    proxy.drop_reply(b"read-me", times=READ_TRIES - 1)

    doc = proxied.read("read-me")

    assert proxy.fired == READ_TRIES - 1
    assert doc is not None
    assert doc.version == 1


@pytest.mark.postgres
def test_a_read_whose_answer_is_lost_every_time_fails_after_its_tries(
    proxy: FaultProxy, proxied: PostgresStore
) -> None:
    proxied.write("read-me", "{}", index(), None, audit("read-me"))
    proxy.drop_reply(b"read-me", times=READ_TRIES + 1)

    with pytest.raises(StoreFailure, match=f"broke {READ_TRIES} times") as failed:
        proxied.read("read-me")

    assert type(failed.value) is StoreFailure  # a read has no unknown outcome
    assert proxy.fired == READ_TRIES


@pytest.mark.postgres
def test_claim_candidates_whose_answer_is_lost_are_read_again(
    proxy: FaultProxy, proxied: PostgresStore
) -> None:
    proxied.write("a", "{}", index(), None, audit("a"))
    proxied.claim_candidates("t", "app", 0, 10)  # opens the claim connection
    proxy.drop_reply(b"app")

    assert [doc.key for doc in proxied.claim_candidates("t", "app", 0, 10)] == ["a"]
    assert proxy.fired == 1


# -- the authority's calls through the proxy: the replay rules answer a repeat ----------------


def two_ready(store: PostgresStore) -> tuple[Authority, str, str]:
    warden = Authority(store, grants=VERIFIER)
    first = warden.admit(request(idempotency_key="first"), 10_000).workload
    second = warden.admit(request(idempotency_key="second"), 10_001).workload
    return warden, first.workload_id, second.workload_id


def writes_of(store: PostgresStore, operation: str) -> list[AuditRecord]:
    return [record for record in store.audit_log() if record.operation == operation]


@pytest.mark.postgres
def test_claim_next_whose_answer_is_lost_is_answered_again_with_the_claim_and_its_work(
    proxy: FaultProxy, proxied: PostgresStore
) -> None:
    request_id = "claim-request-lost"
    warden, first, second = two_ready(proxied)
    proxy.drop_reply(request_id.encode())

    with pytest.raises(WorkloadError) as lost:
        warden.claim_next("t", "app", "w1", CAPS, 11_000, 10_000, request_id=request_id)
    assert lost.value.code == errors.OUTCOME_UNKNOWN
    assert proxy.fired == 1

    claim = warden.claim_next("t", "app", "w1", CAPS, 11_100, 10_000, request_id=request_id)

    assert claim is not None
    assert claim.workload_id == first
    assert claim.input == warden.get(first).input
    assert claim.checkpoints == ()
    assert len(writes_of(proxied, "claim_next")) == 1
    assert warden.get(first).current_claim == claim
    assert warden.get(second).state == "READY"


@pytest.mark.postgres
@pytest.mark.parametrize("operation", ["cancel", "timeout"])
def test_an_operator_call_whose_answer_is_lost_is_answered_again_without_a_second_write(
    proxy: FaultProxy, proxied: PostgresStore, operation: str
) -> None:
    warden, first, _ = two_ready(proxied)
    claim = warden.claim(first, "w1", CAPS, 11_000, 10_000)
    warden.start(first, claim.fence, 11_100)
    call = getattr(warden, operation)
    proxy.drop_reply(b"ops-lost")

    with pytest.raises(WorkloadError) as lost:
        call(first, "ops-lost", 12_000, request_id="op-lost-1")
    assert lost.value.code == errors.OUTCOME_UNKNOWN
    assert proxy.fired == 1
    committed = warden.get(first).state

    assert call(first, "ops-lost", 12_100, request_id="op-lost-1") == committed
    assert [r.request_id for r in writes_of(proxied, operation)] == ["op-lost-1"]


def _stored(store: PostgresStore) -> tuple[Any, ...]:
    """Every document and the length of the audit log: what a repeat must leave as it was."""
    return tuple((d.key, d.version, d.document) for d in store.scan()), len(store.audit_log())


def _started(warden: Authority, workload_id: str) -> Any:
    claim = warden.claim(workload_id, "w1", CAPS, 11_000, 10_000)
    warden.start(workload_id, claim.fence, 11_100)
    return claim.fence


def _lost_call_cases() -> dict[str, tuple[bytes, Any]]:
    """Call name -> (a marker only its write sends, set-up returning the call to repeat)."""

    def claim(warden: Authority, wid: str) -> Any:
        return lambda: warden.claim(wid, "w1", CAPS, 11_000, 10_000, request_id="lost-claim")

    def start(warden: Authority, wid: str) -> Any:
        fence = warden.claim(wid, "w1", CAPS, 11_000, 10_000).fence
        return lambda: warden.start(wid, fence, 11_100)

    def checkpoint(warden: Authority, wid: str) -> Any:
        fence = _started(warden, wid)
        return lambda: warden.checkpoint(wid, fence, {"at": "lost-ckpt"}, 11_200, sequence=1)

    def complete(warden: Authority, wid: str) -> Any:
        fence = _started(warden, wid)
        return lambda: warden.complete(wid, fence, "result-lost", {"sent": True}, 11_200)

    def fail(warden: Authority, wid: str) -> Any:
        fence = _started(warden, wid)
        return lambda: warden.fail(wid, fence, "transient_connection", "lost-fail", 11_200)

    def confirm_cancel(warden: Authority, wid: str) -> Any:
        fence = _started(warden, wid)
        warden.cancel(wid, "ops", 11_200)
        return lambda: warden.confirm_cancel(wid, fence, 11_300)

    def retry(warden: Authority, wid: str) -> Any:
        fence = _started(warden, wid)
        warden.fail(wid, fence, "validation", "bad input", 11_200, effect="none")
        return lambda: warden.retry(
            wid, "ops", 11_300, reason="fixed-lost", request_id="lost-retry"
        )

    return {
        "claim": (b"lost-claim", claim),
        "start": (b"start", start),
        "checkpoint": (b"lost-ckpt", checkpoint),
        "complete": (b"result-lost", complete),
        "fail": (b"lost-fail", fail),
        "confirm_cancel": (b"confirm_cancel", confirm_cancel),
        "retry": (b"fixed-lost", retry),  # its request id is read first
    }


LOST_CALLS = _lost_call_cases()


@pytest.mark.postgres
@pytest.mark.parametrize("call", sorted(LOST_CALLS))
def test_a_call_whose_answer_the_connection_lost_ends_as_if_called_once(
    proxy: FaultProxy, proxied: PostgresStore, call: str
) -> None:
    # The proxy cuts the connection after the server committed and answered,
    # before the client reads the answer: the caller sees OUTCOME_UNKNOWN and
    # calls again with the same arguments.
    marker, set_up = LOST_CALLS[call]
    warden, first, _ = two_ready(proxied)
    repeat = set_up(warden, first)
    proxy.drop_reply(marker)

    with pytest.raises(WorkloadError) as lost:
        repeat()
    assert lost.value.code == errors.OUTCOME_UNKNOWN
    assert proxy.fired == 1
    committed = _stored(proxied)
    workload = warden.get(first)

    answer = repeat()

    assert _stored(proxied) == committed  # nothing more written, no second audit record
    after = warden.get(first)
    assert (after.state, after.execution_history, after.attempts) == (
        workload.state,
        workload.execution_history,
        workload.attempts,
    )
    if call in ("fail", "confirm_cancel", "retry"):
        assert answer == after.state
    elif call == "claim":
        assert answer == after.current_claim
    elif call == "start":
        assert answer == after.attempts[-1]
    elif call == "checkpoint":
        assert answer.sequence == 1
    else:
        assert answer.result_id == "result-lost"


# -- SQLite -----------------------------------------------------------------------------


def test_a_sqlite_write_blocked_past_the_busy_timeout_is_a_store_failure(
    tmp_path: Path,
) -> None:
    path = tmp_path / "work.db"
    with SQLiteStore(path, busy_timeout_ms=200) as store:
        holder = sqlite3.connect(path, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")  # the write lock, held past the timeout
            started = time.monotonic()
            with pytest.raises(StoreFailure, match=r"busy timeout \(200 ms\)") as failed:
                store.write("a", "{}", index(), None, audit("a"))
            assert time.monotonic() - started >= 0.2
            assert not isinstance(failed.value, sqlite3.Error)
            assert isinstance(failed.value.__cause__, sqlite3.OperationalError)
            assert store.read("a") is None  # reads do not wait for the writer
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert store.write("a", "{}", index(), None, audit("a")) == 1


def test_a_sqlite_write_waits_for_a_lock_released_within_the_busy_timeout(
    tmp_path: Path,
) -> None:
    path = tmp_path / "work.db"
    with SQLiteStore(path, busy_timeout_ms=5_000) as store:
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        release = threading.Timer(0.3, lambda: holder.execute("ROLLBACK"))
        release.start()
        try:
            assert store.write("a", "{}", index(), None, audit("a")) == 1
        finally:
            release.join()
            holder.close()
