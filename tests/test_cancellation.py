"""Cancellation: queued work is cancelled at once; held work is asked to stop and confirmed.

While cancellation is requested, the worker cannot complete: it confirms the
cancellation instead. Work cancelled before its eligibility instant never runs.
"""

from __future__ import annotations

import pytest

from support import CAPS, request, store_snapshot
from support import authority as authority_over
from workwarden.statemachine import Authority, Claim, WorkloadError
from workwarden.storage import Store

NOT_BEFORE = 2_000_000


def _running(authority: Authority) -> tuple[str, Claim]:
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    claim = authority.claim(workload_id, "a", CAPS, now=11_000, lease_ms=10_000)
    authority.start(workload_id, claim.fence, now=12_000)
    return workload_id, claim


def test_cancelling_before_the_eligibility_instant_prevents_execution(store: Store) -> None:
    authority = authority_over(store)
    workload_id = authority.admit(request(not_before=NOT_BEFORE), now=10_000).workload.workload_id

    assert authority.cancel(workload_id, "operator", now=1_500_000) == "CANCELLED"

    with pytest.raises(WorkloadError) as caught:
        authority.claim(workload_id, "worker", CAPS, now=NOT_BEFORE + 1_000, lease_ms=10_000)
    assert caught.value.code == "WORKLOAD_NOT_READY", "eligibility arriving does not resurrect it"
    cancelled = authority_over(store).get(workload_id)
    assert cancelled.state == "CANCELLED"
    assert cancelled.attempts == [], "nothing ever executed"
    last = cancelled.execution_history[-1]
    assert (last.from_state, last.to, last.actor) == ("READY", "CANCELLED", "operator")


def test_a_cancellation_racing_a_running_worker_is_confirmed_not_completed(
    authority: Authority, store: Store
) -> None:
    workload_id, claim = _running(authority)

    assert authority.cancel(workload_id, "user", now=13_000) == "CANCELLATION_REQUESTED"
    before = store_snapshot(store)
    with pytest.raises(WorkloadError) as caught:
        authority.complete(workload_id, claim.fence, "r", None, now=14_000)
    assert caught.value.code == "WORKLOAD_TRANSITION_DENIED"
    assert store_snapshot(store) == before

    assert authority.confirm_cancel(workload_id, claim.fence, now=14_000) == "CANCELLED"
    cancelled = authority.get(workload_id)
    assert cancelled.state == "CANCELLED"
    assert cancelled.result is None
    assert cancelled.current_claim is None
    assert cancelled.attempts[-1].status == "CANCELLED"
    assert [(e.to, e.actor) for e in cancelled.execution_history[-2:]] == [
        ("CANCELLATION_REQUESTED", "user"),
        ("CANCELLED", "a"),
    ]


@pytest.mark.parametrize("start", [False, True], ids=["claimed", "running"])
def test_cancelling_held_work_asks_its_worker_and_keeps_the_claim(
    authority: Authority, start: bool
) -> None:
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    claim = authority.claim(workload_id, "a", CAPS, now=11_000, lease_ms=10_000)
    if start:
        authority.start(workload_id, claim.fence, now=12_000)

    assert authority.cancel(workload_id, "user", now=13_000) == "CANCELLATION_REQUESTED"

    assert authority.get(workload_id).current_claim == claim
    assert authority.confirm_cancel(workload_id, claim.fence, now=14_000) == "CANCELLED"


def test_asking_again_while_cancellation_is_requested_changes_nothing(
    authority: Authority, store: Store
) -> None:
    workload_id, _ = _running(authority)
    authority.cancel(workload_id, "user", now=13_000)
    before = store_snapshot(store)

    assert authority.cancel(workload_id, "another-user", now=13_500) == "CANCELLATION_REQUESTED"

    assert store_snapshot(store) == before


def test_only_a_requested_cancellation_can_be_confirmed(authority: Authority, store: Store) -> None:
    workload_id, claim = _running(authority)
    before = store_snapshot(store)

    with pytest.raises(WorkloadError) as caught:
        authority.confirm_cancel(workload_id, claim.fence, now=13_000)

    assert caught.value.code == "WORKLOAD_TRANSITION_DENIED"
    assert store_snapshot(store) == before
    assert authority.get(workload_id).state == "RUNNING"


def test_finished_work_cannot_be_cancelled(authority: Authority, store: Store) -> None:
    workload_id, claim = _running(authority)
    authority.complete(workload_id, claim.fence, "r", {"ok": True}, now=13_000)
    before = store_snapshot(store)

    with pytest.raises(WorkloadError) as caught:
        authority.cancel(workload_id, "user", now=14_000)

    assert caught.value.code == "WORKLOAD_TRANSITION_DENIED"
    assert caught.value.details == {"state": "SUCCEEDED"}
    assert store_snapshot(store) == before
