"""The data model: what is admitted, what is stored, what a worker holds.

All instants are integer milliseconds since the Unix epoch and all durations
integer milliseconds; nothing is truncated to seconds. Sets are stored as
sorted tuples so that every document serialises to the same bytes wherever it
is written (the digest in the audit log depends on it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
)

from workwarden.statemachine.catalogue import shipped_default_retry_on
from workwarden.statemachine.errors import FrozenModel, ValidatedModel
from workwarden.statemachine.grants import SignedGrant, Subject

__all__ = [
    "DEFAULT_RETRY_ON",
    "MAX_INSTANT",
    "MAX_LIST",
    "Attempt",
    "AttemptStatus",
    "Backoff",
    "Checkpoint",
    "Claim",
    "ClaimReply",
    "CreateWorkload",
    "Dependency",
    "Duration",
    "Event",
    "ExecutionContext",
    "Fence",
    "Instant",
    "Name",
    "Prose",
    "Result",
    "RetryPolicy",
    "StrSet",
    "Timeouts",
    "Workload",
    "default_retry_policy",
    "shallow_copy",
    "trusted",
]

#: The largest instant or duration accepted: the largest integer a JSON number
#: carries exactly in every common implementation (2**53 - 1).
MAX_INSTANT = 2**53 - 1

Instant = Annotated[int, Field(strict=True, ge=0, le=MAX_INSTANT)]
"""Milliseconds since the Unix epoch."""

Duration = Annotated[int, Field(strict=True, ge=0, le=MAX_INSTANT)]
"""Milliseconds."""


#: Printable text: no NUL or other control characters, which not every
#: backend's text columns can hold and no identifier needs.
PRINTABLE = r"^[^\x00-\x1f\x7f]*$"

Name = Annotated[str, Field(strict=True, min_length=1, max_length=256, pattern=PRINTABLE)]
"""An identifier: 1 to 256 printable characters."""

Text = Annotated[str, Field(strict=True, max_length=4096, pattern=PRINTABLE)]

#: Free text a person reads: any character but NUL, which PostgreSQL's text
#: columns cannot hold (a store would refuse it where another kept it).
NO_NUL = r"^[^\x00]*$"

Prose = Annotated[str, Field(strict=True, max_length=4096, pattern=NO_NUL)]
"""Free text a person reads (an error, a reason): up to 4,096 characters, newlines
and tabs allowed, no NUL."""


def _as_sorted_set(value: Any) -> Any:
    kind = type(value)
    if kind is list or kind is tuple or kind is set or kind is frozenset:
        try:
            return tuple(sorted(set(value)))
        except TypeError:
            # Not all strings (or not comparable): validation names the bad items.
            return value
    return value


StrSet = Annotated[tuple[Name, ...], BeforeValidator(_as_sorted_set)]
"""A set of names, stored sorted and without duplicates."""

#: The most entries a request's list takes (capabilities, connection scopes,
#: dependencies): each is copied into the document and read on every claim.
MAX_LIST = 256

#: A request's set of names: at most `MAX_LIST` of them.
RequestSet = Annotated[
    tuple[Name, ...], Field(max_length=MAX_LIST), BeforeValidator(_as_sorted_set)
]


def _is_none(value: Any) -> bool:
    return value is None


class _Model(ValidatedModel):
    # Built by a caller, bad input is WORKLOAD_INVALID (`ValidatedModel`).
    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=False)


class _Request(FrozenModel):
    # What a caller hands in to be admitted: validated when built, and no field set
    # afterwards (`policy.max_attempts = 0`) reaches a stored document unchecked.
    pass


Backoff = Literal["fixed", "exponential"]


#: The failure kinds a request without a `retry_policy` retries (the seed's default policy):
#: those the shipped spec declares with `retry_by_default = true` (`[failures.kinds]`).
DEFAULT_RETRY_ON: tuple[str, ...] = shipped_default_retry_on()


class RetryPolicy(_Request):
    """How many attempts a workload gets and how long it waits between them.

    `retry_on` lists the failure kinds the policy retries; `worker_failure`
    also covers a lost worker and a failure whose effect is unknown. As in
    the seed, a policy that leaves `retry_on` out retries no kind: only a
    request with no `retry_policy` at all gets `default_retry_policy()`, which
    retries `DEFAULT_RETRY_ON`. Write `retry_on=DEFAULT_RETRY_ON` to change
    another field of the default policy and keep its retries.
    """

    max_attempts: Annotated[int, Field(strict=True, ge=1, le=1000)] = 3
    initial_delay_ms: Duration = 1000
    max_delay_ms: Duration = 300_000
    backoff: Backoff = "exponential"
    retry_on: StrSet = ()


def default_retry_policy() -> RetryPolicy:
    """The policy of a request that gives none: the defaults, retrying `DEFAULT_RETRY_ON`."""
    return RetryPolicy(retry_on=DEFAULT_RETRY_ON)


class Timeouts(_Request):
    """Optional deadlines, each in milliseconds; an omitted one never falls.

    What each is measured from, and in which states it applies, is the
    deadline table of the spec (`specs/workload.toml`, `deadlines`).
    """

    queue_ms: Duration | None = None
    claim_ms: Duration | None = None
    execution_ms: Duration | None = None
    heartbeat_ms: Duration | None = None
    overall_ms: Duration | None = None


class Dependency(_Request):
    """Gate for the scheduler: `workload_id` must be in `required_state`.

    Omitted in a request, `required_state` is the state a recorded result leads
    into (`SUCCEEDED` in the shipped spec); admission writes it in, so a stored
    workload always names it.
    """

    workload_id: Name
    required_state: Name | None = None


class CreateWorkload(_Request):
    """An admission request. Defaults are the seeds' defaults.

    `not_before` is the instant before which the workload must not be claimed;
    one already in the past is the same as none. The admission instant is the
    `now` of the call, not a field of the request.
    """

    tenant_id: Name
    application_id: Name
    environment: Name
    definition_id: Name
    definition_revision: Name
    trigger: Name
    input: JsonValue
    requested_by: Subject
    session_id: Name | None = None
    authorization_snapshot: SignedGrant
    capability_snapshot: RequestSet = ()
    connection_scopes: RequestSet = ()
    priority: Annotated[int, Field(strict=True, ge=-(2**31), le=2**31 - 1)] = 0
    idempotency_key: Name
    retry_policy: RetryPolicy = Field(default_factory=default_retry_policy)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    dependencies: Annotated[tuple[Dependency, ...], Field(max_length=MAX_LIST)] = ()
    not_before: Instant | None = None
    #: The concurrency key: at most the spec's limit for it (`[concurrency]`) of the
    #: workloads that carry it hold a claim at once. None: no limit applies.
    concurrency_key: Name | None = Field(default=None, exclude_if=_is_none)


class Fence(_Model):
    """What a worker holds for its current claim: every worker call presents it."""

    claim_id: Name
    worker_id: Name
    token: Annotated[int, Field(strict=True, ge=0, le=MAX_INSTANT)]


class Claim(_Model):
    """The lease a worker holds: who, since when, until when, under which token."""

    claim_id: str
    workload_id: str
    worker_id: str
    lease_id: str
    fencing_token: int
    capability_snapshot: StrSet
    claimed_at: int
    expires_at: int
    last_heartbeat: int

    @property
    def fence(self) -> Fence:
        """The fence a worker presents for this claim."""
        return trusted(
            Fence, claim_id=self.claim_id, worker_id=self.worker_id, token=self.fencing_token
        )


#: An attempt's status: the `attempt_status` of the operation that last acted on it
#: (`[operations]` in the spec).
AttemptStatus = Name


class Attempt(_Model):
    """One claim of the workload and what became of it."""

    attempt_id: str
    workload_id: str
    worker_id: str
    claim_id: str
    fencing_token: int
    started_at: int | None = None
    ended_at: int | None = None
    input_hash: str
    result_hash: str | None = None
    error: str | None = None
    status: AttemptStatus


class Checkpoint(_Model):
    """Progress an attempt recorded; later attempts read every checkpoint."""

    checkpoint_id: str
    workload_id: str
    attempt_id: str
    sequence: int
    state: JsonValue
    state_hash: str
    created_at: int
    produced_by: str


class ClaimReply(Claim):
    """What `claim` and `claim_next` answer: the claim, and the work it leases.

    The stored lease is the `Claim` it extends (a workload document holds
    that, never this). Beside it: the attempt the claim opened, the
    workload's `input` and the `checkpoints` earlier attempts recorded (what
    `execution_context` answers, without secret references), so a worker
    starts at once without asking for its context first. `request_id` is the
    claim request id the caller gave (None when it gave none). `started_at`
    is set when the claim started its attempt in the same commit (a spec
    whose claim names `then`, `specs/README.md`): the attempt is RUNNING and
    the worker need not call `start` (a `start` is answered as a replay).
    """

    attempt_id: str
    input: JsonValue
    checkpoints: tuple[Checkpoint, ...] = ()
    request_id: str | None = None
    started_at: int | None = None

    def lease(self) -> Claim:
        """The stored lease alone, as the workload document holds it."""
        return Claim.model_validate(self.model_dump(include=set(Claim.model_fields)))

    def __eq__(self, other: object) -> bool:
        """Equal to a reply with the same fields, or to a `Claim` equal to its lease.

        So a reply still compares equal to the workload's `current_claim`, as
        the `Claim` replies before it did.
        """
        if type(other) is Claim:
            return self.lease() == other
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, as every model here


class Result(_Model):
    """The one successful outcome of a workload."""

    result_id: str
    workload_id: str
    attempt_id: str
    status: str = "succeeded"
    output: JsonValue
    output_hash: str
    artifacts: tuple[str, ...] = ()
    provenance: dict[str, str] = Field(default_factory=dict)
    produced_by: str
    created_at: int
    schema_version: int


class Event(_Model):
    """One committed state change in a workload's history.

    `actor` is who took it (a worker id, an operator id, or `system.<policy>`),
    `actor_class` its class in the spec (worker, system, operator), and
    `evidence` why: the decision a policy made, the deadline that fell, the
    claim that was lost.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    sequence: int
    type: str
    from_state: str | None = Field(default=None, alias="from")
    to: str
    actor: str
    actor_class: str
    at: int
    evidence: dict[str, str] = Field(default_factory=dict)


class ExecutionContext(_Model):
    """What a fenced worker needs to run its attempt, including every checkpoint so far."""

    workload_id: str
    attempt_id: str
    worker_id: str
    capabilities: StrSet
    connection_scopes: StrSet
    secret_references: tuple[str, ...]
    expires_at: int
    fencing_token: int
    input: JsonValue
    checkpoints: tuple[Checkpoint, ...]


class Workload(_Model):
    """The durable document: the whole truth about one piece of work."""

    contract_version: int
    workload_id: str
    tenant_id: str
    application_id: str
    environment: str
    definition_id: str
    definition_revision: str
    trigger: str
    input: JsonValue
    input_hash: str
    requested_by: Subject
    session_id: str | None = None
    authorization_snapshot: SignedGrant
    capability_snapshot: StrSet
    connection_scopes: StrSet
    priority: int
    idempotency_key: str
    created_at: int
    updated_at: int
    state: str
    execution_history: list[Event] = Field(default_factory=list)
    attempts: list[Attempt] = Field(default_factory=list)
    checkpoints: list[Checkpoint] = Field(default_factory=list)
    result: Result | None = None
    retry_policy: RetryPolicy
    timeouts: Timeouts
    attempt_count: int = 0
    retry_count: int = 0
    next_attempt_at: int | None = None
    last_failure: str | None = None
    current_claim: Claim | None = None
    fencing_token: int = 0
    dependencies: tuple[Dependency, ...] = ()
    #: The admission's concurrency key (`CreateWorkload.concurrency_key`); left out of
    #: the document when None, so a workload without one is stored as before.
    concurrency_key: str | None = Field(default=None, exclude_if=_is_none)

    def is_eligible_at(self, now: int) -> bool:
        """Has the eligibility instant arrived? (The state must also be READY to claim.)"""
        return self.next_attempt_at is None or self.next_attempt_at <= now


# -- models the core builds itself ------------------------------------------------

_M = TypeVar("_M", bound=BaseModel)
_REQUIRED = object()
_IMMUTABLE = (type(None), bool, int, float, str, bytes, tuple, frozenset)
_TABLES: dict[type[BaseModel], tuple[tuple[str, Any, Callable[[], Any] | None], ...]] = {}
_new = object.__new__
_set = object.__setattr__


def _table(cls: type[BaseModel]) -> tuple[tuple[str, Any, Callable[[], Any] | None], ...]:
    """Each field of `cls` in order: (name, its default or `_REQUIRED`, its default factory)."""
    rows: list[tuple[str, Any, Callable[[], Any] | None]] = []
    for name, info in cls.model_fields.items():
        factory = info.default_factory
        if factory is not None:
            rows.append((name, _REQUIRED, factory))  # type: ignore[arg-type]  # takes no data
        elif info.is_required():
            rows.append((name, _REQUIRED, None))
        else:
            # A shared default must be one no holder can change.
            assert isinstance(info.default, _IMMUTABLE), (cls.__name__, name)
            rows.append((name, info.default, None))
    table = tuple(rows)
    _TABLES[cls] = table
    return table


def _made(cls: type[_M], values: dict[str, Any], given: set[str]) -> _M:
    model = _new(cls)
    _set(model, "__dict__", values)
    _set(model, "__pydantic_fields_set__", given)
    _set(model, "__pydantic_extra__", None)
    _set(model, "__pydantic_private__", None)
    return model


def trusted(cls: type[_M], /, **fields: Any) -> _M:
    """A `cls` made of `fields` without validating them: for values the core already holds valid.

    The core builds an event, a claim, an attempt, a result and a reply on
    every call, out of values that were validated when they came in (a
    command's fields, the workload's own) or that it computed (ids, instants,
    evidence text). Validating them again would only cost time. Each value
    must already be what validation makes of it (a set as a sorted tuple,
    evidence as text); fields left out take their defaults, as with the
    constructor. A name that is not a field, or a required field left out, is
    a `TypeError` (a mistake in the core, not bad input). Nothing a caller or
    a store hands in is built this way: that is always validated.

    >>> trusted(Fence, claim_id="c", worker_id="w", token=1) == Fence(
    ...     claim_id="c", worker_id="w", token=1
    ... )
    True
    """
    table = _TABLES.get(cls) or _table(cls)
    values: dict[str, Any] = {}
    found = 0
    for name, default, factory in table:
        if name in fields:
            values[name] = fields[name]
            found += 1
        elif factory is not None:
            values[name] = factory()
        elif default is _REQUIRED:
            raise TypeError(f"{cls.__name__} needs {name}")
        else:
            values[name] = default
    if found != len(fields):
        raise TypeError(f"{cls.__name__} has no field {sorted(fields.keys() - values.keys())}")
    return _made(cls, values, set(fields))


def shallow_copy(model: _M, /, **replace: Any) -> _M:
    """A copy of `model` sharing its field values, with the fields in `replace` set anew.

    What `model.model_copy(update=replace)` makes, at a fraction of the cost:
    the values are not copied, so a caller that will edit a mutable value
    (a list, a nested model) replaces it with its own copy.
    """
    values = model.__dict__.copy()
    given = set(model.__pydantic_fields_set__)
    if replace:
        values.update(replace)
        given.update(replace)
    copy = _made(type(model), values, given)
    if model.__pydantic_extra__ is not None:
        _set(copy, "__pydantic_extra__", dict(model.__pydantic_extra__))
    if model.__pydantic_private__ is not None:
        _set(copy, "__pydantic_private__", dict(model.__pydantic_private__))
    return copy
