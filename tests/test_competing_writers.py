"""Competing writers: two authorities over one store, their `prepare` and `commit` interleaved.

Each call is decided on the version it read and written only if that version
is still the committed one. Exactly one of two competing calls commits; the
other's `commit()` raises `WORKLOAD_CONFLICT` and leaves the store exactly as
the winner left it (documents and audit log), and the loser's next call is
decided on what the winner committed.
"""

from __future__ import annotations

from typing import Any

import pytest

from support import CAPS, request, store_snapshot
from support import authority as authority_over
from workwarden.statemachine import (
    AdmitCommand,
    Authority,
    ClaimCommand,
    CompleteCommand,
    Prepared,
    RecoverCommand,
    WorkloadError,
    errors,
)
from workwarden.storage import Store


def _claim_command(workload_id: str, worker: str, lease_ms: int = 1_000) -> ClaimCommand:
    return ClaimCommand(
        workload_id=workload_id, worker_id=worker, capabilities=CAPS, lease_ms=lease_ms
    )


def _loses(store: Store, prepared: Prepared) -> None:
    """`prepared` was overtaken: its commit conflicts and writes nothing at all."""
    before = store_snapshot(store)
    with pytest.raises(WorkloadError) as caught:
        prepared.commit()
    assert caught.value.code == "WORKLOAD_CONFLICT"
    assert caught.value.details is not None
    assert caught.value.details["workload_id"] == prepared.key
    assert store_snapshot(store) == before


def _one_more_version(before: tuple[Any, ...], after: tuple[Any, ...], key: str) -> Any:
    """Between two snapshots exactly one version of `key` was committed; return its audit record."""
    (docs_before, audit_before), (docs_after, audit_after) = before, after
    assert len(audit_after) == len(audit_before) + 1
    assert audit_after[: len(audit_before)] == audit_before
    versions_before = {doc[0]: doc[1] for doc in docs_before}
    versions_after = {doc[0]: doc[1] for doc in docs_after}
    assert versions_after == {**versions_before, key: versions_before.get(key, 0) + 1}
    record = audit_after[-1]
    assert (record.key, record.version) == (key, versions_after[key])
    return record


@pytest.mark.parametrize(
    "first_wins", [True, False], ids=["first-commits-first", "second-commits-first"]
)
def test_of_two_competing_claims_exactly_one_commits(
    authority: Authority, second_authority: Authority, store: Store, first_wins: bool
) -> None:
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    left = authority.prepare(_claim_command(workload_id, "worker-a"), 11_000)
    right = second_authority.prepare(_claim_command(workload_id, "worker-b"), 11_000)
    winner, loser = (left, right) if first_wins else (right, left)
    winning_worker = "worker-a" if first_wins else "worker-b"
    losing_authority = second_authority if first_wins else authority
    before = store_snapshot(store)

    claim = winner.commit()

    record = _one_more_version(before, store_snapshot(store), workload_id)
    assert record.worker == winning_worker
    assert record.operation == "claim"
    _loses(store, loser)
    committed = losing_authority.get(workload_id)
    assert committed.current_claim == claim
    assert committed.attempt_count == 1
    assert len(committed.attempts) == 1
    # The loser's next call is decided on the winner's claim.
    loser_worker = "worker-b" if first_wins else "worker-a"
    with pytest.raises(WorkloadError) as again:
        losing_authority.claim(workload_id, loser_worker, CAPS, now=11_000, lease_ms=1_000)
    assert again.value.code == "WORKLOAD_NOT_READY"


def test_competing_claims_conflict_the_same_way_after_reopening(store: Store) -> None:
    workload_id = authority_over(store).admit(request(), now=10_000).workload.workload_id
    authority_over(store).claim(workload_id, "worker-a", CAPS, now=11_000, lease_ms=1_000)

    # Reopened: recovery by one authority, then two fresh authorities race.
    assert authority_over(store).recover_expired(now=13_000) == [workload_id]
    winner = authority_over(store)
    loser = authority_over(store)
    winning = winner.prepare(_claim_command(workload_id, "worker-c", 10_000), 13_000)
    losing = loser.prepare(_claim_command(workload_id, "worker-d", 10_000), 13_000)
    claim = winning.commit()
    _loses(store, losing)

    committed = loser.get(workload_id)
    assert committed.state == "CLAIMED"
    assert committed.current_claim == claim
    assert claim.worker_id == "worker-c"
    assert claim.fencing_token == 2


@pytest.mark.parametrize(
    "completion_first", [True, False], ids=["completion-first", "recovery-first"]
)
def test_recovery_racing_a_completion_commits_exactly_one_outcome(
    authority: Authority, second_authority: Authority, store: Store, completion_first: bool
) -> None:
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    claim = authority.claim(workload_id, "worker-a", CAPS, now=11_000, lease_ms=5_000)
    authority.start(workload_id, claim.fence, now=12_000)
    # The worker completes just inside its lease; the sweep runs as it expires.
    completion = authority.prepare(
        CompleteCommand(workload_id=workload_id, fence=claim.fence, result_id="r1", output=1),
        claim.expires_at - 1,
    )
    recovery = second_authority.prepare(RecoverCommand(workload_id=workload_id), claim.expires_at)
    before = store_snapshot(store)

    if completion_first:
        result = completion.commit()
        record = _one_more_version(before, store_snapshot(store), workload_id)
        assert record.operation == "complete"
        _loses(store, recovery)
        # The sweep, run again, finds nothing left to recover.
        assert second_authority.recover_expired(now=claim.expires_at) == []
        done = authority.get(workload_id)
        assert done.state == "SUCCEEDED"
        assert done.result == result
        assert [a.status for a in done.attempts] == ["SUCCEEDED"]
    else:
        assert recovery.commit().changed
        record = _one_more_version(before, store_snapshot(store), workload_id)
        assert record.operation == "recover_expired"
        _loses(store, completion)
        # The worker's retried completion is decided on the recovery: its claim is gone.
        with pytest.raises(WorkloadError) as late:
            authority.complete(workload_id, claim.fence, "r1", 1, now=claim.expires_at)
        assert late.value.code == "WORKLOAD_CLAIM_INVALID"
        recovered = authority.get(workload_id)
        assert recovered.state == "READY"
        assert recovered.result is None
        assert [a.status for a in recovered.attempts] == ["WORKER_LOST"]
        assert sum(e.to == "RECOVERING" for e in recovered.execution_history) == 1


def test_competing_admissions_of_one_request_make_one_workload_created_once(
    authority: Authority, second_authority: Authority, store: Store
) -> None:
    first = authority.prepare(AdmitCommand(request=request()), 10_000)
    second = second_authority.prepare(AdmitCommand(request=request()), 10_000)
    before = store_snapshot(store)

    created = first.commit()

    assert created.created
    workload_id = created.workload.workload_id
    record = _one_more_version(before, store_snapshot(store), workload_id)
    assert record.operation == "admit"
    _loses(store, second)
    # The stale writer converges on what was committed: the original, not created again.
    converged = second_authority.admit(request(), now=10_000)
    assert not converged.created
    assert converged.workload == created.workload
    assert [doc.key for doc in store.scan()] == [workload_id]
    assert sum(r.operation == "admit" for r in store.audit_log()) == 1


def test_competing_admissions_of_different_requests_under_one_key_admit_one(
    authority: Authority, second_authority: Authority, store: Store
) -> None:
    mine = request(idempotency_key="contested")
    theirs = request(idempotency_key="contested", input={"id": 2})
    first = authority.prepare(AdmitCommand(request=mine), 10_000)
    second = second_authority.prepare(AdmitCommand(request=theirs), 10_000)

    admitted = first.commit()
    _loses(store, second)

    # Never answered with the winner's workload: the key is reused for a different request.
    with pytest.raises(WorkloadError) as refused:
        second_authority.admit(theirs, now=10_000)
    assert refused.value.code == "IDEMPOTENCY_KEY_REUSED"
    assert refused.value.details == {"fields": ["input"]}
    (stored,) = store.scan()
    assert stored.key == admitted.workload.workload_id
    assert authority.get(stored.key).input == {"id": 1}


def test_a_writer_that_prepared_after_the_commit_replays_without_writing(
    authority: Authority, second_authority: Authority, store: Store
) -> None:
    created = authority.admit(request(), now=10_000)
    before = store_snapshot(store)

    prepared = second_authority.prepare(AdmitCommand(request=request()), 10_500)
    assert not prepared.writes
    replayed = prepared.commit()

    assert not replayed.created
    assert replayed.workload == created.workload
    assert store_snapshot(store) == before


def test_competing_completions_cannot_record_one_result_id_twice(
    authority: Authority, second_authority: Authority, store: Store
) -> None:
    def running(key: str, worker: str) -> tuple[str, Any]:
        workload_id = authority.admit(request(idempotency_key=key), now=10_000).workload.workload_id
        claim = authority.claim(workload_id, worker, CAPS, now=11_000, lease_ms=10_000)
        authority.start(workload_id, claim.fence, now=12_000)
        return workload_id, claim

    one, one_claim = running("one", "worker-a")
    two, two_claim = running("two", "worker-b")
    first = authority.prepare(
        CompleteCommand(workload_id=one, fence=one_claim.fence, result_id="r", output=1), 13_000
    )
    second = second_authority.prepare(
        CompleteCommand(workload_id=two, fence=two_claim.fence, result_id="r", output=2), 13_000
    )

    first.commit()
    _loses(store, second)

    with pytest.raises(WorkloadError) as again:
        second_authority.complete(two, two_claim.fence, "r", 2, now=13_000)
    assert again.value.code == "WORKLOAD_RESULT_DUPLICATE"
    assert authority.get(two).state == "RUNNING"
    assert authority.get(two).result is None


def test_another_writers_commits_are_read_and_acted_on_at_once(
    authority: Authority, second_authority: Authority
) -> None:
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    # The second writer never saw the admission, yet reads it from the store.
    assert second_authority.get(workload_id).state == "READY"
    assert [w.workload_id for w in second_authority.list("t", "app")] == [workload_id]

    claim = authority.claim(workload_id, "worker-a", CAPS, now=11_000, lease_ms=10_000)
    with pytest.raises(WorkloadError) as refused:
        second_authority.claim(workload_id, "worker-b", CAPS, now=11_000, lease_ms=10_000)
    assert refused.value.code == "WORKLOAD_NOT_READY"

    # A claim committed through one writer is what the other fences against.
    second_authority.start(workload_id, claim.fence, now=12_000)
    assert authority.get(workload_id).state == "RUNNING"
    assert not second_authority.admit(request(), now=12_000).created


def test_a_prepared_call_commits_once(authority: Authority, store: Store) -> None:
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    prepared = authority.prepare(_claim_command(workload_id, "worker-a"), 11_000)
    prepared.commit()
    after = store_snapshot(store)

    with pytest.raises(WorkloadError) as again:
        prepared.commit()

    assert again.value.code == errors.INVALID
    assert store_snapshot(store) == after
