"""Failure reports and retries: what a worker's report records, how the policy decides.

Counterparts of the seeds' failure-report tests (`a_worker_reports_failure_...`,
`failure_policy_decides_retry_...`, `failure_racing_completion_...`) and of the
retry-eligibility test (`retry_sets_next_eligibility_...`), in milliseconds:
backoff delays are exact, never rounded to seconds.
"""

from __future__ import annotations

from typing import Any

import pytest

from support import CAPS, request
from workwarden.statemachine import (
    Authority,
    Claim,
    CompleteCommand,
    FailCommand,
    RetryPolicy,
    Workload,
    WorkloadError,
)
from workwarden.statemachine.models import DEFAULT_RETRY_ON
from workwarden.storage import Store

ADMITTED = 10_000
CLAIMED = 11_000
LEASE = 10_000


def admit(authority: Authority, **changes: Any) -> str:
    """Admit the fixture request with `changes` at ADMITTED; its workload id."""
    return authority.admit(request(**changes), now=ADMITTED).workload.workload_id


def claimed(authority: Authority, **changes: Any) -> tuple[str, Claim]:
    """Admit with `changes` and claim it for worker `a` at CLAIMED."""
    workload_id = admit(authority, **changes)
    return workload_id, authority.claim(workload_id, "a", CAPS, now=CLAIMED, lease_ms=LEASE)


def running(authority: Authority, **changes: Any) -> tuple[str, Claim]:
    """Admit, claim for worker `a` and start the attempt at CLAIMED + 1000."""
    workload_id, claim = claimed(authority, **changes)
    authority.start(workload_id, claim.fence, now=CLAIMED + 1_000)
    return workload_id, claim


def version(store: Store, workload_id: str) -> int:
    doc = store.read(workload_id)
    assert doc is not None
    return doc.version


def refusal(call: Any, *args: Any, **kwargs: Any) -> WorkloadError:
    with pytest.raises(WorkloadError) as caught:
        call(*args, **kwargs)
    return caught.value


def failed_event_evidence(workload: Workload) -> dict[str, str]:
    (event,) = [e for e in workload.execution_history if e.to == "FAILED"]
    return event.evidence


# -- a failure report and its replay ------------------------------------------


def test_a_worker_that_could_not_start_reports_a_failure_with_no_effect(
    authority: Authority,
) -> None:
    workload_id, claim = claimed(authority)
    state = authority.fail(workload_id, claim.fence, "transient_connection", "no route", 12_000)
    assert state == "READY"
    workload = authority.get(workload_id)
    evidence = failed_event_evidence(workload)
    assert evidence["effect"] == "none"
    assert evidence["failure_kind"] == "transient_connection"
    assert evidence["attempt_id"] == workload.attempts[0].attempt_id
    assert workload.execution_history[-2].from_state == "CLAIMED"
    assert workload.execution_history[-1].evidence["decision"] == "retry"
    assert workload.attempts[0].status == "FAILED"
    assert workload.attempts[0].error == "no route"
    assert workload.last_failure == "transient_connection: no route"
    assert workload.current_claim is None


def test_the_identical_failure_report_repeated_replays_its_outcome_and_commits_nothing(
    authority: Authority, store: Store
) -> None:
    workload_id, claim = claimed(authority)
    authority.fail(workload_id, claim.fence, "transient_connection", "no route", 12_000)
    before = version(store, workload_id)
    audit_before = len(store.audit_log())
    assert (
        authority.fail(workload_id, claim.fence, "transient_connection", "no route", 13_000)
        == "READY"
    )
    # Naming the effect that was implied is the same report.
    assert (
        authority.fail(
            workload_id, claim.fence, "transient_connection", "no route", 13_000, effect="none"
        )
        == "READY"
    )
    assert version(store, workload_id) == before
    assert len(store.audit_log()) == audit_before


@pytest.mark.parametrize(
    ("kind", "error", "effect"),
    [
        ("timeout", "other", None),
        ("transient_connection", "another error text", None),
        ("transient_connection", "no route", "unknown"),
    ],
)
def test_a_different_report_from_an_attempt_that_already_failed_is_claim_invalid(
    authority: Authority, store: Store, kind: str, error: str, effect: str | None
) -> None:
    workload_id, claim = claimed(authority)
    authority.fail(workload_id, claim.fence, "transient_connection", "no route", 12_000)
    before = version(store, workload_id)
    refused = refusal(authority.fail, workload_id, claim.fence, kind, error, 13_000, effect=effect)
    assert refused.code == "WORKLOAD_CLAIM_INVALID"
    assert version(store, workload_id) == before


def test_a_completion_after_a_failure_is_claim_invalid_and_the_failure_stands(
    authority: Authority,
) -> None:
    workload_id, claim = claimed(authority)
    authority.fail(workload_id, claim.fence, "transient_connection", "no route", 12_000)
    refused = refusal(authority.complete, workload_id, claim.fence, "r", None, 13_000)
    assert refused.code == "WORKLOAD_CLAIM_INVALID"
    workload = authority.get(workload_id)
    assert workload.result is None
    assert workload.attempts[0].status == "FAILED"


def test_another_workers_claim_fences_the_failed_attempt_out(authority: Authority) -> None:
    workload_id, claim = claimed(authority)
    authority.fail(workload_id, claim.fence, "transient_connection", "no route", 12_000)
    successor = authority.claim(workload_id, "b", CAPS, now=14_000, lease_ms=LEASE)
    refused = refusal(authority.fail, workload_id, claim.fence, "timeout", "late", 15_000)
    assert refused.code == "WORKLOAD_STALE_FENCE"
    current = authority.get(workload_id).current_claim
    assert current is not None
    assert current.claim_id == successor.claim_id
    assert current.worker_id == "b"


# -- the failure policy's decisions -------------------------------------------


def test_a_failure_kind_the_policy_does_not_retry_dead_letters(authority: Authority) -> None:
    workload_id, claim = running(authority)
    state = authority.fail(
        workload_id, claim.fence, "validation", "bad input", 13_000, effect="none"
    )
    assert state == "DEAD_LETTER"
    workload = authority.get(workload_id)
    assert workload.state == "DEAD_LETTER"
    assert workload.execution_history[-1].evidence["decision"] == "failure_kind_not_retryable"
    assert failed_event_evidence(workload)["effect"] == "none"


def test_an_unknown_effect_is_not_retried_when_the_policy_does_not_retry_worker_failure(
    authority: Authority,
) -> None:
    policy = RetryPolicy(retry_on=("timeout", "transient_connection"))
    workload_id, claim = running(authority, retry_policy=policy)
    state = authority.fail(
        workload_id, claim.fence, "timeout", "charge sent, no answer", 13_000, effect="unknown"
    )
    assert state == "DEAD_LETTER"
    workload = authority.get(workload_id)
    assert workload.execution_history[-1].evidence["decision"] == "effect_unknown_not_retryable"
    assert failed_event_evidence(workload)["effect"] == "unknown"


@pytest.mark.parametrize("kind", ["validation", "timeout", "worker_failure"])
def test_an_unknown_effect_is_retried_whatever_the_kind_when_worker_failure_is_retried(
    authority: Authority, kind: str
) -> None:
    workload_id, claim = running(authority)
    assert authority.fail(workload_id, claim.fence, kind, "x", 13_000, effect="unknown") == "READY"
    workload = authority.get(workload_id)
    assert workload.execution_history[-1].evidence["decision"] == "retry"
    assert workload.next_attempt_at == 14_000


def test_a_started_attempt_reporting_no_effect_records_none_and_is_decided_by_kind(
    authority: Authority,
) -> None:
    workload_id, claim = running(authority)
    assert authority.fail(workload_id, claim.fence, "timeout", "slow", 13_000) == "READY"
    workload = authority.get(workload_id)
    evidence = failed_event_evidence(workload)
    assert "effect" not in evidence, "a started attempt's effect is only what it reports"
    assert workload.execution_history[-1].evidence["decision"] == "retry"


def test_the_attempt_budget_bounds_failure_retries(authority: Authority) -> None:
    workload_id, claim = claimed(
        authority, retry_policy=RetryPolicy(max_attempts=2, retry_on=DEFAULT_RETRY_ON)
    )
    assert authority.fail(workload_id, claim.fence, "timeout", "x", 12_000) == "READY"
    eligible = authority.get(workload_id).next_attempt_at
    assert eligible == 13_000
    claim = authority.claim(workload_id, "a", CAPS, now=eligible, lease_ms=LEASE)
    assert authority.fail(workload_id, claim.fence, "timeout", "x", eligible) == "DEAD_LETTER"
    workload = authority.get(workload_id)
    assert workload.execution_history[-1].evidence["decision"] == "attempt_budget_exhausted"
    assert workload.attempt_count == 2
    assert [attempt.status for attempt in workload.attempts] == ["FAILED", "FAILED"]


def test_a_single_attempt_policy_dead_letters_a_retryable_failure(authority: Authority) -> None:
    workload_id, claim = running(
        authority, retry_policy=RetryPolicy(max_attempts=1, retry_on=DEFAULT_RETRY_ON)
    )
    assert authority.fail(workload_id, claim.fence, "worker_failure", "crashed", 13_000) == (
        "DEAD_LETTER"
    )
    workload = authority.get(workload_id)
    assert workload.execution_history[-1].evidence["decision"] == "attempt_budget_exhausted"
    refused = refusal(authority.claim, workload_id, "b", CAPS, now=20_000, lease_ms=LEASE)
    assert refused.code == "WORKLOAD_NOT_READY"


def test_an_effect_other_than_none_or_unknown_is_invalid_and_changes_nothing(
    authority: Authority, store: Store
) -> None:
    workload_id, claim = running(authority)
    before = version(store, workload_id)
    refused = refusal(authority.fail, workload_id, claim.fence, "x", "y", 14_000, effect="maybe")
    assert refused.code == "WORKLOAD_INVALID"
    assert version(store, workload_id) == before
    assert authority.get(workload_id).state == "RUNNING"


def test_every_policy_decided_failure_event_records_its_decision(authority: Authority) -> None:
    workload_id, claim = running(authority)
    authority.fail(workload_id, claim.fence, "timeout", "x", 13_000)
    workload = authority.get(workload_id)
    decided = workload.execution_history[-1]
    assert decided.from_state == "FAILED"
    assert decided.actor_class == "system"
    assert decided.evidence == {"decision": "retry"}


# -- a failure racing a completion --------------------------------------------


@pytest.mark.parametrize("completion_first", [True, False])
def test_a_failure_racing_a_completion_commits_exactly_one_outcome(
    authority: Authority, completion_first: bool
) -> None:
    workload_id, claim = running(authority)

    def complete() -> None:
        authority.complete(workload_id, claim.fence, "r", None, 13_000)

    def fail() -> None:
        authority.fail(workload_id, claim.fence, "timeout", "x", 13_000)

    first, second = (complete, fail) if completion_first else (fail, complete)
    first()
    assert refusal(second).code == "WORKLOAD_CLAIM_INVALID"
    workload = authority.get(workload_id)
    assert workload.state == ("SUCCEEDED" if completion_first else "READY")
    assert len(workload.attempts) == 1
    assert workload.attempts[0].status == ("SUCCEEDED" if completion_first else "FAILED")
    assert (workload.result is not None) == completion_first
    outcomes = [e.to for e in workload.execution_history if e.to in ("SUCCEEDED", "FAILED")]
    assert outcomes == (["SUCCEEDED"] if completion_first else ["FAILED"])


@pytest.mark.parametrize("completion_first", [True, False])
def test_a_failure_and_a_completion_decided_on_the_same_version_commit_one_outcome(
    authority: Authority, second_authority: Authority, store: Store, completion_first: bool
) -> None:
    workload_id, claim = running(authority)
    completion = authority.prepare(
        CompleteCommand(workload_id=workload_id, fence=claim.fence, result_id="r", output=None),
        13_000,
    )
    failure = second_authority.prepare(
        FailCommand(workload_id=workload_id, fence=claim.fence, kind="timeout", error="x"), 13_000
    )
    winner, loser = (completion, failure) if completion_first else (failure, completion)
    winner.commit()
    committed = version(store, workload_id)
    with pytest.raises(WorkloadError) as caught:
        loser.commit()
    assert caught.value.code == "WORKLOAD_CONFLICT"
    assert version(store, workload_id) == committed
    # Decided again on the committed version, the loser's report has no claim left.
    if completion_first:
        again = refusal(second_authority.fail, workload_id, claim.fence, "timeout", "x", 13_000)
    else:
        again = refusal(authority.complete, workload_id, claim.fence, "r", None, 13_000)
    assert again.code == "WORKLOAD_CLAIM_INVALID"
    workload = authority.get(workload_id)
    assert workload.state == ("SUCCEEDED" if completion_first else "READY")
    assert len(workload.attempts) == 1


# -- retries and backoff -------------------------------------------------------


def _fail_and_reclaim(
    authority: Authority, workload_id: str, claim: Claim, now: int
) -> tuple[int, Claim]:
    """Fail the claimed attempt at `now`; claim the retry at its eligibility instant."""
    assert authority.fail(workload_id, claim.fence, "timeout", "x", now) == "READY"
    eligible = authority.get(workload_id).next_attempt_at
    assert eligible is not None
    return eligible - now, authority.claim(workload_id, "a", CAPS, now=eligible, lease_ms=LEASE)


def test_exponential_backoff_doubles_each_delay_exactly_and_is_capped(
    authority: Authority,
) -> None:
    policy = RetryPolicy(
        max_attempts=6,
        initial_delay_ms=1_500,
        max_delay_ms=7_000,
        backoff="exponential",
        retry_on=DEFAULT_RETRY_ON,
    )
    workload_id, claim = claimed(authority, retry_policy=policy)
    now = 12_345
    delays = []
    for _ in range(5):
        delay, claim = _fail_and_reclaim(authority, workload_id, claim, now)
        delays.append(delay)
        now = claim.claimed_at + 7
    assert delays == [1_500, 3_000, 6_000, 7_000, 7_000]


def test_fixed_backoff_waits_the_initial_delay_every_time(authority: Authority) -> None:
    policy = RetryPolicy(
        max_attempts=4,
        initial_delay_ms=250,
        max_delay_ms=1_000,
        backoff="fixed",
        retry_on=DEFAULT_RETRY_ON,
    )
    workload_id, claim = claimed(authority, retry_policy=policy)
    now = 11_001
    delays = []
    for _ in range(3):
        delay, claim = _fail_and_reclaim(authority, workload_id, claim, now)
        delays.append(delay)
        now = claim.claimed_at + 3
    assert delays == [250, 250, 250]


def test_a_retry_pushes_eligibility_into_the_future_and_is_claimable_exactly_then(
    authority: Authority,
) -> None:
    workload_id = authority.admit(request(not_before=2_000), now=1_000).workload.workload_id
    first = authority.claim(workload_id, "worker-a", CAPS, now=2_000, lease_ms=LEASE)
    authority.start(workload_id, first.fence, now=2_001)
    state = authority.fail(workload_id, first.fence, "timeout", "upstream did not answer", 2_002)
    assert state == "READY"
    eligible = authority.get(workload_id).next_attempt_at
    assert eligible == 3_002, "initial_delay_ms 1000 after the failure at 2002, exactly"

    early = refusal(
        authority.claim, workload_id, "worker-b", CAPS, now=eligible - 1, lease_ms=LEASE
    )
    assert early.code == "WORKLOAD_NOT_YET_ELIGIBLE"
    assert early.details is not None
    assert early.details["eligible_at"] == eligible
    assert authority.get(workload_id).attempt_count == 1

    second = authority.claim(workload_id, "worker-b", CAPS, now=eligible, lease_ms=LEASE)
    assert second.fencing_token > first.fencing_token

    # The first attempt cannot land a result after the retry was handed on.
    stale = refusal(authority.complete, workload_id, first.fence, "stale", None, eligible)
    assert stale.code == "WORKLOAD_STALE_FENCE"
    workload = authority.get(workload_id)
    assert workload.attempt_count == 2
    assert workload.result is None
