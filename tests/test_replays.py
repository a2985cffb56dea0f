"""Every worker call is safe to repeat after a lost reply: it answers as the first did.

The store below commits each write and then raises, as a connection that
broke after the server committed would: the caller sees a failure and calls
again with the same arguments. Each such call must end as if it had been made
once: the same state, history, attempts, checkpoints and audit count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from support import VERIFIER, request
from workwarden.statemachine import (
    Authority,
    CheckpointCommand,
    Claim,
    ClaimCommand,
    WorkloadError,
    errors,
)
from workwarden.storage import (
    AuditRecord,
    ForwardingStore,
    IndexFields,
    Store,
    StoreFailure,
    StoreOutcomeUnknown,
)

CAPS = {"email:send"}
LEASE = 10_000


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
