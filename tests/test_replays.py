"""Every worker call is safe to repeat after a lost reply: it answers as the first did.

The store below commits each write and then raises, as a connection that
broke after the server committed would: the caller sees a failure and calls
again with the same arguments. Each such call must end as if it had been made
once: the same state, history, attempts, checkpoints and audit count.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pg import postgres_database
from support import VERIFIER, request
from workwarden.statemachine import (
    Authority,
    CheckpointCommand,
    Claim,
    ClaimCommand,
    WorkloadError,
    errors,
)
from workwarden.statemachine.models import ClaimReply
from workwarden.statemachine.spec import Spec, load_spec_text
from workwarden.storage import (
    AuditRecord,
    ForwardingStore,
    IndexFields,
    SQLiteStore,
    Store,
    StoreFailure,
    StoreOutcomeUnknown,
)
from workwarden.storage.pg_schema import SCHEMA_VERSION as PG_VERSION
from workwarden.storage.postgres import PostgresStore
from workwarden.storage.sqlite_schema import SCHEMA_VERSION as SQLITE_VERSION

CAPS = {"email:send"}
LEASE = 10_000
EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"


class LosesReplies(ForwardingStore):
    """Commits every write, then raises as if the reply had been lost on the way back."""

    def __init__(self, inner: Store, lost: type[StoreFailure] = StoreFailure) -> None:
        super().__init__(inner)
        self.losing = False
        self.lost = lost

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        version = self.inner.write(key, document, index, expected_version, audit)
        if self.losing:
            raise self.lost("the connection broke after the commit")
        return version


def the_record(store: Store, workload_id: str) -> tuple[Any, ...]:
    """What must not change when a call is repeated: the document and the audit count."""
    doc = store.read(workload_id)
    assert doc is not None
    return doc.version, doc.document, len(store.audit_log())


def lost_then_repeated(store: LosesReplies, call: Callable[[], Any]) -> Any:
    """Make `call` once with its reply lost, then again; the second answer."""
    store.losing = True
    with pytest.raises(WorkloadError) as lost:
        call()
    expected = (
        errors.OUTCOME_UNKNOWN if store.lost is StoreOutcomeUnknown else errors.STORAGE_FAILURE
    )
    assert lost.value.code == expected
    store.losing = False
    return call()


def started(store: Store) -> tuple[LosesReplies, Authority, str, Claim]:
    """An authority over a reply-losing `store` and a workload w1 has claimed and started."""
    lossy = LosesReplies(store)
    warden = Authority(lossy, grants=VERIFIER, remember=0)
    workload_id = warden.admit(request(), 10_000).workload.workload_id
    claim = warden.claim(workload_id, "w1", CAPS, 11_000, lease_ms=LEASE)
    warden.start(workload_id, claim.fence, 12_000)
    return lossy, warden, workload_id, claim


def test_a_claim_repeated_by_the_same_worker_answers_the_claim_it_holds(store: Store) -> None:
    lossy = LosesReplies(store)
    warden = Authority(lossy, grants=VERIFIER, remember=0)
    workload_id = warden.admit(request(), 10_000).workload.workload_id
    claim = lost_then_repeated(
        lossy, lambda: warden.claim(workload_id, "w1", CAPS, 11_000, lease_ms=LEASE)
    )
    workload = warden.get(workload_id)
    assert workload.current_claim == claim
    assert (workload.fencing_token, workload.attempt_count, len(workload.attempts)) == (1, 1, 1)
    # Another worker still cannot take it.
    with pytest.raises(WorkloadError) as refused:
        warden.claim(workload_id, "w2", CAPS, 11_100, lease_ms=LEASE)
    assert refused.value.code == errors.NOT_READY


def test_a_repeated_start_answers_the_started_attempt(store: Store) -> None:
    lossy = LosesReplies(store)
    warden = Authority(lossy, grants=VERIFIER, remember=0)
    workload_id = warden.admit(request(), 10_000).workload.workload_id
    claim = warden.claim(workload_id, "w1", CAPS, 11_000, lease_ms=LEASE)
    attempt = lost_then_repeated(lossy, lambda: warden.start(workload_id, claim.fence, 12_000))
    assert attempt.started_at == 12_000
    before = the_record(store, workload_id)
    assert warden.start(workload_id, claim.fence, 12_100) == attempt
    assert the_record(store, workload_id) == before
    assert [e.to for e in warden.get(workload_id).execution_history] == [
        "READY",
        "CLAIMED",
        "RUNNING",
    ]


def test_a_repeated_checkpoint_with_its_sequence_is_recorded_once(store: Store) -> None:
    lossy, warden, workload_id, claim = started(store)
    checkpoint = lost_then_repeated(
        lossy,
        lambda: warden.checkpoint(workload_id, claim.fence, {"rendered": True}, 13_000, sequence=1),
    )
    assert checkpoint.sequence == 1
    assert len(warden.get(workload_id).checkpoints) == 1
    other = CheckpointCommand(
        workload_id=workload_id, fence=claim.fence, state={"rendered": False}, sequence=1
    )
    with pytest.raises(WorkloadError) as refused:
        warden.execute(other, 13_100)
    assert refused.value.code == errors.CONFLICT
    assert len(warden.get(workload_id).checkpoints) == 1


def test_a_repeated_failure_report_answers_the_decision_once(store: Store) -> None:
    lossy, warden, workload_id, claim = started(store)
    state = lost_then_repeated(
        lossy, lambda: warden.fail(workload_id, claim.fence, "timeout", "slow", 13_000)
    )
    assert state == "READY"
    workload = warden.get(workload_id)
    assert workload.retry_count == 1
    assert [a.status for a in workload.attempts] == ["FAILED"]


def test_a_repeated_cancel_confirmation_answers_cancelled(store: Store) -> None:
    lossy, warden, workload_id, claim = started(store)
    warden.cancel(workload_id, "ops", 12_500)
    state = lost_then_repeated(
        lossy, lambda: warden.confirm_cancel(workload_id, claim.fence, 13_000)
    )
    assert state == "CANCELLED"
    assert [e.to for e in warden.get(workload_id).execution_history][-2:] == [
        "CANCELLATION_REQUESTED",
        "CANCELLED",
    ]


def test_a_repeated_completion_answers_the_recorded_result(store: Store) -> None:
    lossy, warden, workload_id, claim = started(store)
    result = lost_then_repeated(
        lossy, lambda: warden.complete(workload_id, claim.fence, "r1", {"ok": True}, 13_000)
    )
    assert result.result_id == "r1"
    assert warden.get(workload_id).state == "SUCCEEDED"


def test_a_claim_whose_lease_ran_out_is_not_answered_as_held(store: Store) -> None:
    warden = Authority(store, grants=VERIFIER)
    workload_id = warden.admit(request(), 10_000).workload.workload_id
    warden.execute(
        ClaimCommand(workload_id=workload_id, worker_id="w1", capabilities=CAPS, lease_ms=100),
        11_000,
    )
    with pytest.raises(WorkloadError) as refused:
        warden.claim(workload_id, "w1", CAPS, 11_100, lease_ms=LEASE)
    assert refused.value.code == errors.NOT_READY


def test_a_write_whose_outcome_is_unknown_says_to_call_again_and_the_repeat_is_safe(
    store: Store,
) -> None:
    lossy = LosesReplies(store, StoreOutcomeUnknown)
    warden = Authority(lossy, grants=VERIFIER, remember=0)
    workload_id = warden.admit(request(), 10_000).workload.workload_id
    claim = warden.claim(workload_id, "w1", CAPS, 11_000, lease_ms=LEASE)
    lossy.losing = True
    with pytest.raises(WorkloadError) as unknown:
        warden.start(workload_id, claim.fence, 12_000)
    assert unknown.value.code == errors.OUTCOME_UNKNOWN
    assert unknown.value.error_class == "retry_later"
    lossy.losing = False
    assert warden.start(workload_id, claim.fence, 12_100).started_at == 12_000
    assert len(warden.get(workload_id).execution_history) == 3


# -- claim requests: claim_next and claim repeated after a lost reply ---------------------------


def two_ready(store: Store) -> tuple[LosesReplies, Authority, str, str]:
    """An authority over a reply-losing `store` and two READY workloads (the first older)."""
    lossy = LosesReplies(store)
    warden = Authority(lossy, grants=VERIFIER, remember=0)
    first = warden.admit(request(idempotency_key="first"), 10_000).workload.workload_id
    second = warden.admit(request(idempotency_key="second"), 10_001).workload.workload_id
    return lossy, warden, first, second


def everything(store: Store) -> tuple[Any, ...]:
    """Every document and the whole audit log: what a replay must leave as it found."""
    return tuple((d.key, d.version, d.document) for d in store.scan()), len(store.audit_log())


def test_claim_next_repeated_after_a_lost_reply_answers_the_claim_it_made(store: Store) -> None:
    request_id = "claim-request-1"
    lossy, warden, first, second = two_ready(store)

    def claim_next() -> ClaimReply | None:
        return warden.claim_next("t", "app", "w1", CAPS, 11_000, LEASE, request_id=request_id)

    lossy.losing = True
    with pytest.raises(WorkloadError):
        claim_next()
    lossy.losing = False
    after_first = everything(store)
    claim = claim_next()

    assert claim is not None
    assert claim.workload_id == first
    assert claim.request_id == request_id
    assert everything(store) == after_first  # the repeat wrote nothing
    assert warden.get(first).current_claim == claim
    assert warden.get(second).state == "READY"
    assert warden.get(second).attempts == []
    # The answer is the claim: its fence starts the attempt.
    assert warden.start(first, claim.fence, 11_500).started_at == 11_500


def test_claim_next_without_a_request_id_always_claims_new_work(store: Store) -> None:
    # A worker may hold several unstarted claims (a batch, several slots): a call
    # without a request id is never taken for a repeat of an earlier one.
    _, warden, first, second = two_ready(store)
    one = warden.claim_next("t", "app", "w1", CAPS, 11_000, LEASE)
    two = warden.claim_next("t", "app", "w1", CAPS, 11_001, LEASE)
    assert one is not None
    assert two is not None
    assert (one.workload_id, two.workload_id) == (first, second)
    assert warden.claim_next("t", "app", "w1", CAPS, 11_002, LEASE) is None
    assert warden.get(first).current_claim == one


def test_a_new_claim_request_id_claims_new_work_while_the_worker_holds_a_claim(
    store: Store,
) -> None:
    _, warden, first, second = two_ready(store)
    one = warden.claim_next("t", "app", "w1", CAPS, 11_000, LEASE, request_id="slot-1")
    two = warden.claim_next("t", "app", "w1", CAPS, 11_001, LEASE, request_id="slot-2")
    assert one is not None
    assert two is not None
    assert (one.workload_id, two.workload_id) == (first, second)
    again = warden.claim_next("t", "app", "w1", CAPS, 11_002, LEASE, request_id="slot-1")
    assert again == one


def test_claim_next_answers_only_claims_of_its_own_worker_and_scope(store: Store) -> None:
    _, warden, first, second = two_ready(store)
    mine = warden.claim_next("t", "app", "w1", CAPS, 11_000, LEASE)
    theirs = warden.claim_next("t", "app", "w2", CAPS, 11_001, LEASE)
    assert mine is not None
    assert theirs is not None
    assert (mine.workload_id, theirs.workload_id) == (first, second)
    assert warden.claim_next("t", "other-app", "w1", CAPS, 11_002, LEASE) is None


def test_a_claim_request_repeated_after_its_attempt_started_is_not_ready(store: Store) -> None:
    _, warden, first, _ = two_ready(store)
    claim = warden.claim_next("t", "app", "w1", CAPS, 11_000, LEASE, request_id="q1")
    assert claim is not None
    warden.start(first, claim.fence, 11_500)
    before = everything(store)
    with pytest.raises(WorkloadError) as by_next:
        warden.claim_next("t", "app", "w1", CAPS, 12_000, LEASE, request_id="q1")
    with pytest.raises(WorkloadError) as by_id:
        warden.claim(first, "w1", CAPS, 12_000, LEASE, request_id="q1")
    assert by_next.value.code == by_id.value.code == errors.NOT_READY
    assert by_next.value.details["request_id"] == "q1"
    assert everything(store) == before
    # Without a request id, a started claim is simply not answered: other work is claimed.
    other = warden.claim_next("t", "app", "w1", CAPS, 12_000, LEASE)
    assert other is not None
    assert other.workload_id != first


def test_a_claim_whose_lease_lapsed_is_not_answered_again(store: Store) -> None:
    _, warden, first, second = two_ready(store)
    claim = warden.claim_next("t", "app", "w1", CAPS, 11_000, 100, request_id="q1")
    assert claim is not None
    assert claim.workload_id == first
    again = warden.claim_next("t", "app", "w1", CAPS, 11_100, LEASE, request_id="q1")
    assert again is not None
    assert again.workload_id == second


def test_a_claim_by_id_with_a_request_id_is_answered_once_and_recorded(store: Store) -> None:
    lossy, warden, first, _ = two_ready(store)
    claim = lost_then_repeated(
        lossy, lambda: warden.claim(first, "w1", CAPS, 11_000, LEASE, request_id="q1")
    )
    assert claim.request_id == "q1"
    workload = warden.get(first)
    assert len(workload.attempts) == 1
    assert workload.execution_history[-1].evidence["request_id"] == "q1"
    # Another request of the same worker for the workload it holds is not this one's replay.
    with pytest.raises(WorkloadError) as refused:
        warden.claim(first, "w1", CAPS, 11_100, LEASE, request_id="q2")
    assert refused.value.code == errors.NOT_READY


def test_a_claim_without_a_request_id_writes_the_document_as_before(store: Store) -> None:
    _, warden, first, _ = two_ready(store)
    warden.claim(first, "w1", CAPS, 11_000, LEASE)
    doc = store.read(first)
    assert doc is not None
    assert "request_id" not in doc.document
    assert [record.request_id for record in store.audit_log()] == [None, None, None]


# -- the claim carries the work -------------------------------------------------------------


def test_a_claim_reply_carries_the_input_and_the_checkpoints_of_earlier_attempts(
    store: Store,
) -> None:
    warden = Authority(store, grants=VERIFIER)
    admitted = warden.admit(request(), 10_000).workload
    workload_id = admitted.workload_id
    first = warden.claim_next("t", "app", "w1", CAPS, 11_000, LEASE)
    assert first is not None
    assert (first.input, first.checkpoints) == (admitted.input, ())
    assert first.attempt_id == warden.get(workload_id).attempts[-1].attempt_id
    warden.start(workload_id, first.fence, 11_100)
    warden.checkpoint(workload_id, first.fence, {"page": 1}, 11_200, sequence=1)
    warden.fail(workload_id, first.fence, "timeout", "slow", 11_300)
    eligible = warden.get(workload_id).next_attempt_at
    assert eligible is not None

    second = warden.claim(workload_id, "w2", CAPS, eligible, LEASE)

    context = warden.execution_context(workload_id, second.fence, eligible)
    assert second.input == context.input == admitted.input
    assert second.checkpoints == context.checkpoints
    assert [c.state for c in second.checkpoints] == [{"page": 1}]
    assert second.attempt_id == context.attempt_id
    assert not hasattr(second, "secret_references")
    # The reply is a copy: changing it changes nothing the authority decides on.
    second.checkpoints[0].state = {"page": 99}
    assert warden.get(workload_id).checkpoints[0].state == {"page": 1}
    # What is stored is the lease alone.
    stored = warden.get(workload_id).current_claim
    assert type(stored) is Claim
    assert stored == second.lease() == second


# -- operator requests ----------------------------------------------------------------------


def running(store: Store) -> tuple[LosesReplies, Authority, str, ClaimReply]:
    lossy = LosesReplies(store)
    warden = Authority(lossy, grants=VERIFIER, remember=0)
    workload_id = warden.admit(request(), 10_000).workload.workload_id
    claim = warden.claim(workload_id, "w1", CAPS, 11_000, lease_ms=LEASE)
    warden.start(workload_id, claim.fence, 12_000)
    return lossy, warden, workload_id, claim


@pytest.mark.parametrize("operation", ["cancel", "timeout"])
def test_an_operator_request_repeated_after_a_lost_reply_is_answered_as_the_first(
    store: Store, operation: str
) -> None:
    lossy, warden, workload_id, _ = running(store)
    call = getattr(warden, operation)
    lossy.losing = True
    with pytest.raises(WorkloadError):
        call(workload_id, "ops", 13_000, request_id="op-1")
    lossy.losing = False
    after_first = everything(store)
    first_state = warden.get(workload_id).state

    assert call(workload_id, "ops", 13_100, request_id="op-1") == first_state
    assert everything(store) == after_first  # no second audit record either
    records = [r for r in store.audit_log() if r.request_id == "op-1"]
    assert [r.operation for r in records] == [operation]


def test_a_repeated_retry_request_is_answered_as_the_first_even_after_the_work_moved_on(
    store: Store,
) -> None:
    lossy, warden, workload_id, claim = running(store)
    warden.fail(workload_id, claim.fence, "validation", "bad input", 13_000)
    assert warden.get(workload_id).state == "DEAD_LETTER"
    state = lost_then_repeated(
        lossy, lambda: warden.retry(workload_id, "ops", 14_000, "fixed", request_id="re-1")
    )
    assert state == "READY"
    warden.claim(workload_id, "w2", CAPS, 14_100, LEASE)
    before = everything(store)
    # The first call answered READY; its repeat answers READY, and re-arms nothing.
    assert warden.retry(workload_id, "ops", 14_200, "fixed", request_id="re-1") == "READY"
    assert everything(store) == before
    assert warden.get(workload_id).state == "CLAIMED"


def test_an_operator_request_id_reused_for_something_else_is_a_conflict(store: Store) -> None:
    _, warden, workload_id, _ = running(store)
    other = warden.admit(request(idempotency_key="other"), 10_500).workload.workload_id
    assert warden.cancel(workload_id, "ops", 13_000, request_id="op-1") == "CANCELLATION_REQUESTED"
    before = everything(store)
    attempts: list[Callable[[], Any]] = [
        lambda: warden.timeout(workload_id, "ops", 13_100, request_id="op-1"),
        lambda: warden.cancel(workload_id, "someone-else", 13_100, request_id="op-1"),
        lambda: warden.cancel(other, "ops", 13_100, request_id="op-1"),
    ]
    for attempt in attempts:
        with pytest.raises(WorkloadError) as refused:
            attempt()
        assert refused.value.code == errors.CONFLICT
        assert refused.value.details["request_id"] == "op-1"
    assert everything(store) == before


def pause_spec() -> Spec:
    """The pause lifecycle, whose move operations name the replay of operator requests."""
    text = (EXAMPLES / "pause.toml").read_text(encoding="utf-8")
    assert text.count('replay = "same_move_request"') == 2
    return load_spec_text(text, "pause.toml")


def test_a_repeated_move_request_is_answered_as_the_first(store: Store) -> None:
    lossy = LosesReplies(store)
    warden = Authority(lossy, grants=VERIFIER, spec=pause_spec(), remember=0)
    workload_id = warden.admit(request(), 10_000).workload.workload_id
    state = lost_then_repeated(
        lossy, lambda: warden.operate(workload_id, "pause", "ops", 11_000, "hold", request_id="p1")
    )
    assert state == "PAUSED"
    before = everything(store)
    assert warden.operate(workload_id, "pause", "ops", 11_100, "hold", request_id="p1") == state
    assert everything(store) == before
    with pytest.raises(WorkloadError) as refused:
        warden.operate(workload_id, "resume", "ops", 11_200, request_id="p1")
    assert refused.value.code == errors.CONFLICT
    assert warden.operate(workload_id, "resume", "ops", 11_300, request_id="p2") == "READY"


# -- stores made before the lookups: schema version 1 is brought to version 2 ----------------


def claimed_by_w1(store: Store) -> tuple[str, ClaimReply]:
    warden = Authority(store, grants=VERIFIER, remember=0)
    workload_id = warden.admit(request(), 10_000).workload.workload_id
    claim = warden.claim(workload_id, "w1", CAPS, 11_000, LEASE, request_id="r1")
    return workload_id, claim


def test_a_version_1_sqlite_file_gains_the_lookups_filled_in_from_its_documents(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v1.db"
    with SQLiteStore(path) as store:
        workload_id, claim = claimed_by_w1(store)
    # What a file of schema version 1 was: neither column, nor their indexes (nor the
    # concurrency index of version 4, over the claim-holder column).
    conn = sqlite3.connect(path)
    conn.executescript(
        "DROP INDEX documents_by_concurrency;"
        " DROP INDEX documents_by_claim_worker; DROP INDEX audit_by_request;"
        " ALTER TABLE documents DROP COLUMN claim_worker; ALTER TABLE audit DROP COLUMN request_id;"
        " UPDATE schema_version SET version = 1;"
    )
    conn.close()

    with SQLiteStore(path) as store:
        assert [row.key for row in store.held_claims("t", "app", "w1")] == [workload_id]
        warden = Authority(store, grants=VERIFIER)
        assert warden.claim_next("t", "app", "w1", CAPS, 11_500, LEASE, request_id="r1") == claim
        assert len(store.audit_log()) == 2
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SQLITE_VERSION,)]
    conn.close()


@pytest.mark.postgres
def test_a_version_1_postgres_database_gains_the_lookups_filled_in_from_its_documents() -> None:
    with postgres_database() as dsn:
        with contextlib.closing(PostgresStore(dsn)) as store:
            workload_id, claim = claimed_by_w1(store)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP INDEX workwarden_documents_by_claim_worker")
            conn.execute("DROP INDEX workwarden_audit_by_request")
            conn.execute("ALTER TABLE workwarden_documents DROP COLUMN claim_worker")
            conn.execute("ALTER TABLE workwarden_audit DROP COLUMN request_id")
            conn.execute("DELETE FROM workwarden_schema_version WHERE version > 1")

        with contextlib.closing(PostgresStore(dsn)) as store:
            assert [row.key for row in store.held_claims("t", "app", "w1")] == [workload_id]
            warden = Authority(store, grants=VERIFIER)
            assert (
                warden.claim_next("t", "app", "w1", CAPS, 11_500, LEASE, request_id="r1") == claim
            )
            assert len(store.audit_log()) == 2
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT max(version) FROM workwarden_schema_version").fetchone()
            assert row == (PG_VERSION,)
