"""The scheduler: `claim_next` hands out the best claimable work of one tenant and application.

Counterparts of the seeds' `scheduler_respects_dependencies_and_tenant_application_isolation`
and `the_scheduler_skips_ineligible_work_rather_than_failing_on_it`, extended to what
the seeds' scheduler left implicit: ordering, capabilities, work a claim dead-letters or
times out, and dependencies across tenants.
"""

from __future__ import annotations

from typing import Any

from support import CAPS, overwrite, request
from workwarden.statemachine import Authority, Dependency, Timeouts
from workwarden.storage import Store

LEASE = 10_000


def admit(authority: Authority, key: str, now: int = 10_000, **changes: Any) -> str:
    return authority.admit(request(idempotency_key=key, **changes), now=now).workload.workload_id


def next_id(authority: Authority, now: int, tenant: str = "t", application: str = "app") -> str:
    claim = authority.claim_next(tenant, application, "worker", CAPS, now=now, lease_ms=LEASE)
    assert claim is not None
    return claim.workload_id


def nothing_next(
    authority: Authority, now: int, tenant: str = "t", application: str = "app"
) -> bool:
    return authority.claim_next(tenant, application, "worker", CAPS, now, LEASE) is None


def succeed(authority: Authority, workload_id: str, now: int) -> None:
    claim = authority.claim(workload_id, "w", CAPS, now=now, lease_ms=LEASE)
    authority.start(workload_id, claim.fence, now=now)
    authority.complete(workload_id, claim.fence, f"result-{workload_id}", {"ok": True}, now)


def test_the_highest_priority_is_claimed_first_then_the_oldest(authority: Authority) -> None:
    low_old = admit(authority, "low-old", now=10_000, priority=1)
    high_new = admit(authority, "high-new", now=10_300, priority=5)
    high_old = admit(authority, "high-old", now=10_200, priority=5)
    negative = admit(authority, "negative", now=10_000, priority=-3)
    order = [next_id(authority, 11_000) for _ in range(4)]
    assert order == [high_old, high_new, low_old, negative]
    assert nothing_next(authority, 11_000)


def test_the_claim_it_returns_is_a_live_claim_for_the_worker(authority: Authority) -> None:
    workload_id = admit(authority, "one")
    claim = authority.claim_next("t", "app", "worker-7", CAPS, now=11_000, lease_ms=LEASE)
    assert claim is not None
    assert claim.workload_id == workload_id
    assert claim.worker_id == "worker-7"
    assert claim.expires_at == 21_000
    authority.start(workload_id, claim.fence, now=11_500)
    workload = authority.get(workload_id)
    assert workload.state == "RUNNING"
    assert workload.attempt_count == 1


def test_the_scheduler_skips_work_that_is_not_yet_eligible(authority: Authority) -> None:
    early = admit(authority, "early", priority=9, not_before=19_000)
    ready = admit(authority, "ready")
    assert next_id(authority, 11_000) == ready
    assert authority.get(early).state == "READY"
    assert authority.get(early).attempt_count == 0
    assert nothing_next(authority, 18_999)
    assert next_id(authority, 19_000) == early


def test_the_scheduler_skips_work_needing_a_capability_the_worker_lacks(
    authority: Authority,
) -> None:
    needs_sms = admit(authority, "sms", priority=9, capability_snapshot=("email:send", "sms:send"))
    plain = admit(authority, "plain")
    assert next_id(authority, 11_000) == plain
    assert nothing_next(authority, 11_000)
    assert authority.get(needs_sms).state == "READY"
    both = authority.claim_next("t", "app", "w", ("email:send", "sms:send"), 11_000, LEASE)
    assert both is not None
    assert both.workload_id == needs_sms


def test_the_scheduler_waits_for_dependencies_and_claims_the_child_once_they_are_met(
    authority: Authority,
) -> None:
    parent = admit(authority, "parent")
    child = admit(authority, "child", priority=9, dependencies=(Dependency(workload_id=parent),))
    assert next_id(authority, 11_000) == parent, "the child outranks it but waits on it"
    # Claimed, running: not yet SUCCEEDED, so the child still waits.
    assert nothing_next(authority, 11_000)
    parent_claim = authority.get(parent).current_claim
    assert parent_claim is not None
    authority.start(parent, parent_claim.fence, now=11_500)
    assert nothing_next(authority, 11_600)
    authority.complete(parent, parent_claim.fence, "parent-result", {"ok": True}, 12_000)
    assert next_id(authority, 12_000) == child


def test_a_dependency_names_the_state_it_waits_for(authority: Authority) -> None:
    cancelled = admit(authority, "cancelled-parent")
    succeeded = admit(authority, "succeeded-parent", now=10_001)
    authority.cancel(cancelled, "user", 10_500)
    succeed(authority, succeeded, 11_000)
    on_cancelled = admit(
        authority,
        "after-cancel",
        dependencies=(Dependency(workload_id=cancelled, required_state="CANCELLED"),),
    )
    on_succeeded = admit(
        authority,
        "cleanup",
        now=10_001,
        dependencies=(Dependency(workload_id=succeeded, required_state="CANCELLED"),),
    )
    assert next_id(authority, 12_000) == on_cancelled
    assert nothing_next(authority, 12_000), "SUCCEEDED is not the CANCELLED it waits for"
    assert authority.get(on_succeeded).state == "READY"


def test_a_dependency_on_a_missing_workload_is_never_met(authority: Authority) -> None:
    admit(authority, "orphan", dependencies=(Dependency(workload_id="no-such-workload"),))
    assert nothing_next(authority, 11_000)


def test_a_dependency_on_another_tenants_workload_never_counts_as_met(
    authority: Authority,
) -> None:
    foreign = admit(authority, "foreign", tenant_id="other")
    succeed(authority, foreign, 11_000)
    assert authority.get(foreign).state == "SUCCEEDED"
    child = admit(authority, "child", dependencies=(Dependency(workload_id=foreign),))
    assert nothing_next(authority, 12_000)
    assert authority.get(child).state == "READY"
    assert authority.get(child).attempt_count == 0


def test_a_dependency_on_another_applications_workload_never_counts_as_met(
    authority: Authority,
) -> None:
    foreign = admit(authority, "foreign", application_id="billing")
    succeed(authority, foreign, 11_000)
    admit(authority, "child", dependencies=(Dependency(workload_id=foreign),))
    assert nothing_next(authority, 12_000)


def test_the_scheduler_never_returns_another_tenants_or_applications_work(
    authority: Authority,
) -> None:
    theirs = admit(authority, "theirs", tenant_id="other", priority=9)
    billing = admit(authority, "billing", application_id="billing", priority=9)
    ours = admit(authority, "ours")
    assert next_id(authority, 11_000) == ours
    assert nothing_next(authority, 11_000)
    assert authority.get(theirs).state == "READY"
    assert authority.get(billing).state == "READY"
    assert next_id(authority, 11_000, tenant="other") == theirs
    assert next_id(authority, 11_000, application="billing") == billing
    assert nothing_next(authority, 11_000, tenant="nobody")


def test_the_scheduler_returns_none_when_nothing_is_claimable(authority: Authority) -> None:
    assert nothing_next(authority, 11_000)
    done = admit(authority, "done")
    succeed(authority, done, 11_000)
    cancelled = admit(authority, "cancelled", now=10_001)
    authority.cancel(cancelled, "user", 11_000)
    held = admit(authority, "held", now=10_002)
    authority.claim(held, "other-worker", CAPS, now=11_000, lease_ms=LEASE)
    assert nothing_next(authority, 12_000)


def test_an_exhausted_candidate_is_dead_lettered_and_skipped_without_an_error(
    authority: Authority, store: Store
) -> None:
    exhausted = admit(authority, "exhausted", priority=9)
    overwrite(store, authority, exhausted, attempt_count=3)
    fine = admit(authority, "fine")
    assert next_id(authority, 11_000) == fine
    workload = authority.get(exhausted)
    assert workload.state == "DEAD_LETTER"
    assert workload.execution_history[-1].evidence["decision"] == "attempt_budget_exhausted"
    assert workload.attempt_count == 3
    assert workload.attempts == []


def test_a_candidate_whose_deadline_passed_is_timed_out_and_skipped_without_an_error(
    authority: Authority,
) -> None:
    late = admit(authority, "late", priority=9, timeouts=Timeouts(queue_ms=500))
    fine = admit(authority, "fine")
    assert next_id(authority, 11_000) == fine
    workload = authority.get(late)
    assert workload.state == "DEAD_LETTER"
    assert workload.execution_history[-1].evidence["decision"] == "deadline_not_retryable"
    assert workload.attempts == []


def test_only_skipped_candidates_leave_the_scheduler_with_none(
    authority: Authority, store: Store
) -> None:
    exhausted = admit(authority, "exhausted")
    overwrite(store, authority, exhausted, attempt_count=5)
    late = admit(authority, "late", timeouts=Timeouts(queue_ms=500))
    assert nothing_next(authority, 11_000)
    assert authority.get(exhausted).state == "DEAD_LETTER"
    assert authority.get(late).state == "DEAD_LETTER"


def test_two_schedulers_over_one_store_hand_out_each_workload_once(
    authority: Authority, second_authority: Authority
) -> None:
    ids = {admit(authority, f"k{n}", now=10_000 + n) for n in range(3)}
    handed = [
        next_id(authority, 11_000),
        next_id(second_authority, 11_000),
        next_id(second_authority, 11_000),
    ]
    assert sorted(handed) == sorted(ids)
    assert nothing_next(authority, 11_000)
    assert nothing_next(second_authority, 11_000)
    assert all(authority.get(i).attempt_count == 1 for i in ids)
