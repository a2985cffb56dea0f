"""What the SQLite backend adds to the common store contract.

A store reopened on the same file answers exactly as before; every index
query reads an index; the file is in WAL mode and records its schema
version; several stores on one file (as in several processes) serialise
their writes; a writer that cannot get the lock in time fails and changes
nothing; every SQLite error reaches the caller as a `StoreFailure`. And
`open_store` opens each backend from its URL.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from support import CAPS, request, store_snapshot
from support import authority as make_authority
from workwarden.statemachine import Timeouts, WorkloadError
from workwarden.storage import (
    AuditRecord,
    IndexFields,
    MemoryStore,
    SQLiteStore,
    Store,
    StoreConflict,
    StoreFailure,
    open_store,
)
from workwarden.storage.sqlite import SCHEMA_VERSION
from workwarden.storage.urls import Mode

INDEX = IndexFields(tenant="t", application="a", state="READY", priority=0, created_at=0)


def audit(key: str, step: int = 0) -> AuditRecord:
    return AuditRecord(f"tx-{step}", key, 0, "actor", "write", "t", "a", step, "digest")


def populate(store: Store) -> list[str]:
    """Workloads in several states, in two scopes: queued, deferred, leased, done, failed."""
    authority = make_authority(store)
    ids = []
    for number in range(6):
        changes: dict[str, Any] = {
            "idempotency_key": f"key-{number}",
            "priority": number % 3,
            "timeouts": Timeouts(overall_ms=50_000 + number, heartbeat_ms=5_000),
        }
        if number == 1:
            changes["not_before"] = 30_000
        if number == 5:
            changes["application_id"] = "other"
        ids.append(authority.admit(request(**changes), now=10_000 + number).workload.workload_id)
    leased = authority.claim(ids[2], "w1", CAPS, now=11_000, lease_ms=10_000)
    authority.start(ids[2], leased.fence, now=11_500)
    done = authority.claim(ids[3], "w2", CAPS, now=12_000, lease_ms=10_000)
    authority.start(ids[3], done.fence, now=12_500)
    authority.complete(ids[3], done.fence, "result-3", {"ok": "☃"}, now=13_000)
    failed = authority.claim(ids[4], "w3", CAPS, now=12_000, lease_ms=10_000)
    authority.fail(ids[4], failed.fence, "timeout", "slow", now=12_100)
    return ids


def answers(store: Store, ids: list[str]) -> tuple[Any, ...]:
    """Every answer the store gives: reads, results, each index query at many instants."""
    instants = [0, 10_000, 11_000, 13_000, 15_000, 21_000, 30_000, 60_000, 2**53 - 1]
    scopes = [("t", "app"), ("t", "other"), ("u", "app")]
    return (
        store_snapshot(store),
        [store.read(key) for key in [*ids, "absent"]],
        [store.find_result(result) for result in ("result-3", "absent")],
        [store.list(*scope) for scope in scopes],
        [store.claim_candidates(*scope, now, 2) for scope in scopes for now in instants],
        [store.expired_leases(now, 10) for now in instants],
        [store.deadlines_due(now, 10, "t", "app") for now in instants],
        [store.audit_log(after, 3) for after in range(0, 20, 4)],
    )


def test_a_reopened_store_answers_exactly_as_before(tmp_path: Path) -> None:
    path = tmp_path / "work.db"
    with SQLiteStore(path) as first:
        ids = populate(first)
        before = answers(first, ids)
    with SQLiteStore(path) as reopened:
        assert answers(reopened, ids) == before
    with closing(open_store(f"sqlite://{path}")) as by_url:
        assert answers(by_url, ids) == before


def test_a_reopened_store_keeps_its_audit_numbering(tmp_path: Path) -> None:
    path = tmp_path / "work.db"
    with SQLiteStore(path) as first:
        first.write("a", "{}", INDEX, None, audit("a", 1))
        first.write("a", "{}", INDEX, 1, audit("a", 2))
    with SQLiteStore(path) as reopened:
        reopened.write("b", "{}", INDEX, None, audit("b", 3))
        assert [(r.sequence, r.key, r.version) for r in reopened.audit_log()] == [
            (1, "a", 1),
            (2, "a", 2),
            (3, "b", 1),
        ]


@pytest.mark.parametrize("rows", [0, 300])
def test_every_index_query_reads_an_index_not_the_table(tmp_path: Path, rows: int) -> None:
    with SQLiteStore(tmp_path / "work.db") as store:
        for number in range(rows):
            index = IndexFields(
                tenant=f"t{number % 3}",
                application="a",
                state="READY",
                priority=number % 5,
                created_at=number,
                eligible_at=number if number % 2 else None,
                lease_expires_at=number if number % 3 else None,
                next_deadline_at=number if number % 4 else None,
            )
            store.write(f"k{number}", "{}", index, None, audit(f"k{number}"))
        plans = store.query_plans()
    assert set(plans) >= {"claim_candidates", "claim_candidates_after", "expired_leases"}
    assert set(plans) >= {"deadlines_due", "list", "read", "find_result", "scan", "audit_log"}
    for name, plan in plans.items():
        assert plan, name
        for step in plan:
            assert step.startswith("SEARCH "), (name, step)
            assert "INDEX" in step or "PRIMARY KEY" in step, (name, step)
            assert "TEMP B-TREE" not in step, (name, step)
    assert "documents_claimable" in plans["claim_candidates"][0]
    assert "documents_claimable" in plans["claim_candidates_after"][0]
    assert "documents_by_lease" in plans["expired_leases"][0]
    assert "documents_by_deadline" in plans["deadlines_due"][0]


def test_the_file_is_in_wal_mode_and_records_its_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "work.db"
    SQLiteStore(path).close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert raw.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    raw.close()


def test_a_file_from_a_newer_release_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "work.db"
    SQLiteStore(path).close()
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE schema_version SET version = 99")
    raw.close()
    with pytest.raises(StoreFailure, match="schema version 99"):
        SQLiteStore(path)


def test_a_store_opened_on_a_file_that_is_not_a_database_fails(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database, " * 100)
    with pytest.raises(StoreFailure, match=r"notes\.txt"):
        SQLiteStore(path)


def test_a_store_in_a_missing_directory_fails(tmp_path: Path) -> None:
    with pytest.raises(StoreFailure, match="cannot open"):
        SQLiteStore(tmp_path / "missing" / "work.db")


@pytest.mark.parametrize("path", ["", ":memory:", "file:work.db?mode=memory"])
def test_a_store_needs_a_file(path: str) -> None:
    with pytest.raises(ValueError, match="MemoryStore"):
        SQLiteStore(path)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (None, "not NoneType"),
        (7, "not int"),
        (b"/tmp/work.db", "not bytes"),
        ("{tmp}/a\x00b.db", "NUL"),
        (Path("{tmp}/a\x00b.db"), "NUL"),
    ],
)
def test_a_path_that_is_not_text_naming_one_file_is_refused_before_any_file_is_made(
    tmp_path: Path, path: object, message: str
) -> None:
    if isinstance(path, str | Path):
        path = type(path)(str(path).format(tmp=tmp_path))
    with pytest.raises(WorkloadError, match=message) as refused:
        SQLiteStore(path)  # type: ignore[arg-type]
    assert refused.value.code == "WORKLOAD_INVALID"
    assert refused.value.details == {
        "field": "path",
        "errors": [{"field": "path", "message": refused.value.message}],
    }
    # SQLite would have cut the name at the NUL and made tmp_path / "a".
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", ["read_only", "create"])
@pytest.mark.parametrize("value", ["no", "", 0, 1, None])
def test_a_flag_that_is_not_a_bool_is_refused_before_any_file_is_made(
    tmp_path: Path, flag: str, value: object
) -> None:
    with pytest.raises(WorkloadError, match=f"{flag} must be True or False") as refused:
        SQLiteStore(tmp_path / "work.db", **{flag: value})  # type: ignore[arg-type]
    assert refused.value.code == "WORKLOAD_INVALID"
    assert refused.value.details is not None
    assert refused.value.details["field"] == flag
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("level", ["OFF", "fast", ""])
def test_durability_is_full_extra_or_normal(tmp_path: Path, level: str) -> None:
    with pytest.raises(ValueError, match="FULL, EXTRA, NORMAL"):
        SQLiteStore(tmp_path / "work.db", synchronous=level)  # type: ignore[arg-type]


@pytest.mark.parametrize("level", ["FULL", "EXTRA", "NORMAL", "normal"])
def test_each_durability_level_keeps_the_contract(tmp_path: Path, level: str) -> None:
    with SQLiteStore(tmp_path / "work.db", synchronous=level) as store:  # type: ignore[arg-type]
        assert store.write("k", "{}", INDEX, None, audit("k")) == 1
        with pytest.raises(StoreConflict):
            store.write("k", "{}", INDEX, None, audit("k"))
        assert store.synchronous == level.upper()


def test_two_stores_on_one_file_see_each_others_writes_and_conflict(tmp_path: Path) -> None:
    path = tmp_path / "work.db"
    with SQLiteStore(path) as one, SQLiteStore(path) as two:
        assert one.write("k", '{"by": 1}', INDEX, None, audit("k", 1)) == 1
        seen = two.read("k")
        assert seen is not None
        assert seen.document == '{"by": 1}'
        assert two.write("k", '{"by": 2}', INDEX, seen.version, audit("k", 2)) == 2
        before = store_snapshot(one)
        with pytest.raises(StoreConflict):
            one.write("k", '{"by": 1, "again": true}', INDEX, 1, audit("k", 3))
        assert store_snapshot(two) == before
        assert [r.version for r in two.audit_log()] == [1, 2]


def test_stores_opened_at_once_on_a_fresh_file_all_work(tmp_path: Path) -> None:
    path = tmp_path / "fresh.db"
    start = threading.Barrier(8)
    versions: list[int] = []

    def open_and_write(number: int) -> None:
        start.wait()
        with SQLiteStore(path) as store:
            versions.append(store.write(f"k{number}", "{}", INDEX, None, audit(f"k{number}")))

    threads = [threading.Thread(target=open_and_write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert versions == [1] * 8
    with SQLiteStore(path) as store:
        assert [doc.key for doc in store.scan()] == [f"k{n}" for n in range(8)]
        assert len(store.audit_log()) == 8


def test_a_writer_kept_from_the_lock_past_its_timeout_fails_and_changes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "work.db"
    with SQLiteStore(path, busy_timeout_ms=100) as store:
        store.write("k", "{}", INDEX, None, audit("k", 1))
        before = store_snapshot(store)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreFailure, match="locked"):
                store.write("k", '{"late": true}', INDEX, 1, audit("k", 2))
            # Readers never wait for the writer.
            assert store_snapshot(store) == before
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert store_snapshot(store) == before
        assert store.write("k", '{"late": true}', INDEX, 1, audit("k", 2)) == 2


def test_a_write_the_database_refuses_changes_nothing(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "work.db") as store:
        store.write("k", "{}", INDEX, None, audit("k", 1))
        before = store_snapshot(store)
        too_big = IndexFields(tenant="t", application="a", state="X", priority=2**70, created_at=0)
        with pytest.raises(StoreFailure):
            store.write("k", "{}", too_big, 1, audit("k", 2))
        with pytest.raises(StoreFailure):
            store.write("\ud800", "{}", INDEX, None, audit("k", 3))
        assert store_snapshot(store) == before
        assert store.write("k", "{}", INDEX, 1, audit("k", 4)) == 2


def test_a_closed_store_refuses_every_call_and_closes_twice_harmlessly(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "work.db")
    store.write("k", "{}", INDEX, None, audit("k"))
    store.close()
    store.close()
    with pytest.raises(StoreFailure, match="closed"):
        store.read("k")
    with pytest.raises(StoreFailure, match="closed"):
        store.write("j", "{}", INDEX, None, audit("j"))


# Threads reading a store while another thread closes it; run in a process of its own,
# since a connection closed under a running statement can crash the interpreter.
_CLOSED_UNDER_READERS = """
import sys, threading, time
from workwarden.storage import AuditRecord, IndexFields, SQLiteStore, StoreFailure

index = IndexFields(tenant="t", application="a", state="READY", priority=0, created_at=0)
for round in range(int(sys.argv[2])):
    store = SQLiteStore(f"{sys.argv[1]}/work-{round}.db", create=True)
    keys = [f"k{n}" for n in range(200)]
    for key in keys:
        audit = AuditRecord("tx", key, 0, "actor", "write", "t", "a", 0, "digest")
        store.write(key, '{"x": "' + "y" * 3000 + '"}', index, None, audit)
    ended = []

    def read() -> None:
        try:
            while True:
                store.read_many(keys)
                store.list("t", "a")
        except StoreFailure as exc:
            ended.append("closed" in str(exc))
        except BaseException as exc:
            ended.append(repr(exc))

    readers = [threading.Thread(target=read) for _ in range(3)]
    for reader in readers:
        reader.start()
    time.sleep(0.02)
    store.close()
    for reader in readers:
        reader.join(10)
    if ended != [True, True, True]:
        sys.exit(f"round {round}: the readers ended with {ended}")
"""


def test_a_store_closed_while_other_threads_read_it_refuses_them_and_does_not_crash(
    tmp_path: Path,
) -> None:
    """Each reader's next call after the close is a `StoreFailure` saying the store is closed;
    a statement already running finishes first (closing its connection under it could end
    the whole process)."""
    ran = subprocess.run(
        [sys.executable, "-c", _CLOSED_UNDER_READERS, str(tmp_path), "15"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, (ran.returncode, ran.stderr[-2000:])


# -- opening a store by URL ------------------------------------------------------------


def test_memory_urls_open_a_fresh_memory_store() -> None:
    for url in ("memory:", "memory://", "MEMORY:"):
        store = open_store(url)
        assert isinstance(store, MemoryStore)
        assert list(store.scan()) == []


def test_sqlite_urls_and_file_paths_open_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "work.db"
    with SQLiteStore(path) as original:
        original.write("k", "{}", INDEX, None, audit("k"))
    monkeypatch.chdir(tmp_path)
    for url in (f"sqlite://{path}", "sqlite:work.db", str(path), "work.db", "./work.db"):
        with closing(open_store(url)) as store:
            assert isinstance(store, SQLiteStore)
            assert Path(store.path).resolve() == path
            assert [doc.key for doc in store.scan()] == ["k"]


def test_a_sqlite_url_decodes_its_path_and_reads_the_store_options(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/my%20work.db?synchronous=normal&busy_timeout_ms=250"
    with closing(open_store(url, mode="create")) as store:
        assert isinstance(store, SQLiteStore)
        assert store.path == f"{tmp_path}/my work.db"
        assert (store.synchronous, store.busy_timeout_ms) == ("NORMAL", 250)
    assert (tmp_path / "my work.db").exists()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite://host/work.db", "names no host"),
        ("sqlite:", "names no file"),
        ("sqlite:///tmp/work.db?cache=shared", "unknown SQLite option"),
        ("sqlite:///tmp/work.db?busy_timeout_ms=soon", "busy_timeout_ms"),
        ("sqlite:///tmp/work.db?synchronous=OFF", "FULL, EXTRA, NORMAL"),
        ("memory:somewhere", "takes no path"),
        ("", "a store URL is required"),
    ],
)
def test_a_url_that_names_no_store_is_refused(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        open_store(url)


@pytest.mark.parametrize("mode", ["read", "write", "create"])
@pytest.mark.parametrize("url", ["sqlite://{tmp}/a%00b.db", "sqlite://{tmp}/a\x00b.db"])
def test_a_url_whose_path_holds_a_nul_is_refused_in_every_mode_and_makes_no_file(
    tmp_path: Path, url: str, mode: Mode
) -> None:
    with pytest.raises(WorkloadError, match="NUL character") as refused:
        open_store(url.format(tmp=tmp_path), mode=mode)
    assert refused.value.code == "WORKLOAD_STORE_URL_INVALID"
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_scheme_is_refused_without_repeating_the_url() -> None:
    with pytest.raises(ValueError, match="unknown store URL scheme 'mysql'") as refused:
        open_store("mysql://user:secret@db.example/work")
    assert "secret" not in str(refused.value)


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_a_postgresql_url_opens_the_postgresql_backend(tmp_path: Path, scheme: str) -> None:
    # No server listens in an empty directory: reaching the backend's own
    # connection failure shows the URL went to it, whole.
    with pytest.raises(WorkloadError, match="cannot open the database") as refused:
        open_store(f"{scheme}://nobody@/work?host={tmp_path}&connect_timeout=2")
    assert refused.value.code == "WORKLOAD_STORAGE_FAILURE"
