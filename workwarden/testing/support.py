"""What the stateful suite is built from: plans, workers, held calls, a recording store.

`workwarden.testing` drives an authority with these: the workload plans it
admits (small random retry policies, timeouts and eligibility, as a
Hypothesis strategy), the signed grants of its requesters, the workers and
the claims they hold or have forgotten, the prepared calls it holds back,
the store wrapper that keeps every committed version for the write
invariants, the refusals each operation may give when no shadow model
predicts them exactly, and how a run reports a failed check (`CheckFailed`)
and what it reached (`Coverage`).

Which operations the rules call, and what each may refuse, is read from the
shipped spec's operations table and transition table (`allowed_refusals`,
`operator_targets` and the lists below are computed from `default_spec()`
when this module is imported), not listed again here.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence
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
from workwarden.statemachine.properties.coverage import Reached, edges_never_taken, unreached
from workwarden.statemachine.properties.operations import operation_roles
from workwarden.statemachine.properties.registry import named
from workwarden.statemachine.spec import Spec, default_spec
from workwarden.storage.base import (
    AuditRecord,
    BatchStore,
    IndexFields,
    Pauses,
    Purges,
    Store,
    StoreConflict,
    Write,
    WriteOutcome,
)
from workwarden.storage.forwarding import (
    ForwardingBatchStore,
    ForwardingPauses,
    ForwardingPurges,
    ForwardingStore,
)
from workwarden.storage.testing import NotAStore, store_from_factory
from workwarden.testing.shadow import Outcome, ShadowPlan

__all__ = [
    "AGENTS",
    "ALLOWED",
    "APPLICATION",
    "CAPABILITY_SETS",
    "DEADLINE_KINDS",
    "FAILURE_KINDS",
    "FENCED",
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
    "REPORTS",
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
    "RecordingBatchStore",
    "RecordingStore",
    "ScopedRecordingBatchStore",
    "ScopedRecordingStore",
    "StoreFactory",
    "Worker",
    "WorkloadPlan",
    "allowed_refusals",
    "fence_tuple",
    "open_store",
    "operator_targets",
    "recording_store",
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
FAILURE_KINDS = ("transient_connection", "worker_failure", "timeout", "validation")
RETRYABLE = ("timeout", "transient_connection", "worker_failure")
START = 1_000_000
MAX_LIVE = 3
LEASES = (1, 200, 1000, 5000)
REPLAYS = ("completion", "other output", "taken id", "failure")
REPORTS = ("start", "heartbeat", "checkpoint", "complete", "fail", "confirm_cancel")
"""The reports a `report_many` batch of the suite is drawn from (`batches.REPORT_COMMANDS`)."""

_SPEC = default_spec()
_ROLES = operation_roles(_SPEC)
#: The effects that only read (a held call of one writes nothing: no race to lose).
_READ_ONLY_EFFECTS = frozenset({"read_context"})

DEADLINE_KINDS: tuple[str, ...] = _SPEC.deadline_order
"""The deadlines a plan may set: the spec's deadline kinds, in its order."""
SWEEPS: tuple[str, ...] = _ROLES.sweeps
"""The sweeps: the system's operations a policy decides for (the operations table's order)."""
FENCED: tuple[str, ...] = tuple(name for name in _SPEC.operations if name in _ROLES.fenced)
"""The operations a holder calls through its fence (`fenced = true`), in the table's order."""
WORKER_CALLS: tuple[str, ...] = tuple(
    name for name in FENCED if _SPEC.operations[name].spec.effect not in _READ_ONLY_EFFECTS
)
"""The fenced calls that write (what a writer may hold prepared, and race)."""
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
HOLDER_CALLS: tuple[str, ...] = tuple(
    name
    for name in FENCED
    if name not in _ROLES.completing and _SPEC.operations[name].via_policy is None
)
"""The fenced calls that report no outcome (a completion and a failure report, which a
policy may decide on, have rules of their own)."""
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

FENCED_REFUSALS = frozenset(
    {errors.CLAIM_INVALID, errors.STALE_FENCE, errors.LEASE_EXPIRED, errors.TIMED_OUT}
)
"""What a fenced call may be told that means its claim is gone (the fence check's refusals,
and the timeout a fallen deadline causes)."""

#: The fence check's refusals (`core._fence`).
_FENCE_CHECK = frozenset({errors.CLAIM_INVALID, errors.STALE_FENCE, errors.LEASE_EXPIRED})
#: What an effect refuses beyond what its operation's row says (`steps.py`).
_EFFECT_REFUSALS: dict[str, frozenset[str]] = {
    "admit": frozenset({errors.IDEMPOTENCY_KEY_REUSED}),
    # A lease of a workload whose concurrency key is at its limit is refused by the store.
    "lease": frozenset(
        {
            errors.NOT_YET_ELIGIBLE,
            errors.CAPABILITY_DENIED,
            errors.CONCURRENCY_LIMITED,
            errors.RATE_LIMITED,
        }
    ),
    "record_result": frozenset({errors.RESULT_CONFLICT, errors.RESULT_DUPLICATE}),
    "rearm": frozenset({errors.RETRY_EXHAUSTED}),
}
#: The scheduler's claim: it answers with no claim when nothing is claimable.
_SCHEDULER = frozenset({"claim_next"})


def allowed_refusals(spec: Spec) -> dict[str, frozenset[str]]:
    """What each operation may refuse the suite's well-formed calls with, read from its row.

    A fenced operation: the fence check's refusals; one guarded by deadlines:
    `WORKLOAD_TIMED_OUT`; a caller's operation that takes an edge: its
    `denied` code; a gate policy: the codes its rules `refuse` with; and what
    its effect refuses (`_EFFECT_REFUSALS`). The sweeps and the scheduler
    answer with what they did and never refuse.
    """
    roles = operation_roles(spec)
    out: dict[str, frozenset[str]] = {}
    for name, operation in spec.operations.items():
        row = operation.spec
        if name in roles.sweeps or name in _SCHEDULER:
            out[name] = frozenset()
            continue
        codes = set(_EFFECT_REFUSALS.get(row.effect, ()))
        if row.fenced:
            codes |= _FENCE_CHECK
        if row.deadlines:
            codes.add(errors.TIMED_OUT)
        if not row.stays and row.actor != "system":
            codes.add(row.denied)
        if operation.gate is not None:
            codes |= {rule.spec.refuse for rule in operation.gate.rules if rule.spec.refuse}
        out[name] = frozenset(codes)
    return out


def operator_targets(spec: Spec) -> dict[str, tuple[str, ...]]:
    """The states each operator operation prefers: where it hands the work on.

    A cancellation that asks the holder to confirm (its own edge leads into
    a cancelling state), a re-arm of work at rest (its own edge is a `rearm`
    exit); an operation that does neither (an operator's timeout) prefers
    none, and takes any workload.
    """
    out: dict[str, tuple[str, ...]] = {}
    for name, operation in spec.operations.items():
        if operation.actor != "operator":
            continue
        states = []
        for state in spec.states:
            edge = spec.own_edge(state, name)
            if edge is not None and (edge.to in spec.roles.cancelling or edge.exit == "rearm"):
                states.append(state)
        out[name] = tuple(states)
    return out


ALLOWED: dict[str, frozenset[str]] = allowed_refusals(_SPEC)
"""What each operation may refuse with when no shadow model predicts exactly (shipped spec)."""
OPERATOR_TARGETS: dict[str, tuple[str, ...]] = operator_targets(_SPEC)
"""Which workloads an operator call prefers (any, when none is in these states)."""
RACED: tuple[str, ...] = tuple(
    name for name, state in _SPEC.states.items() if state.kind not in ("terminal", "transient")
)
"""The workloads races prefer: not at rest yet (neither terminal nor transient)."""
GIVE_UP = FENCED_REFUSALS
"""A worker told one of these gives its claim up."""


class CheckFailed(AssertionError):
    """A check of the stateful suite failed; `check` is its registered property's name.

    Properties of committed data (`statemachine.properties.registry`), or of
    one call (subject `call`): `shadow_model` (the authority disagreed with
    the shadow model), `refusals_change_nothing`,
    `refusal_is_one_the_operation_gives` (when no shadow model runs),
    `refusal_is_in_the_catalogue` and `replies_are_consistent`.
    """

    def __init__(self, check: str, message: str) -> None:
        named(check)  # every check is a registered property (KeyError otherwise)
        super().__init__(f"{check}: {message}")
        self.check = check


@dataclass
class Coverage:
    """What runs of the machine exercised: the table's edges, the policies' rules, the states
    at rest, and every call's outcomes.

    Pass one to `authority_machine(coverage=...)` to collect across runs
    (a run that never takes an edge, or never sees a refusal, tests less
    than it seems to); `unreached(spec)` says which registered `sometimes`
    properties the runs have not met, and what of each they never reached.
    """

    edges: Counter[tuple[str, str]] = field(default_factory=Counter)
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    at_the_instant: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Refusals at the very instant the lease expired or the deadline fell, by (call, code)."""
    rules: Counter[tuple[str, str]] = field(default_factory=Counter)
    """The policies' rules that decided some committed step, by (policy, decision)."""
    at_rest: Counter[str] = field(default_factory=Counter)
    """The states committed workloads were at rest in, each time one was seen."""

    def edges_never_taken(self, spec: Spec) -> list[tuple[str, str]]:
        """The table's edges no committed history took, sorted (the registered `sometimes`
        property `every_edge_is_taken`, as the checker reports it)."""
        taken = {edge for edge, count in self.edges.items() if count > 0}
        return edges_never_taken(spec, taken)

    def reached(self) -> Reached:
        """What the runs reached, as the registry's reachability checks take it."""
        rules: dict[str, set[str]] = {}
        for (policy, decision), count in self.rules.items():
            if count > 0:
                rules.setdefault(policy, set()).add(decision)
        return Reached(
            edges={edge for edge, count in self.edges.items() if count > 0},
            rules=rules,
            at_rest={state for state, count in self.at_rest.items() if count > 0},
        )

    def unreached(self, spec: Spec) -> dict[str, list[str]]:
        """For each registered `sometimes` property, what no run reached (empty: it is met)."""
        return unreached(spec, self.reached())


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


class RecordingBatchStore(RecordingStore, ForwardingBatchStore):
    """A `RecordingStore` over a `BatchStore`: it forwards the batch methods too, and records
    every version a batch committed, as `write` does.

    `batch_conflicts` counts the writes of batches that found another version
    committed (a writer's batch decided on a version another writer had
    replaced): the race a batch hands to the one-call method.
    """

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.batch_conflicts = 0

    def batch_written(self, results: Sequence[tuple[Write, WriteOutcome]]) -> None:
        """Record each committed text of a batch under its version; count its conflicts."""
        for write, outcome in results:
            if isinstance(outcome, StoreConflict):
                self.batch_conflicts += 1
            else:
                self.versions[(write.key, int(outcome))] = write.document


class ScopedRecordingStore(ForwardingPauses, ForwardingPurges, RecordingStore):
    """A `RecordingStore` over a store that keeps pauses and purges, forwarding them too."""


class ScopedRecordingBatchStore(ForwardingPauses, ForwardingPurges, RecordingBatchStore):
    """A `RecordingBatchStore` over a store that keeps pauses and purges, forwarding them too."""


def recording_store(inner: Store) -> RecordingStore:
    """The recording wrapper that fits `inner`: a `RecordingBatchStore` over a `BatchStore`
    (so the authority takes its batch path, as it would over `inner`), else a
    `RecordingStore` (so it writes one call at a time, as it would over `inner`); either
    forwards the pauses and purges (`Pauses`, `Purges`) when `inner` keeps both."""
    scoped = isinstance(inner, Pauses) and isinstance(inner, Purges)
    if isinstance(inner, BatchStore):
        return ScopedRecordingBatchStore(inner) if scoped else RecordingBatchStore(inner)
    return ScopedRecordingStore(inner) if scoped else RecordingStore(inner)


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
    """A fresh store from `factory`, closed (or its context exited) with `resources`.

    Something that is not a store is said here, as `WORKLOAD_INVALID` naming
    `store_factory`, not as an AttributeError on `close` (or deep in the first call).
    """
    try:
        return store_from_factory(factory, resources)
    except NotAStore as exc:
        raise errors.bad_argument("store_factory", f"the store {exc}") from None
