"""What the PostgreSQL backend adds to the common store contract.

One statement per compare-and-swap (document and audit record commit
together or not at all), a schema that several processes may create at
once, a store reopened on the same database answering exactly as before,
durable commits unless turned off, and claimers that do not all race for the
same workload, in threads of one process and across processes.

Run as a script (`python test_postgres_store.py DSN NAME`), this file is one
of the worker processes of the multi-process test.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pg import postgres_database, server
from support import CAPS, request, store_snapshot
from support import authority as make_authority
from workwarden.statemachine import Authority, Workload
from workwarden.storage import (
    AuditRecord,
    CandidateCursor,
    IndexFields,
    StoreConflict,
    StoredDocument,
    StoreFailure,
    Write,
    pg_offers,
)
from workwarden.storage.postgres import SCHEMA_VERSION, PostgresStore

pytestmark = pytest.mark.postgres

ADMITTED_AT = 10_000
CLAIM_AT = 20_000
LEASE = 600_000
MANY = 2_000


@pytest.fixture
def dsn() -> Iterator[str]:
    """The connection string of an empty database holding the schema."""
    with postgres_database() as fresh:
        yield fresh


@pytest.fixture
def store(dsn: str) -> Iterator[PostgresStore]:
    """A PostgresStore on an empty database."""
    with contextlib.closing(PostgresStore(dsn)) as opened:
        yield opened


def index(state: str = "READY", **changes: Any) -> IndexFields:
    fields: dict[str, Any] = {
        "tenant": "t",
        "application": "app",
        "state": state,
        "priority": 0,
        "created_at": 1_000,
        "eligible_at": 0 if state == "READY" else None,
    }
    fields.update(changes)
    return IndexFields(**fields)


def audit(key: str, **changes: Any) -> AuditRecord:
    fields: dict[str, Any] = {
        "transaction_id": f"tx-{key}",
        "key": key,
        "version": 0,
        "actor": "tester",
        "operation": "write",
        "tenant": "t",
        "application": "app",
        "at": 1_000,
        "digest": "d",
    }
    fields.update(changes)
    return AuditRecord(**fields)


def admit_many(authority: Authority, count: int) -> list[str]:
    return [
        authority.admit(request(idempotency_key=f"key-{n}"), now=ADMITTED_AT).workload.workload_id
        for n in range(count)
    ]


# -- one statement per compare-and-swap ----------------------------------------


def test_a_write_with_a_stale_version_changes_neither_document_nor_audit(
    store: PostgresStore,
) -> None:
    store.write("a", '{"n": 1}', index(), None, audit("a"))
    store.write("a", '{"n": 2}', index(), 1, audit("a"))
    before = store_snapshot(store)
    with pytest.raises(StoreConflict):
        store.write("a", '{"n": 3}', index(), 1, audit("a", transaction_id="stale"))
    with pytest.raises(StoreConflict):
        store.write("a", '{"n": 3}', index(), None, audit("a", transaction_id="again"))
    with pytest.raises(StoreConflict):
        store.write("missing", '{"n": 1}', index(), 1, audit("missing"))
    assert store_snapshot(store) == before


def test_a_result_id_held_by_another_key_is_a_conflict_that_writes_nothing(
    store: PostgresStore,
) -> None:
    store.write("a", "{}", index("SUCCEEDED", result_id="r"), None, audit("a"))
    store.write("b", "{}", index(), None, audit("b"))
    before = store_snapshot(store)
    with pytest.raises(StoreConflict):
        store.write("b", "{}", index("SUCCEEDED", result_id="r"), 1, audit("b"))
    with pytest.raises(StoreConflict):
        store.write("c", "{}", index("SUCCEEDED", result_id="r"), None, audit("c"))
    assert store_snapshot(store) == before
    assert store.find_result("r") == "a"


def test_a_document_whose_audit_record_cannot_be_stored_is_not_written(
    store: PostgresStore,
) -> None:
    store.write("a", '{"n": 1}', index(), None, audit("a"))
    before = store_snapshot(store)
    out_of_range = 2**63  # more than an audit instant column holds
    with pytest.raises(StoreFailure):
        store.write("a", '{"n": 2}', index(), 1, audit("a", at=out_of_range))
    with pytest.raises(StoreFailure):
        store.write("b", '{"n": 1}', index(), None, audit("b", at=out_of_range))
    assert store_snapshot(store) == before


def _settled_or_waiting(dsn: str, racer: threading.Thread, timeout_s: float = 10.0) -> None:
    """Return once `racer` has ended or some session of the database at `dsn` waits on a lock."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline and racer.is_alive():
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()
            if row is not None and row[0]:
                return
            time.sleep(0.02)
    assert not racer.is_alive() or time.monotonic() < deadline, (
        "the create neither ended nor waited"
    )


@pytest.mark.parametrize("batched", [False, True], ids=["write", "write_many"])
def test_a_create_racing_its_keys_purge_is_a_conflict_not_a_document_at_version_one(
    dsn: str, store: PostgresStore, batched: bool
) -> None:
    """A create expecting an absent key, sent while that key's purge is uncommitted, must not
    insert once the purge commits: the key is purged, not absent, so its next document must
    follow the tombstone (a document at version 1 would hand out its namesake's fences)."""
    store.write("k", '{"n": 1}', index("SUCCEEDED"), None, audit("k"))
    outcome: list[Any] = []

    def create() -> None:
        w = Write("k", '{"n": 2}', index(), None, audit("k", transaction_id="again"))
        try:
            if batched:
                outcome.append(store.write_many([w])[0])
            else:
                outcome.append(store.write(w.key, w.document, w.index, w.expected_version, w.audit))
        except StoreConflict as exc:
            outcome.append(exc)

    with psycopg.connect(dsn) as purger:  # the purge's transaction, held open
        purger.execute("DELETE FROM workwarden_documents WHERE key = 'k'")
        purger.execute("INSERT INTO workwarden_tombstones (key, version) VALUES ('k', 2)")
        racer = threading.Thread(target=create)
        racer.start()
        _settled_or_waiting(dsn, racer)
        purger.commit()
    racer.join(10)
    assert not racer.is_alive()
    assert len(outcome) == 1, outcome
    assert isinstance(outcome[0], StoreConflict), outcome
    assert store.read("k") is None
    assert store.tombstone("k") == 2


def test_a_batch_the_server_ends_to_break_a_deadlock_runs_again_and_writes_once(
    dsn: str, store: PostgresStore
) -> None:
    """Two writers taking the same keys in opposite orders deadlock; the server ends the
    transaction of one of them, which wrote nothing: a batch so ended runs again (once the
    other writer is done), rather than failing every write it held."""
    outcome: list[Any] = []
    batch = [Write(key, "{}", index(), None, audit(key)) for key in ("a", "b")]

    def write_batch() -> None:
        try:
            outcome.append(store.write_many(batch))
        except StoreFailure as exc:
            outcome.append(exc)

    insert = (
        "INSERT INTO workwarden_documents"
        " (key, version, document, tenant, application, state, priority, created_at)"
        " VALUES (%s, 1, '{}', 't', 'app', 'READY', 0, 0)"
    )
    with psycopg.connect(dsn) as other:  # another writer's transaction, held open
        other.execute(insert, ("b",))
        racer = threading.Thread(target=write_batch)
        racer.start()
        _settled_or_waiting(dsn, racer)  # the batch wrote "a" and waits on "b"
        # "a" now waits on the batch: a cycle, which the server breaks by ending the
        # batch's transaction (it began waiting first, so it finds the deadlock first).
        other.execute(insert, ("a",))
        other.rollback()
    racer.join(30)
    assert not racer.is_alive()
    assert outcome == [[1, 1]], outcome
    assert [(r.key, r.version) for r in store.audit_log()] == [("a", 1), ("b", 1)]


def test_audit_records_are_numbered_from_one_in_the_order_of_their_writes(
    store: PostgresStore,
) -> None:
    for key in ("b", "a", "c"):
        store.write(key, "{}", index(), None, audit(key))
    store.write("a", "{}", index(), 1, audit("a"))
    records = store.audit_log()
    assert [(r.sequence, r.key, r.version) for r in records] == [
        (1, "b", 1),
        (2, "a", 1),
        (3, "c", 1),
        (4, "a", 2),
    ]
    assert [r.sequence for r in store.audit_log(after=2, limit=1)] == [3]


def test_text_postgresql_cannot_hold_is_a_store_failure_that_writes_nothing(
    store: PostgresStore,
) -> None:
    with pytest.raises(StoreFailure):
        store.write("nul\x00key", "{}", index(), None, audit("nul\x00key"))
    assert store_snapshot(store) == ((), ())


@pytest.mark.parametrize("bad", ["nul\x00", "lone \ud800 surrogate"])
@pytest.mark.parametrize("where", ["key", "document", "tenant", "actor", "request_id"])
def test_a_batch_with_text_postgresql_cannot_hold_fails_whole_and_writes_nothing(
    store: PostgresStore, where: str, bad: str
) -> None:
    """A batch's fields travel as JSON and its documents as an array: text either way
    cannot carry is a `StoreFailure` of the batch, and none of its writes lands."""
    key = bad if where == "key" else "bad"
    document = '{"text": "' + bad + '"}' if where == "document" else "{}"
    fields = index(tenant=bad) if where == "tenant" else index()
    record = audit(key, **({where: bad} if where in ("actor", "request_id") else {}))
    writes = [
        Write("fine", "{}", index(), None, audit("fine")),
        Write(key, document, fields, None, record),
    ]
    with pytest.raises(StoreFailure):
        store.write_many(writes)
    assert store_snapshot(store) == ((), ())
    assert store.write_many(writes[:1]) == [1]


# -- schema and reopening -----------------------------------------------------------


def test_stores_constructed_at_once_on_a_fresh_database_all_work() -> None:
    with postgres_database(schema=False) as empty, ThreadPoolExecutor(6) as pool:
        ready = threading.Barrier(6)

        def construct() -> PostgresStore:
            ready.wait()
            return PostgresStore(empty, pool_size=1)

        futures = [pool.submit(construct) for _ in range(6)]
        stores = [future.result() for future in futures]
        try:
            stores[0].write("a", "{}", index(), None, audit("a"))
            for other in stores:
                read = other.read("a")
                assert read is not None
                assert read.version == 1
            with stores[0].connection() as conn:
                rows = conn.execute("SELECT version FROM workwarden_schema_version").fetchall()
            assert rows == [(SCHEMA_VERSION,)]
        finally:
            for opened in stores:
                opened.close()


def test_a_database_with_a_newer_schema_is_refused() -> None:
    with postgres_database(schema=False) as empty:
        with contextlib.closing(PostgresStore(empty)) as store, store.connection() as conn:
            conn.execute(
                "INSERT INTO workwarden_schema_version (version) VALUES (%s)",
                (SCHEMA_VERSION + 1,),
            )
        with pytest.raises(StoreFailure, match="schema version"):
            PostgresStore(empty)
        # As for a SQLite file of a newer release: unusable (fix it), not a failure to retry.
        from urllib.parse import quote

        from psycopg import conninfo

        from workwarden.statemachine.errors import WorkloadError
        from workwarden.storage import open_store

        params = conninfo.conninfo_to_dict(empty)
        url = (
            f"postgresql:///{params['dbname']}?host={quote(str(params['host']), safe='')}"
            f"&user={params['user']}"
        )
        for mode in ("read", "write", "create"):
            with pytest.raises(WorkloadError) as refused:
                open_store(url, mode=mode)  # type: ignore[arg-type]
            assert refused.value.code == "WORKLOAD_STORE_UNUSABLE"
            assert f"schema version {SCHEMA_VERSION + 1}" in refused.value.message
            assert "upgrade workwarden" in refused.value.message


def _tables(dsn: str) -> list[str]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE 'workwarden%%' ORDER BY 1"
        ).fetchall()
    return [row[0] for row in rows]


def test_a_database_without_a_store_is_not_found_unless_asked_to_create_one() -> None:
    from workwarden.statemachine.errors import WorkloadError
    from workwarden.storage import open_store
    from workwarden.storage.base import StoreAbsent

    with postgres_database(schema=False) as dsn:
        from urllib.parse import quote

        from psycopg import conninfo

        params = conninfo.conninfo_to_dict(dsn)
        empty = (
            f"postgresql:///{params['dbname']}?host={quote(str(params['host']), safe='')}"
            f"&user={params['user']}"
        )
        with pytest.raises(StoreAbsent):
            PostgresStore(dsn, create=False)
        for mode in ("read", "write"):
            with pytest.raises(WorkloadError) as refused:
                open_store(empty, mode=mode)  # type: ignore[arg-type]
            assert refused.value.code == "WORKLOAD_STORE_NOT_FOUND"
            assert empty not in refused.value.message
        listed = subprocess.run(
            [sys.executable, "-m", "workwarden", "list", "--store", empty, "t", "app"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listed.returncode == 1
        assert listed.stderr.startswith("WORKLOAD_STORE_NOT_FOUND: ")
        assert _tables(dsn) == []
        open_store(empty, mode="create").close()
        assert "workwarden_documents" in _tables(dsn)
        open_store(empty, mode="read").close()


def test_a_database_the_server_does_not_have_is_store_not_found_naming_it() -> None:
    # It was a storage failure, whose class says to try later: a supervisor would
    # restart a worker pointed at a mistyped database name for ever.
    from urllib.parse import quote

    from psycopg import conninfo

    from workwarden.statemachine.errors import WorkloadError
    from workwarden.storage import open_store

    with postgres_database(schema=False) as dsn:
        params = conninfo.conninfo_to_dict(dsn)
        host = quote(str(params["host"]), safe="")
        missing = f"postgresql://{params['user']}:sekrit@/no_such_db_here?host={host}"
        present = f"postgresql://{params['user']}@/{params['dbname']}?host={host}"
        for mode in ("read", "write", "create"):
            with pytest.raises(WorkloadError) as refused:
                open_store(missing, mode=mode)  # type: ignore[arg-type]
            assert refused.value.code == "WORKLOAD_STORE_NOT_FOUND", refused.value
            assert "'no_such_db_here'" in refused.value.message
            assert "sekrit" not in refused.value.message
        listed = subprocess.run(
            [sys.executable, "-m", "workwarden", "stats", "--store", missing],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listed.returncode == 1
        assert listed.stderr.startswith("WORKLOAD_STORE_NOT_FOUND: ")
        # A database that exists is opened as ever.
        open_store(present, mode="create").close()
        open_store(present, mode="read").close()


def everything_read(store: PostgresStore, keys: Sequence[str]) -> dict[str, Any]:
    """Every answer a store gives about what it holds."""
    pages: list[Sequence[StoredDocument]] = []
    cursor: CandidateCursor | None = None
    while page := store.claim_candidates("t", "app", CLAIM_AT + 5_000, 2, cursor):
        pages.append(page)
        last = page[-1]
        cursor = CandidateCursor(last.index.priority, last.index.created_at, last.key)
    return {
        "reads": [store.read(key) for key in [*keys, "absent"]],
        "scan": list(store.scan()),
        "list": store.list("t", "app"),
        "other list": store.list("t", "other"),
        "candidates": pages,
        "leases": [store.expired_leases(now, 100) for now in (0, CLAIM_AT + LEASE, 2**53)],
        "leases of t": store.expired_leases(2**53, 100, "t", "app"),
        "deadlines": [store.deadlines_due(now, 100) for now in (0, 10**12, 2**53)],
        "deadlines of t": store.deadlines_due(2**53, 1, tenant="t"),
        "results": [store.find_result(f"result-{key}") for key in keys],
        "audit": store.audit_log(),
        "audit page": store.audit_log(after=3, limit=4),
    }


def test_a_reopened_store_answers_every_read_as_before(dsn: str) -> None:
    with contextlib.closing(PostgresStore(dsn)) as store:
        authority = make_authority(store)
        keys = [
            authority.admit(
                request(idempotency_key=f"key-{n}", priority=n % 3), now=ADMITTED_AT + n
            ).workload.workload_id
            for n in range(9)
        ]
        for n, key in enumerate(keys[:4]):
            claim = authority.claim(key, f"worker-{n}", CAPS, now=CLAIM_AT + n, lease_ms=LEASE)
            if n % 2 == 0:
                authority.start(key, claim.fence, now=CLAIM_AT + 10)
                authority.complete(key, claim.fence, f"result-{key}", {"n": n}, CLAIM_AT + 20)
        before = everything_read(store, keys)
    with contextlib.closing(PostgresStore(dsn)) as reopened:
        assert everything_read(reopened, keys) == before
    assert sum(len(page) for page in before["candidates"]) == 5
    assert len(before["audit"]) == 9 + 4 + 2 * 2


# -- durability ---------------------------------------------------------------------------


def test_commits_are_synchronous_unless_turned_off(dsn: str) -> None:
    with contextlib.closing(PostgresStore(dsn)) as store, store.connection() as conn:
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
    fast = PostgresStore(dsn, synchronous_commit=False)
    with contextlib.closing(fast), fast.connection() as conn:
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)


# -- claim spreading -----------------------------------------------------------------------


class FirstCandidates(PostgresStore):
    """A PostgresStore remembering, per thread, the first candidate handed out since `forget`."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self._first = threading.local()

    def forget(self) -> None:
        self._first.key = None

    def first(self) -> str | None:
        key: str | None = self._first.key
        return key

    def claim_candidates(
        self,
        tenant: str,
        application: str,
        now: int,
        limit: int,
        after: CandidateCursor | None = None,
    ) -> Sequence[StoredDocument]:
        page = super().claim_candidates(tenant, application, now, limit, after)
        if getattr(self._first, "key", None) is None and page:
            self._first.key = page[0].key
        return page


def keys(page: Sequence[StoredDocument]) -> list[str]:
    return [doc.key for doc in page]


def five_candidates(store: PostgresStore) -> None:
    for n in range(5):
        store.write(f"k{n}", "{}", index(created_at=n), None, audit(f"k{n}"))


def test_a_claimer_is_handed_a_different_first_candidate_than_one_still_claiming(
    store: PostgresStore,
) -> None:
    five_candidates(store)
    handed = threading.Event()
    done = threading.Event()

    def first_claimer() -> list[str]:
        page = keys(store.claim_candidates("t", "app", 0, 3))
        handed.set()
        done.wait()
        return page

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(first_claimer)
        handed.wait()
        try:
            second = keys(store.claim_candidates("t", "app", 0, 3))
            rest = keys(store.claim_candidates("t", "app", 0, 3, CandidateCursor(0, 2, "k2")))
        finally:
            done.set()
        assert first.result() == ["k0", "k1", "k2"]
    assert second == ["k1", "k0", "k2"]  # the last row stays last: the cursor skips nothing
    assert rest == ["k3", "k4"]


def test_a_claimer_in_another_process_is_handed_a_different_first_candidate(dsn: str) -> None:
    with (
        contextlib.closing(PostgresStore(dsn)) as here,
        contextlib.closing(PostgresStore(dsn)) as there,
    ):
        five_candidates(here)
        assert keys(here.claim_candidates("t", "app", 0, 3)) == ["k0", "k1", "k2"]
        assert keys(there.claim_candidates("t", "app", 0, 3)) == ["k1", "k0", "k2"]
        # Asking again, a claimer keeps the candidate it was offered.
        assert keys(here.claim_candidates("t", "app", 0, 5))[0] == "k0"
    with contextlib.closing(PostgresStore(dsn)) as alone:
        assert keys(alone.claim_candidates("t", "app", 0, 5)) == ["k0", "k1", "k2", "k3", "k4"]


def test_a_claimer_that_moved_on_no_longer_holds_back_its_candidate(
    store: PostgresStore,
) -> None:
    five_candidates(store)
    with ThreadPoolExecutor(1) as pool:
        pool.submit(store.claim_candidates, "t", "app", 0, 3).result()
    # The thread that was handed k0 has ended; one caller alone sees the exact order.
    assert keys(store.claim_candidates("t", "app", 0, 3)) == ["k0", "k1", "k2"]
    assert keys(store.claim_candidates("t", "app", 0, 3)) == ["k0", "k1", "k2"]


def test_most_concurrent_claimers_win_the_first_workload_they_try(dsn: str) -> None:
    with contextlib.closing(FirstCandidates(dsn)) as store:
        authority = make_authority(store)
        admitted = admit_many(authority, MANY)
        ready = threading.Barrier(8)

        def claimer(worker: str) -> list[tuple[str, bool]]:
            ready.wait()
            claimed: list[tuple[str, bool]] = []
            while True:
                store.forget()
                claim = authority.claim_next("t", "app", worker, CAPS, CLAIM_AT, LEASE)
                if claim is None:
                    return claimed
                claimed.append((claim.workload_id, claim.workload_id == store.first()))

        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(claimer, f"w{n}") for n in range(8)]
            claims = [claim for future in futures for claim in future.result()]
    assert sorted(key for key, _ in claims) == sorted(admitted)
    first_try = sum(1 for _, first in claims if first) / len(claims)
    print(f"first-try claim rate with 8 threads: {first_try:.3f}")
    assert first_try > 0.5


def slow_offers(monkeypatch: pytest.MonkeyPatch, pause_s: float) -> None:
    """Make every claim page's statement wait `pause_s` between its snapshot and its offer,
    as a busy server's would."""
    original = pg_offers._offered_page

    def slowed(query: str, look_again: bool) -> str:
        statement = original(query, look_again)
        for before, after in [
            (
                "probe AS MATERIALIZED (",
                f"pause AS MATERIALIZED (SELECT pg_sleep({pause_s})), probe AS MATERIALIZED (",
            ),
            ("FROM numbered WHERE", "FROM numbered, pause WHERE"),
        ]:
            assert statement.count(before) == 1
            statement = statement.replace(before, after)
        return statement

    monkeypatch.setattr(pg_offers, "_offered_page", slowed)


@pytest.mark.parametrize("pause_s", [0.0, 0.01], ids=["quick", "slow-statement"])
def test_claimers_with_stores_of_their_own_are_not_offered_work_already_taken(
    dsn: str, pause_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Eight stores, each its own sessions, as eight processes would be: a
    # candidate another claimer took since the page was read (and whose offer
    # it then let go) is not offered, so nearly every claim's compare-and-swap
    # is its first, and none is claimed twice. However long the page's
    # statement takes: with 10 ms between its snapshot and its offer, and no
    # second look at the locked row, nearly every first try failed.
    slow_offers(monkeypatch, pause_s)
    with contextlib.closing(FirstCandidates(dsn)) as loader:
        admitted = admit_many(make_authority(loader), MANY // 2)
    stores = [FirstCandidates(dsn) for _ in range(8)]
    ready = threading.Barrier(8)

    def claimer(n: int) -> list[tuple[str, bool]]:
        store = stores[n]
        authority = make_authority(store)
        ready.wait()
        claimed: list[tuple[str, bool]] = []
        while True:
            store.forget()
            claim = authority.claim_next("t", "app", f"w{n}", CAPS, CLAIM_AT, LEASE)
            if claim is None:
                return claimed
            claimed.append((claim.workload_id, claim.workload_id == store.first()))

    try:
        with ThreadPoolExecutor(8) as pool:
            claims = [c for f in [pool.submit(claimer, n) for n in range(8)] for c in f.result()]
    finally:
        for store in stores:
            store.close()
    assert sorted(key for key, _ in claims) == sorted(admitted)
    first_try = sum(1 for _, first in claims if first) / len(claims)
    print(f"first-try claim rate with 8 stores: {first_try:.3f}")
    assert first_try > 0.9


def test_a_role_that_may_not_create_temporary_objects_still_claims() -> None:
    # The offer's second look is a temporary function of its session; where
    # the role may not create one, claims go on, offered as the page read them.
    with postgres_database(schema=False) as owner_dsn:
        with contextlib.closing(PostgresStore(owner_dsn)) as owner:
            admitted = admit_many(make_authority(owner), 20)
        role = f"claimer_{threading.get_ident()}"
        database = psycopg.conninfo.conninfo_to_dict(owner_dsn)["dbname"]
        with psycopg.connect(owner_dsn, autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {role} LOGIN")
            admin.execute(f"REVOKE TEMPORARY ON DATABASE {database} FROM PUBLIC")
            admin.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
            admin.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
        role_dsn = psycopg.conninfo.make_conninfo(owner_dsn, user=role)
        with (
            psycopg.connect(role_dsn, autocommit=True) as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            conn.execute("CREATE TEMPORARY TABLE t (x int)")
        with contextlib.closing(PostgresStore(role_dsn)) as store:
            authority = make_authority(store)
            claimed = [
                claim.workload_id
                for claim in iter(
                    lambda: authority.claim_next("t", "app", "w", CAPS, CLAIM_AT, LEASE), None
                )
            ]
        assert sorted(claimed) == sorted(admitted)


# -- the private server --------------------------------------------------------------------

_START_A_SERVER = """
import sys
import pg
server = pg.server()
print(server.pid, server.root, flush=True)
sys.stdin.read()
"""


def test_the_private_server_stops_when_the_run_that_started_it_is_killed() -> None:
    server()  # skipped, or failed, as every test here is, without server binaries
    run = subprocess.Popen(
        [sys.executable, "-c", _START_A_SERVER],
        cwd=Path(__file__).parent,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert run.stdout is not None
    pid, root = run.stdout.readline().split()
    assert Path(f"/proc/{pid}").exists()
    run.kill()
    run.wait()
    deadline = time.monotonic() + 30
    while (Path(f"/proc/{pid}").exists() or Path(root).exists()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()
    assert not Path(root).exists()


# -- several processes -----------------------------------------------------------------------


def work(dsn: str, worker: str) -> int:
    """Claim, start and complete workloads until none is left; returns how many."""
    done = 0
    with contextlib.closing(PostgresStore(dsn, pool_size=2)) as store:
        authority = make_authority(store)
        while (
            claim := authority.claim_next("t", "app", worker, CAPS, CLAIM_AT, LEASE)
        ) is not None:
            key = claim.workload_id
            authority.start(key, claim.fence, now=CLAIM_AT + 1)
            authority.complete(key, claim.fence, f"result-{key}", {"by": worker}, CLAIM_AT + 2)
            done += 1
    return done


def test_four_processes_complete_every_workload_exactly_once(dsn: str) -> None:
    with contextlib.closing(PostgresStore(dsn)) as store:
        admitted = admit_many(make_authority(store), MANY)
        workers = [
            subprocess.Popen(
                [sys.executable, str(Path(__file__)), dsn, f"process-{n}"],
                stdout=subprocess.PIPE,
                text=True,
            )
            for n in range(4)
        ]
        counts = []
        for process in workers:
            out, _ = process.communicate(timeout=300)
            assert process.returncode == 0
            counts.append(json.loads(out)["done"])
        documents = {doc.key: doc for doc in store.scan()}
        records = store.audit_log()

    assert sum(counts) == MANY
    assert all(count > 0 for count in counts)
    assert sorted(documents) == sorted(admitted)
    workloads = [Workload.model_validate_json(doc.document) for doc in documents.values()]
    assert {w.state for w in workloads} == {"SUCCEEDED"}
    completions = Counter(r.key for r in records if r.operation == "complete")
    assert completions == Counter(admitted)
    for workload in workloads:
        tokens = [
            int(event.evidence["fencing_token"])
            for event in workload.execution_history
            if event.to == "CLAIMED"
        ]
        assert tokens == sorted(set(tokens))
        assert workload.fencing_token == len(tokens)
    versions: dict[str, list[int]] = {}
    for record in records:
        versions.setdefault(record.key, []).append(record.version)
    assert versions == {key: list(range(1, doc.version + 1)) for key, doc in documents.items()}
    assert [r.sequence for r in records] == sorted({r.sequence for r in records})


if __name__ == "__main__":
    print(json.dumps({"done": work(sys.argv[1], sys.argv[2])}))


def test_batches_creating_the_same_keys_in_opposite_orders_never_deadlock(
    dsn: str, store: PostgresStore
) -> None:
    """Producers sending the same admissions again, in another order, create the same keys
    at once: each batch creates in key order, so none waits on another that waits on it
    (a deadlock costs the server's `deadlock_timeout`, a second, before it is broken)."""

    def deadlocks() -> int:
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
            assert row is not None
            return int(row[0])

    before = deadlocks()
    failures: list[BaseException] = []
    together = threading.Barrier(2)

    def produce(rounds: range, backwards: bool) -> None:
        for n in rounds:
            keys = [f"r{n}-k{i:03}" for i in range(200)]
            order = keys[::-1] if backwards else keys
            together.wait(30)
            try:
                store.write_many([Write(k, "{}", index(), None, audit(k)) for k in order])
            except StoreFailure as exc:  # pragma: no cover - reported below
                failures.append(exc)

    racers = [
        threading.Thread(target=produce, args=(range(40), backwards)) for backwards in (False, True)
    ]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(120)
    assert failures == []
    # Every key created once, by one of the two batches; the other's create conflicted.
    assert len({(r.key, r.version) for r in store.audit_log(limit=10_000)}) == 40 * 200
    store.close()  # its sessions end, and with them hand in what they counted
    assert deadlocks() == before
