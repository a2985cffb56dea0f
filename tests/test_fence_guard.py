"""The fence carried downstream: `workwarden.fence` on real SQLite and PostgreSQL databases.

A resource that checks the fencing token with its write refuses a worker whose
claim has been superseded, whatever order the two transactions run in: the
lower token never writes after the higher one, and a write refused leaves the
database as it was.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pg
from support import authority as make_authority
from support import request
from workwarden.fence import (
    FENCE_HEADER,
    FenceChecker,
    FencedCall,
    MemoryFenceRecord,
    SqlFenceRecord,
    ensure_fence_table,
    forget,
    format_fence_header,
    guard,
    parse_fence_header,
)
from workwarden.statemachine import WorkloadError
from workwarden.statemachine.ids import claim_id_for
from workwarden.statemachine.models import Fence
from workwarden.storage import MemoryStore

WORKLOAD = "workload_a905c442ee731da96617b295"

Connect = Callable[[], Any]


def fence(token: int, worker: str = "worker-a", workload: str = WORKLOAD) -> Fence:
    """The fence the authority hands `worker` for its claim of `workload` under `token`."""
    return Fence(claim_id=claim_id_for(workload, token, worker), worker_id=worker, token=token)


class Database:
    """One of the user's own databases, with a `notes` table the fenced writes go to."""

    def __init__(self, kind: str, connect: Connect) -> None:
        self.kind = kind
        self.connect = connect
        self.mark = "?" if kind == "sqlite" else "%s"
        with self.transaction() as conn:
            conn.execute("CREATE TABLE notes (id TEXT PRIMARY KEY, token INTEGER NOT NULL)")

    def transaction(self, conn: Any = None) -> Any:
        """A transaction on `conn` (a new connection when None), committed when the block ends."""
        return _Transaction(self, conn)

    def write(self, conn: Any, note_id: str, token: int) -> None:
        """The fenced write itself: the note holds the token of the last writer."""
        m = self.mark
        conn.execute(
            f"INSERT INTO notes VALUES ({m}, {m})"
            " ON CONFLICT (id) DO UPDATE SET token = excluded.token",
            (note_id, token),
        )

    def rows(self, table: str) -> list[tuple[Any, ...]]:
        """Every row of `table`, sorted, as committed."""
        conn = self.connect()
        try:
            return sorted(tuple(r) for r in conn.execute(f"SELECT * FROM {table}").fetchall())
        finally:
            conn.close()

    def has_fence_table(self) -> bool:
        conn = self.connect()
        try:
            if self.kind == "sqlite":
                sql = "SELECT count(*) FROM sqlite_master WHERE name = 'workwarden_fences'"
            else:
                sql = "SELECT count(*) FROM pg_class WHERE relname = 'workwarden_fences'"
            row = conn.execute(sql).fetchone()
            return bool(row[0])
        finally:
            conn.close()


class _Transaction:
    def __init__(self, db: Database, conn: Any) -> None:
        self.db = db
        self.own = conn is None
        self.conn = db.connect() if conn is None else conn

    def __enter__(self) -> Any:
        if self.db.kind == "postgres":
            self._tx = self.conn.transaction()
            self._tx.__enter__()
        return self.conn

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.db.kind == "postgres":
                self._tx.__exit__(*exc)
            elif exc[0] is None:
                self.conn.commit()
            else:
                self.conn.rollback()
        finally:
            if self.own:
                self.conn.close()


def _sqlite(tmp_path: Path) -> Iterator[Database]:
    path = tmp_path / "user.sqlite"

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(path, timeout=30, check_same_thread=False)

    with contextlib.closing(connect()) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
    yield Database("sqlite", connect)


def _postgres() -> Iterator[Database]:
    with pg.postgres_database(schema=False) as dsn:

        def connect() -> psycopg.Connection[Any]:
            return psycopg.connect(dsn, autocommit=True)

        yield Database("postgres", connect)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """An empty database of the user's, on each backend in turn."""
    if request.param == "sqlite":
        yield from _sqlite(tmp_path)
    else:
        yield from _postgres()


def fenced_write(db: Database, f: Fence, note: str = "n", **where: Any) -> None:
    """One transaction: the guard, then the write it protects."""
    with db.transaction() as conn:
        guard(conn, f, where.pop("workload", WORKLOAD), **where)
        db.write(conn, note, f.token)


def refused(call: Callable[[], Any]) -> WorkloadError:
    with pytest.raises(WorkloadError) as caught:
        call()
    return caught.value


# --- the rule ------------------------------------------------------------------


def test_a_higher_token_supersedes_and_a_lower_one_is_refused_with_nothing_written(
    db: Database,
) -> None:
    fenced_write(db, fence(1))
    fenced_write(db, fence(3))
    assert db.rows("notes") == [("n", 3)]
    before = db.rows("workwarden_fences")

    error = refused(lambda: fenced_write(db, fence(2)))

    assert error.code == "WORKLOAD_STALE_FENCE"
    assert error.error_class == "attempt_over"
    assert error.details == {
        "workload_id": WORKLOAD,
        "resource": None,
        "presented_token": 2,
        "presented_claim_id": fence(2).claim_id,
        "highest_token": 3,
        "highest_claim_id": fence(3).claim_id,
    }
    assert db.rows("notes") == [("n", 3)]
    assert db.rows("workwarden_fences") == before


def test_the_same_claim_may_write_again(db: Database) -> None:
    fenced_write(db, fence(2), "first")
    fenced_write(db, fence(2), "second")
    assert db.rows("notes") == [("first", 2), ("second", 2)]
    assert db.rows("workwarden_fences") == [(WORKLOAD, "", 2, fence(2).claim_id, "worker-a")]


def test_the_same_token_from_another_claim_is_refused(db: Database) -> None:
    fenced_write(db, fence(2, "worker-a"))
    error = refused(lambda: fenced_write(db, fence(2, "worker-b"), "other"))
    assert error.code == "WORKLOAD_STALE_FENCE"
    assert error.details is not None
    assert error.details["highest_claim_id"] == fence(2, "worker-a").claim_id
    assert db.rows("notes") == [("n", 2)]


def test_resources_and_workloads_keep_separate_records(db: Database) -> None:
    other = "workload_000000000000000000000000"
    fenced_write(db, fence(5), "whole")
    fenced_write(db, fence(7), "inv", resource="invoices")
    # A lower token than the workload's record, on a resource that has not seen it.
    fenced_write(db, fence(6), "mail", resource="mail")
    # Another workload's tokens count on their own.
    fenced_write(db, fence(1, workload=other), "o", workload=other)

    assert refused(lambda: fenced_write(db, fence(6), "inv", resource="invoices")).code == (
        "WORKLOAD_STALE_FENCE"
    )
    assert refused(lambda: fenced_write(db, fence(4), "whole")).code == "WORKLOAD_STALE_FENCE"
    assert [row[:3] for row in db.rows("workwarden_fences")] == [
        (other, "", 1),
        (WORKLOAD, "", 5),
        (WORKLOAD, "invoices", 7),
        (WORKLOAD, "mail", 6),
    ]


def test_a_refusal_rolls_back_the_whole_transaction(db: Database) -> None:
    fenced_write(db, fence(2))

    def written_then_guarded() -> None:
        with db.transaction() as conn:
            db.write(conn, "written-before-the-guard", 1)
            guard(conn, fence(1), WORKLOAD)

    assert refused(written_then_guarded).code == "WORKLOAD_STALE_FENCE"
    assert db.rows("notes") == [("n", 2)]


# --- concurrent transactions ------------------------------------------------------


def _hold_then_race(db: Database, first: Fence, second: Fence, *, commit_first: bool) -> Any:
    """`first` guards and writes in an open transaction; `second` starts while it is open.

    Returns what the second transaction ended with: None, or the error it raised.
    """
    outcome: dict[str, Any] = {}
    with db.transaction() as conn:
        ensure_fence_table(conn)
    holder = db.connect()
    tx = db.transaction(holder)
    conn = tx.__enter__()
    guard(conn, first, WORKLOAD)
    db.write(conn, "n", first.token)

    def second_writer() -> None:
        try:
            fenced_write(db, second)
        except WorkloadError as exc:
            outcome["error"] = exc
        else:
            outcome["error"] = None

    thread = threading.Thread(target=second_writer)
    thread.start()
    # The second transaction waits on the first's lock on the record.
    thread.join(0.3)
    assert thread.is_alive(), "the second transaction went ahead of the first's lock"
    if commit_first:
        tx.__exit__(None, None, None)
    else:
        tx.__exit__(RuntimeError, RuntimeError("abandoned"), None)
    holder.close()
    thread.join(30)
    assert not thread.is_alive()
    return outcome["error"]


def test_a_lower_token_waiting_on_a_higher_one_is_refused_once_it_commits(db: Database) -> None:
    error = _hold_then_race(db, fence(2, "worker-b"), fence(1), commit_first=True)
    assert isinstance(error, WorkloadError)
    assert error.code == "WORKLOAD_STALE_FENCE"
    assert db.rows("notes") == [("n", 2)]


def test_a_higher_token_waiting_on_a_lower_one_writes_after_it(db: Database) -> None:
    error = _hold_then_race(db, fence(1), fence(2, "worker-b"), commit_first=True)
    assert error is None
    assert db.rows("notes") == [("n", 2)]
    # And the lower one, coming back, is refused.
    assert refused(lambda: fenced_write(db, fence(1))).code == "WORKLOAD_STALE_FENCE"
    assert db.rows("notes") == [("n", 2)]


def test_a_lower_token_goes_ahead_when_the_higher_one_rolls_back(db: Database) -> None:
    error = _hold_then_race(db, fence(2, "worker-b"), fence(1), commit_first=False)
    assert error is None
    assert db.rows("notes") == [("n", 1)]


def test_racing_writers_commit_in_increasing_token_order(db: Database) -> None:
    """Twelve writers, tokens shuffled, all at once: the committed writes only ever go up."""
    with db.transaction() as conn:
        conn.execute("CREATE TABLE log (token INTEGER PRIMARY KEY)")
        ensure_fence_table(conn)
    tokens = list(range(1, 13))
    random.Random(5).shuffle(tokens)
    start = threading.Barrier(len(tokens))
    order: list[int] = []
    refusals: list[str] = []
    lock = threading.Lock()

    def writer(token: int) -> None:
        conn = db.connect()
        start.wait()
        try:
            with db.transaction(conn) as tx:
                guard(tx, fence(token, f"w{token}"), WORKLOAD)
                tx.execute(f"INSERT INTO log VALUES ({db.mark})", (token,))
                # Recorded while the record's lock is held: the commit order.
                with lock:
                    order.append(token)
        except WorkloadError as exc:
            refusals.append(exc.code)
        finally:
            conn.close()

    threads = [threading.Thread(target=writer, args=(t,)) for t in tokens]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    committed = [row[0] for row in db.rows("log")]
    assert set(refusals) <= {"WORKLOAD_STALE_FENCE"}
    assert len(refusals) + len(committed) == len(tokens)
    assert order == sorted(order)
    assert committed == sorted(order)
    assert 12 in committed
    assert db.rows("workwarden_fences")[0][2] == 12


# --- what the guard refuses as input ---------------------------------------------------


def test_bad_input_is_refused_and_nothing_is_written(db: Database) -> None:
    conn = db.connect()
    try:
        cases: list[tuple[Callable[[], Any], str]] = [
            (lambda: guard(conn, "token-1", WORKLOAD), "fence"),  # type: ignore[arg-type]
            (lambda: guard(conn, {"claim_id": "c", "worker_id": "w"}, WORKLOAD), "fence.token"),
            (lambda: guard(conn, fence(1), ""), "workload_id"),
            (lambda: guard(conn, fence(1), WORKLOAD, resource=""), "resource"),
            (lambda: guard(conn, fence(1), WORKLOAD, resource="a\nb"), "resource"),
            (lambda: guard(conn, fence(0), WORKLOAD), "fence.token"),
            (lambda: guard(conn, fence(1), "workload_other"), "fence.claim_id"),
            (lambda: guard(object(), fence(1), WORKLOAD), "conn"),  # type: ignore[arg-type]
        ]
        for call, field in cases:
            error = refused(call)
            assert error.code == "WORKLOAD_INVALID", field
            assert error.details is not None
            assert error.details["errors"][0]["field"] == field
    finally:
        conn.close()
    assert not db.has_fence_table()


def test_a_connection_without_a_transaction_is_refused(db: Database, tmp_path: Path) -> None:
    if db.kind == "sqlite":
        conn: Any = sqlite3.connect(tmp_path / "user.sqlite", isolation_level=None)
    else:
        conn = db.connect()  # autocommit, outside conn.transaction()
    try:
        error = refused(lambda: guard(conn, fence(1), WORKLOAD))
    finally:
        conn.close()
    assert error.code == "WORKLOAD_INVALID"
    assert not db.has_fence_table()


def test_the_table_is_made_once_and_the_schema_is_as_documented(db: Database) -> None:
    conn = db.connect()
    try:
        with db.transaction(conn):
            ensure_fence_table(conn)
        with db.transaction(conn):
            ensure_fence_table(conn)
            guard(conn, fence(9, "w"), WORKLOAD, resource="r")
    finally:
        conn.close()
    assert db.rows("workwarden_fences") == [(WORKLOAD, "r", 9, fence(9, "w").claim_id, "w")]


# --- the HTTP header ------------------------------------------------------------------------


@pytest.mark.parametrize("worker", ["worker-a", "w;1 %x", "wörker/é", "a" * 256])
def test_the_header_round_trips(worker: str) -> None:
    f = fence(41, worker)
    value = format_fence_header(WORKLOAD, f)
    assert value.isascii()
    assert value.count(";") == 3
    assert parse_fence_header(value) == FencedCall(WORKLOAD, f)
    assert parse_fence_header(f"  {value}\t".encode()) == FencedCall(WORKLOAD, f)


def test_the_header_format_is_as_documented() -> None:
    f = fence(7, "w;x")
    assert format_fence_header(WORKLOAD, f) == f"{WORKLOAD};{f.claim_id};w%3Bx;7"


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (None, FENCE_HEADER),
        ("", FENCE_HEADER),
        (f"{WORKLOAD};{fence(1).claim_id};worker-a", FENCE_HEADER),
        (f"{WORKLOAD};{fence(1).claim_id};worker-a;1;x", FENCE_HEADER),
        (f"{WORKLOAD};{fence(1).claim_id};worker a;1", "fence.worker_id"),
        (f"{WORKLOAD};{fence(1).claim_id};%FF;1", "fence.worker_id"),
        (f"{WORKLOAD};{fence(1).claim_id};%0A;1", "fence.worker_id"),
        (f"{WORKLOAD};;worker-a;1", "fence.claim_id"),
        (f"{WORKLOAD};{fence(1).claim_id};worker-a;01", "fence.token"),
        (f"{WORKLOAD};{fence(1).claim_id};worker-a;-1", "fence.token"),
        (f"{WORKLOAD};{fence(1).claim_id};worker-a;0", "fence.token"),
        (f"{WORKLOAD};{fence(1).claim_id};worker-a;9007199254740992", "fence.token"),
        (f"{WORKLOAD};{fence(1).claim_id};worker-a;2", "fence.claim_id"),
        (b"\xff", FENCE_HEADER),
        ("x" * 9000, FENCE_HEADER),
    ],
)
def test_a_malformed_header_is_refused(value: Any, field: str) -> None:
    error = refused(lambda: parse_fence_header(value))
    assert error.code == "WORKLOAD_INVALID"
    assert error.details is not None
    assert error.details["errors"][0]["field"] == field


def test_the_checker_refuses_a_superseded_header() -> None:
    checker = FenceChecker()
    assert checker.check(format_fence_header(WORKLOAD, fence(1))).fence == fence(1)
    assert checker.check(format_fence_header(WORKLOAD, fence(2, "b"))).fence.token == 2
    for stale in (fence(1), fence(2, "c")):
        error = refused(lambda s=stale: checker.check(format_fence_header(WORKLOAD, s)))
        assert error.code == "WORKLOAD_STALE_FENCE"
    # A resource of its own has seen nothing yet.
    assert checker.check(format_fence_header(WORKLOAD, fence(1)), resource="r").fence == fence(1)


def test_the_memory_record_is_safe_between_threads() -> None:
    record = MemoryFenceRecord()
    accepted: list[int] = []
    refusals: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def sender(tokens: list[int]) -> None:
        start.wait()
        for token in tokens:
            try:
                record.advance(WORKLOAD, fence(token, f"w{token}"))
            except WorkloadError as exc:
                refusals.append(exc.code)
            else:
                with lock:
                    accepted.append(token)

    tokens = list(range(1, 801))
    random.Random(3).shuffle(tokens)
    threads = [threading.Thread(target=sender, args=(tokens[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(refusals) == {"WORKLOAD_STALE_FENCE"}
    assert len(refusals) + len(accepted) == len(tokens)
    # Accepted in the order the lock admitted them: strictly increasing, ending at the highest.
    assert accepted == sorted(set(accepted))
    assert accepted[-1] == 800


def test_the_checker_over_the_receivers_database(db: Database) -> None:
    conn = db.connect()
    try:
        checker = FenceChecker(SqlFenceRecord(conn))
        with db.transaction(conn):
            call = checker.check(format_fence_header(WORKLOAD, fence(3)))
            db.write(conn, "n", call.fence.token)

        def stale_call() -> None:
            with db.transaction(conn):
                stale = checker.check(format_fence_header(WORKLOAD, fence(2)))
                db.write(conn, "n", stale.fence.token)

        error = refused(stale_call)
    finally:
        conn.close()
    assert error.code == "WORKLOAD_STALE_FENCE"
    assert db.rows("notes") == [("n", 3)]


# --- with the authority's own fences -------------------------------------------------------------


def test_a_worker_whose_lease_was_recovered_cannot_write_downstream(tmp_path: Path) -> None:
    """The authority's fences, end to end: a claim recovered and taken over loses its write."""
    authority = make_authority(MemoryStore())
    workload = authority.admit(request(), 10_000).workload.workload_id
    first = authority.claim(workload, "worker-a", ["email:send"], 10_000, 1_000)
    assert authority.recover_expired(11_000) == [workload]
    second = authority.claim(workload, "worker-b", ["email:send"], 11_000, 1_000)
    assert second.fencing_token > first.fencing_token

    db = next(_sqlite(tmp_path))
    with db.transaction() as conn:
        guard(conn, second.fence, workload)
        db.write(conn, workload, second.fencing_token)
    error = refused(lambda: fenced_write(db, first.fence, workload, workload=workload))
    assert error.code == "WORKLOAD_STALE_FENCE"
    assert db.rows("notes") == [(workload, second.fencing_token)]


# --- connections with row factories, and forgetting a purged workload ----------------


def _with_named_rows(db: Database, conn: Any) -> Any:
    """`conn` set to answer rows by name, as many applications set their connections."""
    if db.kind == "sqlite":
        conn.row_factory = sqlite3.Row
    else:
        conn.row_factory = psycopg.rows.dict_row
    return conn


def test_the_guard_works_whatever_row_factory_the_connection_has(db: Database) -> None:
    conn = _with_named_rows(db, db.connect())
    try:
        with db.transaction(conn):
            guard(conn, fence(2), WORKLOAD)  # the table's first use
            db.write(conn, "n", 2)
        with db.transaction(conn):
            guard(conn, fence(2), WORKLOAD)
        with pytest.raises(WorkloadError) as stale, db.transaction(conn):
            guard(conn, fence(1), WORKLOAD)
        assert stale.value.code == "WORKLOAD_STALE_FENCE"
        assert stale.value.details["highest_token"] == 2
    finally:
        conn.close()


def test_forget_lets_a_workload_admitted_again_after_its_purge_start_over(db: Database) -> None:
    fenced_write(db, fence(3), resource="a")
    fenced_write(db, fence(3), resource="b")
    fenced_write(db, fence(2, workload="workload_other"), workload="workload_other", note="o")
    # Token 1 of the workload as a whole: the first write of that record, accepted.
    fenced_write(db, fence(1))
    # The purged workload comes back under the same id and claims with token 1.
    assert refused(lambda: fenced_write(db, fence(1), resource="a")).code == (
        "WORKLOAD_STALE_FENCE"
    )
    conn = _with_named_rows(db, db.connect())
    try:
        with db.transaction(conn):
            assert forget(conn, WORKLOAD) == 3
    finally:
        conn.close()
    fenced_write(db, fence(1), resource="a")
    assert [row[:3] for row in db.rows("workwarden_fences")] == [
        (WORKLOAD, "a", 1),
        ("workload_other", "", 2),
    ]


def test_forget_refuses_a_bad_id_or_connection_and_writes_nothing(db: Database) -> None:
    fenced_write(db, fence(3))
    before = db.rows("workwarden_fences")
    conn = db.connect()
    try:
        with db.transaction(conn):
            assert refused(lambda: forget(conn, "")).code == "WORKLOAD_INVALID"
    finally:
        conn.close()
    assert refused(lambda: forget(object(), WORKLOAD)).code == "WORKLOAD_INVALID"  # type: ignore[arg-type]
    assert db.rows("workwarden_fences") == before


# --- without the postgres extra -----------------------------------------------------------


def test_the_guard_works_on_sqlite_without_psycopg_installed(tmp_path: Path) -> None:
    """psycopg is the `postgres` extra: a SQLite-only install imports and uses the guard."""
    script = f"""
import sqlite3, sys
sys.modules["psycopg"] = None  # as if the postgres extra were not installed
from workwarden.fence import FenceChecker, SqlFenceRecord, ensure_fence_table, forget, guard
from workwarden.statemachine import WorkloadError
from workwarden.statemachine.ids import claim_id_for
from workwarden.statemachine.models import Fence

W = {WORKLOAD!r}
def fence(token):
    return Fence(claim_id=claim_id_for(W, token, "w"), worker_id="w", token=token)
conn = sqlite3.connect({str(tmp_path / "user.sqlite")!r})
with conn:
    ensure_fence_table(conn)
    guard(conn, fence(2), W)
for call in (lambda: guard(conn, fence(1), W), lambda: guard(object(), fence(3), W)):
    try:
        with conn:
            call()
    except WorkloadError as exc:
        print(exc.code)
with conn:
    print(forget(conn, W))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["WORKLOAD_STALE_FENCE", "WORKLOAD_INVALID", "1"]


def _every_call_on(conn: Any) -> list[Callable[[], Any]]:
    """Each public fence function's call on `conn`, with fence 4 of `WORKLOAD`."""
    header = format_fence_header(WORKLOAD, fence(4))
    return [
        lambda: guard(conn, fence(4), WORKLOAD),
        lambda: ensure_fence_table(conn),
        lambda: forget(conn, WORKLOAD),
        lambda: FenceChecker(SqlFenceRecord(conn)).check(header),
    ]


def test_a_closed_connection_is_refused_as_invalid(db: Database) -> None:
    fenced_write(db, fence(3))
    conn = db.connect()
    conn.close()
    calls = _every_call_on(conn)
    for call in calls:
        error = refused(call)
        assert error.code == "WORKLOAD_INVALID"
        assert error.details is not None
        assert error.details["errors"][0]["field"] == "conn"
    assert [row[:3] for row in db.rows("workwarden_fences")] == [(WORKLOAD, "", 3)]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"claim_id": fence(3).claim_id, "worker_id": "worker-a", "token": "3"}, "fence.token"),
        ({"claim_id": fence(3).claim_id, "worker_id": "worker-a", "token": None}, "fence.token"),
        ({"claim_id": fence(1).claim_id, "worker_id": "worker-a", "token": True}, "fence.token"),
        ({"claim_id": None, "worker_id": "worker-a", "token": 3}, "fence.claim_id"),
        ({"claim_id": fence(3).claim_id, "token": 3}, "fence.worker_id"),
    ],
)
def test_a_fence_built_without_validation_is_refused_as_invalid(
    db: Database, fields: dict[str, Any], field: str
) -> None:
    """A `Fence` made with `model_construct`, or changed after it was made (neither is
    validated), is checked like a mapping."""
    unchecked = Fence.model_construct(**fields)
    changed = fence(3)
    for name in Fence.model_fields:
        if name in fields:
            setattr(changed, name, fields[name])
        else:
            delattr(changed, name)
    conn = db.connect()
    try:
        calls: list[Callable[[], Any]] = [
            lambda: guard(conn, unchecked, WORKLOAD),
            lambda: format_fence_header(WORKLOAD, unchecked),
            lambda: MemoryFenceRecord().advance(WORKLOAD, unchecked),
            lambda: guard(conn, changed, WORKLOAD),
        ]
        for call in calls:
            error = refused(call)
            assert error.code == "WORKLOAD_INVALID"
            assert error.details is not None
            assert error.details["errors"][0]["field"] == field
    finally:
        conn.close()
    assert not db.has_fence_table()


def test_concurrent_ensure_fence_table_outside_a_transaction_makes_the_table_once(
    db: Database, tmp_path: Path
) -> None:
    """Processes starting together each make the schema ahead of time, outside a transaction."""
    if db.kind == "sqlite":
        path = tmp_path / "user.sqlite"
        db.connect = lambda: sqlite3.connect(path, timeout=30, isolation_level=None)

    def make(start: threading.Barrier, failures: list[str]) -> None:
        conn = db.connect()  # each statement commits alone
        try:
            start.wait()
            ensure_fence_table(conn)
        except Exception as exc:  # noqa: BLE001 - collected and shown below
            failures.append(f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()

    admin = db.connect()
    try:
        for _ in range(8):
            admin.execute("DROP TABLE IF EXISTS workwarden_fences")
            failures: list[str] = []
            start = threading.Barrier(4)
            threads = [threading.Thread(target=make, args=(start, failures)) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert failures == []
            assert db.has_fence_table()
    finally:
        admin.close()


class _Autocommitting(sqlite3.Connection):
    """A connection in Python 3.12's `autocommit=True` mode, on any Python: from 3.12 the
    mode itself; before it, the attribute 3.12 adds, which the guard reads, over the
    default `isolation_level` (3.12 leaves it at its default in that mode too)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if sys.version_info >= (3, 12):
            kwargs["autocommit"] = True
        super().__init__(*args, **kwargs)
        if sys.version_info < (3, 12):
            # 3.12's attribute, which overrides isolation_level; sqlite3 before it has none.
            self.__dict__["autocommit"] = True


def test_a_sqlite_connection_in_autocommit_mode_is_refused(tmp_path: Path) -> None:
    """Python 3.12's `autocommit=True` commits each statement alone, whatever isolation_level
    says; `autocommit=False` always has a transaction open, which the guard joins."""
    path = tmp_path / "user.sqlite"
    alone = sqlite3.connect(path, factory=_Autocommitting)
    assert alone.autocommit is True  # type: ignore[attr-defined,unused-ignore]
    try:
        error = refused(lambda: guard(alone, fence(1), WORKLOAD))
        assert error.code == "WORKLOAD_INVALID"
        assert error.details is not None
        assert error.details["errors"][0]["field"] == "conn"
        alone.execute("BEGIN")
        guard(alone, fence(1), WORKLOAD)
        alone.execute("ROLLBACK")
    finally:
        alone.close()
    # `autocommit=False` (3.12): a transaction is always open; before 3.12, the default mode.
    joined = (
        sqlite3.connect(path, autocommit=False)  # type: ignore[call-arg,unused-ignore]
        if sys.version_info >= (3, 12)
        else sqlite3.connect(path)
    )
    try:
        guard(joined, fence(2), WORKLOAD)
        joined.rollback()
        guard(joined, fence(3), WORKLOAD)
        joined.commit()
    finally:
        joined.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT token FROM workwarden_fences").fetchall()
    assert rows == [(3,)]


@pytest.fixture
def postgres_db() -> Iterator[Database]:
    """An empty PostgreSQL database of the user's."""
    yield from _postgres()


@pytest.mark.postgres
@pytest.mark.parametrize("cursor_factory", ["ClientCursor", "RawCursor"])
def test_the_guard_works_whatever_cursor_class_the_connection_makes(
    postgres_db: Database, cursor_factory: str
) -> None:
    """A psycopg connection may make client-side binding cursors, or raw ones (`$1`)."""
    conn = postgres_db.connect()
    conn.cursor_factory = getattr(psycopg, cursor_factory)
    try:
        with conn.transaction():
            guard(conn, fence(2), WORKLOAD)  # the table's first use
        with pytest.raises(WorkloadError) as stale, conn.transaction():
            guard(conn, fence(1), WORKLOAD)
        assert stale.value.code == "WORKLOAD_STALE_FENCE"
        with conn.transaction():
            assert forget(conn, WORKLOAD) == 1
    finally:
        conn.close()


# --- a table of the guard's name made otherwise ------------------------------------------------

_COLUMNS = "workload_id TEXT NOT NULL, resource TEXT NOT NULL, token {token} NOT NULL,"
_COLUMNS += " claim_id TEXT NOT NULL, worker_id TEXT NOT NULL"


def _fences_table(rest: str, token: str = "BIGINT") -> str:
    return f"CREATE TABLE workwarden_fences ({_COLUMNS.format(token=token)}{rest})"


# (the statement, what the refusal says): each would let a stale write in, or fail each write
# with the database's own error, if the guard used it.
_OTHER_SHAPES = [
    # Tokens compared as text: "9" > "10", so a stale 9 would land after a fresh 10.
    (_fences_table(", PRIMARY KEY (workload_id, resource)", "TEXT"), "column token"),
    (_fences_table(""), "no primary key or unique constraint"),
    (_fences_table(", PRIMARY KEY (workload_id, resource, token)"), "no primary key"),
    (_fences_table(", UNIQUE (workload_id, resource), UNIQUE (claim_id)"), "(claim_id)"),
    (_fences_table(", at TEXT NOT NULL, PRIMARY KEY (workload_id, resource)"), "column at"),
    ("CREATE TABLE workwarden_fences (workload_id TEXT PRIMARY KEY, token BIGINT)", "resource"),
    ("CREATE VIEW workwarden_fences AS SELECT 1 AS workload_id", ""),
]


@pytest.mark.parametrize(("statement", "said"), _OTHER_SHAPES)
def test_a_fence_table_of_another_shape_is_refused_and_nothing_is_written(
    db: Database, statement: str, said: str
) -> None:
    with db.transaction() as conn:
        conn.execute(statement)
    for token in (10, 9):
        error = refused(lambda token=token: fenced_write(db, fence(token)))  # type: ignore[misc]
        assert error.code == "WORKLOAD_INVALID", error
        assert error.details is not None
        assert error.details["errors"][0]["field"] == "conn"
        assert error.details["table"] == "workwarden_fences"
        assert said in error.message
    assert db.rows("notes") == []


@pytest.mark.postgres
def test_a_postgres_fence_table_of_32_bit_tokens_is_refused(postgres_db: Database) -> None:
    """The documented PostgreSQL table holds tokens as BIGINT: an INTEGER one would fail with
    the server's own error once a workload's tokens pass 2**31."""
    with postgres_db.transaction() as conn:
        conn.execute(_fences_table(", PRIMARY KEY (workload_id, resource)", "INTEGER"))
    error = refused(lambda: fenced_write(postgres_db, fence(2**31)))
    assert error.code == "WORKLOAD_INVALID"
    assert "BIGINT" in error.message
    assert postgres_db.rows("notes") == []


def test_a_fence_table_made_otherwise_but_fit_is_used(db: Database) -> None:
    """A table with a surrogate key, a defaulted column and the key's columns in another
    order keeps the rule as the documented one does."""
    serial = "INTEGER PRIMARY KEY" if db.kind == "sqlite" else "BIGSERIAL PRIMARY KEY"
    at = "TEXT NOT NULL DEFAULT 'now'"
    with db.transaction() as conn:
        conn.execute(
            f"CREATE TABLE workwarden_fences (id {serial}, resource VARCHAR(300) NOT NULL,"
            " workload_id TEXT NOT NULL, token BIGINT NOT NULL, claim_id TEXT NOT NULL,"
            f" worker_id TEXT NOT NULL, at {at}, UNIQUE (resource, workload_id))"
        )
    fenced_write(db, fence(10))
    assert refused(lambda: fenced_write(db, fence(9))).code == "WORKLOAD_STALE_FENCE"
    fenced_write(db, fence(11))
    assert db.rows("notes") == [("n", 11)]


@pytest.mark.postgres
def test_a_repeatable_read_transaction_uses_a_table_made_after_its_snapshot(
    postgres_db: Database,
) -> None:
    """Two first uses at once: the second, at REPEATABLE READ, began before the first made
    the table, so its snapshot has no catalog rows of it; it is used all the same."""
    maker, late = postgres_db.connect(), postgres_db.connect()
    late.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    try:
        with late.transaction():
            late.execute("SELECT count(*) FROM notes")  # the snapshot is taken here
            with maker.transaction():
                guard(maker, fence(1), WORKLOAD)
            guard(late, fence(1, workload="workload_other"), "workload_other")
            postgres_db.write(late, "o", 1)
    finally:
        maker.close()
        late.close()
    assert [row[:3] for row in postgres_db.rows("workwarden_fences")] == [
        (WORKLOAD, "", 1),
        ("workload_other", "", 1),
    ]
    assert postgres_db.rows("notes") == [("o", 1)]


# --- in a SQLite transaction begun before the guard ------------------------------------------


def _begun(path: Path) -> sqlite3.Connection:
    """A connection to `path` whose transaction is begun (deferred: no lock yet), as with
    `BEGIN` under `isolation_level=None`, or always under Python 3.12's `autocommit=False`."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    conn.execute("BEGIN")
    return conn


@contextlib.contextmanager
def _another_commits_before(tmp_path: Path, prefix: str) -> Iterator[sqlite3.Connection]:
    """A connection to the user's database in a begun transaction; just before its first
    statement starting with `prefix` runs, another connection commits a note. Asserts, on
    leaving, that it did."""
    path = tmp_path / "user.sqlite"
    conn, other = _begun(path), sqlite3.connect(path, isolation_level=None, timeout=30)
    committed: list[str] = []

    def meanwhile(statement: str) -> None:
        if statement.startswith(prefix) and not committed:
            other.execute("INSERT INTO notes VALUES ('other', 0)")  # commits at once
            committed.append(statement)

    conn.set_trace_callback(meanwhile)
    try:
        yield conn
    finally:
        conn.close()
        other.close()
    assert committed


def test_a_guard_first_in_a_begun_transaction_writes_when_another_writer_commits_meanwhile(
    tmp_path: Path,
) -> None:
    """Called first in the transaction, as docs/fence.md asks, the guard takes the write lock
    with its first statement: a writer committing just before it never fails it with
    "database is locked" (a snapshot read first could not be upgraded to a write)."""
    db = next(_sqlite(tmp_path))
    fenced_write(db, fence(1))  # the table is there
    with _another_commits_before(tmp_path, "INSERT INTO workwarden_fences") as fresh:
        guard(fresh, fence(2), WORKLOAD)
        db.write(fresh, "n", 2)
        fresh.execute("COMMIT")
    assert db.rows("notes") == [("n", 2), ("other", 0)]
    assert [row[:3] for row in db.rows("workwarden_fences")] == [(WORKLOAD, "", 2)]


@pytest.mark.parametrize(("statement", "said"), _OTHER_SHAPES[:4])
def test_a_fence_table_of_another_shape_is_refused_in_a_begun_transaction(
    tmp_path: Path, statement: str, said: str
) -> None:
    db = next(_sqlite(tmp_path))
    with db.transaction() as conn:
        conn.execute(statement.replace("BIGINT", "INTEGER"))
        conn.execute(
            "INSERT INTO workwarden_fences (workload_id, resource, token, claim_id, worker_id)"
            " VALUES ('w', '', 10, 'c', 'x')"
        )
    before = db.rows("workwarden_fences")
    conn = _begun(tmp_path / "user.sqlite")
    try:
        error = refused(lambda: guard(conn, fence(10, workload="w"), "w"))
        assert conn.in_transaction  # the caller's transaction is left to the caller
        conn.execute("COMMIT")
    finally:
        conn.close()
    assert error.code == "WORKLOAD_INVALID"
    assert said in error.message
    assert db.rows("workwarden_fences") == before


def test_a_guard_in_a_begun_transaction_makes_the_missing_table_in_it(tmp_path: Path) -> None:
    db = next(_sqlite(tmp_path))
    conn = _begun(tmp_path / "user.sqlite")
    try:
        guard(conn, fence(3), WORKLOAD)
        db.write(conn, "n", 3)
        conn.execute("ROLLBACK")
        assert not db.has_fence_table()
        conn.execute("BEGIN")
        guard(conn, fence(3), WORKLOAD)
        conn.execute("COMMIT")
    finally:
        conn.close()
    assert [row[:3] for row in db.rows("workwarden_fences")] == [(WORKLOAD, "", 3)]
    assert db.rows("notes") == []


def test_concurrent_first_uses_in_begun_transactions_make_the_table_once(tmp_path: Path) -> None:
    """Workers whose transactions are begun before the guard, all first to use it: one makes
    the table, the others wait for it and write, none fails with "database is locked"."""
    db = next(_sqlite(tmp_path))
    path = tmp_path / "user.sqlite"

    def first_use(start: threading.Barrier, index: int, failures: list[str]) -> None:
        conn = sqlite3.connect(path, isolation_level=None, timeout=30)
        try:
            start.wait()
            conn.execute("BEGIN")
            workload = f"workload_{index}"
            guard(conn, fence(1, workload=workload), workload)
            db.write(conn, workload, 1)
            conn.execute("COMMIT")
        except Exception as exc:  # noqa: BLE001 - collected and shown below
            failures.append(f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()

    for _ in range(10):
        with contextlib.closing(sqlite3.connect(path)) as admin:
            admin.execute("DROP TABLE IF EXISTS workwarden_fences")
            admin.execute("DELETE FROM notes")
            admin.commit()
        failures: list[str] = []
        start = threading.Barrier(4)
        threads = [threading.Thread(target=first_use, args=(start, i, failures)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        assert len(db.rows("workwarden_fences")) == 4
        assert len(db.rows("notes")) == 4


def test_forget_first_in_a_begun_transaction_deletes_when_another_writer_commits_meanwhile(
    tmp_path: Path,
) -> None:
    db = next(_sqlite(tmp_path))
    fenced_write(db, fence(1))
    with _another_commits_before(tmp_path, "DELETE FROM workwarden_fences") as conn:
        assert forget(conn, WORKLOAD) == 1
        conn.execute("DELETE FROM notes WHERE id = 'n'")
        conn.execute("COMMIT")
    assert db.rows("notes") == [("other", 0)]
    assert db.rows("workwarden_fences") == []


def test_a_sqlite_connection_of_another_thread_is_refused_as_invalid(tmp_path: Path) -> None:
    """Handlers run in the worker's threads: a sqlite3 connection made in another one (at
    import, say) cannot be used there, and is refused naming `conn`."""
    db = next(_sqlite(tmp_path))
    fenced_write(db, fence(3))
    conn = sqlite3.connect(tmp_path / "user.sqlite")  # made in this thread
    calls = _every_call_on(conn)
    errors: list[BaseException | None] = []

    def use() -> None:
        for call in calls:
            try:
                call()
            except BaseException as exc:  # noqa: BLE001 - looked at below
                errors.append(exc)
            else:
                errors.append(None)

    try:
        thread = threading.Thread(target=use)
        thread.start()
        thread.join()
    finally:
        conn.close()
    assert len(errors) == len(calls)
    for error in errors:
        assert isinstance(error, WorkloadError), repr(error)
        assert error.code == "WORKLOAD_INVALID"
        assert error.details is not None
        assert error.details["errors"][0]["field"] == "conn"
        assert "another thread" in error.message
    assert [row[:3] for row in db.rows("workwarden_fences")] == [(WORKLOAD, "", 3)]
