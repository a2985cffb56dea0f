"""Lease recovery: a lost worker's attempt is recorded, the work handed on, the budget kept.

Counterparts of the seeds' recovery tests (`lease_recovery_records_the_lost_worker_...`,
`concurrent_recovery_...`, `a_policy_that_does_not_retry_worker_failure_...`,
`claiming_exhausted_ready_work_...`, `stale_fence_and_lease_recovery`,
`a_worker_dying_after_a_claim_...`, `a_recovered_workload_refuses_its_dead_worker_...`).
The seeds' threaded races are two authorities over one store whose `prepare` and
`commit` are interleaved by hand: the same race, deterministic.
"""

from __future__ import annotations

from typing import Any

import pytest

from support import CAPS, overwrite, request
from workwarden.statemachine import (
    Authority,
    Claim,
    RecoverCommand,
    RetryPolicy,
    StartCommand,
    SweepReply,
    Workload,
    WorkloadError,
)
from workwarden.storage import Store

ADMITTED = 10_000
LEASE = 10_000


def admit(authority: Authority, **changes: Any) -> str:
    return authority.admit(request(**changes), now=ADMITTED).workload.workload_id


def version(store: Store, workload_id: str) -> int:
    doc = store.read(workload_id)
    assert doc is not None
    return doc.version


def refusal(call: Any, *args: Any, **kwargs: Any) -> WorkloadError:
    with pytest.raises(WorkloadError) as caught:
        call(*args, **kwargs)
    return caught.value


def recoveries(workload: Workload) -> int:
    return sum(1 for event in workload.execution_history if event.to == "RECOVERING")


# -- what a recovery records and decides ---------------------------------------


def test_lease_recovery_records_the_lost_worker_and_is_bounded_by_the_attempt_budget(
    authority: Authority,
) -> None:
    workload_id = admit(authority)
    for attempt in (1, 2, 3):
        claim = authority.claim(
            workload_id, "worker-a", CAPS, now=100_000 * attempt, lease_ms=LEASE
        )
        assert authority.recover_expired(claim.expires_at) == [workload_id]
        workload = authority.get(workload_id)
        lost = workload.attempts[-1]
        assert lost.status == "WORKER_LOST"
        assert lost.claim_id == claim.claim_id
        assert lost.ended_at == claim.expires_at
        recovering = [e for e in workload.execution_history if e.to == "RECOVERING"][-1]
        assert recovering.actor == "system.recovery"
        assert recovering.evidence["recovery_reason"] == "lease_expired"
        assert recovering.evidence["worker_id"] == "worker-a"
        assert recovering.evidence["claim_id"] == claim.claim_id
        assert recovering.evidence["attempts_used"] == str(attempt)
        assert recovering.evidence["attempt_budget"] == "3"
        assert recovering.evidence["lease_expired_at"] == str(claim.expires_at)
        assert recovering.evidence["attempt_id"] == lost.attempt_id
        decision = workload.execution_history[-1]
        assert decision.from_state == "RECOVERING"
        if attempt < 3:
            assert workload.state == "READY"
            assert decision.evidence["decision"] == "retry"
        else:
            assert workload.state == "DEAD_LETTER"
            assert decision.evidence["decision"] == "attempt_budget_exhausted"
        assert workload.current_claim is None
    assert authority.get(workload_id).attempt_count == 3
    refused = refusal(authority.claim, workload_id, "worker-b", CAPS, now=1_000_000, lease_ms=LEASE)
    assert refused.code == "WORKLOAD_NOT_READY"


def test_a_lease_is_not_recovered_a_millisecond_before_it_expires(authority: Authority) -> None:
    workload_id = admit(authority)
    claim = authority.claim(workload_id, "a", CAPS, now=11_000, lease_ms=1_500)
    assert claim.expires_at == 12_500
    assert authority.recover_expired(12_499) == []
    assert authority.get(workload_id).state == "CLAIMED"
    assert authority.recover_expired(12_500) == [workload_id]


def test_a_recovered_workload_is_claimable_at_once(authority: Authority) -> None:
    workload_id = admit(authority)
    claim = authority.claim(workload_id, "a", CAPS, now=11_000, lease_ms=1_000)
    authority.recover_expired(12_000)
    workload = authority.get(workload_id)
    assert workload.is_eligible_at(12_000)
    assert authority.claim(workload_id, "b", CAPS, now=12_000, lease_ms=LEASE).fencing_token == (
        claim.fencing_token + 1
    )


def test_a_heartbeat_extends_the_lease_past_recovery(authority: Authority) -> None:
    workload_id = admit(authority)
    claim = authority.claim(workload_id, "a", CAPS, now=11_000, lease_ms=1_000)
    authority.start(workload_id, claim.fence, now=11_500)
    extended = authority.heartbeat(workload_id, claim.fence, now=11_900, extend_ms=5_000)
    assert extended.expires_at == 16_900
    assert authority.recover_expired(12_000) == []
    assert authority.get(workload_id).state == "RUNNING"


def test_a_policy_that_does_not_retry_worker_failure_dead_letters_a_lost_attempt(
    authority: Authority,
) -> None:
    workload_id = admit(authority, retry_policy=RetryPolicy(retry_on=("timeout",)))
    claim = authority.claim(workload_id, "worker-a", CAPS, now=11_000, lease_ms=LEASE)
    assert authority.recover_expired(claim.expires_at) == [workload_id]
    workload = authority.get(workload_id)
    assert workload.state == "DEAD_LETTER"
    assert workload.execution_history[-1].evidence["decision"] == "worker_failure_not_retryable"
    assert workload.attempts[0].status == "WORKER_LOST"


def test_recovering_a_workload_whose_cancellation_was_requested_cancels_it(
    authority: Authority,
) -> None:
    workload_id = admit(authority)
    claim = authority.claim(workload_id, "a", CAPS, now=11_000, lease_ms=1_000)
    authority.start(workload_id, claim.fence, now=11_500)
    assert authority.cancel(workload_id, "user", now=11_600) == "CANCELLATION_REQUESTED"
    assert authority.recover_expired(12_000) == [workload_id]
    workload = authority.get(workload_id)
    assert workload.state == "CANCELLED"
    assert recoveries(workload) == 0, "cancelled directly, not through RECOVERING"
    cancelled = workload.execution_history[-1]
    assert cancelled.from_state == "CANCELLATION_REQUESTED"
    assert cancelled.actor == "system.recovery"
    assert cancelled.evidence["decision"] == "cancellation_requested"
    assert cancelled.evidence["recovery_reason"] == "lease_expired"
    assert cancelled.evidence["claim_id"] == claim.claim_id
    assert workload.attempts[0].status == "WORKER_LOST"
    assert workload.current_claim is None
    assert authority.recover_expired(20_000) == []


def test_claiming_exhausted_ready_work_dead_letters_it_instead(
    authority: Authority, store: Store
) -> None:
    workload_id = admit(authority)
    # What unbounded recovery used to leave behind: READY, budget spent.
    overwrite(store, authority, workload_id, attempt_count=7)
    refused = refusal(authority.claim, workload_id, "worker-a", CAPS, now=11_000, lease_ms=LEASE)
    assert refused.code == "WORKLOAD_ATTEMPTS_EXHAUSTED"
    workload = authority.get(workload_id)
    assert workload.state == "DEAD_LETTER"
    assert workload.current_claim is None
    assert workload.attempts == []
    last = workload.execution_history[-1]
    assert last.evidence["reason"] == "attempt_budget_exhausted"
    assert last.evidence["decision"] == "attempt_budget_exhausted"
    assert last.evidence["attempts_used"] == "7"
    assert last.evidence["attempt_budget"] == "3"
    # Durable: an authority started afresh over the store sees the same outcome.
    reopened = Authority(store, grants=authority.grants)
    assert reopened.get(workload_id).state == "DEAD_LETTER"
    again = refusal(reopened.claim, workload_id, "worker-b", CAPS, now=12_000, lease_ms=LEASE)
    assert again.code == "WORKLOAD_NOT_READY"


# -- a dead worker and its successor -------------------------------------------


def test_a_stale_worker_cannot_complete_after_recovery_hands_the_work_on(
    authority: Authority,
) -> None:
    workload_id = admit(authority)
    old = authority.claim(workload_id, "a", CAPS, now=11_000, lease_ms=1_000)
    authority.start(workload_id, old.fence, now=11_000)
    assert authority.recover_expired(13_000) == [workload_id]
    new = authority.claim(workload_id, "b", CAPS, now=13_000, lease_ms=LEASE)
    assert new.fencing_token > old.fencing_token
    refused = refusal(authority.complete, workload_id, old.fence, "stale", None, 14_000)
    assert refused.code == "WORKLOAD_STALE_FENCE"
    assert authority.get(workload_id).result is None


def test_a_worker_dying_after_a_claim_returns_the_work_and_it_executes_once(
    authority: Authority,
) -> None:
    workload_id = admit(authority)
    dead = authority.claim(workload_id, "worker-a", CAPS, now=10_000, lease_ms=1_000)
    authority.start(workload_id, dead.fence, now=10_000)
    assert authority.get(workload_id).state == "RUNNING"

    # The lease expiring is the only thing that can notice.
    assert authority.recover_expired(12_000) == [workload_id]
    back = authority.get(workload_id)
    assert back.state == "READY"
    assert back.attempts[-1].status == "WORKER_LOST"

    live = authority.claim(workload_id, "worker-b", CAPS, now=12_000, lease_ms=LEASE)
    assert live.fencing_token > dead.fencing_token
    authority.start(workload_id, live.fence, now=13_000)
    authority.complete(workload_id, live.fence, "result-recovered", {"ok": True}, 14_000)

    finished = authority.get(workload_id)
    assert finished.state == "SUCCEEDED"
    assert [a.status for a in finished.attempts] == ["WORKER_LOST", "SUCCEEDED"]
    assert finished.result is not None
    assert finished.result.produced_by == "worker-b"
    # Both claims are released: the dead worker has no claim at all to present.
    refused = refusal(authority.complete, workload_id, dead.fence, "resurrected", None, 15_000)
    assert refused.code == "WORKLOAD_CLAIM_INVALID"
    assert authority.get(workload_id).result == finished.result


def test_a_recovered_workload_refuses_its_dead_worker_while_the_successor_still_holds_it(
    authority: Authority, store: Store
) -> None:
    workload_id = admit(authority)
    dead = authority.claim(workload_id, "worker-a", CAPS, now=10_000, lease_ms=1_000)
    authority.start(workload_id, dead.fence, now=10_000)
    authority.recover_expired(12_000)
    live = authority.claim(workload_id, "worker-b", CAPS, now=12_000, lease_ms=LEASE)
    before = version(store, workload_id)
    for call in (
        lambda: authority.complete(workload_id, dead.fence, "resurrected", None, 13_000),
        lambda: authority.start(workload_id, dead.fence, now=13_000),
        lambda: authority.heartbeat(workload_id, dead.fence, now=13_000, extend_ms=LEASE),
        lambda: authority.fail(workload_id, dead.fence, "timeout", "late", 13_000),
    ):
        assert refusal(call).code == "WORKLOAD_STALE_FENCE"
    workload = authority.get(workload_id)
    assert workload.state == "CLAIMED"
    assert workload.current_claim is not None
    assert workload.current_claim.claim_id == live.claim_id
    assert version(store, workload_id) == before


# -- concurrent recovery: two authorities over one store -----------------------


def _expired_claim(authority: Authority) -> tuple[str, Claim]:
    workload_id = admit(authority)
    claim = authority.claim(workload_id, "worker-a", CAPS, now=100_000, lease_ms=LEASE)
    return workload_id, claim


@pytest.mark.parametrize("first_commits", [0, 1])
def test_concurrent_recovery_commits_one_transition_and_the_loser_commits_nothing(
    authority: Authority, second_authority: Authority, store: Store, first_commits: int
) -> None:
    workload_id, claim = _expired_claim(authority)
    now = claim.expires_at
    writers = (authority, second_authority)
    prepared = [w.prepare(RecoverCommand(workload_id=workload_id), now) for w in writers]
    assert all(p.writes for p in prepared), "both decided on the same, expired version"

    winner, loser = prepared[first_commits], prepared[1 - first_commits]
    reply = winner.commit()
    assert isinstance(reply, SweepReply)
    assert reply.changed
    assert reply.state == "READY"
    committed_version = version(store, workload_id)
    with pytest.raises(WorkloadError) as caught:
        loser.commit()
    assert caught.value.code == "WORKLOAD_CONFLICT"
    assert version(store, workload_id) == committed_version

    committed = authority.get(workload_id)
    assert recoveries(committed) == 1
    assert committed.state == "READY"
    assert committed.attempt_count == 1
    assert [a.status for a in committed.attempts] == ["WORKER_LOST"]
    assert committed.current_claim is None
    recovering = next(e for e in committed.execution_history if e.to == "RECOVERING")
    assert recovering.evidence["claim_id"] == claim.claim_id
    assert recovering.evidence["attempts_used"] == "1"

    # Neither writer recovers it again, or commits anything more.
    loser_writer = writers[1 - first_commits]
    assert loser_writer.recover_expired(now) == []
    assert authority.recover_expired(now + 1) == []
    assert second_authority.recover_expired(now + 1) == []
    assert version(store, workload_id) == committed_version
    assert second_authority.get(workload_id) == committed


def test_a_sweep_that_loses_the_race_to_another_writers_recovery_reports_nothing(
    authority: Authority, second_authority: Authority, store: Store
) -> None:
    workload_id, claim = _expired_claim(authority)
    now = claim.expires_at
    stale = authority.prepare(RecoverCommand(workload_id=workload_id), now)
    assert second_authority.recover_expired(now) == [workload_id]
    committed_version = version(store, workload_id)
    with pytest.raises(WorkloadError) as caught:
        stale.commit()
    assert caught.value.code == "WORKLOAD_CONFLICT"
    assert authority.recover_expired(now) == []
    assert version(store, workload_id) == committed_version
    assert recoveries(authority.get(workload_id)) == 1


def test_the_lost_claimant_cannot_start_or_complete_after_a_concurrent_recovery(
    authority: Authority, second_authority: Authority, store: Store
) -> None:
    workload_id, claim = _expired_claim(authority)
    # The worker decided its start while its lease was still live...
    start = authority.prepare(
        StartCommand(workload_id=workload_id, fence=claim.fence), claim.expires_at - 1
    )
    assert start.writes
    assert start.decision.refusal is None
    # ...and the recovery committed first.
    assert second_authority.recover_expired(claim.expires_at) == [workload_id]
    committed_version = version(store, workload_id)
    with pytest.raises(WorkloadError) as caught:
        start.commit()
    assert caught.value.code == "WORKLOAD_CONFLICT"
    assert authority.get(workload_id).state == "READY"

    # Decided on the committed version, the fence belongs to no live claim.
    late = refusal(
        authority.complete,
        workload_id,
        claim.fence,
        "late-result",
        {"late": True},
        claim.expires_at - 1,
    )
    assert late.code == "WORKLOAD_CLAIM_INVALID"
    beat = refusal(
        second_authority.heartbeat,
        workload_id,
        claim.fence,
        now=claim.expires_at - 1,
        extend_ms=LEASE,
    )
    assert beat.code == "WORKLOAD_CLAIM_INVALID"
    assert refusal(authority.start, workload_id, claim.fence, now=claim.expires_at).code == (
        "WORKLOAD_CLAIM_INVALID"
    )
    assert version(store, workload_id) == committed_version
    assert authority.get(workload_id).result is None


def test_concurrent_recovery_never_exceeds_the_attempt_budget(
    authority: Authority, second_authority: Authority, store: Store
) -> None:
    workload_id = admit(authority)
    for attempt in (1, 2, 3):
        claim = authority.claim(
            workload_id, "worker-a", CAPS, now=100_000 * attempt, lease_ms=LEASE
        )
        now = claim.expires_at
        first = authority.prepare(RecoverCommand(workload_id=workload_id), now)
        second = second_authority.prepare(RecoverCommand(workload_id=workload_id), now)
        # Alternate which writer wins, so both paths are taken.
        winner, loser = (first, second) if attempt % 2 else (second, first)
        assert winner.commit().changed
        with pytest.raises(WorkloadError) as caught:
            loser.commit()
        assert caught.value.code == "WORKLOAD_CONFLICT"
        assert authority.recover_expired(now) == []
        assert second_authority.recover_expired(now) == []
        committed = second_authority.get(workload_id)
        assert recoveries(committed) == attempt
        assert committed.attempt_count == attempt
    committed = authority.get(workload_id)
    assert committed.state == "DEAD_LETTER"
    assert committed.execution_history[-1].evidence["decision"] == "attempt_budget_exhausted"
    assert [a.status for a in committed.attempts] == ["WORKER_LOST"] * 3
    refused = refusal(
        second_authority.claim, workload_id, "worker-b", CAPS, now=1_000_000, lease_ms=LEASE
    )
    assert refused.code == "WORKLOAD_NOT_READY"
    assert authority.get(workload_id).attempt_count == 3
