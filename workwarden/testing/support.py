"""What the stateful suite is built from: plans, workers, held calls, a recording store.

`workwarden.testing` drives an authority with these: the workload plans it
admits (small random retry policies, timeouts and eligibility, as a
Hypothesis strategy), the signed grants of its requesters, the workers and
the claims they hold or have forgotten, the prepared calls it holds back,
the store wrapper that keeps every committed version for the write
invariants, the refusals each operation may give when no shadow model
predicts them exactly, and how a run reports a failed check (`CheckFailed`)
and what it reached (`Coverage`).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from typing import Any, TypeAlias

try:
    import hypothesis  # noqa: F401  (the stateful suite is built on it)
except ImportError:  # pragma: no cover - depends on the environment
    raise ImportError(
        "workwarden.testing needs Hypothesis: pip install 'workwarden[test]'"
    ) from None

from hypothesis import strategies as st

from workwarden.statemachine import errors
from workwarden.statemachine.authority import Prepared
from workwarden.statemachine.grants import Grant, GrantSigner, GrantVerifier, Subject
from workwarden.statemachine.models import CreateWorkload, Fence, RetryPolicy, Timeouts
from workwarden.statemachine.spec import Spec
from workwarden.storage.base import AuditRecord, IndexFields, Store
from workwarden.storage.forwarding import ForwardingStore
from workwarden.testing.shadow import Outcome, ShadowPlan

__all__ = [
    "AGENTS",
    "ALLOWED",
    "APPLICATION",
    "CAPABILITY_SETS",
    "DEADLINE_KINDS",
    "FAILURE_KINDS",
    "FENCED_REFUSALS",
    "GIVE_UP",
    "GRANTS",
    "HOLDER_CALLS",
    "KEYS",
    "LEASES",
    "MAX_HELD",
    "MAX_LIVE",
    "OPERATOR_TARGETS",
    "RACED",
    "RACES",
    "REPLAYS",
    "RETRYABLE",
    "SCOPES",
    "START",
    "SWEEPS",
    "TENANT",
    "VERIFIER",
    "WORKER_CALLS",
    "CheckFailed",
    "Coverage",
    "Held",
    "RecordingStore",
    "StoreFactory",
    "Worker",
    "WorkloadPlan",
    "fence_tuple",
    "open_store",
    "same_rules",
    "shadow_plan",
    "workload_plans",
]

StoreFactory: TypeAlias = Callable[[], "Store | AbstractContextManager[Store]"]
"""Makes a fresh, empty store: the store itself, or a context manager yielding it."""

TENANT = "tenant-1"
APPLICATION = "app-1"
AGENTS = ("agent-1", "agent-2")
KEYS = ("key-1", "key-2", "key-3", "key-4")
SCOPES: tuple[tuple[str, str], ...] = tuple(itertools.product(AGENTS, KEYS))
CAPABILITY_SETS: tuple[tuple[str, ...], ...] = (("email", "gpu"), ("email",), ())
FAILURE_KINDS = ("transient_connection", "worker_failure", "timeout", "invalid_input")
RETRYABLE = ("timeout", "transient_connection", "worker_failure")
DEADLINE_KINDS = ("overall", "queue", "claim", "execution", "heartbeat")
START = 1_000_000
MAX_LIVE = 3
LEASES = (1, 200, 1000, 5000)
SWEEPS = ("recover_expired", "enforce_deadlines")
REPLAYS = ("completion", "other output", "taken id", "failure")
WORKER_CALLS = ("start", "heartbeat", "checkpoint", "complete", "fail", "confirm_cancel")
RACES: tuple[tuple[str, str], ...] = (
    ("cancel", "recover_expired"),
    ("timeout", "recover_expired"),
    ("enforce_deadlines", "recover_expired"),
    ("heartbeat", "recover_expired"),
    ("complete", "enforce_deadlines"),
    ("cancel", "heartbeat"),
    ("heartbeat", "recover_expired"),
    ("recover_expired", "heartbeat"),
    ("complete", "enforce_deadlines"),
    ("enforce_deadlines", "complete"),
    ("cancel", "recover_expired"),
    ("timeout", "recover_expired"),
    ("recover_expired", "recover_expired"),
    ("enforce_deadlines", "recover_expired"),
    ("claim", "claim"),
    ("claim", "cancel"),
    ("fail", "cancel"),
    ("cancel", "complete"),
    ("checkpoint", "timeout"),
    ("heartbeat", "enforce_deadlines"),
    ("enforce_deadlines", "heartbeat"),
    ("cancel", "heartbeat"),
    ("enforce_deadlines", "enforce_deadlines"),
    ("retry", "cancel"),
)
"""The races `race` runs: (the call committed first, the call committed second).

Some are listed twice, so they come up twice as often: the three in which a
recovery's decision meets a write it never read (an operator's cancel or
timeout, a deadline's timeout), the two the boundary instant is about (a
heartbeat against the recovery of its lease, a completion against the
deadline sweep), and a heartbeat that loses to a cancel.
"""
HOLDER_CALLS = ("start", "heartbeat", "execution_context", "checkpoint", "confirm_cancel")
MAX_HELD = 3

_KEY_ID = "workwarden-testing"
_SECRET = b"the stateful suite's grant key.."
_SIGNER = GrantSigner(_KEY_ID, _SECRET)
VERIFIER = GrantVerifier({_KEY_ID: _SECRET})
GRANTS = {
    agent: _SIGNER.sign(
        Grant(
            id=f"grant-{agent}",
            issuer=Subject(kind="human", id="operator-1"),
            subject=Subject(kind="agent", id=agent),
            tenant_id=TENANT,
            application_id=APPLICATION,
            issued_at=0,
            expires_at=2**50,
        )
    )
    for agent in AGENTS
}

# What each operation may refuse with, when no shadow model predicts exactly.
FENCED_REFUSALS = frozenset(
    {errors.CLAIM_INVALID, errors.STALE_FENCE, errors.LEASE_EXPIRED, errors.TIMED_OUT}
)
ALLOWED: dict[str, frozenset[str]] = {
    "admit": frozenset({errors.IDEMPOTENCY_KEY_REUSED}),
    "claim": frozenset(
        {
            errors.TIMED_OUT,
            errors.ATTEMPTS_EXHAUSTED,
            errors.NOT_READY,
            errors.NOT_YET_ELIGIBLE,
            errors.CAPABILITY_DENIED,
        }
    ),
    "claim_next": frozenset(),
    "start": FENCED_REFUSALS | {errors.TRANSITION_DENIED},
    "heartbeat": FENCED_REFUSALS,
    "execution_context": FENCED_REFUSALS,
    "checkpoint": FENCED_REFUSALS | {errors.TRANSITION_DENIED},
    "complete": FENCED_REFUSALS
    | {errors.TRANSITION_DENIED, errors.RESULT_CONFLICT, errors.RESULT_DUPLICATE},
    "fail": FENCED_REFUSALS | {errors.TRANSITION_DENIED},
    "confirm_cancel": FENCED_REFUSALS | {errors.TRANSITION_DENIED},
    "cancel": frozenset({errors.TRANSITION_DENIED}),
    "timeout": frozenset({errors.TRANSITION_DENIED}),
    "retry": frozenset({errors.TRANSITION_DENIED, errors.RETRY_EXHAUSTED}),
    "recover_expired": frozenset(),
    "enforce_deadlines": frozenset(),
}
# Which workloads an operator call prefers (any, when none is in these states).
OPERATOR_TARGETS: dict[str, tuple[str, ...]] = {
    "cancel": ("CLAIMED", "RUNNING", "CHECKPOINTED"),
    "timeout": (),
    "retry": ("DEAD_LETTER",),
}
# The workloads races prefer: not at rest yet.
RACED = ("READY", "CLAIMED", "RUNNING", "CHECKPOINTED", "CANCELLATION_REQUESTED")
# A worker told one of these gives its claim up.
GIVE_UP = FENCED_REFUSALS


class CheckFailed(AssertionError):
    """A check of the stateful suite failed; `check` names it (an invariant or a machine check).

    The machine checks besides the invariants: `shadow_model` (the authority
    disagreed with the shadow model), `refusals_change_nothing`,
    `refusal_is_one_the_operation_gives` (when no shadow model runs),
    `refusal_is_in_the_catalogue` and `replies_are_consistent`.
    """

    def __init__(self, check: str, message: str) -> None:
        super().__init__(f"{check}: {message}")
        self.check = check


@dataclass
class Coverage:
    """What runs of the machine exercised: the table's edges and every call's outcomes.

    Pass one to `authority_machine(coverage=...)` to collect across runs
    (a run that never takes an edge, or never sees a refusal, tests less
    than it seems to).
    """

    edges: Counter[tuple[str, str]] = field(default_factory=Counter)
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    at_the_instant: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Refusals at the very instant the lease expired or the deadline fell, by (call, code)."""

    def edges_never_taken(self, spec: Spec) -> list[tuple[str, str]]:
        """The table's edges no committed history took, sorted."""
        return sorted(edge for edge in spec.edges if self.edges[edge] == 0)


@dataclass(frozen=True)
class WorkloadPlan:
    """What one admitted workload asks for: small retry policies, timeouts and eligibility.

    `timeouts` lists the deadlines that are set, as (kind, milliseconds);
    `not_before_ms` delays eligibility past the admission instant.
    """

    priority: int = 0
    capabilities: tuple[str, ...] = ()
    max_attempts: int = 2
    initial_delay_ms: int = 0
    max_delay_ms: int = 0
    backoff: str = "fixed"
    retry_on: tuple[str, ...] = RETRYABLE
    timeouts: tuple[tuple[str, int], ...] = ()
    not_before_ms: int | None = None
    payload: int = 0

    def request(self, agent: str, key: str, now: int) -> CreateWorkload:
        """The admission request of this plan, by `agent` under idempotency key `key`."""
        not_before = None if self.not_before_ms is None else now + self.not_before_ms
        return CreateWorkload(
            tenant_id=TENANT,
            application_id=APPLICATION,
            environment="test",
            definition_id="send",
            definition_revision="r1",
            trigger="stateful",
            input={"payload": self.payload},
            requested_by=Subject(kind="agent", id=agent),
            authorization_snapshot=GRANTS[agent],
            capability_snapshot=self.capabilities,
            priority=self.priority,
            idempotency_key=key,
            retry_policy=RetryPolicy(
                max_attempts=self.max_attempts,
                initial_delay_ms=self.initial_delay_ms,
                max_delay_ms=self.max_delay_ms,
                backoff="fixed" if self.backoff == "fixed" else "exponential",
                retry_on=self.retry_on,
            ),
            timeouts=Timeouts(**{f"{kind}_ms": ms for kind, ms in self.timeouts}),
            not_before=not_before,
        )


def shadow_plan(plan: WorkloadPlan, request: CreateWorkload) -> ShadowPlan:
    """What the shadow model needs to know of an admitted plan and its request."""
    return ShadowPlan(
        priority=plan.priority,
        capabilities=tuple(sorted(set(plan.capabilities))),
        max_attempts=plan.max_attempts,
        initial_delay_ms=plan.initial_delay_ms,
        max_delay_ms=plan.max_delay_ms,
        backoff=plan.backoff,
        retry_on=plan.retry_on,
        timeouts=plan.timeouts,
        not_before=request.not_before,
        request=request.model_dump_json(),
    )


@st.composite
def workload_plans(draw: st.DrawFn) -> WorkloadPlan:
    """Plans with small random retry policies, at most two timeouts, and eligibility."""
    initial = draw(st.sampled_from((0, 1, 40, 300)))
    kinds = draw(st.lists(st.sampled_from(DEADLINE_KINDS), unique=True, max_size=2))
    timeouts = tuple(
        (kind, draw(st.sampled_from((150, 1000, 5000)), label=kind))
        for kind in DEADLINE_KINDS
        if kind in kinds
    )
    return WorkloadPlan(
        priority=draw(st.integers(0, 2)),
        capabilities=draw(st.sampled_from(((), (), ("email",), ("email", "gpu")))),
        max_attempts=draw(st.sampled_from((2, 3, 1))),
        initial_delay_ms=initial,
        max_delay_ms=initial + draw(st.sampled_from((0, 100, 1000))),
        backoff=draw(st.sampled_from(("fixed", "exponential"))),
        retry_on=tuple(x for x in RETRYABLE if draw(st.sampled_from((True, True, False)), label=x)),
        timeouts=timeouts,
        not_before_ms=draw(st.sampled_from((None, None, None, None, 0, 50, 1500))),
        payload=draw(st.integers(0, 3)),
    )


class RecordingStore(ForwardingStore):
    """A store that passes every call through and keeps every document text it committed.

    The write invariants need each version a write replaced; a store keeps
    only the latest, so the machine records them on the way in.
    """

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.versions: dict[tuple[str, int], str] = {}

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        """Write through, and record the text under the version the store gave it."""
        version = super().write(key, document, index, expected_version, audit)
        self.versions[(key, version)] = document
        return version


@dataclass
class Worker:
    """A worker of the machine: the claims it holds, and the fences it has forgotten."""

    name: str
    capabilities: tuple[str, ...]
    held: dict[str, Fence] = field(default_factory=dict)
    old: list[tuple[str, Fence]] = field(default_factory=list)

    def drop(self, key: str) -> None:
        """Give up (or finish) the claim on `key`, remembering its fence as old."""
        fence = self.held.pop(key, None)
        if fence is not None:
            self.old.append((key, fence))
            del self.old[:-8]

    def __repr__(self) -> str:
        return f"Worker({self.name!r})"


@dataclass
class Held:
    """A prepared call not yet committed, and what committing it will mean."""

    op: str
    label: str
    key: str
    prepared: Prepared
    outcome: Outcome | None
    version: int | None
    worker: Worker | None = None
    fence: Fence | None = None
    extra: tuple[Any, ...] = ()

    def __repr__(self) -> str:
        return f"Held({self.label!r})"


def fence_tuple(fence: Fence) -> tuple[str, str, int]:
    """A fence as the shadow model compares it: (worker, claim id, token)."""
    return (fence.worker_id, fence.claim_id, fence.token)


def same_rules(spec: Spec, other: Spec) -> bool:
    """Do two specs have the same states, table, policies, backoff and deadlines?"""
    fields = {"states", "transitions", "policies", "backoff", "deadlines"}
    return spec.data.model_dump(include=fields) == other.data.model_dump(include=fields)


def open_store(factory: StoreFactory, resources: ExitStack) -> Store:
    """A fresh store from `factory`, closed (or its context exited) with `resources`."""
    made = factory()
    if isinstance(made, AbstractContextManager):
        store: Store = resources.enter_context(made)
        return store
    resources.callback(made.close)
    return made
