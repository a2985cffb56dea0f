"""Rates per concurrency key: a token bucket the store checks atomically with each claim.

`[concurrency] rates = { key = { every_ms = N, burst = B } }`: at most B claims
of the key at one instant, one more every N ms; a claim with no token left is
`WORKLOAD_RATE_LIMITED`, skipped by the scheduler, and changes nothing.
"""

from __future__ import annotations

import contextlib
import sqlite3
import textwrap
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from fleet import drain_with_processes, fleet_target
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

import pg
from backends import BACKENDS
from support import CAPS, failed_check, request, store_snapshot
from support import authority as make_authority
from workwarden.statemachine import Authority, Spec, WorkloadError
from workwarden.statemachine.spec import load_spec_text, shipped_spec_text
from workwarden.storage import (
    AuditRecord,
    IndexFields,
    MemoryStore,
    SQLiteStore,
    Store,
    StoreLimited,
    StoreRateLimited,
)
from workwarden.storage.base import Write, WriteOutcome, spend_rate
from workwarden.storage.pg_schema import SCHEMA_VERSION as PG_SCHEMA
from workwarden.storage.postgres import PostgresStore
from workwarden.storage.sqlite_schema import SCHEMA_VERSION as SQLITE_SCHEMA
from workwarden.testing import authority_machine
from workwarden.testing.concurrency_rules import CONCURRENCY_KEY, ConcurrencyRules

NOW = 50_000
LEASE = 600_000
KEY = "reports"
_SHIPPED_TABLE = "[concurrency]\nlimits = {}"


def rated_spec(table: str = "rates = { reports = { every_ms = 1000, burst = 2 } }") -> Spec:
    """The shipped spec with its `[concurrency]` table replaced by `table`."""
    text = shipped_spec_text()
    assert _SHIPPED_TABLE in text
    return load_spec_text(text.replace(_SHIPPED_TABLE, "[concurrency]\nlimits = {}\n" + table))


def admit(authority: Authority, name: str, key: str | None = KEY) -> str:
    reply = authority.admit(request(idempotency_key=name, concurrency_key=key), NOW - 10_000)
    return reply.workload.workload_id


def claims_within_rate(instants: Sequence[int], every_ms: int, burst: int) -> bool:
    """Over every span of the claims (sorted instants), at most burst + span // every_ms."""
    ordered = sorted(instants)
    return all(
        j - i + 1 <= burst + (ordered[j] - ordered[i]) // every_ms
        for i in range(len(ordered))
        for j in range(i, len(ordered))
    )


# -- the bucket itself -------------------------------------------------------------------------


def _rated(every_ms: int, burst: int) -> IndexFields:
    return IndexFields(
        tenant="t",
        application="app",
        state="CLAIMED",
        priority=0,
        created_at=0,
        claim_worker="w",
        concurrency_key=KEY,
        rate_every_ms=every_ms,
        rate_burst=burst,
    )


@given(
    every_ms=st.integers(1, 500),
    burst=st.integers(1, 5),
    gaps=st.lists(st.integers(0, 700), min_size=1, max_size=60),
)
def test_the_bucket_grants_exactly_what_the_rate_allows(
    every_ms: int, burst: int, gaps: list[int]
) -> None:
    index = _rated(every_ms, burst)
    mark: int | None = None
    at = 0
    granted: list[int] = []
    for gap in gaps:
        at += gap
        try:
            mark = spend_rate(index, mark, at)
        except StoreRateLimited as refused:
            retry_at = refused.retry_at
        else:
            granted.append(at)
            continue
        assert retry_at > at
        # A token is back at retry_at, not a millisecond before.
        assert spend_rate(index, mark, retry_at) > retry_at
        with pytest.raises(StoreRateLimited):
            spend_rate(index, mark, retry_at - 1)
    assert claims_within_rate(granted, every_ms, burst)


def test_a_full_bucket_grants_its_burst_at_once_then_one_per_interval() -> None:
    index = _rated(100, 3)
    mark = None
    for _ in range(3):
        mark = spend_rate(index, mark, 1_000)
    with pytest.raises(StoreRateLimited) as refused:
        spend_rate(index, mark, 1_000)
    assert refused.value.retry_at == 1_100
    assert isinstance(refused.value, StoreLimited)
    mark = spend_rate(index, mark, 1_100)
    with pytest.raises(StoreRateLimited):
        spend_rate(index, mark, 1_150)


def test_the_check_above_fails_on_claims_faster_than_the_rate() -> None:
    assert claims_within_rate([0, 0, 1000, 2000], 1000, 2)
    assert not claims_within_rate([0, 0, 999], 1000, 2)


# -- through the authority, on every store ----------------------------------------------------


def test_claims_of_a_rated_key_wait_for_tokens_and_others_go_on(store: Store) -> None:
    authority = make_authority(store, rated_spec())
    ids = [admit(authority, f"r{n}") for n in range(4)]
    free = admit(authority, "free", key=None)
    first = [authority.claim_next("t", "app", f"w{n}", CAPS, NOW, LEASE) for n in range(4)]
    taken = [c.workload_id for c in first if c is not None]
    # Two tokens for the key, then the unrated workload; the key's others are skipped.
    assert len(taken) == 3
    assert free in taken
    assert first[3] is None
    waiting = [w for w in ids if w not in taken]
    assert [authority.get(w).state for w in waiting] == ["READY", "READY"]
    # One token back a second later: one more claim, not two.
    later = [authority.claim_next("t", "app", "late", CAPS, NOW + 1_000, LEASE) for _ in range(2)]
    assert later[0] is not None
    assert later[1] is None


def test_a_claim_by_id_with_no_token_is_refused_and_changes_nothing(store: Store) -> None:
    authority = make_authority(store, rated_spec("rates = { reports = { every_ms = 500 } }"))
    a, b = admit(authority, "a"), admit(authority, "b")
    claim = authority.claim(a, "w1", CAPS, NOW, LEASE)
    before = store_snapshot(store)
    with pytest.raises(WorkloadError) as refused:
        authority.claim(b, "w2", CAPS, NOW + 499, LEASE)
    assert refused.value.code == "WORKLOAD_RATE_LIMITED"
    assert refused.value.details["retry_at"] == NOW + 500
    assert store_snapshot(store) == before
    # The holder's own writes spend nothing: it starts and heartbeats at once.
    authority.start(a, claim.fence, NOW + 1)
    authority.heartbeat(a, claim.fence, NOW + 2, LEASE)
    assert authority.claim(b, "w2", CAPS, NOW + 500, LEASE).workload_id == b


def test_batch_claims_spend_one_token_each(store: Store) -> None:
    authority = make_authority(store, rated_spec())
    for n in range(5):
        admit(authority, f"r{n}")
    assert len(authority.claim_many("t", "app", "w", CAPS, NOW, LEASE, 5)) == 2
    assert authority.claim_many("t", "app", "w", CAPS, NOW + 999, LEASE, 5) == []
    assert len(authority.claim_many("t", "app", "w", CAPS, NOW + 2_000, LEASE, 5)) == 2


def test_the_default_rate_holds_every_key_not_listed(store: Store) -> None:
    spec = rated_spec("default_rate = { every_ms = 1000 }")
    authority = make_authority(store, spec)
    admit(authority, "x1", key="x")
    admit(authority, "x2", key="x")
    admit(authority, "y1", key="y")
    claimed = [authority.claim_next("t", "app", "w", CAPS, NOW, LEASE) for _ in range(3)]
    assert sum(c is not None for c in claimed) == 2  # one of x, one of y
    assert spec.concurrency_rate(None) is None


@pytest.mark.parametrize(
    "table",
    [
        "rates = { reports = { every_ms = 0 } }",
        "rates = { reports = { every_ms = 10, burst = 0 } }",
        "rates = { reports = { burst = 2 } }",
        'rates = { reports = { every_ms = "1s" } }',
        "default_rate = { every_ms = 10, per = 1 }",
    ],
)
def test_a_malformed_rate_is_refused_when_the_spec_loads(table: str) -> None:
    with pytest.raises(WorkloadError) as refused:
        rated_spec(table)
    assert refused.value.code == "WORKLOAD_SPEC_INVALID"


# -- schema version 4 to 5 --------------------------------------------------------------------


def test_a_version_4_sqlite_file_gains_the_rate_and_key_pause_columns(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    with SQLiteStore(path) as store:
        authority = make_authority(store, rated_spec())
        admit(authority, "old")
        before = [(d.key, d.version, d.document) for d in store.scan()]
    conn = sqlite3.connect(path)
    conn.executescript(
        "ALTER TABLE documents DROP COLUMN rate_every_ms;"
        " ALTER TABLE documents DROP COLUMN rate_burst; DROP TABLE key_rates;"
        " ALTER TABLE pauses DROP COLUMN concurrency_key;"
        " UPDATE schema_version SET version = 4;"
    )
    conn.close()
    with SQLiteStore(path) as store:
        assert [(d.key, d.version, d.document) for d in store.scan()] == before
        authority = make_authority(store, rated_spec())
        admit(authority, "new")
        assert authority.claim_next("t", "app", "w", CAPS, NOW, LEASE) is not None
        assert authority.claim_next("t", "app", "w", CAPS, NOW, LEASE) is not None
        authority.pause("ops", NOW, tenant="t", concurrency_key=KEY)
        assert [p.scope.concurrency_key for p in authority.pauses()] == [KEY]
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SQLITE_SCHEMA,)]
    conn.close()


@pytest.mark.postgres
def test_a_version_4_postgres_database_gains_the_rate_and_key_pause_columns() -> None:
    with pg.postgres_database() as dsn:
        with contextlib.closing(PostgresStore(dsn)) as store:
            admit(make_authority(store, rated_spec()), "old")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE workwarden_documents DROP COLUMN rate_every_ms")
            conn.execute("ALTER TABLE workwarden_documents DROP COLUMN rate_burst")
            conn.execute("DROP TABLE workwarden_key_rates")
            conn.execute("ALTER TABLE workwarden_pauses DROP COLUMN concurrency_key")
            conn.execute("DELETE FROM workwarden_schema_version WHERE version > 4")
        with contextlib.closing(PostgresStore(dsn)) as store:
            authority = make_authority(store, rated_spec())
            admit(authority, "new")
            claims = [authority.claim_next("t", "app", "w", CAPS, NOW, LEASE) for _ in range(3)]
            assert [c is not None for c in claims] == [True, True, False]
            authority.pause("ops", NOW, tenant="t", concurrency_key=KEY)
            assert [p.scope.concurrency_key for p in authority.pauses()] == [KEY]
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT max(version) FROM workwarden_schema_version").fetchone()
            assert row == (PG_SCHEMA,)


# -- eight processes on one rated key ----------------------------------------------------------

PROCESSES = 8
WORKLOADS = 40
EVERY_MS = 100
BURST = 3

DRIVER = '''
"""A worker process of the test: the runtime over a spec that rates key "reports".

Its poll interval is the default: it looks again as often as the key gains a token.
"""

import sys
import time

from workwarden import App, Worker
from workwarden.statemachine import Authority, GrantVerifier
from workwarden.statemachine.spec import load_spec_text, shipped_spec_text
from workwarden.storage import SQLiteStore
from workwarden.storage.postgres import PostgresStore

kind, target, worker_id, every_ms, burst = sys.argv[1:6]
text = shipped_spec_text().replace(
    "[concurrency]\\nlimits = {}",
    "[concurrency]\\nlimits = {}\\nrates = { reports = { every_ms = %s, burst = %s } }"
    % (every_ms, burst),
)
app = App()


@app.handler("send", needs=("email:send",))
def send(job):
    # Longer than the rate's interval: one worker cannot take every token.
    time.sleep(0.15)
    return {"sent": job.input}


store = SQLiteStore(target) if kind == "sqlite" else PostgresStore(target)
authority = Authority(
    store, grants=GrantVerifier.without_signatures(), spec=load_spec_text(text)
)
Worker(
    authority,
    app,
    tenant="t",
    application="app",
    worker_id=worker_id,
    concurrency=1,
    lease_ms=60_000,
).run()
'''


def _claims(records: Sequence[AuditRecord]) -> list[AuditRecord]:
    return [r for r in records if r.operation in ("claim", "claim_next", "claim_many")]


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_eight_processes_never_claim_a_key_faster_than_its_rate(kind: str, tmp_path: Path) -> None:
    driver = tmp_path / "rated_worker.py"
    driver.write_text(textwrap.dedent(DRIVER))
    with fleet_target(kind, tmp_path) as (target, store):
        authority = make_authority(store, rated_spec())
        ids = [admit(authority, f"job{n}") for n in range(WORKLOADS)]
        drain_with_processes(
            driver,
            lambda n: (kind, target, f"worker-{n}", str(EVERY_MS), str(BURST)),
            PROCESSES,
            store,
            WORKLOADS,
            tmp_path,
        )
        assert [authority.get(w).state for w in ids] == ["SUCCEEDED"] * WORKLOADS
        claims = _claims(store.audit_log())
        assert len(claims) == WORKLOADS
        instants = [record.at for record in claims]
        assert claims_within_rate(instants, EVERY_MS, BURST)
        # The rate was what held them back: half the rate would not have allowed them.
        assert not claims_within_rate(instants, EVERY_MS * 2, BURST)
        assert len({record.worker for record in claims}) > 1


# -- the stateful suite, with workloads of one rated key ----------------------------------------

_SUITE_RATE = f"rates = {{ {CONCURRENCY_KEY} = {{ every_ms = 2000, burst = 1 }} }}"


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_the_stateful_suite_never_sees_a_key_claimed_faster_than_its_rate(backend: str) -> None:
    machine = authority_machine(BACKENDS[backend], rated_spec(_SUITE_RATE), shadow=False)
    rated = type("RatedMachine", (ConcurrencyRules, machine), {})
    base = settings.default
    examples = base.max_examples if backend == "memory" else max(1, base.max_examples // 2)
    run_state_machine_as_test(  # type: ignore[no-untyped-call, unused-ignore]
        rated,
        settings=settings(
            base, max_examples=examples, suppress_health_check=[HealthCheck.too_slow]
        ),
    )


class RatelessStore(MemoryStore):
    """A store that drops the rate from every write: it never refuses a claim for its rate."""

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        rateless = replace(index, rate_every_ms=None, rate_burst=None)
        return super().write(key, document, rateless, expected_version, audit)

    def write_many(self, writes: Sequence[Write]) -> list[WriteOutcome]:
        return super().write_many(
            [
                replace(w, index=replace(w.index, rate_every_ms=None, rate_burst=None))
                for w in writes
            ]
        )


def test_the_stateful_suite_catches_a_store_that_ignores_the_rate() -> None:
    machine = authority_machine(RatelessStore, rated_spec(_SUITE_RATE), shadow=False)
    rated = type("RatedMachine", (ConcurrencyRules, machine), {})
    assert failed_check(rated) == "claims_within_rates"
