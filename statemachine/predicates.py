"""The named predicates policies decide on, and the anchors deadlines run from.

Each is a small pure function, registered by name. The spec refers to them by
these names; loading a spec that names one not registered here fails, with the
field and the valid names. Nothing here reads a clock or a store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workwarden.statemachine.models import Workload

__all__ = [
    "ANCHORS",
    "PREDICATES",
    "Facts",
    "Roles",
    "attempt_budget",
    "operator_retries",
]


@dataclass(frozen=True, slots=True)
class Roles:
    """The states by what they are for, derived from the spec's table (`Spec.roles`).

    The core and the predicates name no state: they ask which states play a
    role. `initial`: where a workload is created (the admitting operation's
    edge starts there). `queued`: states of kind queued. `claimed`: the
    active states a claim leads into. `succeeded`: the states a recorded
    result leads into. `cancelling`: the active states a cancellation leads
    into (the worker is asked to confirm it).
    """

    initial: str = ""
    queued: frozenset[str] = frozenset()
    claimed: frozenset[str] = frozenset()
    succeeded: frozenset[str] = frozenset()
    cancelling: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Facts:
    """What a policy decides on: the committed workload, the spec's roles, the report."""

    workload: Workload
    roles: Roles
    failure_kind: str | None = None
    effect: str | None = None
    deadline_bounds: str | None = None


def operator_retries(workload: Workload) -> int:
    """Operator re-arms recorded in the workload's own history."""
    return sum(
        1 for event in workload.execution_history if event.evidence.get("retry") == "operator"
    )


def attempt_budget(workload: Workload) -> int:
    """Claims the workload may have in all: `max_attempts` plus one per operator re-arm."""
    return workload.retry_policy.max_attempts + operator_retries(workload)


def _effect_unknown(facts: Facts) -> bool:
    return facts.effect == "unknown"


def _retries_worker_failure(facts: Facts) -> bool:
    return "worker_failure" in facts.workload.retry_policy.retry_on


def _retries_failure_kind(facts: Facts) -> bool:
    return (
        facts.failure_kind is not None
        and facts.failure_kind in facts.workload.retry_policy.retry_on
    )


def _retries_timeout(facts: Facts) -> bool:
    return "timeout" in facts.workload.retry_policy.retry_on


def _budget_exhausted(facts: Facts) -> bool:
    return facts.workload.attempt_count >= attempt_budget(facts.workload)


def _cancellation_requested(facts: Facts) -> bool:
    return facts.workload.state in facts.roles.cancelling


def _deadline_bounds_work(facts: Facts) -> bool:
    return facts.deadline_bounds == "work"


#: Predicate name -> (function, one-line meaning). Policies name these.
PREDICATES: dict[str, tuple[Callable[[Facts], bool], str]] = {
    "effect_unknown": (_effect_unknown, "the failure report says an effect may have happened"),
    "retries_worker_failure": (
        _retries_worker_failure,
        "the workload's retry policy retries `worker_failure`",
    ),
    "retries_failure_kind": (
        _retries_failure_kind,
        "the workload's retry policy retries the reported failure kind",
    ),
    "retries_timeout": (_retries_timeout, "the workload's retry policy retries `timeout`"),
    "budget_exhausted": (
        _budget_exhausted,
        "attempt_count has reached the attempt budget (max_attempts + operator re-arms)",
    ),
    "cancellation_requested": (
        _cancellation_requested,
        "the workload is in a state a cancellation of active work leads into"
        " (CANCELLATION_REQUESTED in the shipped spec)",
    ),
    "deadline_bounds_work": (
        _deadline_bounds_work,
        "the deadline that fell bounds the work, not one attempt",
    ),
}


def _admitted(workload: Workload, roles: Roles) -> int | None:
    return workload.created_at


def _ready_or_eligible(workload: Workload, roles: Roles) -> int | None:
    ready_since = workload.created_at
    for event in reversed(workload.execution_history):
        if event.to in roles.queued:
            ready_since = event.at
            break
    if workload.next_attempt_at is not None:
        return max(ready_since, workload.next_attempt_at)
    return ready_since


def _claimed(workload: Workload, roles: Roles) -> int | None:
    claim = workload.current_claim
    return claim.claimed_at if claim is not None else None


def _started(workload: Workload, roles: Roles) -> int | None:
    return workload.attempts[-1].started_at if workload.attempts else None


def _last_heartbeat(workload: Workload, roles: Roles) -> int | None:
    claim = workload.current_claim
    return claim.last_heartbeat if claim is not None else None


#: Anchor name -> (function, one-line meaning). Deadlines name these.
ANCHORS: dict[str, tuple[Callable[[Workload, Roles], int | None], str]] = {
    "admitted": (_admitted, "the admission instant (created_at)"),
    "ready_or_eligible": (
        _ready_or_eligible,
        "the last time it entered a queued state, or its eligibility instant if later",
    ),
    "claimed": (_claimed, "the current claim's instant"),
    "started": (_started, "the current attempt's start"),
    "last_heartbeat": (_last_heartbeat, "the current claim's last heartbeat (or its claim)"),
}
