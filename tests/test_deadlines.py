"""Deadlines: the five kinds, found by a worker call or by the sweep, from committed instants.

Counterparts of the seeds' `deadlines_are_enforced_from_committed_timestamps_and_race_safely`
and `deadlines_are_versioned_and_zero_is_refused`. Durations are exact milliseconds:
a 3000 ms heartbeat timeout after a heartbeat at 13_000 falls at 16_000, and a call at
16_000 already finds it fallen while one at 15_999 does not. The seeds' restart is a
fresh `Authority` over the same store, and their race is an interleaved
`prepare`/`commit` of two authorities.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from support import CAPS, overwrite, request
from workwarden.statemachine import (
    Authority,
    Claim,
    EnforceDeadlineCommand,
    HeartbeatCommand,
    RetryPolicy,
    Timeouts,
    Workload,
    WorkloadError,
)
from workwarden.storage import Store

ADMITTED = 10_000
CLAIMED = 11_000
STARTED = 12_000
LEASE = 10_000


def admit(authority: Authority, *, retry_policy: RetryPolicy | None = None, **timeouts: int) -> str:
    changes: dict[str, Any] = {"timeouts": Timeouts(**timeouts)}
    if retry_policy is not None:
        changes["retry_policy"] = retry_policy
    return authority.admit(request(**changes), now=ADMITTED).workload.workload_id


def claimed(
    authority: Authority, *, retry_policy: RetryPolicy | None = None, **timeouts: int
) -> tuple[str, Claim]:
    workload_id = admit(authority, retry_policy=retry_policy, **timeouts)
    return workload_id, authority.claim(workload_id, "a", CAPS, now=CLAIMED, lease_ms=LEASE)


def running(
    authority: Authority, *, retry_policy: RetryPolicy | None = None, **timeouts: int
) -> tuple[str, Claim]:
    workload_id, claim = claimed(authority, retry_policy=retry_policy, **timeouts)
    authority.start(workload_id, claim.fence, now=STARTED)
    return workload_id, claim


def refusal(call: Any, *args: Any, **kwargs: Any) -> WorkloadError:
    with pytest.raises(WorkloadError) as caught:
        call(*args, **kwargs)
    return caught.value


def version(store: Store, workload_id: str) -> int:
    doc = store.read(workload_id)
    assert doc is not None
    return doc.version


def timeouts_of(workload: Workload) -> int:
    return sum(1 for event in workload.execution_history if event.to == "TIMED_OUT")


# -- execution --------------------------------------------------------------------


def test_the_execution_deadline_times_a_late_completion_out_once(authority: Authority) -> None:
    workload_id, claim = running(authority, execution_ms=5_000)
    # A heartbeat inside the deadline keeps the attempt.
    authority.heartbeat(workload_id, claim.fence, now=16_000, extend_ms=LEASE)
    assert authority.enforce_deadlines(16_999) == []
    refused = refusal(authority.complete, workload_id, claim.fence, "late", None, 17_000)
    assert refused.code == "WORKLOAD_TIMED_OUT"
    assert refused.details == {"deadline": "execution", "deadline_at": 17_000}
    workload = authority.get(workload_id)
    assert workload.state == "READY", "a timeout is retried by default"
    assert workload.result is None, "a late completion never lands"
    attempt = workload.attempts[0]
    assert attempt.status == "TIMED_OUT"
    assert attempt.ended_at == 17_000
    assert attempt.error == "timeout: execution deadline passed"
    assert workload.current_claim is None
    timed_out, decided = workload.execution_history[-2:]
    assert (timed_out.from_state, timed_out.to) == ("RUNNING", "TIMED_OUT")
    assert timed_out.actor == "system.deadline"
    assert timed_out.evidence["deadline"] == "execution"
    assert timed_out.evidence["deadline_at"] == "17000"
    assert timed_out.evidence["claim_id"] == claim.claim_id
    assert timed_out.evidence["worker_id"] == "a"
    assert decided.evidence["decision"] == "retry"
    assert workload.next_attempt_at == 18_000, "initial_delay_ms after the timeout, exactly"
    # Timed out once: neither the sweep nor another late call times it out again.
    assert authority.enforce_deadlines(30_000) == []
    again = refusal(authority.complete, workload_id, claim.fence, "late", None, 30_000)
    assert again.code == "WORKLOAD_CLAIM_INVALID"
    assert timeouts_of(authority.get(workload_id)) == 1


def test_a_completion_at_the_execution_deadline_instant_is_timed_out_with_no_result(
    authority: Authority,
) -> None:
    workload_id, claim = running(authority, execution_ms=5_000)
    refused = refusal(authority.complete, workload_id, claim.fence, "r", {"ok": True}, 17_000)
    assert refused.code == "WORKLOAD_TIMED_OUT"
    workload = authority.get(workload_id)
    assert workload.result is None
    assert [a.status for a in workload.attempts] == ["TIMED_OUT"]
    assert not any(event.to == "SUCCEEDED" for event in workload.execution_history)


def test_a_completion_a_millisecond_before_the_execution_deadline_lands(
    authority: Authority,
) -> None:
    workload_id, claim = running(authority, execution_ms=5_000)
    result = authority.complete(workload_id, claim.fence, "r", {"ok": True}, 16_999)
    assert result.result_id == "r"
    assert authority.get(workload_id).state == "SUCCEEDED"
    assert authority.enforce_deadlines(100_000) == []


# -- heartbeat --------------------------------------------------------------------


def test_the_heartbeat_deadline_runs_from_the_last_heartbeat(authority: Authority) -> None:
    workload_id, claim = running(authority, heartbeat_ms=3_000)
    authority.heartbeat(workload_id, claim.fence, now=13_000, extend_ms=LEASE)
    assert authority.enforce_deadlines(15_999) == []
    assert authority.enforce_deadlines(16_000) == [workload_id]
    workload = authority.get(workload_id)
    assert workload.current_claim is None
    assert workload.attempts[0].status == "TIMED_OUT"
    timed_out = next(e for e in workload.execution_history if e.to == "TIMED_OUT")
    assert timed_out.evidence["deadline"] == "heartbeat"
    assert timed_out.evidence["deadline_at"] == "16000"
    # The timed-out claim is gone.
    refused = refusal(authority.heartbeat, workload_id, claim.fence, now=16_000, extend_ms=LEASE)
    assert refused.code == "WORKLOAD_CLAIM_INVALID"


def test_without_a_heartbeat_the_heartbeat_deadline_runs_from_the_claim(
    authority: Authority,
) -> None:
    workload_id, _ = claimed(authority, heartbeat_ms=3_000)
    assert authority.enforce_deadlines(13_999) == []
    assert authority.enforce_deadlines(14_000) == [workload_id]


def test_a_heartbeat_that_commits_first_moves_the_deadline_and_the_sweep_changes_nothing(
    authority: Authority, store: Store
) -> None:
    workload_id, claim = running(authority, heartbeat_ms=3_000)
    authority.heartbeat(workload_id, claim.fence, now=13_000, extend_ms=LEASE)
    authority.heartbeat(workload_id, claim.fence, now=15_500, extend_ms=LEASE)
    before = version(store, workload_id)
    assert authority.enforce_deadlines(16_000) == []
    assert version(store, workload_id) == before
    assert authority.get(workload_id).state == "RUNNING"
    assert authority.enforce_deadlines(18_500) == [workload_id]


def test_a_sweep_racing_a_heartbeat_that_commits_first_commits_nothing(
    authority: Authority, second_authority: Authority, store: Store
) -> None:
    workload_id, claim = running(authority, heartbeat_ms=3_000)
    authority.heartbeat(workload_id, claim.fence, now=13_000, extend_ms=LEASE)
    sweep = second_authority.prepare(EnforceDeadlineCommand(workload_id=workload_id), 16_000)
    assert sweep.writes, "decided on the version whose heartbeat deadline had fallen"
    beat = authority.prepare(
        HeartbeatCommand(workload_id=workload_id, fence=claim.fence, extend_ms=LEASE), 15_999
    )
    assert beat.decision.refusal is None, "decided inside the deadline"
    beat.commit()
    committed = version(store, workload_id)
    with pytest.raises(WorkloadError) as caught:
        sweep.commit()
    assert caught.value.code == "WORKLOAD_CONFLICT"
    assert version(store, workload_id) == committed
    # Decided again on the committed version, the deadline has moved to 18_999.
    assert second_authority.enforce_deadlines(16_000) == []
    workload = authority.get(workload_id)
    assert workload.state == "RUNNING"
    assert workload.current_claim is not None
    assert workload.attempts[0].status == "RUNNING"
    assert second_authority.enforce_deadlines(18_999) == [workload_id]


def test_a_heartbeat_racing_a_sweep_that_commits_first_is_refused(
    authority: Authority, second_authority: Authority, store: Store
) -> None:
    workload_id, claim = running(authority, heartbeat_ms=3_000)
    authority.heartbeat(workload_id, claim.fence, now=13_000, extend_ms=LEASE)
    beat = authority.prepare(
        HeartbeatCommand(workload_id=workload_id, fence=claim.fence, extend_ms=LEASE), 15_999
    )
    assert beat.writes
    assert beat.decision.refusal is None, "decided inside the deadline"
    assert second_authority.enforce_deadlines(16_000) == [workload_id]
    committed = version(store, workload_id)
    with pytest.raises(WorkloadError) as caught:
        beat.commit()
    assert caught.value.code == "WORKLOAD_CONFLICT"
    assert version(store, workload_id) == committed
    refused = refusal(authority.heartbeat, workload_id, claim.fence, now=15_999, extend_ms=LEASE)
    assert refused.code == "WORKLOAD_CLAIM_INVALID"
    assert timeouts_of(authority.get(workload_id)) == 1


# -- claim ------------------------------------------------------------------------


def test_the_claim_deadline_times_out_work_claimed_but_never_started(
    authority: Authority,
) -> None:
    workload_id, claim = claimed(
        authority, retry_policy=RetryPolicy(retry_on=("worker_failure",)), claim_ms=2_000
    )
    refused = refusal(authority.start, workload_id, claim.fence, now=13_000)
    assert refused.code == "WORKLOAD_TIMED_OUT"
    assert refused.details == {"deadline": "claim", "deadline_at": 13_000}
    workload = authority.get(workload_id)
    assert workload.state == "DEAD_LETTER"
    assert workload.execution_history[-1].evidence["decision"] == "timeout_not_retryable"
    assert workload.attempts[0].status == "TIMED_OUT"


def test_the_claim_deadline_no_longer_applies_once_the_attempt_started(
    authority: Authority,
) -> None:
    workload_id, claim = claimed(authority, claim_ms=2_000)
    authority.start(workload_id, claim.fence, now=12_999)
    assert authority.enforce_deadlines(20_000) == []
    authority.heartbeat(workload_id, claim.fence, now=20_000, extend_ms=LEASE)
    assert authority.get(workload_id).state == "RUNNING"


# -- queue and overall: they bound the work --------------------------------------


def test_the_queue_deadline_dead_letters_unclaimed_work_and_no_attempt_is_made(
    authority: Authority,
) -> None:
    workload_id = admit(authority, queue_ms=4_000)
    refused = refusal(authority.claim, workload_id, "a", CAPS, now=14_000, lease_ms=LEASE)
    assert refused.code == "WORKLOAD_TIMED_OUT"
    assert refused.details == {"deadline": "queue", "deadline_at": 14_000}
    workload = authority.get(workload_id)
    assert workload.state == "DEAD_LETTER"
    assert workload.execution_history[-1].evidence["decision"] == "deadline_not_retryable"
    assert workload.attempts == []
    assert workload.attempt_count == 0


def test_the_queue_deadline_runs_from_eligibility_and_leaves_the_last_attempt_alone(
    authority: Authority,
) -> None:
    workload_id, claim = claimed(authority, queue_ms=4_000)
    authority.fail(workload_id, claim.fence, "transient_connection", "no route", 12_000)
    assert authority.get(workload_id).next_attempt_at == 13_000
    assert authority.enforce_deadlines(16_999) == []
    assert authority.enforce_deadlines(17_000) == [workload_id]
    workload = authority.get(workload_id)
    assert workload.state == "DEAD_LETTER"
    assert workload.execution_history[-1].evidence["decision"] == "deadline_not_retryable"
    attempt = workload.attempts[0]
    assert attempt.status == "FAILED", "a queued workload's last attempt is not rewritten"
    assert attempt.error == "no route"
    assert attempt.ended_at == 12_000


def test_the_overall_deadline_comes_from_the_committed_record_after_a_restart(
    authority: Authority, store: Store
) -> None:
    workload_id, _ = running(authority, overall_ms=10_000)
    restarted = Authority(store, grants=authority.grants)
    assert restarted.enforce_deadlines(19_999) == []
    assert restarted.enforce_deadlines(20_000) == [workload_id]
    workload = restarted.get(workload_id)
    assert workload.state == "DEAD_LETTER"
    assert workload.execution_history[-1].evidence["decision"] == "deadline_not_retryable"
    timed_out = next(e for e in workload.execution_history if e.to == "TIMED_OUT")
    assert timed_out.evidence["deadline"] == "overall"
    assert timed_out.evidence["deadline_at"] == "20000"


def test_a_heartbeat_deadline_is_enforced_by_an_authority_that_never_saw_the_heartbeat(
    authority: Authority, store: Store
) -> None:
    workload_id, claim = running(authority, heartbeat_ms=3_000)
    authority.heartbeat(workload_id, claim.fence, now=13_500, extend_ms=LEASE)
    restarted = Authority(store, grants=authority.grants)
    assert restarted.enforce_deadlines(16_499) == []
    assert restarted.enforce_deadlines(16_500) == [workload_id]
    assert authority.get(workload_id).attempts[0].status == "TIMED_OUT"


# -- boundaries -------------------------------------------------------------------

Setup = Callable[[Authority], tuple[str, Callable[[int], Any], int]]


def _queue(authority: Authority) -> tuple[str, Callable[[int], Any], int]:
    workload_id = admit(authority, queue_ms=4_000)
    return (
        workload_id,
        lambda now: authority.claim(workload_id, "a", CAPS, now=now, lease_ms=LEASE),
        14_000,
    )


def _claim(authority: Authority) -> tuple[str, Callable[[int], Any], int]:
    workload_id, claim = claimed(authority, claim_ms=2_000)
    return workload_id, lambda now: authority.start(workload_id, claim.fence, now=now), 13_000


def _execution(authority: Authority) -> tuple[str, Callable[[int], Any], int]:
    workload_id, claim = running(authority, execution_ms=5_000)
    return (
        workload_id,
        lambda now: authority.checkpoint(workload_id, claim.fence, {"step": 1}, now),
        17_000,
    )


def _heartbeat(authority: Authority) -> tuple[str, Callable[[int], Any], int]:
    workload_id, claim = claimed(authority, heartbeat_ms=3_000)
    return workload_id, lambda now: authority.start(workload_id, claim.fence, now=now), 14_000


def _overall(authority: Authority) -> tuple[str, Callable[[int], Any], int]:
    workload_id, claim = running(authority, overall_ms=5_000)
    return (
        workload_id,
        lambda now: authority.fail(workload_id, claim.fence, "timeout", "x", now),
        15_000,
    )


BOUNDARIES: dict[str, Setup] = {
    "queue": _queue,
    "claim": _claim,
    "execution": _execution,
    "heartbeat": _heartbeat,
    "overall": _overall,
}


@pytest.mark.parametrize("kind", sorted(BOUNDARIES))
def test_a_call_one_millisecond_before_a_deadline_passes(authority: Authority, kind: str) -> None:
    workload_id, call, at = BOUNDARIES[kind](authority)
    call(at - 1)
    assert timeouts_of(authority.get(workload_id)) == 0


@pytest.mark.parametrize("kind", sorted(BOUNDARIES))
def test_a_call_at_the_deadline_instant_is_timed_out(authority: Authority, kind: str) -> None:
    workload_id, call, at = BOUNDARIES[kind](authority)
    refused = refusal(call, at)
    assert refused.code == "WORKLOAD_TIMED_OUT"
    assert refused.details == {"deadline": kind, "deadline_at": at}
    workload = authority.get(workload_id)
    assert timeouts_of(workload) == 1
    assert "decision" in workload.execution_history[-1].evidence


@pytest.mark.parametrize("kind", sorted(BOUNDARIES))
def test_the_sweep_times_out_at_the_deadline_instant_and_not_before(
    authority: Authority, kind: str
) -> None:
    workload_id, _, at = BOUNDARIES[kind](authority)
    assert authority.enforce_deadlines(at - 1) == []
    assert authority.enforce_deadlines(at) == [workload_id]
    assert authority.enforce_deadlines(at) == []
    assert timeouts_of(authority.get(workload_id)) == 1


# -- zero and versions ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["queue", "claim", "execution", "heartbeat", "overall"])
def test_a_zero_timeout_is_refused_at_admission(
    authority: Authority, store: Store, kind: str
) -> None:
    refused = refusal(authority.admit, request(timeouts=Timeouts(**{f"{kind}_ms": 0})), ADMITTED)
    assert refused.code == "WORKLOAD_INVALID"
    assert refused.details == {"fields": [f"timeouts.{kind}_ms"]}
    assert list(store.scan()) == []


def _versioned(authority: Authority, store: Store, contract_version: int) -> tuple[str, Claim]:
    workload_id = admit(authority, execution_ms=1_000, overall_ms=2_000)
    assert authority.get(workload_id).contract_version == 2
    if contract_version != 2:
        overwrite(store, authority, workload_id, contract_version=contract_version)
    claim = authority.claim(workload_id, "a", CAPS, now=CLAIMED, lease_ms=60_000)
    authority.start(workload_id, claim.fence, now=STARTED - 500)
    return workload_id, claim


def test_a_workload_admitted_before_deadlines_is_never_timed_out(
    authority: Authority, store: Store
) -> None:
    workload_id, claim = _versioned(authority, store, contract_version=1)
    assert authority.enforce_deadlines(1_000_000) == []
    authority.heartbeat(workload_id, claim.fence, now=50_000, extend_ms=60_000)
    authority.checkpoint(workload_id, claim.fence, {"step": 1}, 60_000)
    authority.complete(workload_id, claim.fence, "r", {"ok": True}, 70_000)
    workload = authority.get(workload_id)
    assert workload.contract_version == 1
    assert workload.state == "SUCCEEDED"
    assert timeouts_of(workload) == 0


def test_a_workload_admitted_under_the_deadline_contract_is_timed_out(
    authority: Authority, store: Store
) -> None:
    workload_id, claim = _versioned(authority, store, contract_version=2)
    refused = refusal(authority.heartbeat, workload_id, claim.fence, now=50_000, extend_ms=60_000)
    assert refused.code == "WORKLOAD_TIMED_OUT"
    assert refused.details == {"deadline": "overall", "deadline_at": 12_000}
    assert authority.get(workload_id).state == "DEAD_LETTER"


def test_the_sweep_times_out_a_workload_admitted_under_the_deadline_contract(
    authority: Authority, store: Store
) -> None:
    workload_id, _ = _versioned(authority, store, contract_version=2)
    assert authority.enforce_deadlines(1_000_000) == [workload_id]
