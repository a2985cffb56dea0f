"""Fencing: every worker call presents the fence of its claim, and only the current one works.

A lost worker (its lease expired and the work was recovered) is refused for a
stale fence while another worker holds the work, and for having no claim at
all once nobody does. A current fence whose lease has run out is refused as
expired. The seeds' second `11` is `11_000`; a `1_000` ms lease lasts 1 000 ms.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from support import CAPS, request, store_snapshot
from workwarden.statemachine import Authority, Claim, Fence, WorkloadError
from workwarden.storage import Store

FencedCall = Callable[[Authority, str, Fence, int], Any]

FENCED_CALLS: dict[str, FencedCall] = {
    "start": lambda a, wid, fence, now: a.start(wid, fence, now),
    "heartbeat": lambda a, wid, fence, now: a.heartbeat(wid, fence, now, 5_000),
    "execution_context": lambda a, wid, fence, now: a.execution_context(wid, fence, now),
    "checkpoint": lambda a, wid, fence, now: a.checkpoint(wid, fence, {"step": 1}, now),
    "complete": lambda a, wid, fence, now: a.complete(wid, fence, "late", {"ok": True}, now),
    "fail": lambda a, wid, fence, now: a.fail(wid, fence, "timeout", "late", now),
    "confirm_cancel": lambda a, wid, fence, now: a.confirm_cancel(wid, fence, now),
}


def _lost_and_reclaimed(authority: Authority) -> tuple[str, Claim, Claim]:
    """Worker a starts on a 1 000 ms lease and is lost; worker b claims the work after recovery."""
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    lost = authority.claim(workload_id, "a", CAPS, now=11_000, lease_ms=1_000)
    authority.start(workload_id, lost.fence, now=11_000)
    assert authority.recover_expired(now=13_000) == [workload_id]
    successor = authority.claim(workload_id, "b", CAPS, now=13_000, lease_ms=10_000)
    return workload_id, lost, successor


def _code(call: Callable[[], Any]) -> str:
    with pytest.raises(WorkloadError) as caught:
        call()
    return caught.value.code


def test_after_recovery_a_new_claim_has_a_larger_token_and_the_old_fence_is_stale(
    authority: Authority, store: Store
) -> None:
    workload_id, lost, successor = _lost_and_reclaimed(authority)
    assert successor.fencing_token > lost.fencing_token
    before = store_snapshot(store)

    def late_completion() -> Any:
        return authority.complete(workload_id, lost.fence, "stale", None, now=14_000)

    assert _code(late_completion) == "WORKLOAD_STALE_FENCE"
    assert store_snapshot(store) == before
    held = authority.get(workload_id)
    assert held.state == "CLAIMED"
    assert held.current_claim == successor


@pytest.mark.parametrize("operation", sorted(FENCED_CALLS))
def test_a_lost_worker_is_refused_by_every_call_while_the_successor_holds_the_work(
    authority: Authority, store: Store, operation: str
) -> None:
    workload_id, lost, successor = _lost_and_reclaimed(authority)
    authority.start(workload_id, successor.fence, now=13_500)
    authority.cancel(workload_id, "operator", now=13_600)  # so confirm_cancel is legal
    before = store_snapshot(store)

    code = _code(lambda: FENCED_CALLS[operation](authority, workload_id, lost.fence, 14_000))

    assert code == "WORKLOAD_STALE_FENCE"
    assert store_snapshot(store) == before


def test_once_nobody_holds_the_work_a_lost_fence_has_no_claim_at_all(
    authority: Authority, store: Store
) -> None:
    workload_id, lost, successor = _lost_and_reclaimed(authority)
    authority.start(workload_id, successor.fence, now=13_500)
    authority.complete(workload_id, successor.fence, "result-b", {"ok": True}, now=14_000)
    before = store_snapshot(store)

    def resurrected() -> Any:
        return authority.complete(workload_id, lost.fence, "resurrected", None, now=15_000)

    assert _code(resurrected) == "WORKLOAD_CLAIM_INVALID"
    assert store_snapshot(store) == before
    done = authority.get(workload_id)
    assert [a.status for a in done.attempts] == ["WORKER_LOST", "SUCCEEDED"]
    assert done.result is not None
    assert done.result.produced_by == "b"


def test_a_fence_for_work_that_was_never_claimed_has_no_claim(authority: Authority) -> None:
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    invented = Fence(claim_id="claim_x", worker_id="w", token=1)

    assert _code(lambda: authority.start(workload_id, invented, now=11_000)) == (
        "WORKLOAD_CLAIM_INVALID"
    )
    assert authority.get(workload_id).state == "READY"


@pytest.mark.parametrize(
    "forge",
    [
        {"claim_id": "claim_other"},
        {"worker_id": "intruder"},
        {"token": 2},
        {"token": 0},
    ],
    ids=["claim-id", "worker", "newer-token", "older-token"],
)
def test_each_part_of_the_fence_must_match_the_current_claim(
    authority: Authority, store: Store, forge: dict[str, Any]
) -> None:
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    claim = authority.claim(workload_id, "w", CAPS, now=11_000, lease_ms=10_000)
    forged = claim.fence.model_copy(update=forge)
    before = store_snapshot(store)

    with pytest.raises(WorkloadError) as caught:
        authority.start(workload_id, forged, now=12_000)

    assert caught.value.code == "WORKLOAD_STALE_FENCE"
    assert caught.value.details == {"current_token": 1, "presented_token": forged.token}
    assert store_snapshot(store) == before
    authority.start(workload_id, claim.fence, now=12_000)


@pytest.mark.parametrize("operation", sorted(FENCED_CALLS))
def test_an_expired_lease_refuses_its_own_worker(
    authority: Authority, store: Store, operation: str
) -> None:
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    claim = authority.claim(workload_id, "w", CAPS, now=11_000, lease_ms=5_000)
    if operation != "start":
        authority.start(workload_id, claim.fence, now=12_000)
    if operation == "confirm_cancel":
        authority.cancel(workload_id, "operator", now=12_500)
    before = store_snapshot(store)

    with pytest.raises(WorkloadError) as caught:
        FENCED_CALLS[operation](authority, workload_id, claim.fence, claim.expires_at)

    assert caught.value.code == "WORKLOAD_LEASE_EXPIRED"
    assert caught.value.details == {"expired_at": 16_000}
    assert store_snapshot(store) == before
    # A millisecond earlier the same call is the holder's.
    FENCED_CALLS[operation](authority, workload_id, claim.fence, claim.expires_at - 1)


def test_a_resumed_attempt_reads_the_input_and_the_lost_attempts_checkpoints(
    authority: Authority,
) -> None:
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    lost = authority.claim(workload_id, "a", CAPS, now=11_000, lease_ms=1_000)
    authority.start(workload_id, lost.fence, now=11_000)
    authority.checkpoint(workload_id, lost.fence, {"step": "reserve", "status": "done"}, now=11_500)
    authority.recover_expired(now=13_000)
    successor = authority.claim(workload_id, "b", CAPS, now=13_000, lease_ms=10_000)

    context = authority.execution_context(workload_id, successor.fence, now=13_000)

    assert context.input == {"id": 1}
    assert context.worker_id == "b"
    assert context.fencing_token == successor.fencing_token
    assert context.expires_at == 23_000
    assert context.capabilities == CAPS
    (checkpoint,) = context.checkpoints
    assert checkpoint.state == {"step": "reserve", "status": "done"}
    assert checkpoint.produced_by == "a"
    assert checkpoint.attempt_id != context.attempt_id, "written by the lost attempt"
    assert context.attempt_id == authority.get(workload_id).attempts[-1].attempt_id

    # The lost worker's fence reads nothing.
    lost_read = _code(lambda: authority.execution_context(workload_id, lost.fence, now=13_000))
    assert lost_read == "WORKLOAD_STALE_FENCE"


def test_the_execution_context_hands_out_secret_references_only(
    authority: Authority, store: Store
) -> None:
    workload_id = authority.admit(
        request(connection_scopes=("crm", "billing")), now=10_000
    ).workload.workload_id
    claim = authority.claim(workload_id, "w", CAPS, now=11_000, lease_ms=10_000)
    before = store_snapshot(store)

    context = authority.execution_context(
        workload_id, claim.fence, now=12_000, secret_references=["secret://db", "secret://smtp"]
    )

    assert context.secret_references == ("secret://db", "secret://smtp")
    assert context.connection_scopes == ("billing", "crm")
    assert store_snapshot(store) == before, "reading the context writes nothing"


@pytest.mark.parametrize(
    "references",
    [["hunter2"], ["secret://db", "sk-live-abc"], ["secret://"], ["SECRET://db"], ["env://DB"]],
    ids=["plaintext", "one-plaintext-among-references", "empty-reference", "wrong-case", "other"],
)
def test_the_execution_context_refuses_anything_but_a_secret_reference(
    authority: Authority, store: Store, references: list[str]
) -> None:
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    claim = authority.claim(workload_id, "w", CAPS, now=11_000, lease_ms=10_000)
    before = store_snapshot(store)

    with pytest.raises(WorkloadError) as caught:
        authority.execution_context(workload_id, claim.fence, 12_000, references)

    assert caught.value.code == "WORKLOAD_SECRET_REJECTED"
    assert "hunter2" not in str(caught.value.to_dict())
    assert store_snapshot(store) == before
