"""Temporal eligibility: a workload may be durable before it is executable.

Admitted with `not_before`, a workload is READY at once, refused to every
worker with `WORKLOAD_NOT_YET_ELIGIBLE` (naming the instant) until then, and
claimable exactly at the instant. The seeds' second `2000` is `2_000_000`.
"""

from __future__ import annotations

import pytest

from support import CAPS, request, store_snapshot
from support import authority as authority_over
from workwarden.statemachine import Authority, WorkloadError
from workwarden.storage import Store

NOT_BEFORE = 2_000_000


def _scheduled(authority: Authority) -> str:
    return authority.admit(request(not_before=NOT_BEFORE), now=10_000).workload.workload_id


def test_scheduled_work_is_ready_but_not_claimable_before_its_instant(
    authority: Authority, store: Store
) -> None:
    workload_id = _scheduled(authority)
    admitted = authority.get(workload_id)
    assert admitted.state == "READY"
    assert admitted.next_attempt_at == NOT_BEFORE
    assert admitted.execution_history[0].evidence == {"not_before": str(NOT_BEFORE)}
    before = store_snapshot(store)

    with pytest.raises(WorkloadError) as caught:
        authority.claim(workload_id, "worker", CAPS, now=NOT_BEFORE - 1, lease_ms=10_000)

    refused = caught.value
    assert refused.code == "WORKLOAD_NOT_YET_ELIGIBLE"
    assert str(NOT_BEFORE) in refused.message, "the refusal names when to come back"
    assert refused.details == {"eligible_at": NOT_BEFORE}
    assert store_snapshot(store) == before, "refusing a claim changes nothing"
    after = authority.get(workload_id)
    assert after.attempt_count == 0
    assert after.attempts == []
    assert after.current_claim is None


def test_scheduled_work_is_claimable_exactly_at_its_instant(authority: Authority) -> None:
    workload_id = _scheduled(authority)

    claim = authority.claim(workload_id, "worker", CAPS, now=NOT_BEFORE, lease_ms=10_000)

    assert claim.worker_id == "worker"
    assert claim.claimed_at == NOT_BEFORE
    assert authority.get(workload_id).state == "CLAIMED"


def test_scheduled_work_survives_reopening_before_it_is_eligible(store: Store) -> None:
    workload_id = _scheduled(authority_over(store))

    reopened = authority_over(store)
    recovered = reopened.get(workload_id)
    assert recovered.state == "READY"
    assert recovered.next_attempt_at == NOT_BEFORE
    with pytest.raises(WorkloadError) as caught:
        reopened.claim(workload_id, "worker", CAPS, now=NOT_BEFORE - 1, lease_ms=10_000)
    assert caught.value.code == "WORKLOAD_NOT_YET_ELIGIBLE"


def test_scheduled_work_executes_after_reopening(store: Store) -> None:
    workload_id = _scheduled(authority_over(store))

    reopened = authority_over(store)
    claim = reopened.claim(workload_id, "worker", CAPS, now=NOT_BEFORE + 1_000, lease_ms=10_000)
    reopened.start(workload_id, claim.fence, now=NOT_BEFORE + 2_000)
    reopened.complete(
        workload_id, claim.fence, "result-scheduled", {"ok": True}, now=NOT_BEFORE + 3_000
    )

    finished = authority_over(store).get(workload_id)
    assert finished.state == "SUCCEEDED"
    assert finished.result is not None
    assert finished.result.result_id == "result-scheduled"


def test_a_not_before_in_the_past_is_the_same_as_none(authority: Authority) -> None:
    workload_id = authority.admit(request(not_before=5_000), now=10_000).workload.workload_id

    claim = authority.claim(workload_id, "worker", CAPS, now=10_000, lease_ms=10_000)

    assert claim.claimed_at == 10_000


def test_immediate_work_is_claimable_at_its_admission_instant(authority: Authority) -> None:
    admitted = authority.admit(request(), now=10_000).workload
    assert admitted.next_attempt_at is None
    assert admitted.execution_history[0].evidence == {}

    claim = authority.claim(admitted.workload_id, "worker", CAPS, now=10_000, lease_ms=10_000)

    assert claim.claimed_at == admitted.created_at


def test_of_several_workers_at_the_instant_exactly_one_claims_the_work(
    authority: Authority, store: Store
) -> None:
    workload_id = _scheduled(authority)

    winner = authority.claim(workload_id, "worker-a", CAPS, now=NOT_BEFORE, lease_ms=10_000)
    before = store_snapshot(store)
    with pytest.raises(WorkloadError) as loser:
        authority.claim(workload_id, "worker-b", CAPS, now=NOT_BEFORE, lease_ms=10_000)

    assert loser.value.code == "WORKLOAD_NOT_READY", "refused on state, not on time"
    assert loser.value.details == {"state": "CLAIMED"}
    # Nor can the loser complete work it never owned, even naming the winner's claim.
    borrowed = winner.fence.model_copy(update={"worker_id": "worker-b"})
    with pytest.raises(WorkloadError) as duplicate:
        authority.complete(workload_id, borrowed, "duplicate", None, now=NOT_BEFORE + 1)
    assert duplicate.value.code == "WORKLOAD_STALE_FENCE"
    assert store_snapshot(store) == before
    assert authority.get(workload_id).attempt_count == 1


def test_a_worker_without_the_capability_snapshot_cannot_claim(
    authority: Authority, store: Store
) -> None:
    workload_id = authority.admit(
        request(capability_snapshot=("email:send", "crm:read")), now=10_000
    ).workload.workload_id
    before = store_snapshot(store)

    with pytest.raises(WorkloadError) as caught:
        authority.claim(workload_id, "worker", ("email:send",), now=11_000, lease_ms=10_000)

    assert caught.value.code == "WORKLOAD_CAPABILITY_DENIED"
    assert caught.value.details == {"missing": ["crm:read"]}
    assert store_snapshot(store) == before
    claim = authority.claim(
        workload_id, "worker", ("crm:read", "email:send", "extra"), now=11_000, lease_ms=10_000
    )
    assert claim.capability_snapshot == ("crm:read", "email:send")
