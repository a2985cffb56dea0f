"""Concurrency limits per key: at most the spec's limit of a key's workloads hold a claim.

An admission's `concurrency_key` and the spec's `[concurrency]` table set how
many workloads of one key may hold a claim at once. The store checks the
limit atomically with the claim's write; a claim past it is refused with
`WORKLOAD_CONCURRENCY_LIMITED` and writes nothing, and `claim_next` and
`claim_many` pass such a workload over, so it waits READY, never failed.

The unit tests run on every backend (`store` fixture). Then the proof under
contention: eight worker processes on one SQLite file and on one PostgreSQL
database drain 48 workloads of one key with limit 2; the audit log, replayed
in commit order, shows no committed version at which more than two of them
held a claim, and every workload succeeded.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import textwrap
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fleet import drain_with_processes, fleet_target
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

import pg
from backends import BACKENDS
from support import CAPS, failed_check, request, store_snapshot
from support import authority as make_authority
from workwarden.statemachine import Authority, Spec, WorkloadError
from workwarden.statemachine.properties.invariants import check_store
from workwarden.statemachine.spec import load_spec_text, shipped_spec_text
from workwarden.storage import AuditRecord, IndexFields, MemoryStore, SQLiteStore, Store
from workwarden.storage.base import Write, WriteOutcome
from workwarden.storage.pg_schema import SCHEMA_VERSION as PG_SCHEMA
from workwarden.storage.postgres import PostgresStore
from workwarden.storage.sqlite_schema import SCHEMA_VERSION as SQLITE_SCHEMA
from workwarden.testing import authority_machine
from workwarden.testing.concurrency_rules import CONCURRENCY_KEY, ConcurrencyRules

NOW = 5_000
LEASE = 60_000
KEY = "reports"

_SHIPPED_TABLE = "[concurrency]\nlimits = {}"


def limited_spec(table: str = "limits = { reports = 2, other = 1 }") -> Spec:
    """The shipped spec with its `[concurrency]` table replaced by `table`."""
    text = shipped_spec_text()
    assert _SHIPPED_TABLE in text
    return load_spec_text(text.replace(_SHIPPED_TABLE, "[concurrency]\n" + table))


def admit(authority: Authority, name: str, key: str | None = KEY, **changes: Any) -> str:
    """Admit the fixture request under idempotency key `name` with concurrency key `key`."""
    reply = authority.admit(
        request(idempotency_key=name, concurrency_key=key, **changes), NOW - 1_000
    )
    return reply.workload.workload_id


def holders(store: Store, key: str = KEY) -> list[str]:
    """The documents of concurrency key `key` that hold a claim, by key."""
    return sorted(
        doc.key
        for doc in store.scan()
        if doc.index.concurrency_key == key and doc.index.claim_worker is not None
    )


def claim_all(authority: Authority, worker: str = "w") -> list[str]:
    """Claim with `claim_next` until nothing is claimable; the workload ids claimed."""
    claimed = []
    for number in range(20):
        claim = authority.claim_next("t", "app", f"{worker}{number}", CAPS, NOW, LEASE)
        if claim is None:
            return claimed
        claimed.append(claim.workload_id)
    raise AssertionError("claim_next never ran out of work")


# -- one store, one claimer at a time ------------------------------------------------------


def test_no_more_workloads_of_a_key_hold_a_claim_than_its_limit(store: Store) -> None:
    authority = make_authority(store, limited_spec())
    reports = [admit(authority, f"r{n}") for n in range(4)]
    other = [admit(authority, f"o{n}", "other") for n in range(2)]
    free = [admit(authority, f"f{n}", None) for n in range(2)]

    claimed = claim_all(authority)

    assert len([w for w in claimed if w in reports]) == 2
    assert len([w for w in claimed if w in other]) == 1
    assert sorted(w for w in claimed if w in free) == sorted(free)
    assert len(holders(store)) == 2
    assert len(holders(store, "other")) == 1
    # The workloads passed over are READY and untouched: skipped, not failed.
    for workload_id in set(reports + other) - set(claimed):
        workload = authority.get(workload_id)
        assert workload.state == "READY"
        assert workload.attempt_count == 0


def test_a_claim_past_the_limit_is_refused_and_changes_nothing(store: Store) -> None:
    authority = make_authority(store, limited_spec())
    first, second, third = (admit(authority, f"r{n}") for n in range(3))
    authority.claim(first, "w1", CAPS, NOW, LEASE)
    authority.claim(second, "w2", CAPS, NOW, LEASE)
    before = store_snapshot(store)

    with pytest.raises(WorkloadError) as refused:
        authority.claim(third, "w3", CAPS, NOW, LEASE)

    assert refused.value.code == "WORKLOAD_CONCURRENCY_LIMITED"
    assert refused.value.error_class == "retry_later"
    assert refused.value.details is not None
    assert refused.value.details["workload_id"] == third
    assert store_snapshot(store) == before


def test_a_place_freed_by_a_completion_goes_to_the_next_workload_of_the_key(store: Store) -> None:
    authority = make_authority(store, limited_spec())
    reports = [admit(authority, f"r{n}") for n in range(3)]
    claims = [authority.claim(w, f"w{n}", CAPS, NOW, LEASE) for n, w in enumerate(reports[:2])]
    assert authority.claim_next("t", "app", "late", CAPS, NOW, LEASE) is None

    done = claims[0]
    authority.start(done.workload_id, done.fence, NOW + 1)
    authority.complete(done.workload_id, done.fence, "result-0", {"ok": True}, NOW + 2)

    claim = authority.claim_next("t", "app", "late", CAPS, NOW + 3, LEASE)
    assert claim is not None
    assert claim.workload_id == reports[2]
    assert holders(store) == sorted(reports[1:])


def test_the_holders_of_a_key_work_on_when_its_limit_is_lowered(store: Store) -> None:
    before = make_authority(store, limited_spec())
    reports = [admit(before, f"r{n}") for n in range(3)]
    claims = [before.claim(w, f"w{n}", CAPS, NOW, LEASE) for n, w in enumerate(reports[:2])]

    after = make_authority(store, limited_spec("limits = { reports = 1 }"))
    for number, claim in enumerate(claims):
        after.start(claim.workload_id, claim.fence, NOW + 1)
        after.heartbeat(claim.workload_id, claim.fence, NOW + 2, LEASE)
        after.checkpoint(claim.workload_id, claim.fence, {"step": number}, NOW + 3)
    assert after.claim_next("t", "app", "late", CAPS, NOW + 4, LEASE) is None

    first = claims[0]
    after.complete(first.workload_id, first.fence, "result-0", {"ok": True}, NOW + 5)
    # One still holds its claim: at the lowered limit, the third waits on.
    assert after.claim_next("t", "app", "late", CAPS, NOW + 6, LEASE) is None
    second = claims[1]
    after.complete(second.workload_id, second.fence, "result-1", {"ok": True}, NOW + 7)
    claim = after.claim_next("t", "app", "late", CAPS, NOW + 8, LEASE)
    assert claim is not None
    assert claim.workload_id == reports[2]


def test_claim_many_never_claims_past_the_limit(store: Store) -> None:
    authority = make_authority(store, limited_spec())
    reports = [admit(authority, f"r{n}") for n in range(5)]
    free = [admit(authority, f"f{n}", None) for n in range(2)]

    claimed = []
    for number in range(4):
        batch = authority.claim_many("t", "app", f"m{number}", CAPS, NOW, LEASE, 4)
        claimed.extend(claim.workload_id for claim in batch)

    assert len([w for w in claimed if w in reports]) == 2
    assert sorted(w for w in claimed if w in free) == sorted(free)
    assert len(holders(store)) == 2


def test_a_key_not_listed_takes_the_default_limit_and_no_default_means_unlimited(
    store: Store,
) -> None:
    limited = make_authority(store, limited_spec("default = 1"))
    workloads = [admit(limited, f"u{n}", "unlisted") for n in range(3)]
    assert len(claim_all(limited, "a")) == 1

    unlimited = make_authority(store, limited_spec("limits = { reports = 1 }"))
    assert len(claim_all(unlimited, "b")) == 2
    assert len(holders(store, "unlisted")) == len(workloads)


def test_a_replay_must_carry_the_same_concurrency_key(store: Store) -> None:
    authority = make_authority(store, limited_spec())
    workload_id = admit(authority, "r")
    before = store_snapshot(store)

    again = authority.admit(request(idempotency_key="r", concurrency_key=KEY), NOW)
    assert again.created is False
    assert again.workload.workload_id == workload_id
    for other in ("other", None):
        with pytest.raises(WorkloadError) as refused:
            authority.admit(request(idempotency_key="r", concurrency_key=other), NOW)
        assert refused.value.code == "IDEMPOTENCY_KEY_REUSED"
        assert refused.value.details == {"fields": ["concurrency_key"]}
    assert store_snapshot(store) == before


def test_a_concurrency_key_is_validated_like_other_ids() -> None:
    store = MemoryStore()
    authority = make_authority(store, limited_spec())
    fields = request().model_dump(mode="json")
    for bad in ("", "x" * 257, "tab\there", 7):
        with pytest.raises(WorkloadError) as refused:
            authority.admit({**fields, "concurrency_key": bad}, NOW)
        assert refused.value.code == "WORKLOAD_INVALID"
        assert "concurrency_key" in refused.value.message
    assert list(store.scan()) == []


def test_a_workload_without_a_key_is_stored_exactly_as_before(store: Store) -> None:
    authority = make_authority(store, limited_spec())
    plain = admit(authority, "plain", None)
    keyed = admit(authority, "keyed")
    documents = {doc.key: json.loads(doc.document) for doc in store.scan()}
    assert "concurrency_key" not in documents[plain]
    assert documents[keyed]["concurrency_key"] == KEY
    index = {doc.key: doc.index for doc in store.scan()}
    assert (index[plain].concurrency_key, index[plain].concurrency_limit) == (None, None)
    assert (index[keyed].concurrency_key, index[keyed].concurrency_limit) == (KEY, 2)


@pytest.mark.parametrize(
    "table",
    ["limits = { reports = 0 }", "default = 0", "limits = { reports = true }", "extra = 1"],
)
def test_a_spec_with_a_bad_concurrency_table_is_refused(table: str) -> None:
    with pytest.raises(WorkloadError) as refused:
        limited_spec(table)
    assert refused.value.code == "WORKLOAD_SPEC_INVALID"
    assert "concurrency" in refused.value.message


def test_the_store_check_names_a_key_holding_more_claims_than_its_limit(store: Store) -> None:
    loose = make_authority(store, limited_spec("limits = { reports = 3 }"))
    for number in range(3):
        loose.claim(admit(loose, f"r{number}"), f"w{number}", CAPS, NOW, LEASE)
    documents, audit = list(store.scan()), store.audit_log()

    assert check_store(loose.spec, documents, audit) == []
    found = check_store(limited_spec(), documents, audit)
    assert [violation.property for violation in found] == ["claims_within_concurrency_limits"]
    assert "3 workloads holding a claim" in found[0].message


# -- the stateful suite, with workloads of one key ----------------------------------------


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_the_stateful_suite_never_sees_more_claims_of_a_key_than_its_limit(backend: str) -> None:
    spec = limited_spec(f"limits = {{ {CONCURRENCY_KEY} = 1 }}")
    machine = authority_machine(BACKENDS[backend], spec, shadow=False)
    limited = type("LimitedMachine", (ConcurrencyRules, machine), {})
    base = settings.default
    # The durable store gets half the profile's examples: each one opens a fresh file.
    examples = base.max_examples if backend == "memory" else max(1, base.max_examples // 2)
    run_state_machine_as_test(  # type: ignore[no-untyped-call, unused-ignore]
        limited,
        settings=settings(
            base, max_examples=examples, suppress_health_check=[HealthCheck.too_slow]
        ),
    )


def test_the_stateful_suite_catches_a_store_that_ignores_the_limit() -> None:
    spec = limited_spec(f"limits = {{ {CONCURRENCY_KEY} = 1 }}")
    machine = authority_machine(UnlimitedStore, spec, shadow=False)
    limited = type("LimitedMachine", (ConcurrencyRules, machine), {})
    assert failed_check(limited) == "claims_within_concurrency_limits"


class UnlimitedStore(MemoryStore):
    """A store that drops the concurrency limit from every write: it never refuses a claim."""

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        unlimited = replace(index, concurrency_limit=None)
        return super().write(key, document, unlimited, expected_version, audit)

    def write_many(self, writes: Sequence[Write]) -> list[WriteOutcome]:
        return super().write_many(
            [replace(w, index=replace(w.index, concurrency_limit=None)) for w in writes]
        )


# -- schema version 3 to the current one -------------------------------------------------


def _populate(store: Store) -> None:
    authority = make_authority(store, limited_spec())
    for number in range(3):
        admit(authority, f"old{number}", None)
    claim = authority.claim_next("t", "app", "w", CAPS, NOW, LEASE)
    assert claim is not None


def _works_after_the_upgrade(store: Store, before: list[Any]) -> None:
    assert [(d.key, d.version, d.document, d.index) for d in store.scan()] == before
    authority = make_authority(store, limited_spec("limits = { reports = 1 }"))
    admit(authority, "new0")
    admit(authority, "new1")
    assert len(claim_all(authority)) == 3  # the two old workloads left, and one of the key
    assert len(holders(store)) == 1


def test_a_version_3_sqlite_file_is_brought_to_the_current_version(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    with SQLiteStore(path) as store:
        _populate(store)
        before = [(d.key, d.version, d.document, d.index) for d in store.scan()]
    conn = sqlite3.connect(path)
    conn.executescript(
        "DROP INDEX documents_by_concurrency; ALTER TABLE documents DROP COLUMN concurrency_key;"
        " ALTER TABLE documents DROP COLUMN concurrency_limit;"
        " UPDATE schema_version SET version = 3;"
    )
    conn.close()

    with SQLiteStore(path) as store:
        _works_after_the_upgrade(store, before)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SQLITE_SCHEMA,)]
    kinds = {row[1]: row[2] for row in conn.execute("PRAGMA table_info(documents)")}
    assert kinds["concurrency_limit"] == "INTEGER"
    conn.close()


@pytest.mark.postgres
def test_a_version_3_postgres_database_is_brought_to_the_current_version() -> None:
    with pg.postgres_database() as dsn:
        with contextlib.closing(PostgresStore(dsn)) as store:
            _populate(store)
            before = [(d.key, d.version, d.document, d.index) for d in store.scan()]
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP INDEX workwarden_documents_by_concurrency")
            conn.execute("ALTER TABLE workwarden_documents DROP COLUMN concurrency_key")
            conn.execute("ALTER TABLE workwarden_documents DROP COLUMN concurrency_limit")
            conn.execute("DELETE FROM workwarden_schema_version WHERE version > 3")

        with contextlib.closing(PostgresStore(dsn)) as store:
            _works_after_the_upgrade(store, before)
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT max(version) FROM workwarden_schema_version").fetchone()
            assert row == (PG_SCHEMA,)


# -- eight processes on one key -----------------------------------------------------------

PROCESSES = 8
WORKLOADS = 48
LIMIT = 2

# What each operation of the shipped spec leaves a workload holding, as the audit log
# names it: a claim taken, kept, or given up. The drain below runs no other operation.
TAKES = frozenset({"claim", "claim_next"})
KEEPS = frozenset({"start", "heartbeat", "checkpoint", "execution_context"})
RELEASES = frozenset({"complete", "fail", "recover_expired", "enforce_deadlines"})

DRIVER = '''
"""A worker process of the test: the runtime over a spec that limits key "reports" to 2."""

import pathlib
import random
import sys
import time

from workwarden import App, Worker
from workwarden.statemachine import Authority, GrantVerifier
from workwarden.statemachine.spec import load_spec_text, shipped_spec_text
from workwarden.storage import SQLiteStore
from workwarden.storage.postgres import PostgresStore

kind, target, worker_id = sys.argv[1:4]
text = shipped_spec_text().replace(
    "[concurrency]\\nlimits = {}", "[concurrency]\\nlimits = { reports = 2 }"
)
app = App()


@app.handler("send", needs=("email:send",))
def send(job):
    time.sleep(random.uniform(0.002, 0.012))
    return {"sent": job.input}


store = SQLiteStore(target) if kind == "sqlite" else PostgresStore(target)
authority = Authority(
    store, grants=GrantVerifier.without_signatures(), spec=load_spec_text(text)
)
# Start together: a process that started first could drain the store alone before the
# others have imported anything, and then no two processes would ever have competed.
ready = pathlib.Path.cwd()
(ready / f"ready-{worker_id}").touch()
deadline = time.monotonic() + 120
while len(list(ready.glob("ready-*"))) < FLEET_SIZE and time.monotonic() < deadline:
    time.sleep(0.01)
Worker(
    authority,
    app,
    tenant="t",
    application="app",
    worker_id=worker_id,
    concurrency=2,
    lease_ms=60_000,
    poll_ms=100,
).run()
'''


def _most_holders_at_any_version(store: Store) -> tuple[int, int]:
    """Replay the audit log in commit order: the most holders of `KEY` at once, and records read.

    Each record is one committed version of one key; after it, the key holds
    a claim when its operation took or kept one. Only workloads of `KEY`
    are in the store, so every key counts.
    """
    held: set[str] = set()
    most = 0
    records = store.audit_log()
    sequences = [record.sequence for record in records]
    assert sequences == sorted(sequences)
    for record in records:
        if record.operation in TAKES or record.operation in KEEPS:
            held.add(record.key)
        elif record.operation in RELEASES:
            held.discard(record.key)
        else:
            assert record.operation == "admit", record
        most = max(most, len(held))
        assert len(held) <= LIMIT, (record.sequence, sorted(held))
    return most, len(records)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_eight_processes_never_hold_more_claims_of_a_key_than_its_limit(
    kind: str, tmp_path: Path
) -> None:
    driver = tmp_path / "limited_worker.py"
    driver.write_text(textwrap.dedent(DRIVER).replace("FLEET_SIZE", str(PROCESSES)))
    with fleet_target(kind, tmp_path) as (target, store):
        authority = make_authority(store, limited_spec())
        ids = [
            authority.admit(
                request(idempotency_key=f"job{n}", input={"n": n}, concurrency_key=KEY), NOW
            ).workload.workload_id
            for n in range(WORKLOADS)
        ]
        drain_with_processes(
            driver,
            lambda n: (kind, target, f"worker-{n}"),
            PROCESSES,
            store,
            WORKLOADS,
            tmp_path,
        )

        assert [authority.get(w).state for w in ids] == ["SUCCEEDED"] * WORKLOADS
        most, records = _most_holders_at_any_version(store)
        # The limit was reached, not merely never tried: two held at once.
        assert most == LIMIT
        assert records >= WORKLOADS * 4
        workers = {record.worker for record in store.audit_log() if record.operation in TAKES}
        assert len(workers) > 1
