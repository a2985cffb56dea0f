"""Batches whose connection breaks: a batch commits as a whole or not at all, never a part.

Through the fault-injecting proxy of `tests/faultproxy.py`, on the suite's
private PostgreSQL server:

- a `write_many` or `claim_batch` whose answer is lost after the commit
  raises `StoreOutcomeUnknown`, and every write of the batch is in the
  database (each document and its audit record); called again, each write
  of the batch is a conflict, the replay rules' "already done";
- a `write_many` cut on its way, after its first writes reached the server
  and before its last did, raises `StoreOutcomeUnknown` and wrote nothing;
- `Authority.claim_many` over such a `claim_batch` is
  `WORKLOAD_OUTCOME_UNKNOWN`, and its repeat with the same request id is
  answered with the claims that committed;
- a `claim_batch` whose page of candidates is lost on its way (nothing
  written yet) is read again on a fresh connection, as a read is, and claims
  as usual.

And SQLite: a batch blocked past the busy timeout, or sent to a read-only
store, is a `StoreFailure` that wrote nothing (and offered no page).
"""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from faultproxy import FaultProxy

from pg import server
from support import CAPS, VERIFIER, request
from workwarden.statemachine import Authority, WorkloadError, errors
from workwarden.storage import (
    AuditRecord,
    IndexFields,
    SQLiteStore,
    StoreConflict,
    StoredDocument,
    StoreFailure,
    StoreOutcomeUnknown,
)
from workwarden.storage.base import BatchStore, Store, Write
from workwarden.storage.postgres import PostgresStore

_DOCUMENT = '{"payload": "' + "x" * 4_096 + '"}'
_BATCH = 40  # 40 writes of 4 KiB: the batch crosses several of the proxy's 64 KiB chunks
_steps = itertools.count(1)


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


def audit(key: str, tx: str, worker: str | None = None) -> AuditRecord:
    return AuditRecord(
        transaction_id=tx,
        key=key,
        version=0,
        actor="test",
        operation="op",
        tenant="t",
        application="app",
        at=next(_steps),
        digest="d",
        worker=worker,
    )


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    sockets = sorted(server().socket_dir.glob(".s.PGSQL.*[0-9]"))
    assert sockets, "the server has no Unix socket"
    with FaultProxy(sockets[0]) as relaying:
        yield relaying


@pytest.fixture
def proxied(proxy: FaultProxy) -> Iterator[PostgresStore]:
    """A store on an empty database of the suite's server, reached through the proxy."""
    running = server()
    name = running.acquire()
    try:
        with contextlib.closing(PostgresStore(proxy.dsn(name), pool_size=2)) as opened:
            yield opened
    finally:
        running.release(name)


def created_in(store: BatchStore, count: int) -> list[str]:
    """`count` READY documents at version 1, by key (and claim) order."""
    keys = [f"k{number:03d}" for number in range(count)]
    outcomes = store.write_many(
        [
            Write(key, "{}", index(created_at=number), None, audit(key, f"tx-create-{key}"))
            for number, key in enumerate(keys)
        ]
    )
    assert outcomes == [1] * count
    return keys


def updates(keys: Sequence[str], tx: str) -> list[Write]:
    """A batch moving every key from version 1 to 2; each audit record's transaction id is `tx`."""
    return [
        Write(key, _DOCUMENT, index(state="DONE", eligible_at=None), 1, audit(key, f"{tx}-{key}"))
        for key in keys
    ]


def versions(store: BatchStore, keys: Sequence[str]) -> list[int]:
    found = store.read_many(keys)
    return [found[key].version for key in keys]


def transactions(store: Store) -> list[str]:
    return [record.transaction_id for record in store.audit_log()]


@pytest.mark.postgres
def test_a_write_many_whose_answer_is_lost_after_the_commit_committed_every_write(
    proxy: FaultProxy, proxied: PostgresStore
) -> None:
    keys = created_in(proxied, _BATCH)
    batch = updates(keys, "tx-lost-answer")
    # The marker is in the last write: the server has the whole batch, commit included,
    # when its answer is held back.
    proxy.drop_reply(f"tx-lost-answer-{keys[-1]}".encode())

    with pytest.raises(StoreOutcomeUnknown, match="may or may not have committed"):
        proxied.write_many(batch)

    assert proxy.fired == 1
    assert versions(proxied, keys) == [2] * _BATCH
    assert all(doc.document == _DOCUMENT for doc in proxied.read_many(keys).values())
    assert transactions(proxied)[_BATCH:] == [write.audit.transaction_id for write in batch]
    # Called again with the same writes: each is a conflict, none is written twice.
    again = proxied.write_many(batch)
    assert all(isinstance(outcome, StoreConflict) for outcome in again)
    assert len(proxied.audit_log()) == 2 * _BATCH


@pytest.mark.postgres
def test_a_write_many_cut_before_its_commit_arrived_wrote_nothing(
    proxy: FaultProxy, proxied: PostgresStore
) -> None:
    keys = created_in(proxied, _BATCH)
    batch = updates(keys, "tx-lost-request")
    # The batch's first chunks reach the server; the chunk holding the last write is
    # cut, and the rest of the batch with it.
    proxy.drop_request(f"tx-lost-request-{keys[-1]}".encode())

    with pytest.raises(StoreOutcomeUnknown):
        proxied.write_many(batch)

    assert proxy.fired == 1
    assert versions(proxied, keys) == [1] * _BATCH
    assert len(proxied.audit_log()) == _BATCH
    # Called again, the whole batch goes ahead, once.
    assert proxied.write_many(batch) == [2] * _BATCH
    assert transactions(proxied)[_BATCH:] == [write.audit.transaction_id for write in batch]


class ClaimAll:
    """A `choose` claiming every document of each page, the claim's audit named `tx`."""

    def __init__(self, tx: str) -> None:
        self.tx = tx
        self.pages: list[list[str]] = []

    def __call__(self, page: Sequence[StoredDocument]) -> Sequence[Write]:
        self.pages.append([doc.key for doc in page])
        return [
            Write(
                doc.key,
                _DOCUMENT,
                index(state="CLAIMED", eligible_at=None, claim_worker="w"),
                doc.version,
                audit(doc.key, f"{self.tx}-{doc.key}", worker="w"),
            )
            for doc in page
        ]


@pytest.mark.postgres
def test_a_claim_batch_whose_answer_is_lost_after_the_commit_claimed_the_whole_batch(
    proxy: FaultProxy, proxied: PostgresStore
) -> None:
    keys = created_in(proxied, _BATCH + 5)
    claimed = keys[:_BATCH]
    choose = ClaimAll("tx-claim-lost")
    proxy.drop_reply(f"tx-claim-lost-{claimed[-1]}".encode())

    with pytest.raises(StoreOutcomeUnknown, match="may or may not have committed"):
        proxied.claim_batch("t", "app", 0, _BATCH, choose)

    assert proxy.fired == 1
    assert choose.pages == [claimed]
    found = proxied.read_many(keys)
    assert [found[key].index.state for key in claimed] == ["CLAIMED"] * _BATCH
    assert [found[key].version for key in claimed] == [2] * _BATCH
    assert [found[key].index.state for key in keys[_BATCH:]] == ["READY"] * 5
    assert transactions(proxied)[_BATCH + 5 :] == [f"tx-claim-lost-{key}" for key in claimed]
    # The lost claims are no longer candidates; the next batch takes the rest.
    rest = proxied.claim_batch("t", "app", 0, _BATCH, ClaimAll("tx-claim-rest"))
    assert [(write.key, outcome) for write, outcome in rest] == [(key, 2) for key in keys[_BATCH:]]


@pytest.mark.postgres
def test_a_claim_many_whose_answer_is_lost_is_outcome_unknown_and_its_repeat_answers_the_claims(
    proxy: FaultProxy, proxied: PostgresStore
) -> None:
    # The claims committed and their answer was lost: not a store failure
    # ("nothing is known to have been committed") but an unknown outcome, which the
    # repeat with the same request id answers with the claims made, writing nothing.
    warden = Authority(proxied, grants=VERIFIER)
    admitted = [
        warden.admit(request(idempotency_key=f"k{number}"), 10_000).workload.workload_id
        for number in range(3)
    ]
    proxy.drop_reply(b"claims-answer-lost")

    with pytest.raises(WorkloadError) as lost:
        warden.claim_many("t", "app", "w", CAPS, 10_001, 60_000, 5, request_id="claims-answer-lost")

    assert proxy.fired == 1
    assert lost.value.code == errors.OUTCOME_UNKNOWN
    assert lost.value.error_class == "retry_later"
    found = proxied.read_many(admitted)
    assert {found[key].index.state for key in admitted} == {"CLAIMED"}
    audited = len(proxied.audit_log())
    again = warden.claim_many(
        "t", "app", "w", CAPS, 10_002, 60_000, 5, request_id="claims-answer-lost"
    )
    assert sorted(claim.workload_id for claim in again) == sorted(admitted)
    assert len(proxied.audit_log()) == audited


@pytest.mark.postgres
def test_a_claim_batch_whose_page_is_lost_reads_it_again_and_claims(
    proxy: FaultProxy, proxied: PostgresStore
) -> None:
    keys = created_in(proxied, 3)
    choose = ClaimAll("tx-claim")
    # The first request naming the scope is the page's (BEGIN and the locking SELECT).
    # Lost on its way: had its answer been lost instead, the server would hold the
    # rows locked until it noticed the session was gone, and the page read again at
    # once might skip them.
    proxy.drop_request(b"app")

    claimed = proxied.claim_batch("t", "app", 0, 10, choose)

    assert proxy.fired == 1
    assert choose.pages == [keys]
    assert [(write.key, outcome) for write, outcome in claimed] == [(key, 2) for key in keys]
    assert versions(proxied, keys) == [2, 2, 2]


def test_a_sqlite_batch_blocked_past_the_busy_timeout_fails_and_writes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.db"
    with contextlib.closing(SQLiteStore(path, busy_timeout_ms=50)) as store:
        keys = [f"k{number}" for number in range(3)]
        assert store.write_many([Write(k, "{}", index(), None, audit(k, f"c-{k}")) for k in keys])
        holder = sqlite3.connect(path, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            with pytest.raises(StoreFailure, match="stayed locked"):
                store.write_many(updates(keys, "tx-blocked"))
            choose = ClaimAll("tx-blocked-claim")
            with pytest.raises(StoreFailure, match="stayed locked"):
                store.claim_batch("t", "app", 0, 10, choose)
            assert choose.pages == []
        finally:
            holder.close()
        assert versions(store, keys) == [1, 1, 1]
        assert len(store.audit_log()) == 3


def test_a_read_only_sqlite_store_refuses_batches_and_offers_no_page(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with contextlib.closing(SQLiteStore(path)) as store:
        keys = created_in(store, 2)
    with contextlib.closing(SQLiteStore(path, read_only=True)) as reader:
        with pytest.raises(StoreFailure, match="readonly"):
            reader.write_many(updates(keys, "tx-read-only"))
        choose = ClaimAll("tx-read-only-claim")
        with pytest.raises(StoreFailure, match="readonly"):
            reader.claim_batch("t", "app", 0, 10, choose)
        assert choose.pages == []
        assert versions(reader, keys) == [1, 1]
