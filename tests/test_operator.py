"""Operator re-arms and operator timeouts: each decided by policy and recorded with its actor.

Counterparts of the seeds' `operator_retry_grants_one_attempt_is_recorded_and_is_bounded`,
the re-arm of an unknown-effect dead letter in
`failure_policy_decides_retry_and_an_unknown_effect_...`, and the 0.15 rule that an
operator timeout of READY work leaves the last attempt's outcome alone. Unlike the
seeds, the operator timeout's policy decision is recorded as `evidence["decision"]`.
"""

from __future__ import annotations

from typing import Any

import pytest

from support import CAPS, request
from workwarden.statemachine import Authority, RetryPolicy, WorkloadError
from workwarden.statemachine.models import DEFAULT_RETRY_ON
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


def exhaust(authority: Authority, workload_id: str, now: int) -> int:
    """Claim and lose leases until the workload stops being claimable; the instant reached."""
    while authority.get(workload_id).state == "READY":
        now += 100
        claim = authority.claim(workload_id, "worker-a", CAPS, now=now, lease_ms=LEASE)
        now = claim.expires_at
        assert authority.recover_expired(now) == [workload_id]
    now += 100
    refused = refusal(authority.claim, workload_id, "worker-a", CAPS, now=now, lease_ms=LEASE)
    assert refused.code == "WORKLOAD_NOT_READY"
    return now


def dead_lettered(authority: Authority, **changes: Any) -> str:
    """A workload that has used its budget of 3 attempts and is DEAD_LETTER."""
    workload_id = admit(authority, **changes)
    exhaust(authority, workload_id, 10_000)
    assert authority.get(workload_id).state == "DEAD_LETTER"
    return workload_id


# -- operator re-arms -----------------------------------------------------------


def test_each_operator_retry_grants_exactly_one_attempt_and_is_recorded(
    authority: Authority,
) -> None:
    workload_id = admit(authority)
    now = exhaust(authority, workload_id, 10_000)
    assert authority.get(workload_id).attempt_count == 3
    for retry in (1, 2, 3):
        now += 100
        assert authority.retry(workload_id, "operator-1", now, "dependency restored") == "READY"
        workload = authority.get(workload_id)
        event = workload.execution_history[-1]
        assert event.from_state == "DEAD_LETTER"
        assert event.to == "READY"
        assert event.actor == "operator-1"
        assert event.actor_class == "operator"
        assert event.evidence["retry"] == "operator"
        assert event.evidence["operator_retry"] == str(retry)
        assert event.evidence["attempt_budget"] == str(3 + retry)
        assert event.evidence["reason"] == "dependency restored"
        assert workload.next_attempt_at == now, "claimable at once"
        now = exhaust(authority, workload_id, now)
        workload = authority.get(workload_id)
        assert workload.attempt_count == 3 + retry, "each re-arm grants exactly one attempt"
        assert workload.state == "DEAD_LETTER"
        assert workload.execution_history[-1].evidence["decision"] == "attempt_budget_exhausted"


def test_operator_retries_are_bounded_by_max_attempts(authority: Authority, store: Store) -> None:
    workload_id = dead_lettered(
        authority, retry_policy=RetryPolicy(max_attempts=2, retry_on=DEFAULT_RETRY_ON)
    )
    now = 1_000_000
    for _ in range(2):
        authority.retry(workload_id, "operator-1", now)
        now = exhaust(authority, workload_id, now)
    assert authority.get(workload_id).attempt_count == 4
    before = version(store, workload_id)
    refused = refusal(authority.retry, workload_id, "operator-1", now + 100)
    assert refused.code == "WORKLOAD_RETRY_EXHAUSTED"
    assert refused.details == {"operator_retries": 2, "max": 2}
    assert authority.get(workload_id).state == "DEAD_LETTER"
    assert version(store, workload_id) == before


def test_an_operator_retry_reason_is_capped_at_256_characters(authority: Authority) -> None:
    workload_id = dead_lettered(authority)
    reason = "é" * 200 + "x" * 100
    authority.retry(workload_id, "operator-1", 2_000_000, reason)
    recorded = authority.get(workload_id).execution_history[-1].evidence["reason"]
    assert recorded == reason[:256]
    assert len(recorded) == 256


@pytest.mark.parametrize("reason", [None, "", "   "])
def test_an_operator_retry_without_a_reason_records_none(
    authority: Authority, reason: str | None
) -> None:
    workload_id = dead_lettered(authority)
    authority.retry(workload_id, "operator-1", 2_000_000, reason)
    event = authority.get(workload_id).execution_history[-1]
    assert "reason" not in event.evidence
    assert event.evidence["retry"] == "operator"


def test_an_operator_retry_reason_carrying_a_secret_is_refused_and_changes_nothing(
    authority: Authority, store: Store
) -> None:
    workload_id = dead_lettered(authority)
    before = version(store, workload_id)
    refused = refusal(authority.retry, workload_id, "operator-1", 2_000_000, "sk-live-key")
    assert refused.code == "WORKLOAD_SECRET_REJECTED"
    assert version(store, workload_id) == before
    assert authority.get(workload_id).state == "DEAD_LETTER"


def test_an_operator_can_rearm_a_dead_letter_whose_effect_was_unknown(
    authority: Authority,
) -> None:
    workload_id = admit(authority, retry_policy=RetryPolicy(retry_on=("timeout",)))
    claim = authority.claim(workload_id, "a", CAPS, now=11_000, lease_ms=LEASE)
    authority.start(workload_id, claim.fence, now=12_000)
    state = authority.fail(
        workload_id, claim.fence, "timeout", "charge sent, no answer", 13_000, effect="unknown"
    )
    assert state == "DEAD_LETTER"
    assert authority.retry(workload_id, "operator", 14_000, "verified: not charged") == "READY"
    workload = authority.get(workload_id)
    assert workload.execution_history[-1].evidence["reason"] == "verified: not charged"
    second = authority.claim(workload_id, "b", CAPS, now=14_000, lease_ms=LEASE)
    assert second.fencing_token == claim.fencing_token + 1
    assert authority.get(workload_id).attempt_count == 2


@pytest.mark.parametrize("where", ["READY", "RUNNING", "SUCCEEDED"])
def test_an_operator_retry_of_work_that_has_not_stopped_is_denied(
    authority: Authority, store: Store, where: str
) -> None:
    workload_id = admit(authority)
    if where != "READY":
        claim = authority.claim(workload_id, "a", CAPS, now=11_000, lease_ms=LEASE)
        authority.start(workload_id, claim.fence, now=12_000)
        if where == "SUCCEEDED":
            authority.complete(workload_id, claim.fence, "r", {"ok": True}, 13_000)
    assert authority.get(workload_id).state == where
    before = version(store, workload_id)
    refused = refusal(authority.retry, workload_id, "operator-1", 14_000)
    assert refused.code == "WORKLOAD_TRANSITION_DENIED"
    assert version(store, workload_id) == before


# -- operator timeouts ------------------------------------------------------------


def test_an_operator_timeout_of_ready_work_leaves_the_last_attempts_outcome(
    authority: Authority,
) -> None:
    workload_id = admit(authority)
    claim = authority.claim(workload_id, "a", CAPS, now=11_000, lease_ms=LEASE)
    authority.fail(workload_id, claim.fence, "transient_connection", "no route", 12_000)
    assert authority.get(workload_id).state == "READY"
    assert authority.timeout(workload_id, "operator-1", 15_000) == "READY"
    workload = authority.get(workload_id)
    attempt = workload.attempts[0]
    assert attempt.status == "FAILED"
    assert attempt.ended_at == 12_000
    assert attempt.error == "no route"
    timed_out, decided = workload.execution_history[-2:]
    assert (timed_out.from_state, timed_out.to) == ("READY", "TIMED_OUT")
    assert timed_out.actor == "operator-1"
    assert timed_out.actor_class == "operator"
    assert (decided.from_state, decided.to) == ("TIMED_OUT", "READY")
    assert decided.evidence["decision"] == "retry"
    assert workload.next_attempt_at == 16_000, "initial_delay_ms after the timeout, exactly"


def test_an_operator_timeout_of_running_work_times_the_attempt_out_and_ends_its_claim(
    authority: Authority,
) -> None:
    workload_id = admit(authority)
    claim = authority.claim(workload_id, "a", CAPS, now=11_000, lease_ms=LEASE)
    authority.start(workload_id, claim.fence, now=12_000)
    assert authority.timeout(workload_id, "operator-1", 13_000) == "READY"
    workload = authority.get(workload_id)
    assert workload.attempts[0].status == "TIMED_OUT"
    assert workload.attempts[0].ended_at == 13_000
    assert workload.current_claim is None
    assert workload.execution_history[-1].evidence["decision"] == "retry"
    refused = refusal(authority.complete, workload_id, claim.fence, "late", None, 13_500)
    assert refused.code == "WORKLOAD_CLAIM_INVALID"
    assert authority.get(workload_id).result is None


def test_an_operator_timeout_dead_letters_when_the_policy_does_not_retry_timeouts(
    authority: Authority,
) -> None:
    workload_id = admit(authority, retry_policy=RetryPolicy(retry_on=("worker_failure",)))
    claim = authority.claim(workload_id, "a", CAPS, now=11_000, lease_ms=LEASE)
    authority.start(workload_id, claim.fence, now=12_000)
    assert authority.timeout(workload_id, "operator-1", 13_000) == "DEAD_LETTER"
    workload = authority.get(workload_id)
    assert workload.execution_history[-1].evidence["decision"] == "timeout_not_retryable"
    assert workload.attempts[0].status == "TIMED_OUT"


def test_an_operator_timeout_dead_letters_when_the_attempt_budget_is_spent(
    authority: Authority,
) -> None:
    workload_id = admit(
        authority, retry_policy=RetryPolicy(max_attempts=1, retry_on=DEFAULT_RETRY_ON)
    )
    authority.claim(workload_id, "a", CAPS, now=11_000, lease_ms=LEASE)
    assert authority.timeout(workload_id, "operator-1", 12_000) == "DEAD_LETTER"
    workload = authority.get(workload_id)
    assert workload.execution_history[-1].evidence["decision"] == "attempt_budget_exhausted"
    assert workload.attempts[0].status == "TIMED_OUT"


@pytest.mark.parametrize("where", ["DEAD_LETTER", "SUCCEEDED", "CANCELLATION_REQUESTED"])
def test_an_operator_timeout_of_work_that_cannot_time_out_is_denied(
    authority: Authority, store: Store, where: str
) -> None:
    workload_id = admit(
        authority, retry_policy=RetryPolicy(max_attempts=1, retry_on=DEFAULT_RETRY_ON)
    )
    claim = authority.claim(workload_id, "a", CAPS, now=11_000, lease_ms=LEASE)
    authority.start(workload_id, claim.fence, now=12_000)
    if where == "DEAD_LETTER":
        authority.fail(workload_id, claim.fence, "validation", "bad", 13_000)
    elif where == "SUCCEEDED":
        authority.complete(workload_id, claim.fence, "r", None, 13_000)
    else:
        authority.cancel(workload_id, "user", 13_000)
    assert authority.get(workload_id).state == where
    before = version(store, workload_id)
    refused = refusal(authority.timeout, workload_id, "operator-1", 14_000)
    assert refused.code == "WORKLOAD_TRANSITION_DENIED"
    assert version(store, workload_id) == before
