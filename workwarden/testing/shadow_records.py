"""The shadow model's records: what it knows of a workload, and what it predicts of a call.

Plain frozen dataclasses, written apart from the core's models like the rest
of the shadow model (`workwarden.testing.shadow`): the plan a workload was
admitted with, the lease a worker holds, the recorded result and failure
reports, the model's view of one committed workload, and the `Outcome` the
model predicts for one call.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "FailureReport",
    "Lease",
    "Outcome",
    "ResultReport",
    "ShadowPlan",
    "ShadowWorkload",
]


@dataclass(frozen=True, slots=True)
class ShadowPlan:
    """What a workload was admitted with, as far as the model's rules need it.

    `timeouts` lists the deadlines that are set, as (kind, milliseconds);
    `request` is anything that tells two admission requests apart (a replay
    must be equal to the original).
    """

    priority: int
    capabilities: tuple[str, ...]
    max_attempts: int
    initial_delay_ms: int
    max_delay_ms: int
    backoff: str
    retry_on: tuple[str, ...]
    timeouts: tuple[tuple[str, int], ...]
    not_before: int | None
    request: Any


@dataclass(frozen=True, slots=True)
class Lease:
    """The claim a worker holds: its fence (worker, claim id, token) and its times."""

    worker: str
    claim_id: str
    token: int
    claimed_at: int
    expires_at: int
    last_heartbeat: int


@dataclass(frozen=True, slots=True)
class ResultReport:
    """A recorded completion: the result id and the report that recorded it."""

    result_id: str
    worker: str
    claim_id: str
    token: int
    output: Any


@dataclass(frozen=True, slots=True)
class FailureReport:
    """A recorded failure report (the effect as recorded: `none` is implied in CLAIMED)."""

    worker: str
    claim_id: str
    token: int
    kind: str
    error: str
    effect: str | None


@dataclass(frozen=True, slots=True)
class ShadowWorkload:
    """The model's view of one committed workload."""

    plan: ShadowPlan
    created_at: int
    state: str = "READY"
    version: int = 1
    token: int = 0
    attempts: int = 0
    rearms: int = 0
    retries: int = 0
    eligible_at: int | None = None
    ready_since: int = 0
    started_at: int | None = None
    lease: Lease | None = None
    result: ResultReport | None = None
    failures: tuple[FailureReport, ...] = ()
    #: The fence (worker, claim id, token) that confirmed the cancellation, once one did.
    confirmed: tuple[str, str, int] | None = None

    @property
    def budget(self) -> int:
        """Claims allowed in all: max_attempts plus one per operator re-arm."""
        return self.plan.max_attempts + self.rearms

    def timeout(self, kind: str) -> int | None:
        """The workload's `kind` timeout in milliseconds, or None when unset."""
        for name, value in self.plan.timeouts:
            if name == kind:
                return value
        return None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the model predicts for one call on one workload.

    `code` is the refusal (None: the call succeeds). `after` is the workload
    as the call commits it (None: the call writes nothing). `state` is the
    state the reply reports, `created` whether an admission creates the
    workload, `claimed` whether a claim was granted, `changed` whether a sweep
    step changed the workload.
    """

    key: str | None
    code: str | None = None
    after: ShadowWorkload | None = None
    state: str | None = None
    created: bool = False
    claimed: bool = False
    changed: bool = False

    @property
    def writes(self) -> bool:
        """Does committing this call write a new version?"""
        return self.after is not None

    def with_claim_id(self, claim_id: str) -> Outcome:
        """The outcome of a granted claim, with the claim id the authority derived for it."""
        if self.after is None or self.after.lease is None:
            return self
        lease = replace(self.after.lease, claim_id=claim_id)
        return replace(self, after=replace(self.after, lease=lease))

    def describe(self) -> str:
        """A short description for failure messages."""
        what = "success" if self.code is None else self.code
        return f"{what} ({'writes' if self.writes else 'writes nothing'})"
