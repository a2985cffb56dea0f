"""The store conformance suite: the checks every `Store` backend must pass.

Point it at a factory of your own backend: a zero-argument callable that
returns a fresh, empty store each time it is called, or a context manager
that yields one (the factory of the stateful suite, `workwarden.testing`,
serves both). Every check takes its own store from the factory and closes
it when done, then exits the factory's context (so `close` may be called on
a store the factory also cleans up later: make it harmless twice). A close
that raises fails the check it ended.

    import itertools
    from workwarden.storage.testing import run_store_conformance

    def test_my_store_conforms(tmp_path):
        numbers = itertools.count()
        run_store_conformance(lambda: MyStore(tmp_path / f"{next(numbers)}.db"))

A failing run raises `ConformanceFailure` (an `AssertionError`) naming every
check that failed and why. For one pytest test per check, subclass
`StoreConformance` and define `make_store`.

The checks: compare-and-swap (versions from 1, create requires absence, the
expected version must hold, a conflicting write changes nothing: documents,
index answers and audit log alike), audit atomicity (one record per committed
write, in commit order), `audit_log` paging and its refusal of a negative or
non-integer bound (`WORKLOAD_INVALID`, nothing changed), unique result ids,
the claim query (priority, age, key order; keyset paging; eligibility;
tenant and application isolation),
the lease and deadline queries (due at or before `now`), listing and
scanning, writers racing in threads (exactly one wins each version), and
closing (every read and write after `close` is a `StoreFailure`, and closing
twice is harmless).

Further checks cover optional capabilities (`workwarden.storage.base`), and
pass for a store that does not offer them: `next_instants` (`DueInstants`),
`claimable_scopes` (`ScopeListing`), `list_page` (`ListPages`: walked by
pages of several sizes, it lists what `list` lists, in its order),
`audit_of` (`KeyedAudit`: one key's records of the log, in commit order),
`audit_tail` and `audit_since` (`RecentAudit`: the end of the log),
the work signal (`WakeUps`), and batches (`BatchStore`: `write_many`
outcomes, conflicts, duplicate keys, result id clashes and audit records;
`read_many`; `claim_batch` pages, limits and compare-and-swaps, and two
concurrent callers, each with its own store object when `reopen` is given,
never offered one document), pauses (`Pauses`: kept, listed and audited,
repeats writing nothing; `claim_candidates` and `claim_batch` leave out a
paused tenant, application or definition until it is resumed; a resume wakes
the work signal) and purges (`Purges`: `purgeable` paging, the purge's
compare-and-swap and audit record, the tombstone each purge leaves
(`Tombstones`, required of a store that purges), a key created again by
`write` or `write_many` only when the write names its tombstone, and then
continuing after it, the result id freed).

Every store checks concurrency limits: a write that takes a claim while the
committed document held none is refused (`StoreLimited`, nothing written)
when as many documents of its `concurrency_key` as its `concurrency_limit`
hold a claim, in single writes, in `write_many`, and under writers racing
in threads; a holder's own writes and a released claim are never refused.
Every store checks rates too: a write that takes a claim of a key with a rate
(`rate_every_ms`, `rate_burst`) is refused (`StoreRateLimited`, nothing
written) when the key's token bucket is empty at the write's instant, in
single writes, in `write_many` and under racing writers; a holder's own
writes spend no token.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import replace
from functools import partial
from itertools import pairwise
from typing import Any, Final

from workwarden.statemachine.errors import INVALID, WorkloadError, bad_argument
from workwarden.storage.base import (
    CLAIM_PAGES,
    AuditRecord,
    BatchStore,
    CandidateCursor,
    DueInstants,
    IndexFields,
    KeyedAudit,
    ListPages,
    NextInstants,
    PauseRecord,
    Pauses,
    PauseScope,
    Purges,
    RecentAudit,
    ScopeListing,
    Store,
    StoreConflict,
    StoredDocument,
    StoreFailure,
    StoreLimited,
    StoreRateLimited,
    Tombstones,
    WakeUps,
    Write,
    WriteOutcome,
)

__all__ = [
    "CHECK_NAMES",
    "ConformanceFailure",
    "StoreConformance",
    "run_store_conformance",
]

_THREADS: Final = 8
_ROUNDS: Final = 12
_BARRIER_TIMEOUT_S: Final = 60.0
_BIG: Final = 2**53 - 1
_CONCURRENT_CLAIMS: Final = "concurrent_claim_batches_never_choose_one_document_twice"


class ConformanceFailure(AssertionError):
    """One or more conformance checks failed; `failures` maps each check's name to why."""

    def __init__(self, failures: Mapping[str, str], passed: Sequence[str]) -> None:
        self.failures = dict(failures)
        self.passed = tuple(passed)
        lines = [
            f"store conformance: {len(self.failures)} of"
            f" {len(self.failures) + len(self.passed)} check(s) failed"
        ]
        lines += [f"- {name}: {why}" for name, why in self.failures.items()]
        super().__init__("\n".join(lines))


# -- building blocks ----------------------------------------------------------


def _expect(condition: bool, message: str) -> None:
    # Not `assert`: the suite must check under `python -O` too.
    if not condition:
        raise AssertionError(message)


def _equal(actual: Any, expected: Any, what: str) -> None:
    _expect(actual == expected, f"{what}: expected {expected!r}, got {actual!r}")


def _index(
    tenant: str = "t",
    application: str = "a",
    *,
    state: str = "READY",
    priority: int = 0,
    created_at: int = 0,
    eligible_at: int | None = None,
    lease_expires_at: int | None = None,
    next_deadline_at: int | None = None,
    result_id: str | None = None,
    claim_worker: str | None = None,
    definition: str | None = None,
    concurrency_key: str | None = None,
    concurrency_limit: int | None = None,
    rate_every_ms: int | None = None,
    rate_burst: int | None = None,
) -> IndexFields:
    return IndexFields(
        tenant=tenant,
        application=application,
        state=state,
        priority=priority,
        created_at=created_at,
        eligible_at=eligible_at,
        lease_expires_at=lease_expires_at,
        next_deadline_at=next_deadline_at,
        result_id=result_id,
        claim_worker=claim_worker,
        definition=definition,
        concurrency_key=concurrency_key,
        concurrency_limit=concurrency_limit,
        rate_every_ms=rate_every_ms,
        rate_burst=rate_burst,
    )


def _audit(key: str, index: IndexFields, step: int = 0, **fields: Any) -> AuditRecord:
    record = AuditRecord(
        transaction_id=f"tx-{key}-{step}",
        key=key,
        version=0,
        actor="conformance",
        operation="write",
        tenant=index.tenant,
        application=index.application,
        at=1_000 + step,
        digest=f"digest-{key}-{step}",
    )
    return replace(record, **fields)


def _text(key: str, step: int) -> str:
    return json.dumps({"key": key, "step": step}, sort_keys=True)


class _Writer:
    """Writes to a store the way the authority does, remembering what it committed."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.committed: list[AuditRecord] = []
        self._steps = 0

    def put(self, key: str, index: IndexFields, document: str | None = None) -> StoredDocument:
        """Create `key` or overwrite its current version; returns what was committed."""
        current = self.store.read(key)
        if current is not None:
            expected: int | None = current.version
        else:
            # A key purged before is created again by naming its tombstone.
            expected = self.store.tombstone(key) if isinstance(self.store, Tombstones) else None
        self._steps += 1
        audit = _audit(key, index, self._steps)
        text = document if document is not None else _text(key, self._steps)
        version = self.store.write(key, text, index, expected, audit)
        self.committed.append(replace(audit, version=version))
        return StoredDocument(key=key, version=version, document=text, index=index)


def _snapshot(store: Store, probes: Iterable[str] = ()) -> tuple[Any, ...]:
    """Everything a store answers: documents, audit log, and each index query over the probes."""
    documents = tuple(store.scan())
    scopes = sorted({(doc.index.tenant, doc.index.application) for doc in documents})
    instants = sorted(
        {0, _BIG}
        | {
            value
            for doc in documents
            for value in (
                doc.index.eligible_at,
                doc.index.lease_expires_at,
                doc.index.next_deadline_at,
            )
            if value is not None
        }
    )
    keys = sorted({doc.key for doc in documents} | set(probes))
    results = sorted({doc.index.result_id for doc in documents if doc.index.result_id})
    return (
        documents,
        tuple(store.audit_log()),
        tuple(store.read(key) for key in keys),
        tuple(store.find_result(result) for result in results),
        tuple(tuple(store.list(t, a)) for t, a in scopes),
        tuple(
            tuple(store.claim_candidates(t, a, now, 1_000)) for t, a in scopes for now in instants
        ),
        tuple(tuple(store.expired_leases(now, 1_000)) for now in instants),
        tuple(tuple(store.deadlines_due(now, 1_000)) for now in instants),
    )


def _conflicts(what: str, attempt: Callable[[], object]) -> None:
    try:
        attempt()
    except StoreConflict:
        return
    raise AssertionError(f"{what}: expected StoreConflict, but the write was accepted")


def _unchanged(store: Store, before: tuple[Any, ...], what: str, probes: Iterable[str]) -> None:
    after = _snapshot(store, probes)
    if after != before:
        parts = (
            "documents",
            "audit log",
            "reads",
            "result ids",
            "lists",
            "claim candidates",
            "expired leases",
            "deadlines due",
        )
        changed = [name for name, b, a in zip(parts, before, after, strict=True) if a != b]
        raise AssertionError(f"{what} changed the store ({', '.join(changed)})")


def _order(doc: StoredDocument) -> tuple[int, int, str]:
    return (-doc.index.priority, doc.index.created_at, doc.key)


def _keys(docs: Iterable[StoredDocument]) -> list[str]:
    return [doc.key for doc in docs]


# -- compare-and-swap -----------------------------------------------------------


def _versions_count_from_one(store: Store) -> None:
    _equal(store.read("absent"), None, "read of a key never written")
    writes = [
        (_text("k", 1), _index(priority=1, created_at=5, eligible_at=0)),
        (_text("k", 2), _index(state="CLAIMED", priority=1, created_at=5, lease_expires_at=9)),
        (_text("k", 3), _index(state="DONE", priority=1, created_at=5, result_id="r")),
    ]
    expected: int | None = None
    for step, (text, index) in enumerate(writes, start=1):
        version = store.write("k", text, index, expected, _audit("k", index, step))
        _equal(version, step, f"version returned by write {step}")
        _equal(
            store.read("k"),
            StoredDocument(key="k", version=step, document=text, index=index),
            f"read after write {step}",
        )
        expected = version


def _every_field_index() -> IndexFields:
    """Index fields with every one set: text to escape, and each number at its range's edge."""
    return _index(
        state="CLAIMED",
        priority=2**31 - 1,
        created_at=1,
        eligible_at=_BIG,
        lease_expires_at=_BIG - 1,
        next_deadline_at=0,
        result_id='result ☃ "',
        claim_worker="worker ☃",
        definition="definition \\ ☃",
        concurrency_key="key ☃ '",
        concurrency_limit=2**31 - 1,
        rate_every_ms=_BIG,
        rate_burst=1,
    )


def _documents_round_trip_exactly(store: Store) -> None:
    cases = {
        "plain": ("{}", _index()),
        "ünïcødé-キー": (
            json.dumps({"text": 'naïve ☃ 𝄞 "quoted" \\ back', "n": [1, 2.5, None]}),
            _index("tenant-é", "app/ß", state="RUNNING", priority=-(2**31), created_at=_BIG),
        ),
        "every-field": (json.dumps({"big": "x" * 100_000}), _every_field_index()),
    }
    for key, (text, index) in cases.items():
        store.write(key, text, index, None, _audit(key, index))
    for key, (text, index) in cases.items():
        _equal(
            store.read(key),
            StoredDocument(key=key, version=1, document=text, index=index),
            f"read of {key!r}",
        )


def _require_absent_refuses_an_existing_key(store: Store) -> None:
    index = _index(eligible_at=0)
    store.write("k", _text("k", 1), index, None, _audit("k", index, 1))
    before = _snapshot(store)
    _conflicts(
        "create of an existing key",
        lambda: store.write("k", _text("k", 2), index, None, _audit("k", index, 2)),
    )
    _unchanged(store, before, "a refused create", ())


def _expected_version_must_match(store: Store) -> None:
    writer = _Writer(store)
    writer.put("k", _index(eligible_at=0))
    writer.put("k", _index(eligible_at=0))
    index = _index(state="CLAIMED", lease_expires_at=10)

    def expecting(version: int, key: str = "k") -> Callable[[], object]:
        return lambda: store.write(key, "{}", index, version, _audit(key, index, 9))

    for version in (1, 3, 0):
        _conflicts(f"a write expecting version {version} of a key at version 2", expecting(version))
    _conflicts("a write expecting version 1 of an absent key", expecting(1, "absent"))
    _equal(store.read("absent"), None, "read of an absent key after a refused write")
    committed = writer.put("k", _index())
    _equal(committed.version, 3, "version written with the right expected version")
    _equal(store.read("k"), committed, "read after the refused writes and a right one")


def _a_conflicting_write_changes_nothing(store: Store) -> None:
    writer = _Writer(store)
    writer.put("a", _index(priority=2, created_at=1, eligible_at=0))
    writer.put("b", _index(state="CLAIMED", created_at=2, lease_expires_at=50))
    writer.put("b", _index(state="RUNNING", created_at=2, lease_expires_at=60, next_deadline_at=70))
    writer.put("c", _index("u", "a", state="DONE", created_at=3, result_id="r-c"))
    probes = ("absent",)
    before = _snapshot(store, probes)
    every_change = _index(
        "other",
        "other",
        state="X",
        priority=99,
        created_at=0,
        eligible_at=0,
        lease_expires_at=0,
        next_deadline_at=0,
    )
    attempts: list[tuple[str, Callable[[], object]]] = [
        (
            "a write expecting a stale version",
            lambda: store.write("b", "{}", every_change, 1, _audit("b", every_change, 90)),
        ),
        (
            "a write expecting a future version",
            lambda: store.write("b", "{}", every_change, 3, _audit("b", every_change, 91)),
        ),
        (
            "a create of an existing key",
            lambda: store.write("a", "{}", every_change, None, _audit("a", every_change, 92)),
        ),
        (
            "a write expecting a version of an absent key",
            lambda: store.write(
                "absent", "{}", every_change, 1, _audit("absent", every_change, 93)
            ),
        ),
        (
            "a write taking another key's result id",
            lambda: store.write(
                "b",
                "{}",
                replace(every_change, result_id="r-c"),
                2,
                _audit("b", every_change, 94),
            ),
        ),
        (
            "a create taking another key's result id",
            lambda: store.write(
                "absent",
                "{}",
                replace(every_change, result_id="r-c"),
                None,
                _audit("absent", every_change, 95),
            ),
        ),
    ]
    for what, attempt in attempts:
        _conflicts(what, attempt)
        _unchanged(store, before, what, probes)


# -- the audit log ----------------------------------------------------------------


def _each_write_appends_one_audit_record(store: Store) -> None:
    writer = _Writer(store)
    writer.put("b", _index(eligible_at=0))
    writer.put("a", _index("u", "x", priority=3))
    writer.put("b", _index(state="CLAIMED", lease_expires_at=10))
    # A refused write in between must leave no record.
    index = _index()
    _conflicts("a stale write", lambda: store.write("b", "{}", index, 1, _audit("b", index, 50)))
    # The store fills in version and sequence, whatever the caller passed.
    doc = store.read("b")
    if doc is None:
        raise AssertionError("read of a key just written returned None")
    full = _audit(
        "b",
        index,
        60,
        version=77,
        sequence=42,
        worker="w-1",
        attempt="att-1",
        result="res-1",
        fencing_token=7,
        actor="system.policy",
        operation="complete",
    )
    version = store.write("b", _text("b", 60), _index(state="DONE"), doc.version, full)
    writer.committed.append(replace(full, version=version))
    writer.put("a", _index("u", "x", priority=3))
    records = list(store.audit_log())
    _equal(len(records), len(writer.committed), "number of audit records after 6 writes")
    sequences = [record.sequence for record in records]
    _expect(
        all(s > 0 for s in sequences) and sequences == sorted(set(sequences)),
        f"audit sequences are not positive and strictly increasing: {sequences}",
    )
    for position, (record, expected) in enumerate(zip(records, writer.committed, strict=True)):
        _equal(
            replace(record, sequence=0),
            replace(expected, sequence=0),
            f"audit record {position + 1} (in commit order)",
        )


def _audit_log_pages_by_sequence(store: Store) -> None:
    writer = _Writer(store)
    for step in range(7):
        writer.put(f"k{step % 3}", _index(created_at=step))
    records = list(store.audit_log())
    _equal(len(records), 7, "number of audit records after 7 writes")
    for position, record in enumerate(records):
        _equal(
            list(store.audit_log(after=record.sequence)),
            records[position + 1 :],
            f"audit_log(after={record.sequence})",
        )
        _equal(
            list(store.audit_log(after=record.sequence, limit=2)),
            records[position + 1 : position + 3],
            f"audit_log(after={record.sequence}, limit=2)",
        )
    _equal(list(store.audit_log(limit=3)), records[:3], "audit_log(limit=3)")
    _equal(list(store.audit_log(limit=0)), [], "audit_log(limit=0)")
    _equal(list(store.audit_log(after=0)), records, "audit_log(after=0)")


def _audit_log_refuses_a_negative_or_non_integer_bound(store: Store) -> None:
    writer = _Writer(store)
    for step in range(4):
        writer.put(f"k{step}", _index(created_at=step))
    before = _snapshot(store)
    bad: list[tuple[str, dict[str, Any]]] = [
        *(("after", {"after": value}) for value in (-1, -3, 1.5, "2", True, None, 2**63)),
        *(("limit", {"limit": value}) for value in (-1, -2, 2.0, "3", False, 2**63)),
    ]
    for field, bounds in bad:
        what = f"audit_log({', '.join(f'{k}={v!r}' for k, v in bounds.items())})"
        try:
            answer = store.audit_log(**bounds)
        except WorkloadError as exc:
            _equal(exc.code, INVALID, f"the code of {what}'s refusal")
            _equal((exc.details or {}).get("field"), field, f"the field {what}'s refusal names")
        else:
            raise AssertionError(f"{what}: expected WORKLOAD_INVALID, got {len(answer)} records")
        _unchanged(store, before, f"a refused {what}", ())


# -- result ids -----------------------------------------------------------------------


def _result_ids_are_unique(store: Store) -> None:
    writer = _Writer(store)
    _equal(store.find_result("r"), None, "find_result of an unknown id")
    writer.put("a", _index(state="DONE", result_id="r"))
    writer.put("b", _index(state="RUNNING"))
    writer.put("c", _index(state="RUNNING"))
    writer.put("d", _index(state="RUNNING"))
    _equal(store.find_result("r"), "a", "find_result after a write recording it")
    before = _snapshot(store, ("e",))
    taken = _index(state="DONE", result_id="r")
    _conflicts(
        "a create with a taken result id",
        lambda: store.write("e", "{}", taken, None, _audit("e", taken)),
    )
    _conflicts(
        "an update to a taken result id",
        lambda: store.write("b", "{}", taken, 1, _audit("b", taken)),
    )
    _unchanged(store, before, "a refused result id", ("e",))
    writer.put("a", _index(state="DONE", result_id="r"))
    _equal(store.find_result("r"), "a", "find_result after rewriting its holder")
    writer.put("a", _index(state="DONE", result_id="r2"))
    _equal(store.find_result("r2"), "a", "find_result of the holder's new result id")
    _equal(store.find_result("r"), None, "find_result of a result id its holder gave up")
    writer.put("b", _index(state="DONE", result_id="r"))
    _equal(store.find_result("r"), "b", "find_result of a released result id taken again")


def _held_claims_are_a_workers_claims_in_a_scope(store: Store) -> None:
    writer = _Writer(store)
    _equal(list(store.held_claims("t", "a", "w1")), [], "held_claims of an empty store")
    writer.put("k-b", _index(state="CLAIMED", claim_worker="w1"))
    writer.put("k-a", _index(state="RUNNING", claim_worker="w1"))
    writer.put("k-c", _index(state="CLAIMED", claim_worker="w2"))
    writer.put("k-d", _index("t2", state="CLAIMED", claim_worker="w1"))
    writer.put("k-e", _index(application="a2", state="CLAIMED", claim_worker="w1"))
    writer.put("k-f", _index(state="READY", eligible_at=0))
    held = store.held_claims("t", "a", "w1")
    _equal(_keys(held), ["k-a", "k-b"], "held_claims: the worker's, in the scope, by key")
    _equal(held[0], store.read("k-a"), "held_claims answers the committed document")
    _equal(_keys(store.held_claims("t2", "a", "w1")), ["k-d"], "held_claims of another tenant")
    writer.put("k-b", _index(state="SUCCEEDED"))
    _equal(_keys(store.held_claims("t", "a", "w1")), ["k-a"], "held_claims after a release")
    writer.put("k-a", _index(state="CLAIMED", claim_worker="w2"))
    _equal(_keys(store.held_claims("t", "a", "w2")), ["k-a", "k-c"], "held_claims after a move")
    _equal(list(store.held_claims("t", "a", "w1")), [], "held_claims of a worker holding none")


def _find_request_answers_the_first_record_of_a_request(store: Store) -> None:
    _equal(store.find_request("q1"), None, "find_request of an unknown id")
    index = _index(state="READY", eligible_at=0)
    store.write("k", "{}", index, None, _audit("k", index, 1, request_id="q1"))
    store.write("k", "{}", index, 1, _audit("k", index, 2))
    store.write("k", "{}", index, 2, _audit("k", index, 3, request_id="q1"))
    store.write("j", "{}", index, None, _audit("j", index, 4, request_id="q2"))
    first = store.find_request("q1")
    _expect(first is not None, "find_request finds a recorded request id")
    assert first is not None
    _equal((first.key, first.version, first.transaction_id), ("k", 1, "tx-k-1"), "the first")
    _equal(first, store.audit_log()[0], "find_request answers the record as the log holds it")
    other = store.find_request("q2")
    _equal(None if other is None else other.key, "j", "find_request of another id")
    _equal(store.audit_log()[1].request_id, None, "a write made for no request records none")
    before = _snapshot(store)
    _conflicts(
        "a conflicting write made for a request",
        lambda: store.write("k", "{}", index, 1, _audit("k", index, 5, request_id="q3")),
    )
    _unchanged(store, before, "a conflicting write made for a request", ())
    _equal(store.find_request("q3"), None, "find_request of a request whose write conflicted")


# -- the claim query -----------------------------------------------------------------


def _claim_candidates_order_by_priority_then_age_then_key(store: Store) -> None:
    writer = _Writer(store)
    shapes = [
        (priority, created_at, key)
        for priority in (-3, 0, 5)
        for created_at in (10, 20)
        for key in ("k-b", "k-a", "k-c")
    ]
    random.Random(7).shuffle(shapes)
    for priority, created_at, key in shapes:
        name = f"{key}-{priority}-{created_at}"
        writer.put(name, _index(priority=priority, created_at=created_at, eligible_at=0))
    expected = [name for _, _, name in sorted((-p, c, f"{k}-{p}-{c}") for p, c, k in shapes)]
    got = store.claim_candidates("t", "a", 100, 1_000)
    _equal(_keys(got), expected, "claim_candidates order")
    _equal(sorted(got, key=_order), list(got), "claim_candidates order by their own index fields")
    _equal(_keys(store.claim_candidates("t", "a", 100, 4)), expected[:4], "claim_candidates limit")
    _equal(list(store.claim_candidates("t", "a", 100, 0)), [], "claim_candidates limit 0")


def _claim_candidates_page_with_a_keyset_cursor(store: Store) -> None:
    writer = _Writer(store)
    for number in range(23):
        writer.put(
            f"k{number:02d}",
            _index(priority=number % 3, created_at=number % 4, eligible_at=number % 2),
        )
    everything = list(store.claim_candidates("t", "a", 10, 1_000))
    _equal(len(everything), 23, "number of claim candidates")
    pages: list[StoredDocument] = []
    cursor: CandidateCursor | None = None
    for _ in range(10):
        page = list(store.claim_candidates("t", "a", 10, 5, cursor))
        if not page:
            break
        _expect(len(page) <= 5, f"a page of limit 5 held {len(page)} candidates")
        pages += page
        last = page[-1]
        cursor = CandidateCursor(last.index.priority, last.index.created_at, last.key)
    _equal(_keys(pages), _keys(everything), "claim candidates read page by page")
    # A cursor between rows (its key was never written) starts after its place.
    between = CandidateCursor(1, 1, "k04z")
    _equal(
        _keys(store.claim_candidates("t", "a", 10, 1_000, between)),
        [doc.key for doc in everything if _order(doc) > (-1, 1, "k04z")],
        "claim candidates after a cursor between rows",
    )
    past_the_end = CandidateCursor(-(2**31), _BIG, "\U0010ffff")
    _equal(
        list(store.claim_candidates("t", "a", 10, 5, past_the_end)),
        [],
        "claim candidates after a cursor past the last row",
    )


def _claim_candidates_are_only_eligible_documents(store: Store) -> None:
    writer = _Writer(store)
    writer.put("never", _index(state="CLAIMED"))
    writer.put("at-zero", _index(eligible_at=0))
    writer.put("at-now", _index(eligible_at=100))
    writer.put("later", _index(eligible_at=101))
    _equal(
        sorted(_keys(store.claim_candidates("t", "a", 100, 10))),
        ["at-now", "at-zero"],
        "claim candidates at 100 (eligible at 0, 100, 101, never)",
    )
    _equal(
        sorted(_keys(store.claim_candidates("t", "a", 101, 10))),
        ["at-now", "at-zero", "later"],
        "claim candidates at 101",
    )
    writer.put("at-zero", _index(state="CLAIMED", lease_expires_at=200))
    writer.put("never", _index(eligible_at=50))
    _equal(
        sorted(_keys(store.claim_candidates("t", "a", 100, 10))),
        ["at-now", "never"],
        "claim candidates follow the latest write",
    )
    latest = store.claim_candidates("t", "a", 100, 10)
    _equal(
        [doc.version for doc in sorted(latest, key=lambda doc: doc.key)],
        [1, 2],
        "versions of claim candidates",
    )


def _claim_candidates_isolate_tenants_and_applications(store: Store) -> None:
    writer = _Writer(store)
    scopes = [("t", "a"), ("t", "b"), ("u", "a"), ("u", "b")]
    for tenant, application in scopes:
        for number in range(3):
            writer.put(
                f"{tenant}-{application}-{number}",
                _index(tenant, application, created_at=number, eligible_at=0),
            )
    for tenant, application in scopes:
        got = store.claim_candidates(tenant, application, 10, 100)
        _equal(
            _keys(got),
            [f"{tenant}-{application}-{number}" for number in range(3)],
            f"claim candidates of tenant {tenant!r}, application {application!r}",
        )
        _equal(
            list(store.claim_candidates(tenant, "nobody", 10, 100)),
            [],
            f"claim candidates of tenant {tenant!r}, an application with no work",
        )


# -- the lease and deadline queries --------------------------------------------------


def _due_query(
    store: Store,
    query: Callable[..., Sequence[str]],
    due: Callable[[IndexFields, int | None], IndexFields],
    name: str,
) -> None:
    writer = _Writer(store)
    shapes = [
        ("d-late", "t", "a", 300),
        ("d-now-b", "t", "a", 200),
        ("d-now-a", "t", "b", 200),
        ("d-early", "u", "a", 100),
        ("d-zero", "t", "a", 0),
        ("d-none", "t", "a", None),
    ]
    for key, tenant, application, value in shapes:
        writer.put(key, due(_index(tenant, application), value))
    _equal(list(query(199, 100)), ["d-zero", "d-early"], f"{name}(now=199)")
    _equal(
        list(query(200, 100)),
        ["d-zero", "d-early", "d-now-a", "d-now-b"],
        f"{name}(now=200): due at or before now, earliest first, then by key",
    )
    _equal(list(query(200, 2)), ["d-zero", "d-early"], f"{name}(now=200, limit=2)")
    _equal(list(query(200, 0)), [], f"{name}(now=200, limit=0)")
    _equal(list(query(200, 100, "t")), ["d-zero", "d-now-a", "d-now-b"], f"{name} of tenant t")
    _equal(list(query(200, 100, None, "a")), ["d-zero", "d-early", "d-now-b"], f"{name} of app a")
    _equal(list(query(200, 100, "t", "a")), ["d-zero", "d-now-b"], f"{name} of t and a")
    _equal(list(query(_BIG, 100, "nobody")), [], f"{name} of a tenant with no work")
    writer.put("d-zero", due(_index(), None))
    writer.put("d-late", due(_index(), 150))
    _equal(
        list(query(200, 100)),
        ["d-early", "d-late", "d-now-a", "d-now-b"],
        f"{name} follow the latest write",
    )


def _expired_leases_are_due_at_or_before_now(store: Store) -> None:
    _due_query(
        store,
        store.expired_leases,
        lambda index, value: replace(index, lease_expires_at=value),
        "expired_leases",
    )


def _deadlines_due_are_due_at_or_before_now(store: Store) -> None:
    _due_query(
        store,
        store.deadlines_due,
        lambda index, value: replace(index, next_deadline_at=value),
        "deadlines_due",
    )


# -- listing and scanning -------------------------------------------------------------


def _list_returns_a_scope_by_priority_then_age(store: Store) -> None:
    writer = _Writer(store)
    writer.put("z", _index(state="DONE", priority=1, created_at=5, result_id="r"))
    writer.put("y", _index(state="READY", priority=1, created_at=5, eligible_at=999))
    writer.put("x", _index(state="RUNNING", priority=2, created_at=9, lease_expires_at=1))
    writer.put("w", _index(state="READY", priority=-1, created_at=0, eligible_at=0))
    writer.put("v", _index("t", "other", priority=5))
    writer.put("u", _index("other", "a", priority=5))
    latest = writer.put("x", _index(state="RUNNING", priority=2, created_at=9, next_deadline_at=4))
    got = list(store.list("t", "a"))
    _equal(_keys(got), ["x", "y", "z", "w"], "list of tenant t, application a")
    _equal(got[0], latest, "list holds the latest version")
    _equal(list(store.list("nobody", "a")), [], "list of a tenant with no work")


def _scan_returns_every_document_by_key(store: Store) -> None:
    _equal(list(store.scan()), [], "scan of an empty store")
    writer = _Writer(store)
    latest: dict[str, StoredDocument] = {}
    # More than a page of a backend that scans 256 documents at a time.
    keys = [f"k{number:04d}" for number in range(300)] + ["B", "a", "é", "Z"]
    random.Random(3).shuffle(keys)
    for number, key in enumerate(keys):
        tenant = ("t", "u")[number % 2]
        latest[key] = writer.put(key, _index(tenant, "a", created_at=number))
    for key in keys[:10]:
        latest[key] = writer.put(key, _index("v", "b", state="DONE"))
    got = list(store.scan())
    _equal(_keys(got), sorted(keys), "scan order (by key, code point order)")
    _equal(got, [latest[key] for key in sorted(keys)], "scan holds the latest versions")


# -- writers racing ---------------------------------------------------------------------


def _race(store: Store, work: Callable[[int, threading.Barrier], object]) -> list[object]:
    """Run `work(thread_number, barrier)` in threads together; returns their results."""
    barrier = threading.Barrier(_THREADS, timeout=_BARRIER_TIMEOUT_S)
    results: list[object] = [None] * _THREADS
    errors: list[str] = []

    def run(number: int) -> None:
        try:
            results[number] = work(number, barrier)
        except BaseException as exc:  # noqa: BLE001 - reported below, with the thread
            errors.append(f"thread {number}: {type(exc).__name__}: {exc}")
            barrier.abort()

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in range(_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(_BARRIER_TIMEOUT_S * (_ROUNDS + 2))
    _expect(not any(t.is_alive() for t in threads), "racing writers did not finish")
    _expect(not errors, "racing writers failed: " + "; ".join(sorted(errors)))
    return results


def _concurrent_writers_win_once_per_version(store: Store) -> None:
    def race(number: int, barrier: threading.Barrier) -> list[int | None]:
        won: list[int | None] = []
        index = _index(created_at=number)
        for round_ in range(_ROUNDS + 1):
            barrier.wait()
            expected = None if round_ == 0 else round_
            audit = _audit("k", index, number, transaction_id=f"tx-{round_}-{number}")
            try:
                won.append(store.write("k", _text("k", number), index, expected, audit))
            except StoreConflict:
                won.append(None)
        return won

    results = _race(store, race)
    for round_ in range(_ROUNDS + 1):
        winners = [
            number
            for number, won in enumerate(results)
            if isinstance(won, list) and won[round_] is not None
        ]
        what = "the create" if round_ == 0 else f"version {round_}"
        _equal(len(winners), 1, f"number of {_THREADS} racing writers that won {what}")
    doc = store.read("k")
    _equal(None if doc is None else doc.version, _ROUNDS + 1, "version after the race")
    records = [record for record in store.audit_log() if record.key == "k"]
    _equal(
        [record.version for record in records],
        list(range(1, _ROUNDS + 2)),
        "versions in the audit log after the race (one record each, in order)",
    )


def _concurrent_writes_to_distinct_keys_all_commit(store: Store) -> None:
    writes = 10

    def race(number: int, barrier: threading.Barrier) -> int:
        barrier.wait()
        version: int | None = None
        for step in range(writes):
            key = f"k{number}"
            index = _index(created_at=number, eligible_at=step)
            version = store.write(key, _text(key, step), index, version, _audit(key, index, step))
        return version or 0

    results = _race(store, race)
    _equal(results, [writes] * _THREADS, "final versions returned to each writer")
    records = list(store.audit_log())
    _equal(len(records), writes * _THREADS, "number of audit records")
    sequences = [record.sequence for record in records]
    _expect(len(set(sequences)) == len(sequences), "audit sequences repeat")
    for number in range(_THREADS):
        key = f"k{number}"
        _equal(
            [record.version for record in records if record.key == key],
            list(range(1, writes + 1)),
            f"audit versions of {key}, in sequence order",
        )
        doc = store.read(key)
        _equal(None if doc is None else doc.document, _text(key, writes - 1), f"document {key}")


# -- closing ------------------------------------------------------------------------------


def _a_closed_store_refuses_reads_and_writes(store: Store) -> None:
    index = _index(eligible_at=0)
    store.write("k", _text("k", 1), index, None, _audit("k", index, 1))
    store.close()
    store.close()
    calls: dict[str, Callable[[], object]] = {
        "read": lambda: store.read("k"),
        "write": lambda: store.write("j", _text("j", 2), index, None, _audit("j", index, 2)),
        "update": lambda: store.write("k", _text("k", 3), index, 1, _audit("k", index, 3)),
        "audit_log": store.audit_log,
        "scan": lambda: list(store.scan()),
        "list": lambda: store.list("t", "a"),
        "claim_candidates": lambda: store.claim_candidates("t", "a", 0, 10),
        "expired_leases": lambda: store.expired_leases(_BIG, 10),
    }
    if isinstance(store, ListPages):
        calls["list_page"] = lambda: store.list_page("t", "a", 10)
    for what, call in calls.items():
        try:
            answer = call()
        except StoreFailure:
            continue
        raise AssertionError(f"{what} after close: expected StoreFailure, got {answer!r}")


# -- optional capabilities ---------------------------------------------------------------


def _claimable_scopes_are_the_scopes_with_work_eligible_now(store: Store) -> None:
    if not isinstance(store, ScopeListing):
        return
    _equal(store.claimable_scopes(0), [], "claimable_scopes of an empty store")
    writer = _Writer(store)
    writer.put("k1", _index("t2", "a", eligible_at=100))
    writer.put("k2", _index("t1", "b", eligible_at=0))
    writer.put("k3", _index("t1", "a", eligible_at=500))
    writer.put("k4", _index("t3", "a", state="CLAIMED", claim_worker="w"))
    writer.put("k5", _index("t1", "b", eligible_at=50))
    _equal(store.claimable_scopes(0), [("t1", "b")], "claimable_scopes at 0")
    _equal(
        store.claimable_scopes(500),
        [("t1", "a"), ("t1", "b"), ("t2", "a")],
        "claimable_scopes at 500, sorted, each once",
    )
    writer.put("k2", _index("t1", "b", state="CLAIMED", claim_worker="w"))
    writer.put("k5", _index("t1", "b", state="SUCCEEDED"))
    _equal(store.claimable_scopes(500), [("t1", "a"), ("t2", "a")], "after the claims")


def _audit_of_a_key_is_its_records_of_the_log(store: Store) -> None:
    if not isinstance(store, KeyedAudit):
        return
    _equal(list(store.audit_of("k1")), [], "audit_of in an empty store")
    writer = _Writer(store)
    for step in range(12):
        writer.put(f"k{step % 3}", _index(priority=step))
    log = list(store.audit_log())
    for key in ("k0", "k1", "k2"):
        mine = [record for record in log if record.key == key]
        _equal(list(store.audit_of(key)), mine, f"audit_of({key!r}) against the log")
    _equal(list(store.audit_of("k")), [], "audit_of a key never written (a prefix of others)")


def _recent_audit_is_the_end_of_the_log(store: Store) -> None:
    if not isinstance(store, RecentAudit):
        return
    _equal(list(store.audit_tail(5)), [], "audit_tail of an empty store")
    writer = _Writer(store)
    for step in range(12):
        writer.put(f"k{step % 3}", _index(priority=step))
    log = list(store.audit_log())
    for limit in (0, 1, 5, 12, 50):
        _equal(list(store.audit_tail(limit)), log[::-1][:limit], f"audit_tail({limit})")
    # The writer's records are at 1,001, 1,002, ... (one instant a step).
    for at in (0, 1_001, 1_007, 1_012, 1_013):
        since = [record for record in log if record.at >= at]
        _equal(list(store.audit_since(at)), since, f"audit_since({at})")
    calls: list[Callable[[], object]] = [
        lambda: store.audit_tail(-1),
        lambda: store.audit_since(-1),
    ]
    for call in calls:
        try:
            answer = call()
        except WorkloadError as exc:
            _expect(exc.code == INVALID, f"a negative bound: expected WORKLOAD_INVALID, {exc.code}")
        else:
            raise AssertionError(f"a negative bound: expected WORKLOAD_INVALID, got {answer!r}")


def _list_pages_walk_a_scope_in_list_order(store: Store) -> None:
    if not isinstance(store, ListPages):
        return
    _equal(list(store.list_page("t", "a", 5)), [], "list_page of an empty store")
    writer = _Writer(store)
    rng = random.Random(7)
    for number in range(40):
        # Few priorities and instants, so that ties are ordered by key.
        index = _index(priority=rng.choice([-2, 0, 0, 3]), created_at=rng.choice([0, 5, 9]))
        writer.put(f"k{rng.randrange(10_000):04d}-{number}", index)
    writer.put("v", _index("t", "other", priority=5))
    writer.put("u", _index("other", "a", priority=5))
    whole = list(store.list("t", "a"))
    for limit in (1, 3, 7, 40, 100):
        walked: list[StoredDocument] = []
        after: CandidateCursor | None = None
        for _ in range(len(whole) // limit + 1):  # a page more than the walk needs
            page = list(store.list_page("t", "a", limit, after))
            _expect(len(page) <= limit, f"a list_page of limit {limit} held {len(page)}")
            walked.extend(page)
            if len(page) < limit:
                break
            ended = page[-1]
            after = CandidateCursor(ended.index.priority, ended.index.created_at, ended.key)
        _equal(_keys(walked), _keys(whole), f"list_page walked by {limit}, against list")
        _equal(walked, whole, f"list_page walked by {limit}: the latest versions")
    end = CandidateCursor(whole[-1].index.priority, whole[-1].index.created_at, whole[-1].key)
    _equal(list(store.list_page("t", "a", 5, end)), [], "list_page after the last")
    _equal(list(store.list_page("nobody", "a", 5)), [], "list_page of a tenant with no work")


def _next_instants_are_the_earliest_after_an_instant(store: Store) -> None:
    if not isinstance(store, DueInstants):
        return
    _equal(store.next_instants(0), NextInstants(), "next_instants of an empty store")
    writer = _Writer(store)
    writer.put("k1", _index(eligible_at=500))
    writer.put("k2", _index(eligible_at=300))
    writer.put("k3", _index(state="CLAIMED", lease_expires_at=900, next_deadline_at=2_000))
    writer.put("k4", _index(state="CLAIMED", lease_expires_at=700))
    writer.put("k5", _index("t2", state="CLAIMED", lease_expires_at=400, next_deadline_at=450))
    writer.put("k6", _index(application="a2", eligible_at=100))
    _equal(
        store.next_instants(0),
        NextInstants(eligible_at=100, lease_expires_at=400, deadline_at=450),
        "next_instants over every scope",
    )
    _equal(
        store.next_instants(300, "t", "a"),
        NextInstants(eligible_at=500, lease_expires_at=700, deadline_at=2_000),
        "next_instants strictly after 300 in one scope",
    )
    _equal(store.next_instants(0, "t2").eligible_at, None, "next_instants of a tenant")
    _equal(
        store.next_instants(2_000),
        NextInstants(),
        "next_instants after everything",
    )


def _a_work_signal_wakes_on_a_write_that_makes_work_claimable(store: Store) -> None:
    if not isinstance(store, WakeUps):
        return
    signal = store.work_signal("t", "a")
    try:
        started = time.monotonic()
        _expect(not signal.wait(0.05), "a work signal woke with nothing written")
        _expect(time.monotonic() - started >= 0.04, "a work signal's wait ended early")
        writer = _Writer(store)
        writer.put("k1", _index(eligible_at=0))
        _expect(signal.wait(5.0), "a READY write did not wake the work signal of its scope")
    finally:
        signal.close()


# -- batches (`BatchStore`) ---------------------------------------------------------------


def _batch(store: Store) -> BatchStore | None:
    return store if isinstance(store, BatchStore) else None


def _write_of(
    key: str,
    index: IndexFields,
    expected_version: int | None,
    step: int,
    **audit_fields: Any,
) -> Write:
    """A batch write of `key` at `step`, its document and audit record named after both."""
    return Write(
        key=key,
        document=_text(key, step),
        index=index,
        expected_version=expected_version,
        audit=_audit(key, index, step, **audit_fields),
    )


def _committed(outcome: WriteOutcome, what: str) -> int:
    _expect(isinstance(outcome, int), f"{what}: expected a new version, got {outcome!r}")
    return int(outcome) if isinstance(outcome, int) else 0


def _conflicted(outcome: WriteOutcome, what: str) -> None:
    _expect(
        isinstance(outcome, StoreConflict),
        f"{what}: expected a StoreConflict outcome, got {outcome!r}",
    )


def _write_many_answers_each_outcome_in_order(store: Store) -> None:
    batch = _batch(store)
    if batch is None:
        return
    _equal(batch.write_many([]), [], "write_many of no writes")
    writer = _Writer(store)
    writer.put("k2", _index(created_at=2))
    writer.put("k2", _index(created_at=2))
    writes = [
        _write_of("k1", _index(created_at=1, eligible_at=0), None, 10),
        _write_of("k2", _index(state="CLAIMED", created_at=2, lease_expires_at=50), 2, 11),
        _write_of("k3", _index(created_at=3, result_id="r3"), None, 12),
    ]
    _equal(batch.write_many(writes), [1, 3, 1], "outcomes of a batch, in order")
    for write, version in zip(writes, (1, 3, 1), strict=True):
        _equal(
            store.read(write.key),
            StoredDocument(write.key, version, write.document, write.index),
            f"{write.key} after the batch",
        )
    _equal(store.find_result("r3"), "k3", "a result id written by a batch")
    _equal(_keys(store.claim_candidates("t", "a", 0, 10)), ["k1"], "candidates after a batch")
    _equal(list(store.expired_leases(50, 10)), ["k2"], "leases after a batch")


def _write_many_conflict_leaves_the_others_committed(store: Store) -> None:
    batch = _batch(store)
    if batch is None:
        return
    writer = _Writer(store)
    writer.put("old", _index(created_at=1))
    writer.put("stale", _index(created_at=2))
    writer.put("stale", _index(created_at=2))
    before = {doc.key: doc for doc in store.scan()}
    records = len(store.audit_log())
    writes = [
        _write_of("new1", _index(created_at=3), None, 20),
        _write_of("old", _index(created_at=9, eligible_at=0), None, 21),
        _write_of("stale", _index(created_at=9, eligible_at=0), 1, 22),
        _write_of("missing", _index(created_at=9), 4, 23),
        _write_of("new2", _index(created_at=4), None, 24),
    ]
    outcomes = batch.write_many(writes)
    _equal(len(outcomes), len(writes), "number of outcomes")
    _committed(outcomes[0], "the first write of the batch")
    _conflicted(outcomes[1], "a create of an existing key in a batch")
    _conflicted(outcomes[2], "a stale expected version in a batch")
    _conflicted(outcomes[3], "an expected version of a missing key in a batch")
    _committed(outcomes[4], "the write after the conflicts")
    _equal(store.read("old"), before["old"], "a key whose batch create conflicted")
    _equal(store.read("stale"), before["stale"], "a key whose batch update conflicted")
    _equal(store.read("missing"), None, "a missing key whose batch update conflicted")
    _equal(_keys(store.claim_candidates("t", "a", 0, 10)), [], "candidates of conflicted writes")
    log = store.audit_log()
    _equal(
        [record.transaction_id for record in log[records:]],
        [writes[0].audit.transaction_id, writes[4].audit.transaction_id],
        "audit records of a batch with conflicts (the committed writes' only)",
    )


def _write_many_refuses_a_key_written_twice(store: Store) -> None:
    batch = _batch(store)
    if batch is None:
        return
    _Writer(store).put("k", _index())
    before = _snapshot(store, ["a", "b"])
    writes = [
        _write_of("a", _index(), None, 1),
        _write_of("k", _index(state="DONE"), 1, 2),
        _write_of("k", _index(state="FAILED"), 1, 3),
    ]
    try:
        batch.write_many(writes)
    except ValueError:
        _unchanged(store, before, "a batch writing one key twice", ["a", "b"])
        return
    raise AssertionError("a batch writing one key twice was accepted (expected ValueError)")


def _write_many_result_id_clash_is_a_conflict_of_its_write(store: Store) -> None:
    batch = _batch(store)
    if batch is None:
        return
    writer = _Writer(store)
    writer.put("owner", _index(state="DONE", result_id="r"))
    writer.put("other", _index())
    records = len(store.audit_log())
    writes = [
        _write_of("a", _index(), None, 1),
        _write_of("other", _index(state="DONE", result_id="r"), 1, 2),
        _write_of("b", _index(result_id="rb"), None, 3),
        _write_of("c", _index(state="DONE", result_id="r"), None, 4),
        _write_of("d", _index(), None, 5),
    ]
    outcomes = batch.write_many(writes)
    _equal(
        [isinstance(outcome, int) for outcome in outcomes],
        [True, False, True, False, True],
        "which writes of a batch with result id clashes committed",
    )
    _conflicted(outcomes[1], "an update taking another key's result id")
    _conflicted(outcomes[3], "a create taking another key's result id")
    _equal(store.find_result("r"), "owner", "the result id's owner after the clashes")
    _equal(store.find_result("rb"), "b", "a result id written beside the clashes")
    other = store.read("other")
    _equal(None if other is None else other.version, 1, "version of the clashing update's key")
    _equal(store.read("c"), None, "the clashing create's key")
    _equal(
        [record.key for record in store.audit_log()[records:]],
        ["a", "b", "d"],
        "audit records of a batch with result id clashes",
    )


def _write_many_audits_like_single_writes(store: Store) -> None:
    batch = _batch(store)
    if batch is None:
        return
    writer = _Writer(store)
    writer.put("k0", _index())
    writer.put("k1", _index())
    first = list(store.audit_log())
    writes = [
        _write_of("k1", _index(state="CLAIMED"), 1, 1, worker="w", request_id="q1"),
        _write_of("k2", _index(), None, 2, request_id="q2"),
        _write_of("k0", _index(state="DONE"), 1, 3, result="ok", fencing_token=7),
    ]
    versions = [_committed(outcome, "a batch write") for outcome in batch.write_many(writes)]
    _equal(versions, [2, 1, 2], "versions of a batch")
    log = list(store.audit_log())
    added = log[len(first) :]
    _equal(log[: len(first)], first, "audit records before the batch")
    _equal(
        [replace(record, sequence=0) for record in added],
        [
            replace(write.audit, version=version)
            for write, version in zip(writes, versions, strict=True)
        ],
        "the batch's audit records (versions filled in, in batch order)",
    )
    sequences = [record.sequence for record in log]
    _expect(
        all(a < b for a, b in pairwise(sequences)),
        f"audit sequences do not increase through a batch: {sequences}",
    )
    _equal(store.find_request("q2"), added[1], "find_request of a batch write")
    writer.put("k3", _index())
    _expect(
        store.audit_log()[-1].sequence > added[-1].sequence,
        "a write after a batch is numbered after it",
    )


def _write_many_round_trips_text_exactly(store: Store) -> None:
    batch = _batch(store)
    if batch is None:
        return
    quoted = 'naïve ☃ 𝄞 "quoted" \\ back\nline\ttab'
    writes = [
        Write(
            key="ünïcødé-キー \"'\\",
            document=json.dumps({"text": quoted, "n": [1, 2.5, None]}),
            index=_index("tenant-é", "app/ß", state="RUNNING", priority=-(2**31), created_at=_BIG),
            expected_version=None,
            audit=replace(
                _audit("ünïcødé-キー \"'\\", _index("tenant-é", "app/ß")),
                actor=quoted,
                worker="worker ☃\n",
                attempt='attempt "1"',
                result="result \\ ☃",
                fencing_token=2**62,
                request_id="request ☃",
                at=_BIG,
            ),
        ),
        Write(
            key="every-field",
            document=json.dumps({"big": "x" * 100_000, "quote": '"' * 50}),
            index=_every_field_index(),
            expected_version=None,
            audit=_audit("every-field", _index(), 2),
        ),
    ]
    records = len(store.audit_log())
    _equal(batch.write_many(writes), [1, 1], "outcomes of a batch of unusual text")
    for write in writes:
        _equal(
            store.read(write.key),
            StoredDocument(write.key, 1, write.document, write.index),
            f"read of {write.key!r} written by a batch",
        )
    _equal(
        [replace(record, sequence=0) for record in store.audit_log()[records:]],
        [replace(write.audit, version=1) for write in writes],
        "the audit records of a batch of unusual text",
    )


def _read_many_answers_the_keys_present(store: Store) -> None:
    batch = _batch(store)
    if batch is None:
        return
    _equal(batch.read_many([]), {}, "read_many of no keys")
    _equal(batch.read_many(["absent"]), {}, "read_many of a missing key")
    writer = _Writer(store)
    # More keys than one query of a backend that reads 500 at a time names.
    stored = {f"k{n:04d}": writer.put(f"k{n:04d}", _index(created_at=n)) for n in range(620)}
    stored["k0003"] = writer.put("k0003", _index(state="DONE"))
    wanted = [*reversed(stored), "absent", "k0003", "é"]
    _equal(batch.read_many(wanted), stored, "read_many of present, missing and repeated keys")


def _a_batch_wakes_the_work_signal_of_a_scope_it_makes_work_claimable_in(
    store: Store,
) -> None:
    batch = _batch(store)
    if batch is None or not isinstance(store, WakeUps):
        return
    signal = store.work_signal("t", "a")
    try:
        _expect(not signal.wait(0.05), "a work signal woke with nothing written")
        batch.write_many(
            [
                _write_of("busy", _index(state="CLAIMED", lease_expires_at=9), None, 1),
                _write_of("ready", _index(eligible_at=0), None, 2),
            ]
        )
        _expect(signal.wait(5.0), "a READY write of a batch did not wake its scope's signal")
    finally:
        signal.close()


def _ready_documents(store: Store, count: int) -> list[StoredDocument]:
    """`count` READY documents in scope t/a, created in claim order, plus some not claimable."""
    writer = _Writer(store)
    docs = [
        writer.put(f"k{n:03d}", _index(priority=1 - n // 10, created_at=n, eligible_at=0))
        for n in range(count)
    ]
    writer.put("later", _index(eligible_at=_BIG))
    writer.put("elsewhere", _index("u", eligible_at=0))
    writer.put("claimed", _index(state="CLAIMED", lease_expires_at=10))
    return sorted(docs, key=_order)


def _claim(doc: StoredDocument, worker: str, step: int = 0) -> Write:
    index = replace(doc.index, state="CLAIMED", eligible_at=None, claim_worker=worker)
    return _write_of(doc.key, index, doc.version, step, worker=worker)


class _Chooser:
    """A `choose` that records each page and claims the first `take` documents of it."""

    def __init__(self, take: int, worker: str = "w") -> None:
        self.take = take
        self.worker = worker
        self.pages: list[list[str]] = []

    def __call__(self, page: Sequence[StoredDocument]) -> Sequence[Write]:
        self.pages.append(_keys(page))
        return [_claim(doc, self.worker) for doc in page[: self.take]]


def _claim_batch_offers_pages_in_claim_order(store: Store) -> None:
    batch = _batch(store)
    if batch is None:
        return
    docs = _ready_documents(store, 30)
    keys = _keys(docs)
    nothing = _Chooser(0)
    _equal(batch.claim_batch("t", "a", 0, 4, nothing), [], "claim_batch choosing nothing")
    _equal(
        nothing.pages,
        [keys[n * 4 : (n + 1) * 4] for n in range(CLAIM_PAGES)],
        f"pages offered when nothing is chosen (at most CLAIM_PAGES={CLAIM_PAGES})",
    )
    one_each = _Chooser(1)
    claimed = batch.claim_batch("t", "a", 0, 3, one_each)
    _equal(
        one_each.pages,
        [keys[0:3], keys[3:6], keys[6:9]],
        "pages offered until `limit` writes are chosen",
    )
    _equal(
        [(write.key, outcome) for write, outcome in claimed],
        [(keys[0], 2), (keys[3], 2), (keys[6], 2)],
        "claims written by claim_batch, with their outcomes",
    )
    for write, _ in claimed:
        _equal(
            store.read(write.key),
            StoredDocument(write.key, 2, write.document, write.index),
            f"{write.key} after claim_batch",
        )
    left = [key for key in keys if key not in {keys[0], keys[3], keys[6]}]
    _equal(_keys(store.claim_candidates("t", "a", 0, 100)), left, "candidates after claims")
    everything = _Chooser(100)
    claimed = batch.claim_batch("t", "a", 0, 5, everything)
    _equal(everything.pages, [left[:5]], "one page when the whole page is chosen")
    _equal(len(claimed), 5, "claims of a whole page")
    _equal(
        [record.worker for record in store.audit_log()[-5:]],
        ["w"] * 5,
        "audit records of claim_batch",
    )


def _claim_batch_stops_at_a_short_page(store: Store) -> None:
    batch = _batch(store)
    if batch is None:
        return
    keys = _keys(_ready_documents(store, 7))
    nothing = _Chooser(0)
    batch.claim_batch("t", "a", 0, 3, nothing)
    _equal(nothing.pages, [keys[0:3], keys[3:6], keys[6:7]], "pages up to a short one")
    exact = _Chooser(0)
    batch.claim_batch("t", "a", 0, 7, exact)
    _equal(exact.pages, [keys], "a full last page, then no empty page offered")
    empty = _Chooser(0)
    _equal(batch.claim_batch("t", "b", 0, 3, empty), [], "claim_batch of a scope with no work")
    _equal(empty.pages, [], "pages offered in a scope with no work")
    _equal(batch.claim_batch("t", "a", 0, 0, empty), [], "claim_batch with limit 0")
    _equal(empty.pages, [], "pages offered with limit 0")


def _claim_batch_writes_each_claim_as_a_compare_and_swap(store: Store) -> None:
    batch = _batch(store)
    if batch is None:
        return
    docs = _ready_documents(store, 4)
    _Writer(store).put("owner", _index(state="DONE", result_id="r"))

    def stale(page: Sequence[StoredDocument]) -> Sequence[Write]:
        taking = _claim(page[3], "w")
        return [
            _claim(page[0], "w"),
            replace(_claim(page[1], "w"), expected_version=page[1].version + 1),
            _claim(page[2], "w"),
            replace(taking, index=replace(taking.index, result_id="r")),
        ]

    claimed = batch.claim_batch("t", "a", 0, 4, stale)
    _committed(claimed[0][1], "the first claim")
    _conflicted(claimed[1][1], "a claim on a version the document does not have")
    _committed(claimed[2][1], "the claim after a conflict")
    _conflicted(claimed[3][1], "a claim taking another key's result id")
    _equal(store.read(docs[1].key), docs[1], "the document of the conflicting claim")
    _equal(store.read(docs[3].key), docs[3], "the document of the claim taking a result id")
    _equal(store.find_result("r"), "owner", "the result id's owner after the claims")
    before = _snapshot(store)

    def twice(page: Sequence[StoredDocument]) -> Sequence[Write]:
        return [_claim(page[0], "w"), _claim(page[0], "x")]

    try:
        batch.claim_batch("t", "a", 0, 3, twice)
    except ValueError:
        _unchanged(store, before, "a claim_batch choosing one key twice", [])
        return
    raise AssertionError("a claim_batch choosing one key twice was accepted (expected ValueError)")


def _concurrent_claim_batches_never_choose_one_document_twice(
    store: Store, reopen: Callable[[Store], Store] | None
) -> None:
    if _batch(store) is None:
        return
    keys = set(_keys(_ready_documents(store, 60)))
    callers = 2
    barrier = threading.Barrier(callers, timeout=_BARRIER_TIMEOUT_S)
    chosen: list[list[str]] = [[] for _ in range(callers)]
    lost: list[str] = []
    errors: list[str] = []

    def claim(number: int) -> None:
        own = store
        try:
            own = store if reopen is None else reopen(store)
            batch = _batch(own)
            if batch is None:
                raise AssertionError("a reopened store does not offer BatchStore")
            worker = f"w{number}"

            def choose(page: Sequence[StoredDocument]) -> Sequence[Write]:
                chosen[number].extend(_keys(page))
                time.sleep(0.002)  # hold the page, so that the callers overlap
                return [_claim(doc, worker) for doc in page]

            barrier.wait()
            while claimed := batch.claim_batch("t", "a", 0, 4, choose):
                lost.extend(w.key for w, outcome in claimed if not isinstance(outcome, int))
        except BaseException as exc:  # noqa: BLE001 - reported below, with the caller
            errors.append(f"caller {number}: {type(exc).__name__}: {exc}")
            barrier.abort()
        finally:
            if own is not store:
                own.close()

    threads = [threading.Thread(target=claim, args=(n,), daemon=True) for n in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(_BARRIER_TIMEOUT_S * 2)
    _expect(not any(t.is_alive() for t in threads), "concurrent claim_batch callers hung")
    _expect(not errors, "concurrent claim_batch callers failed: " + "; ".join(errors))
    shared = set(chosen[0]) & set(chosen[1])
    _expect(not shared, f"documents offered to two claim_batch callers: {sorted(shared)}")
    _equal(lost, [], "claims of concurrent claim_batch callers that conflicted")
    _equal(set(chosen[0]) | set(chosen[1]), keys, "documents claimed by the callers together")
    _equal(_keys(store.claim_candidates("t", "a", 0, 100)), [], "candidates left")


# -- pauses (`Pauses`) -------------------------------------------------------------------


def _pauses(store: Store) -> Pauses | None:
    return store if isinstance(store, Pauses) else None


def _pause_audit(scope: PauseScope, operation: str, step: int) -> AuditRecord:
    return AuditRecord(
        transaction_id=f"tx-{scope.key}-{step}",
        key=scope.key,
        version=0,
        actor="operator",
        operation=operation,
        tenant=scope.tenant,
        application=scope.application or "*",
        at=2_000 + step,
        digest=f"digest-{scope.key}-{step}",
        request_id=f"req-{scope.key}-{step}",
    )


def _pause(pauses: Pauses, scope: PauseScope, step: int, reason: str | None = None) -> bool:
    record = PauseRecord(scope, 2_000 + step, "operator", reason, f"req-{scope.key}-{step}")
    return pauses.set_pause(scope, record, _pause_audit(scope, "pause", step))


def _resume(pauses: Pauses, scope: PauseScope, step: int) -> bool:
    return pauses.set_pause(scope, None, _pause_audit(scope, "resume", step))


def _pauses_are_kept_listed_and_audited(store: Store) -> None:
    pauses = _pauses(store)
    if pauses is None:
        return
    _equal(pauses.paused(), [], "pauses of a new store")
    tenant = PauseScope("t")
    app = PauseScope("t", "a")
    definition = PauseScope("t", "a", "d ☃")
    other = PauseScope("u", "a")
    for step, scope in enumerate((definition, other, tenant, app), start=1):
        _expect(_pause(pauses, scope, step, reason=f"why {step}"), f"pausing {scope.key}")
    records = {
        scope.key: PauseRecord(
            scope, 2_000 + step, "operator", f"why {step}", f"req-{scope.key}-{step}"
        )
        for step, scope in enumerate((definition, other, tenant, app), start=1)
    }
    _equal(pauses.paused(), [records[key] for key in sorted(records)], "the pauses in force")
    _equal(
        pauses.paused("t"),
        [records[key] for key in sorted(records) if key.startswith("pause/t/")],
        "the pauses of one tenant",
    )
    _equal(pauses.paused("nobody"), [], "the pauses of a tenant with none")
    before = _snapshot(store)
    _expect(not _pause(pauses, app, 9, reason="again"), "pausing a paused scope answered True")
    _unchanged(store, before, "pausing a paused scope", ())
    _equal(
        pauses.paused(),
        [records[key] for key in sorted(records)],
        "the pauses in force after pausing a paused scope (the first pause kept)",
    )
    _expect(_resume(pauses, app, 10), "resuming a paused scope answered False")
    after = _snapshot(store)
    _expect(not _resume(pauses, app, 11), "resuming a scope not paused answered True")
    _unchanged(store, after, "resuming a scope not paused", ())
    _expect(_pause(pauses, app, 12), "pausing a resumed scope")
    _expect(_resume(pauses, app, 13), "resuming it again")
    _equal(
        [record.scope for record in pauses.paused()],
        sorted((definition, tenant, other), key=lambda scope: scope.key),
        "the pauses in force after resuming one",
    )
    log = [record for record in store.audit_log() if record.key == app.key]
    _equal(
        [(record.operation, record.version, record.transaction_id) for record in log],
        [
            ("pause", 1, f"tx-{app.key}-4"),
            ("resume", 2, f"tx-{app.key}-10"),
            ("pause", 3, f"tx-{app.key}-12"),
            ("resume", 4, f"tx-{app.key}-13"),
        ],
        "audit records of a scope's pauses and resumes (versions counting them)",
    )
    _equal(
        replace(log[0], sequence=0),
        replace(_pause_audit(app, "pause", 4), version=1),
        "the audit record of a pause, as given",
    )
    _equal(len(store.audit_log()), 7, "audit records of 5 pauses and 2 resumes")


def _paused_readies(store: Store) -> dict[str, list[str]]:
    """READY documents of definitions d1, d2 and none in t/a, and in t/b and u/a; keys by scope."""
    writer = _Writer(store)
    made: dict[str, list[str]] = {"t/a": [], "t/b": [], "u/a": []}
    for number in range(12):
        definition = ("d1", "d2", None)[number % 3]
        key = f"k{number:02d}-{definition}"
        writer.put(key, _index(created_at=number, eligible_at=0, definition=definition))
        made["t/a"].append(key)
    for tenant, application in (("t", "b"), ("u", "a")):
        for number in range(3):
            key = f"{tenant}{application}{number}"
            writer.put(
                key, _index(tenant, application, created_at=number, eligible_at=0, definition="d1")
            )
            made[f"{tenant}/{application}"].append(key)
    return made


def _offered(store: Store, tenant: str, application: str) -> tuple[list[str], list[str]]:
    """The keys `claim_candidates` pages (2 at a time) and `claim_batch` offers (nothing chosen)."""
    paged: list[str] = []
    after: CandidateCursor | None = None
    while page := store.claim_candidates(tenant, application, 0, 2, after):
        paged += _keys(page)
        last = page[-1]
        after = CandidateCursor(last.index.priority, last.index.created_at, last.key)
    batch = _batch(store)
    if batch is None:
        return paged, paged
    chooser = _Chooser(0)
    batch.claim_batch(tenant, application, 0, 100, chooser)
    return paged, [key for page in chooser.pages for key in page]


def _claims_leave_out_paused_scopes_at_each_level(store: Store) -> None:
    pauses = _pauses(store)
    if pauses is None:
        return
    made = _paused_readies(store)
    everything = {scope: (keys, keys) for scope, keys in made.items()}

    def offered() -> dict[str, tuple[list[str], list[str]]]:
        return {scope: _offered(store, *scope.split("/")) for scope in made}

    _equal(offered(), everything, "candidates with nothing paused")
    not_d1 = [key for key in made["t/a"] if not key.endswith("-d1")]
    levels = (
        (PauseScope("t"), {"t/a": [], "t/b": [], "u/a": made["u/a"]}),
        (PauseScope("t", "a"), {"t/a": [], "t/b": made["t/b"], "u/a": made["u/a"]}),
        (PauseScope("t", "a", "d1"), {"t/a": not_d1, "t/b": made["t/b"], "u/a": made["u/a"]}),
        (PauseScope("u", "b"), {"t/a": made["t/a"], "t/b": made["t/b"], "u/a": made["u/a"]}),
        (PauseScope("t", "b", "d2"), {"t/a": made["t/a"], "t/b": made["t/b"], "u/a": made["u/a"]}),
    )
    for step, (scope, expected) in enumerate(levels, start=1):
        _expect(_pause(pauses, scope, step), f"pausing {scope.key}")
        _equal(
            offered(),
            {name: (keys, keys) for name, keys in expected.items()},
            f"candidates (claim_candidates, claim_batch) while {scope.key} is paused",
        )
        _expect(_resume(pauses, scope, step), f"resuming {scope.key}")
        _equal(offered(), everything, f"candidates after {scope.key} was resumed")
    _pause(pauses, PauseScope("t", "a", "d1"), 10)
    _pause(pauses, PauseScope("t", "a", "d2"), 11)
    only_none = [key for key in made["t/a"] if key.endswith("-None")]
    _equal(
        offered()["t/a"],
        (only_none, only_none),
        "candidates of t/a while two of its definitions are paused",
    )


def _a_resume_wakes_the_work_signal_of_the_scopes_it_frees(store: Store) -> None:
    pauses = _pauses(store)
    if pauses is None or not isinstance(store, WakeUps):
        return
    _Writer(store).put("k", _index(eligible_at=0, definition="d"))
    for step, scope in enumerate((PauseScope("t"), PauseScope("t", "a", "d")), start=1):
        _pause(pauses, scope, step)
        signal = store.work_signal("t", "a")
        try:
            _expect(not signal.wait(0.05), "a work signal woke with nothing written")
            _resume(pauses, scope, step)
            _expect(signal.wait(5.0), f"resuming {scope.key} did not wake the signal of t/a")
        finally:
            signal.close()


# -- purges (`Purges`) --------------------------------------------------------------------


def _purges(store: Store) -> Purges | None:
    return store if isinstance(store, Purges) else None


def _purge_audit(key: str, step: int) -> AuditRecord:
    return replace(_audit(key, _index(), step), operation="purge", actor="retention")


def _purgeable_pages_documents_in_the_given_states_by_key(store: Store) -> None:
    purges = _purges(store)
    if purges is None:
        return
    writer = _Writer(store)
    states = {"a": "DONE", "b": "READY", "c": "FAILED", "d": "DONE", "é": "DONE", "e": "CLAIMED"}
    stored = {key: writer.put(key, _index(state=state)) for key, state in states.items()}
    terminal = ["a", "c", "d", "é"]
    _equal(
        _keys(purges.purgeable(["DONE", "FAILED"], None, 100)),
        terminal,
        "purgeable documents, by key",
    )
    pages: list[str] = []
    after: str | None = None
    while page := purges.purgeable(["FAILED", "DONE"], after, 1):
        _equal(len(page), 1, "a page of purgeable documents")
        pages += _keys(page)
        after = page[-1].key
    _equal(pages, terminal, "purgeable documents paged one at a time")
    _equal(list(purges.purgeable(["DONE"], "a", 100)), [stored["d"], stored["é"]], "after 'a'")
    _equal(list(purges.purgeable(["DONE"], None, 0)), [], "purgeable with limit 0")
    _equal(list(purges.purgeable([], None, 100)), [], "purgeable of no states")
    _equal(list(purges.purgeable(["GONE"], None, 100)), [], "purgeable of a state no one has")


def _a_purge_is_a_compare_and_swap_with_its_audit_record(store: Store) -> None:
    purges = _purges(store)
    if purges is None:
        return
    writer = _Writer(store)
    writer.put("k", _index(eligible_at=0))
    writer.put("k", _index(state="DONE", lease_expires_at=5, next_deadline_at=5))
    writer.put("other", _index(eligible_at=0))
    before = _snapshot(store, ["k"])
    for stale in (1, 3):
        _expect(
            not purges.purge("k", stale, _purge_audit("k", 9)),
            f"a purge expecting version {stale} of a key at version 2 answered True",
        )
        _unchanged(store, before, "a purge on a stale version", ["k"])
    _expect(not purges.purge("absent", 1, _purge_audit("absent", 9)), "a purge of a missing key")
    _unchanged(store, before, "a purge of a missing key", ["k"])
    records = len(store.audit_log())
    _expect(purges.purge("k", 2, _purge_audit("k", 10)), "a purge on the current version")
    _equal(store.read("k"), None, "a purged key")
    _equal(_keys(store.scan()), ["other"], "documents after a purge")
    _equal(_keys(store.claim_candidates("t", "a", 0, 10)), ["other"], "candidates after a purge")
    _equal(list(store.expired_leases(_BIG, 10)), [], "leases after a purge")
    _equal(list(store.deadlines_due(_BIG, 10)), [], "deadlines after a purge")
    log = store.audit_log()
    _equal(len(log), records + 1, "audit records added by a purge")
    _equal(
        replace(log[-1], sequence=0),
        replace(_purge_audit("k", 10), version=3),
        "the audit record of a purge (its version the deleted one + 1)",
    )
    after = _snapshot(store, ["k"])
    _expect(not purges.purge("k", 2, _purge_audit("k", 11)), "purging a purged key again")
    _unchanged(store, after, "purging a purged key again", ["k"])


def _a_key_created_again_after_a_purge_continues_its_versions(store: Store) -> None:
    purges = _purges(store)
    if purges is None:
        return
    _expect(
        isinstance(store, Tombstones),
        "a store that purges says each purged key's tombstone (`Tombstones`): a key purged"
        " before is created again only by a write naming it",
    )
    assert isinstance(store, Tombstones)
    writer = _Writer(store)
    writer.put("k", _index())
    writer.put("k", _index(state="DONE"))
    _equal(store.tombstone("k"), None, "the tombstone of a key never purged")
    _expect(purges.purge("k", 2, _purge_audit("k", 1)), "a purge of k at version 2")
    _equal(store.tombstone("k"), 3, "the tombstone of a key purged at version 2")
    before = _snapshot(store, ["k"])

    def create(expected: int | None) -> Callable[[], object]:
        return lambda: store.write("k", "{}", _index(), expected, _audit("k", _index(), 20))

    for expected in (None, 2, 4):
        # Unaware of the purge (None), or naming a version it never had.
        _conflicts(
            f"a create of a purged key expecting {expected} (its tombstone is 3)", create(expected)
        )
    _unchanged(store, before, "creates of a purged key not naming its tombstone", ["k"])
    _equal(writer.put("k", _index(eligible_at=0)).version, 4, "a write creating a purged key")
    _equal(store.tombstone("k"), 3, "the tombstone of a purged key created again")
    _expect(purges.purge("k", 4, _purge_audit("k", 2)), "a purge of k at version 4")
    _equal(store.tombstone("k"), 5, "the tombstone of a key purged twice")
    _equal(store.tombstone("never"), None, "the tombstone of a key never written")
    batch = _batch(store)
    if batch is not None:
        unaware = batch.write_many([_write_of("k", _index(eligible_at=0), None, 29)])
        _conflicted(unaware[0], "a batch's create of a purged key expecting None")
        writes = [
            _write_of("k", _index(eligible_at=0), 5, 30),
            _write_of("fresh", _index(), None, 31),
        ]
        _equal(batch.write_many(writes), [6, 1], "a batch creating a purged key and a new one")
        _equal(
            store.read("k"),
            StoredDocument("k", 6, writes[0].document, writes[0].index),
            "a purged key created again by a batch",
        )
    else:
        writer.put("k", _index(eligible_at=0))
    _equal(
        [record.version for record in store.audit_log() if record.key == "k"],
        [1, 2, 3, 4, 5, 6],
        "the versions of a key's audit records across two purges (none repeated)",
    )
    _conflicts(
        "a create of a key created again after its purge",
        lambda: store.write("k", "{}", _index(), None, _audit("k", _index(), 40)),
    )


def _a_purge_frees_the_result_id(store: Store) -> None:
    purges = _purges(store)
    if purges is None:
        return
    writer = _Writer(store)
    done = writer.put("k", _index(state="DONE", result_id="r"))
    _expect(
        purges.purge("k", done.version, _purge_audit("k", 1)), "a purge of a document with a result"
    )
    _equal(store.find_result("r"), None, "a purged document's result id")
    _equal(
        writer.put("other", _index(state="DONE", result_id="r")).version, 1, "another key taking it"
    )
    _equal(store.find_result("r"), "other", "the result id's new owner")


# -- running the checks ----------------------------------------------------------------

# -- concurrency limits (`IndexFields.concurrency_limit`) -----------------------------------


def _held(key: str = "c", limit: int | None = 2, worker: str = "w") -> IndexFields:
    """A document of concurrency key `key` that holds a claim."""
    return _index(
        state="CLAIMED", claim_worker=worker, concurrency_key=key, concurrency_limit=limit
    )


def _queued(key: str | None = "c", limit: int | None = 2) -> IndexFields:
    """A READY document of concurrency key `key`, holding no claim."""
    return _index(eligible_at=0, concurrency_key=key, concurrency_limit=limit)


def _a_claim_past_its_keys_limit_is_refused_and_changes_nothing(store: Store) -> None:
    writer = _Writer(store)
    for key in ("k1", "k2", "k3"):
        writer.put(key, _queued())
    writer.put("k1", _held())
    writer.put("k2", _held())
    held = store.read("k1")
    _equal(None if held is None else held.index, _held(), "a holder's index fields read back")
    before = _snapshot(store, ["k3"])
    doc = store.read("k3")
    _expect(doc is not None, "k3 was written")
    assert doc is not None
    refused = False
    try:
        store.write("k3", _text("k3", 99), _held(), doc.version, _audit("k3", _held(), 99))
    except StoreLimited:
        refused = True
    _expect(refused, "a claim past its key's limit is refused with StoreLimited")
    _unchanged(store, before, "a claim refused for its key's limit", ["k3"])
    # A holder's own writes go on, even under a lower limit; other keys and no key are free.
    writer.put("k1", _held(limit=1))
    writer.put("o1", _held(key="other"))
    writer.put("n1", _index(state="CLAIMED", claim_worker="w"))
    # A released claim frees a place.
    writer.put("k1", _index(state="SUCCEEDED", concurrency_key="c", concurrency_limit=2))
    writer.put("k3", _held())
    _equal(
        sorted(
            d.key for d in store.scan() if d.index.concurrency_key == "c" and d.index.claim_worker
        ),
        ["k2", "k3"],
        "the key's holders after a release and a claim",
    )
    batch = _batch(store)
    if batch is None:
        return
    for key in ("k4", "k5"):
        writer.put(key, _queued())
    docs = batch.read_many(["k4", "k5"])
    outcomes = batch.write_many(
        [_write_of(key, _held(limit=3), docs[key].version, 100 + n) for n, key in enumerate(docs)]
    )
    _committed(outcomes[0], "write_many: the first claim under the limit")
    _expect(
        isinstance(outcomes[1], StoreLimited),
        f"write_many: the claim past the limit is StoreLimited, got {outcomes[1]!r}",
    )


def _concurrent_claims_of_a_key_never_pass_its_limit(store: Store) -> None:
    writer = _Writer(store)
    keys = [f"k{number}" for number in range(_THREADS)]
    for key in keys:
        writer.put(key, _queued())
    versions = {key: doc.version for key in keys if (doc := store.read(key)) is not None}

    def race(number: int, barrier: threading.Barrier) -> bool:
        key = keys[number]
        index = _held(worker=f"w{number}")
        barrier.wait()
        try:
            store.write(key, _text(key, 50), index, versions[key], _audit(key, index, 50 + number))
        except StoreLimited:
            return False
        return True

    won = _race(store, race)
    _equal(won.count(True), 2, f"claims committed by {_THREADS} racing claimers of a key limit 2")
    holders = [d.key for d in store.scan() if d.index.claim_worker is not None]
    _equal(len(holders), 2, "documents holding a claim after the race")


def _rated_claim(key: str = "c", worker: str = "w") -> IndexFields:
    """A claim of concurrency key `key`, rated 2 at once and one more per 100 ms."""
    return _index(
        state="CLAIMED", claim_worker=worker, concurrency_key=key, rate_every_ms=100, rate_burst=2
    )


def _a_claim_past_its_keys_rate_is_refused_and_changes_nothing(store: Store) -> None:
    writer = _Writer(store)
    for key in ("k1", "k2", "k3", "k4"):
        writer.put(key, _index(eligible_at=0, concurrency_key="c", rate_every_ms=100, rate_burst=2))
    versions = {key: doc.version for key in ("k1", "k2", "k3", "k4") if (doc := store.read(key))}
    for key in ("k1", "k2"):
        store.write(
            key, _text(key, 50), _rated_claim(), versions[key], _audit(key, _rated_claim(), 50)
        )
    before = _snapshot(store, ["k3"])
    refused: StoreRateLimited | None = None
    try:
        # At the same instant as the two claims: the burst of two is spent.
        store.write(
            "k3", _text("k3", 50), _rated_claim(), versions["k3"], _audit("k3", _rated_claim(), 50)
        )
    except StoreRateLimited as exc:
        refused = exc
    _expect(refused is not None, "a claim past its key's rate is refused with StoreRateLimited")
    _equal(refused.retry_at if refused else None, 1_150, "when the refused claim's token is back")
    _unchanged(store, before, "a claim refused for its key's rate", ["k3"])
    stale: StoreConflict | None = None
    try:
        # Expecting a version that is not the committed one: a conflict, not the rate.
        store.write(
            "k3",
            _text("k3", 50),
            _rated_claim(),
            versions["k3"] + 5,
            _audit("k3", _rated_claim(), 50),
        )
    except StoreConflict as exc:
        stale = exc
    _expect(
        stale is not None and not isinstance(stale, StoreLimited),
        f"a stale claim of a spent key is a plain conflict, got {stale!r}",
    )
    # A holder's own writes spend no token; another key has its own bucket.
    writer.put("k1", _rated_claim())
    writer.put("o1", _rated_claim(key="other"))
    # One token back 100 ms later: one claim, not two.
    store.write(
        "k3", _text("k3", 150), _rated_claim(), versions["k3"], _audit("k3", _rated_claim(), 150)
    )
    batch = _batch(store)
    if batch is None:
        return
    docs = batch.read_many(["k4"])
    outcomes = batch.write_many([_write_of("k4", _rated_claim(), docs["k4"].version, 150)])
    _expect(
        isinstance(outcomes[0], StoreRateLimited),
        f"write_many: a claim past the rate is StoreRateLimited, got {outcomes[0]!r}",
    )
    _committed(
        batch.write_many([_write_of("k4", _rated_claim(), docs["k4"].version, 250)])[0],
        "write_many: a claim once a token is back",
    )


def _concurrent_claims_of_a_key_never_pass_its_rate(store: Store) -> None:
    writer = _Writer(store)
    keys = [f"k{number}" for number in range(_THREADS)]
    queued = _index(eligible_at=0, concurrency_key="c", rate_every_ms=100, rate_burst=2)
    for key in keys:
        writer.put(key, queued)
    versions = {key: doc.version for key in keys if (doc := store.read(key)) is not None}

    def race(number: int, barrier: threading.Barrier) -> bool:
        key = keys[number]
        index = _rated_claim(worker=f"w{number}")
        barrier.wait()
        try:
            # Every claim at one instant: the burst, and not one more.
            store.write(key, _text(key, 60), index, versions[key], _audit(key, index, 60))
        except StoreRateLimited:
            return False
        return True

    won = _race(store, race)
    _equal(won.count(True), 2, f"claims committed by {_THREADS} racing claimers of a key rated 2")


_CHECKS: Final[tuple[tuple[str, Callable[[Store], None]], ...]] = (
    ("versions_count_from_one", _versions_count_from_one),
    ("documents_round_trip_exactly", _documents_round_trip_exactly),
    ("require_absent_refuses_an_existing_key", _require_absent_refuses_an_existing_key),
    ("expected_version_must_match", _expected_version_must_match),
    ("a_conflicting_write_changes_nothing", _a_conflicting_write_changes_nothing),
    ("each_write_appends_one_audit_record", _each_write_appends_one_audit_record),
    ("audit_log_pages_by_sequence", _audit_log_pages_by_sequence),
    (
        "audit_log_refuses_a_negative_or_non_integer_bound",
        _audit_log_refuses_a_negative_or_non_integer_bound,
    ),
    ("result_ids_are_unique", _result_ids_are_unique),
    ("held_claims_are_a_workers_claims_in_a_scope", _held_claims_are_a_workers_claims_in_a_scope),
    (
        "find_request_answers_the_first_record_of_a_request",
        _find_request_answers_the_first_record_of_a_request,
    ),
    (
        "claim_candidates_order_by_priority_then_age_then_key",
        _claim_candidates_order_by_priority_then_age_then_key,
    ),
    ("claim_candidates_page_with_a_keyset_cursor", _claim_candidates_page_with_a_keyset_cursor),
    ("claim_candidates_are_only_eligible_documents", _claim_candidates_are_only_eligible_documents),
    (
        "claim_candidates_isolate_tenants_and_applications",
        _claim_candidates_isolate_tenants_and_applications,
    ),
    ("expired_leases_are_due_at_or_before_now", _expired_leases_are_due_at_or_before_now),
    ("deadlines_due_are_due_at_or_before_now", _deadlines_due_are_due_at_or_before_now),
    ("list_returns_a_scope_by_priority_then_age", _list_returns_a_scope_by_priority_then_age),
    ("scan_returns_every_document_by_key", _scan_returns_every_document_by_key),
    ("concurrent_writers_win_once_per_version", _concurrent_writers_win_once_per_version),
    (
        "concurrent_writes_to_distinct_keys_all_commit",
        _concurrent_writes_to_distinct_keys_all_commit,
    ),
    ("a_closed_store_refuses_reads_and_writes", _a_closed_store_refuses_reads_and_writes),
    (
        "next_instants_are_the_earliest_after_an_instant",
        _next_instants_are_the_earliest_after_an_instant,
    ),
    (
        "claimable_scopes_are_the_scopes_with_work_eligible_now",
        _claimable_scopes_are_the_scopes_with_work_eligible_now,
    ),
    ("list_pages_walk_a_scope_in_list_order", _list_pages_walk_a_scope_in_list_order),
    ("audit_of_a_key_is_its_records_of_the_log", _audit_of_a_key_is_its_records_of_the_log),
    ("recent_audit_is_the_end_of_the_log", _recent_audit_is_the_end_of_the_log),
    (
        "a_work_signal_wakes_on_a_write_that_makes_work_claimable",
        _a_work_signal_wakes_on_a_write_that_makes_work_claimable,
    ),
    ("write_many_answers_each_outcome_in_order", _write_many_answers_each_outcome_in_order),
    (
        "write_many_conflict_leaves_the_others_committed",
        _write_many_conflict_leaves_the_others_committed,
    ),
    ("write_many_refuses_a_key_written_twice", _write_many_refuses_a_key_written_twice),
    (
        "write_many_result_id_clash_is_a_conflict_of_its_write",
        _write_many_result_id_clash_is_a_conflict_of_its_write,
    ),
    ("write_many_audits_like_single_writes", _write_many_audits_like_single_writes),
    ("write_many_round_trips_text_exactly", _write_many_round_trips_text_exactly),
    ("read_many_answers_the_keys_present", _read_many_answers_the_keys_present),
    (
        "a_batch_wakes_the_work_signal_of_a_scope_it_makes_work_claimable_in",
        _a_batch_wakes_the_work_signal_of_a_scope_it_makes_work_claimable_in,
    ),
    ("claim_batch_offers_pages_in_claim_order", _claim_batch_offers_pages_in_claim_order),
    ("claim_batch_stops_at_a_short_page", _claim_batch_stops_at_a_short_page),
    (
        "claim_batch_writes_each_claim_as_a_compare_and_swap",
        _claim_batch_writes_each_claim_as_a_compare_and_swap,
    ),
    (
        _CONCURRENT_CLAIMS,
        partial(_concurrent_claim_batches_never_choose_one_document_twice, reopen=None),
    ),
    ("pauses_are_kept_listed_and_audited", _pauses_are_kept_listed_and_audited),
    (
        "claims_leave_out_paused_scopes_at_each_level",
        _claims_leave_out_paused_scopes_at_each_level,
    ),
    (
        "a_resume_wakes_the_work_signal_of_the_scopes_it_frees",
        _a_resume_wakes_the_work_signal_of_the_scopes_it_frees,
    ),
    (
        "purgeable_pages_documents_in_the_given_states_by_key",
        _purgeable_pages_documents_in_the_given_states_by_key,
    ),
    (
        "a_purge_is_a_compare_and_swap_with_its_audit_record",
        _a_purge_is_a_compare_and_swap_with_its_audit_record,
    ),
    (
        "a_key_created_again_after_a_purge_continues_its_versions",
        _a_key_created_again_after_a_purge_continues_its_versions,
    ),
    ("a_purge_frees_the_result_id", _a_purge_frees_the_result_id),
    (
        "a_claim_past_its_keys_limit_is_refused_and_changes_nothing",
        _a_claim_past_its_keys_limit_is_refused_and_changes_nothing,
    ),
    (
        "concurrent_claims_of_a_key_never_pass_its_limit",
        _concurrent_claims_of_a_key_never_pass_its_limit,
    ),
    (
        "a_claim_past_its_keys_rate_is_refused_and_changes_nothing",
        _a_claim_past_its_keys_rate_is_refused_and_changes_nothing,
    ),
    (
        "concurrent_claims_of_a_key_never_pass_its_rate",
        _concurrent_claims_of_a_key_never_pass_its_rate,
    ),
)

CHECK_NAMES: Final[tuple[str, ...]] = tuple(name for name, _ in _CHECKS)
"""The name of every check, in the order `run_store_conformance` runs them."""


class NotAStore(Exception):
    """The factory gave something that is not a store (the message says what it gave)."""


def _what(made: object) -> str:
    """What a factory returned, for its refusal: a class by name, else the value's type."""
    return f"the class {made.__name__}" if isinstance(made, type) else type(made).__name__


def store_from_factory(factory: Callable[[], Any], resources: ExitStack) -> Store:
    """A fresh store from `factory`, closed (and its context exited) with `resources`.

    The factory returns the store, or a context manager that yields it (as the
    stateful suite's factories may): the context is exited after the store is
    closed. Anything else is `NotAStore`, saying "factory returned ..., not a
    store ...".
    """
    made = factory()
    store: Store = (
        resources.enter_context(made) if isinstance(made, AbstractContextManager) else made
    )
    if (
        isinstance(store, type)
        or not callable(getattr(store, "close", None))
        or not callable(getattr(store, "read", None))
    ):
        raise NotAStore(
            f"factory returned {_what(store)}, not a store (nor a context manager that yields one)"
        )
    # Closed first, then the factory's context (if any) is exited: `resources` unwinds
    # in reverse.
    resources.callback(store.close)
    return store


def _close(resources: ExitStack) -> str | None:
    """Close what `store_from_factory` opened; why that failed, if it did."""
    try:
        resources.close()
    except Exception as exc:  # noqa: BLE001 - reported as the check's failure
        return f"closing the store raised {type(exc).__name__}: {exc}"
    return None


def run_store_conformance(
    factory: Callable[[], Store | AbstractContextManager[Store]],
    *,
    checks: Iterable[str] | None = None,
    reopen: Callable[[Store], Store] | None = None,
) -> tuple[str, ...]:
    """Run every check (or the ones named in `checks`) on fresh stores from `factory`.

    `factory` returns a fresh, empty store, or a context manager that yields
    one (as the stateful suite's factories may); the store is closed after
    its check, and then the context exited. A factory that raises or returns
    no store, and a store whose `close` raises, fail the check, naming why.

    `reopen`, when given, opens another store object on the same data as
    the store it is passed (the check closes it): the check of concurrent
    `claim_batch` callers gives each caller its own, as separate processes
    would have. Without it, the callers share the one store.

    Returns the names of the checks that passed. Raises `ConformanceFailure`
    naming each check that failed (an assertion it made, or anything it
    raised), after running them all. An unknown name in `checks` is a
    `WORKLOAD_INVALID` (an `InvalidArgument`, also a `ValueError`).
    """
    selected = CHECK_NAMES if checks is None else tuple(checks)
    unknown = [name for name in selected if name not in CHECK_NAMES]
    if unknown:
        raise bad_argument(
            "checks", f"unknown conformance check(s) {unknown}; known: {list(CHECK_NAMES)}"
        )
    registry = dict(_CHECKS)
    registry[_CONCURRENT_CLAIMS] = partial(
        _concurrent_claim_batches_never_choose_one_document_twice, reopen=reopen
    )
    passed: list[str] = []
    failures: dict[str, str] = {}
    for name in selected:
        with ExitStack() as resources:
            try:
                store = store_from_factory(factory, resources)
            except NotAStore as exc:
                failures[name] = f"the {exc}"
            except Exception as exc:  # noqa: BLE001 - reported as the check's failure
                failures[name] = f"the factory raised {type(exc).__name__}: {exc}"
            if name in failures:
                closed = _close(resources)
                failures[name] = "; ".join(filter(None, (failures[name], closed)))
                continue
            try:
                registry[name](store)
            except AssertionError as exc:
                failures[name] = f"the {exc}"
            except Exception as exc:  # noqa: BLE001 - reported as the check's failure
                failures[name] = f"raised {type(exc).__name__}: {exc}"
            finally:
                closed = _close(resources)
            if closed is not None:
                failures[name] = "; ".join(filter(None, (failures.get(name), closed)))
            elif name not in failures:
                passed.append(name)
    if failures:
        raise ConformanceFailure(failures, passed)
    return tuple(passed)


class StoreConformance:
    """Every conformance check as a pytest test: subclass it and define `make_store`.

        class TestMyStore(StoreConformance):
            def make_store(self) -> Store:
                return MyStore(...)

    The class name must start with `Test` for pytest to collect it.
    """

    def make_store(self) -> Store:
        """A fresh, empty store of the backend under test."""
        raise NotImplementedError("define make_store() to return a fresh, empty store")

    #: Another store object on the same data as the one passed, for the
    #: checks of concurrent callers (see `run_store_conformance`); None
    #: (the default) makes them share one store.
    reopen_store: Callable[[Store], Store] | None = None

    def _check(self, name: str) -> None:
        run_store_conformance(self.make_store, checks=(name,), reopen=self.reopen_store)

    def test_versions_count_from_one(self) -> None:
        """Versions count 1, 2, 3 and a read returns exactly what was written."""
        self._check("versions_count_from_one")

    def test_documents_round_trip_exactly(self) -> None:
        """Text, Unicode, large documents and every index field read back unchanged."""
        self._check("documents_round_trip_exactly")

    def test_require_absent_refuses_an_existing_key(self) -> None:
        """A create of an existing key conflicts and changes nothing."""
        self._check("require_absent_refuses_an_existing_key")

    def test_expected_version_must_match(self) -> None:
        """A stale, future or absent expected version conflicts."""
        self._check("expected_version_must_match")

    def test_a_conflicting_write_changes_nothing(self) -> None:
        """After any conflicting write, every answer of the store is as before."""
        self._check("a_conflicting_write_changes_nothing")

    def test_each_write_appends_one_audit_record(self) -> None:
        """One audit record per committed write, in commit order, version filled in."""
        self._check("each_write_appends_one_audit_record")

    def test_audit_log_pages_by_sequence(self) -> None:
        """`audit_log(after, limit)` pages by sequence."""
        self._check("audit_log_pages_by_sequence")

    def test_audit_log_refuses_a_negative_or_non_integer_bound(self) -> None:
        """A negative, non-integer or too large `after` or `limit` is `WORKLOAD_INVALID`."""
        self._check("audit_log_refuses_a_negative_or_non_integer_bound")

    def test_result_ids_are_unique(self) -> None:
        """A result id belongs to one key at a time."""
        self._check("result_ids_are_unique")

    def test_held_claims_are_a_workers_claims_in_a_scope(self) -> None:
        """`held_claims` answers the documents whose claim a worker holds in one scope."""
        self._check("held_claims_are_a_workers_claims_in_a_scope")

    def test_find_request_answers_the_first_record_of_a_request(self) -> None:
        """`find_request` answers the first audit record a request id was written with."""
        self._check("find_request_answers_the_first_record_of_a_request")

    def test_claim_candidates_order_by_priority_then_age_then_key(self) -> None:
        """Highest priority first, then oldest, then by key."""
        self._check("claim_candidates_order_by_priority_then_age_then_key")

    def test_claim_candidates_page_with_a_keyset_cursor(self) -> None:
        """Pages read with a cursor are the full list, in order."""
        self._check("claim_candidates_page_with_a_keyset_cursor")

    def test_claim_candidates_are_only_eligible_documents(self) -> None:
        """Only documents eligible at or before `now`, as of their latest write."""
        self._check("claim_candidates_are_only_eligible_documents")

    def test_claim_candidates_isolate_tenants_and_applications(self) -> None:
        """A tenant and application see only their own candidates."""
        self._check("claim_candidates_isolate_tenants_and_applications")

    def test_expired_leases_are_due_at_or_before_now(self) -> None:
        """Leases expired at or before `now`, earliest first, filtered by scope."""
        self._check("expired_leases_are_due_at_or_before_now")

    def test_deadlines_due_are_due_at_or_before_now(self) -> None:
        """Deadlines fallen at or before `now`, earliest first, filtered by scope."""
        self._check("deadlines_due_are_due_at_or_before_now")

    def test_list_returns_a_scope_by_priority_then_age(self) -> None:
        """Every document of a scope, whatever its state, by priority then age."""
        self._check("list_returns_a_scope_by_priority_then_age")

    def test_scan_returns_every_document_by_key(self) -> None:
        """Every document, latest version, by key."""
        self._check("scan_returns_every_document_by_key")

    def test_concurrent_writers_win_once_per_version(self) -> None:
        """Threads racing for one version: exactly one wins each."""
        self._check("concurrent_writers_win_once_per_version")

    def test_concurrent_writes_to_distinct_keys_all_commit(self) -> None:
        """Threads writing their own keys all commit, each write audited once."""
        self._check("concurrent_writes_to_distinct_keys_all_commit")

    def test_a_closed_store_refuses_reads_and_writes(self) -> None:
        """Every read and write after `close` is a `StoreFailure`; closing twice is harmless."""
        self._check("a_closed_store_refuses_reads_and_writes")

    def test_next_instants_are_the_earliest_after_an_instant(self) -> None:
        """`next_instants` (when offered) answers the earliest instants strictly after one."""
        self._check("next_instants_are_the_earliest_after_an_instant")

    def test_claimable_scopes_are_the_scopes_with_work_eligible_now(self) -> None:
        """`claimable_scopes` lists each scope with work eligible now once, sorted."""
        self._check("claimable_scopes_are_the_scopes_with_work_eligible_now")

    def test_recent_audit_is_the_end_of_the_log(self) -> None:
        """`audit_tail` and `audit_since` answer the end of the log, refusing negative bounds."""
        self._check("recent_audit_is_the_end_of_the_log")

    def test_audit_of_a_key_is_its_records_of_the_log(self) -> None:
        """`audit_of` answers the records of one key the log holds, in commit order."""
        self._check("audit_of_a_key_is_its_records_of_the_log")

    def test_list_pages_walk_a_scope_in_list_order(self) -> None:
        """`list_page`, walked by pages of several sizes, lists what `list` lists, in its order."""
        self._check("list_pages_walk_a_scope_in_list_order")

    def test_a_work_signal_wakes_on_a_write_that_makes_work_claimable(self) -> None:
        """A work signal (when offered) wakes on a READY write of its scope, not before."""
        self._check("a_work_signal_wakes_on_a_write_that_makes_work_claimable")

    def test_write_many_answers_each_outcome_in_order(self) -> None:
        """A batch's writes commit, each answered with its new version, in order."""
        self._check("write_many_answers_each_outcome_in_order")

    def test_write_many_round_trips_text_exactly(self) -> None:
        """A batch keeps every character of its keys, documents, index fields and audit
        records (quotes, backslashes, control and non-ASCII characters) and the full range
        of their numbers."""
        self._check("write_many_round_trips_text_exactly")

    def test_write_many_conflict_leaves_the_others_committed(self) -> None:
        """A conflict in a batch writes nothing of itself; the others commit."""
        self._check("write_many_conflict_leaves_the_others_committed")

    def test_write_many_refuses_a_key_written_twice(self) -> None:
        """A batch writing one key twice is refused before anything is written."""
        self._check("write_many_refuses_a_key_written_twice")

    def test_write_many_result_id_clash_is_a_conflict_of_its_write(self) -> None:
        """A result id held by another key is the conflict of that write only."""
        self._check("write_many_result_id_clash_is_a_conflict_of_its_write")

    def test_write_many_audits_like_single_writes(self) -> None:
        """A batch's audit records carry versions and sequences as single writes' do."""
        self._check("write_many_audits_like_single_writes")

    def test_read_many_answers_the_keys_present(self) -> None:
        """`read_many` answers the keys present, leaving out missing ones."""
        self._check("read_many_answers_the_keys_present")

    def test_a_batch_wakes_the_work_signal_of_a_scope_it_makes_work_claimable_in(self) -> None:
        """A batch with a READY write (when signals are offered) wakes its scope's signal."""
        self._check("a_batch_wakes_the_work_signal_of_a_scope_it_makes_work_claimable_in")

    def test_claim_batch_offers_pages_in_claim_order(self) -> None:
        """Pages in claim order, until `limit` claims or `CLAIM_PAGES` pages; claims written."""
        self._check("claim_batch_offers_pages_in_claim_order")

    def test_claim_batch_stops_at_a_short_page(self) -> None:
        """No page after a short one, and never an empty page."""
        self._check("claim_batch_stops_at_a_short_page")

    def test_claim_batch_writes_each_claim_as_a_compare_and_swap(self) -> None:
        """A stale claim or a result id clash is its own conflict; a key chosen twice, nothing."""
        self._check("claim_batch_writes_each_claim_as_a_compare_and_swap")

    def test_concurrent_claim_batches_never_choose_one_document_twice(self) -> None:
        """Two concurrent `claim_batch` callers are never offered the same document."""
        self._check("concurrent_claim_batches_never_choose_one_document_twice")

    def test_pauses_are_kept_listed_and_audited(self) -> None:
        """Pauses are kept, listed by scope key, audited; repeating one writes nothing."""
        self._check("pauses_are_kept_listed_and_audited")

    def test_claims_leave_out_paused_scopes_at_each_level(self) -> None:
        """No candidate of a paused tenant, application or definition; a resume restores them."""
        self._check("claims_leave_out_paused_scopes_at_each_level")

    def test_a_resume_wakes_the_work_signal_of_the_scopes_it_frees(self) -> None:
        """Resuming a pause wakes the work signals of the scopes it frees."""
        self._check("a_resume_wakes_the_work_signal_of_the_scopes_it_frees")

    def test_purgeable_pages_documents_in_the_given_states_by_key(self) -> None:
        """`purgeable` pages the documents in the given states by key."""
        self._check("purgeable_pages_documents_in_the_given_states_by_key")

    def test_a_purge_is_a_compare_and_swap_with_its_audit_record(self) -> None:
        """A purge deletes only the expected version, with its audit record."""
        self._check("a_purge_is_a_compare_and_swap_with_its_audit_record")

    def test_a_key_created_again_after_a_purge_continues_its_versions(self) -> None:
        """A purged key is created again, by `write` or `write_many`, only naming its tombstone."""
        self._check("a_key_created_again_after_a_purge_continues_its_versions")

    def test_a_purge_frees_the_result_id(self) -> None:
        """A purged document's result id may be taken by another key."""
        self._check("a_purge_frees_the_result_id")

    def test_a_claim_past_its_keys_limit_is_refused_and_changes_nothing(self) -> None:
        """A claim past its concurrency key's limit is `StoreLimited` and writes nothing."""
        self._check("a_claim_past_its_keys_limit_is_refused_and_changes_nothing")

    def test_concurrent_claims_of_a_key_never_pass_its_limit(self) -> None:
        """Claimers racing in threads on one key never commit more claims than its limit."""
        self._check("concurrent_claims_of_a_key_never_pass_its_limit")

    def test_a_claim_past_its_keys_rate_is_refused_and_changes_nothing(self) -> None:
        """A claim past its concurrency key's rate is `StoreRateLimited` and writes nothing."""
        self._check("a_claim_past_its_keys_rate_is_refused_and_changes_nothing")

    def test_concurrent_claims_of_a_key_never_pass_its_rate(self) -> None:
        """Claimers racing in threads at one instant never commit more claims than the burst."""
        self._check("concurrent_claims_of_a_key_never_pass_its_rate")
