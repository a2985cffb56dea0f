"""The spec file's structure: its registries of names and the pydantic models of its tables.

Every table and key of `specs/workload.toml` has a model here; the JSON
Schema of the file is exported from them. What the names in the file must
refer to (states, operations, predicates, anchors, error codes) is checked
by `spec_checks`; the compiled form the core uses is `spec.Spec`.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from workwarden.statemachine.models import Name

__all__ = [
    "ACTOR_CLASSES",
    "BACKOFF_SHAPES",
    "CHECK_DEFAULT_DELAYS_MS",
    "DEADLINE_KINDS",
    "ERROR_CLASSES",
    "KIND_PREDICATES",
    "REQUIRED_OPERATIONS",
    "STATE_KINDS",
    "BackoffSpec",
    "CheckSpec",
    "ConcurrencySpec",
    "DeadlineKindSpec",
    "DeadlinesSpec",
    "ErrorSpec",
    "FailureKindSpec",
    "FailuresSpec",
    "LimitsSpec",
    "OperationSpec",
    "PolicySpec",
    "Problem",
    "RateSpec",
    "RuleSpec",
    "SecretsSpec",
    "SpecFile",
    "SpecHeader",
    "StateSpec",
    "TextPattern",
    "TransitionSpec",
    "file_stem",
    "spec_json_schema",
    "split_test",
]

ActorClass = Literal["worker", "system", "operator"]
ACTOR_CLASSES: tuple[str, ...] = ("worker", "system", "operator")

#: The kinds of state: queued (waiting for a worker), held (waiting for an
#: operator: never claimed), active (held by a worker), terminal (at rest,
#: finished), transient (exists only inside one commit).
STATE_KINDS: tuple[str, ...] = ("queued", "held", "active", "terminal", "transient")

#: The operations the library's commands call, and the effect each must have.
REQUIRED_OPERATIONS: dict[str, str] = {
    "admit": "admit",
    "claim": "lease",
    "claim_next": "lease",
    "start": "start_attempt",
    "heartbeat": "extend_lease",
    "execution_context": "read_context",
    "checkpoint": "record_checkpoint",
    "complete": "record_result",
    "fail": "record_failure",
    "cancel": "cancel",
    "confirm_cancel": "confirm_cancel",
    "timeout": "end_attempt",
    "retry": "rearm",
    "recover_expired": "recover_lease",
    "enforce_deadlines": "enforce_deadline",
}

#: Deadline kinds, one per field of `Timeouts` (`<kind>_ms`).
DEADLINE_KINDS: tuple[str, ...] = ("overall", "queue", "claim", "execution", "heartbeat")

#: Backoff shapes, one per value of `RetryPolicy.backoff`.
BACKOFF_SHAPES: tuple[str, ...] = ("fixed", "exponential")


class _Strict(BaseModel):
    # Strict: a TOML string is not a number and an unknown key is a mistake,
    # exactly as the exported JSON Schema says.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)


#: The largest whole number a spec may give a count, a version or a duration: the
#: largest JSON carries exactly (`models.MAX_INSTANT`). A spec's numbers reach
#: documents, index fields and the authority's arguments, which refuse more.
_MAX_WHOLE = 2**53 - 1


def _whole(least: int) -> Any:
    """A count, version or duration of the spec: at least `least`, at most `_MAX_WHOLE`."""
    return Field(ge=least, le=_MAX_WHOLE)


#: What a spec's name may be: not empty, no `/` or `\\`, not starting with `.` (so
#: neither `..` nor a hidden file), and no control character (a line break would
#: end the comment and title lines of the DOT and Mermaid drawn from the spec).
_FILE_STEM = r"^[^./\\\x00-\x1f\x7f][^/\\\x00-\x1f\x7f]*$"


def file_stem(name: str) -> str:
    """`name` if it can be the stem of a file name in a folder (`_FILE_STEM`), else `ValueError`."""
    if not re.fullmatch(_FILE_STEM, name):
        raise ValueError(
            "the name is the stem of the files made from the spec (diagrams, vectors):"
            " give one that is not empty, holds no / or \\ and does not start with .,"
            " with no control character (a line break, a tab)"
        )
    return name


class SpecHeader(_Strict):
    """`[spec]`: the spec's name, the seed behaviour it reproduces, its contract version."""

    #: The stem of the files made from the spec (`<name>.dot`, `<name>.jsonl`).
    name: Annotated[
        str, AfterValidator(file_stem), Field(json_schema_extra={"pattern": _FILE_STEM})
    ]
    #: Informational, and printed on one line of the diagrams' comments: no control character.
    seed_version: Annotated[str, Field(pattern=r"^[^\x00-\x1f\x7f]*$")]
    contract_version: Annotated[int, _whole(1)]


class StateSpec(_Strict):
    """`[states.NAME]`: a state's kind and one-line meaning."""

    kind: Literal["queued", "held", "active", "terminal", "transient"]
    meaning: str


class TransitionSpec(_Strict):
    """One legal edge of the table."""

    from_state: str = Field(alias="from")
    to: str
    event: str
    actors: list[ActorClass] = Field(min_length=1)
    operations: list[str] = Field(min_length=1)
    exit: Literal["rearm", "close"] | None = None


class RuleSpec(_Strict):
    """One rule of a policy: when all predicates hold, `decision` decides."""

    when: list[str] = Field(default_factory=list)
    decision: str
    to: str | None = None
    direct: bool = False
    delay: Literal["backoff", "initial", "none"] = "none"
    refuse: str | None = None


class PolicySpec(_Strict):
    """`[policies.NAME]`: ordered rules, first match decides, recorded as `actor`."""

    via: str | None = None
    actor: str = Field(min_length=1)
    meaning: str
    rules: list[RuleSpec] = Field(min_length=1)


class OperationSpec(_Strict):
    """`[operations.NAME]`: who calls an operation, what guards it, what it does.

    The edge it takes out of a state is found in the table: each (state,
    operation) pair has at most one edge, or leads into the `via` state of
    its policy, whose rules pick the target. `stays = true` declares an
    operation that takes no edge at all (it changes the workload in place,
    or only reads it).
    """

    actor: ActorClass
    acting_as: str | None = Field(default=None, min_length=1)
    fenced: bool = False
    deadlines: bool = False
    #: Stored on the attempt the operation acts on, which a stored document's
    #: reader holds to a name (`models.AttemptStatus`): 1 to 256 printable characters.
    attempt_status: Name | None = None
    policy: str | None = None
    effect: str
    denied: str = "WORKLOAD_TRANSITION_DENIED"
    replay: str | None = None
    stays: bool = False
    then: str | None = Field(default=None, min_length=1)
    meaning: str


class BackoffSpec(_Strict):
    """`[backoff.SHAPE]`: the n-th retry waits initial * multiplier^(n-1), capped."""

    multiplier: Annotated[int, Field(ge=1, le=16)]


class DeadlineKindSpec(_Strict):
    """`[deadlines.kinds.NAME]`: what a deadline runs from, while which states, what it bounds."""

    anchor: str
    while_states: list[str] = Field(alias="while", min_length=1)
    bounds: Literal["work", "attempt"]
    meaning: str


class DeadlinesSpec(_Strict):
    """`[deadlines]`: the contract version from which they apply, their order, the kinds."""

    contract_version: Annotated[int, _whole(1)]
    order: list[str]
    kinds: dict[str, DeadlineKindSpec]


class TextPattern(_Strict):
    """A forbidden text pattern: exactly one of `contains` or `prefix`."""

    contains: str | None = None
    prefix: str | None = None


class SecretsSpec(_Strict):
    """`[secrets]`: forbidden keys, forbidden text, and the secret reference prefix."""

    forbidden_keys: list[str]
    forbidden_text: list[TextPattern]
    reference_prefix: str = Field(min_length=1)


class LimitsSpec(_Strict):
    """`[limits]`: bounds on caller-supplied JSON and free text."""

    max_json_bytes: Annotated[int, _whole(1)]
    max_json_depth: Annotated[int, Field(ge=1, le=512)]
    max_reason_chars: Annotated[int, _whole(1)]


ErrorClass = Literal["attempt_over", "conflict_retry_now", "retry_later", "fix_request", "give_up"]
#: The classes a program sorts refusals by (`[errors.CODE] class`).
ERROR_CLASSES: tuple[str, ...] = (
    "attempt_over",
    "conflict_retry_now",
    "retry_later",
    "fix_request",
    "give_up",
)


class ErrorSpec(_Strict):
    """`[errors.CODE]`: what the code means, what the caller should do, its class."""

    meaning: str
    action: Literal["retry_later", "give_up", "fix_request"]
    error_class: ErrorClass = Field(alias="class")
    records: bool = False


#: Predicates that ask whether a workload's retry policy retries one named
#: failure kind: a policy rule that uses one needs that kind declared in
#: `[failures.kinds]`.
KIND_PREDICATES: dict[str, str] = {
    "retries_timeout": "timeout",
    "retries_worker_failure": "worker_failure",
}


class FailureKindSpec(_Strict):
    """`[failures.kinds.NAME]`: what a failure kind means; does the default policy retry it?"""

    meaning: str
    retry_by_default: bool = False


class FailuresSpec(_Strict):
    """`[failures]`: the vocabulary of failure kinds (`fail(kind=...)`, `RetryPolicy.retry_on`).

    With `open = false` (the default) a kind not declared in `kinds` is
    refused with `WORKLOAD_INVALID`; `open = true` accepts any name.
    """

    open: bool = False
    kinds: dict[str, FailureKindSpec]


class RetentionSpec(_Strict):
    """`[retention]`: how long finished work is kept, and what a purge never removes."""

    after_ms: Annotated[int, Field(strict=True), _whole(0)] = 30 * 24 * 3_600_000
    keep: list[str] = Field(default_factory=lambda: ["DEAD_LETTER"])

    @model_validator(mode="after")
    def _each_kept_once(self) -> RetentionSpec:
        twice = sorted(state for state, times in Counter(self.keep).items() if times > 1)
        if twice:
            raise ValueError(f"keep names {', '.join(twice)} more than once")
        return self


class FairnessSpec(_Strict):
    """`[fairness]`: the order in which a claimer serving many scopes takes their work.

    `policy` is `round_robin` (every scope with work in turn) or `weighted`
    (each in proportion to its weight). `weights` names a weight by tenant
    or by `tenant/application` (weighted only); `default_weight` is the
    weight of a scope not named. See `workwarden.statemachine.fairness`.
    """

    policy: Literal["round_robin", "weighted"] = "round_robin"
    default_weight: Annotated[int, Field(strict=True, ge=1, le=1000)] = 1
    weights: dict[
        Annotated[str, Field(pattern=r"^[^/\s]{1,128}(/[^/\s]{1,128})?$")],
        Annotated[int, Field(strict=True, ge=1, le=1000)],
    ] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _weights_need_weighted(self) -> FairnessSpec:
        if self.policy == "round_robin" and (self.weights or self.default_weight != 1):
            raise ValueError("weights are for policy = 'weighted'; round robin weighs all alike")
        return self


class RateSpec(_Strict):
    """A concurrency key's rate: a token bucket of `burst` tokens, one back every `every_ms`."""

    every_ms: Annotated[int, Field(strict=True, ge=1, le=86_400_000)]
    burst: Annotated[int, Field(strict=True, ge=1, le=100_000)] = 1


#: A concurrency key as a workload carries one (`models.Name`): printable, no control character.
_KEY = r"^[^\x00-\x1f\x7f]*$"


class ConcurrencySpec(_Strict):
    """`[concurrency]`: how many workloads of one concurrency key may hold a claim at once.

    `limits` names a limit per key; `default` is the limit of a key not listed
    there (None: such keys are unlimited). A workload without a key is never
    limited. `rates` names a rate per key (claims per interval, with a burst),
    `default_rate` the rate of a key not listed (None: no rate). The store
    enforces both atomically with the claim's write.
    """

    default: Annotated[int, Field(strict=True), _whole(1)] | None = None
    limits: dict[
        Annotated[str, Field(min_length=1, max_length=256, pattern=_KEY)],
        Annotated[int, Field(strict=True), _whole(1)],
    ] = Field(default_factory=dict)
    default_rate: RateSpec | None = None
    rates: dict[Annotated[str, Field(min_length=1, max_length=256, pattern=_KEY)], RateSpec] = (
        Field(default_factory=dict)
    )


#: A workload's timeouts as the checker's universe admits them: one `<kind>_ms` per deadline.
_TimeoutField = Literal["overall_ms", "queue_ms", "claim_ms", "execution_ms", "heartbeat_ms"]

#: The checker's retry delays when `[check]` leaves them out (`Universe`'s defaults).
CHECK_DEFAULT_DELAYS_MS: tuple[int, int] = (3, 6)


class CheckSpec(_Strict):
    """`[check]`: the bounded universe `workwarden check` explores (every key optional).

    Unset keys take the checker's defaults; command-line options override
    both. See `workwarden.statemachine.check.universe.Universe` for each meaning.
    The timeouts name deadline kinds and the delays make a retry policy, so a
    table the checker could not admit work under is refused here, not when
    the checker first runs.
    """

    workers: Annotated[int, Field(ge=1, le=4)] | None = None
    max_attempts: Annotated[int, Field(ge=1, le=5)] | None = None
    lease_ms: Annotated[int, Field(ge=1, le=1000)] | None = None
    horizon_ms: Annotated[int, Field(ge=1, le=100_000)] | None = None
    rearms: Annotated[int, Field(ge=0, le=5)] | None = None
    operator_actions: Annotated[int, Field(ge=0, le=5)] | None = None
    moves: Annotated[int, Field(ge=0, le=5)] | None = None
    crashes: Annotated[int, Field(ge=0, le=5)] | None = None
    racer_prepares: Annotated[int, Field(ge=0, le=5)] | None = None
    checkpoints_per_attempt: Annotated[int, Field(ge=0, le=5)] | None = None
    initial_delay_ms: Annotated[int, Field(ge=0, le=1000)] | None = None
    max_delay_ms: Annotated[int, Field(ge=0, le=1000)] | None = None
    dependent: bool | None = None
    racer: bool | None = None
    stale_workers: bool | None = None
    request_ids: bool | None = None
    first_timeouts: dict[_TimeoutField, Annotated[int, Field(ge=1, le=1000)]] | None = None
    second_timeouts: dict[_TimeoutField, Annotated[int, Field(ge=1, le=1000)]] | None = None
    second_retry_on: list[str] | None = None
    first_retry_on: list[str] | None = None

    @model_validator(mode="after")
    def _delays_in_order(self) -> CheckSpec:
        initial, most = CHECK_DEFAULT_DELAYS_MS
        initial = initial if self.initial_delay_ms is None else self.initial_delay_ms
        most = most if self.max_delay_ms is None else self.max_delay_ms
        if initial > most:
            raise ValueError(
                f"initial_delay_ms ({initial}) exceeds max_delay_ms ({most}): no retry policy"
                " waits longer at first than at most (unset, they are 3 and 6)"
            )
        return self


class SpecFile(_Strict):
    """The whole spec file, as written in TOML."""

    spec: SpecHeader
    states: dict[str, StateSpec]
    transitions: list[TransitionSpec]
    policies: dict[str, PolicySpec]
    operations: dict[str, OperationSpec]
    backoff: dict[str, BackoffSpec]
    deadlines: DeadlinesSpec
    secrets: SecretsSpec
    limits: LimitsSpec
    errors: dict[str, ErrorSpec]
    failures: FailuresSpec
    check: CheckSpec = Field(default_factory=CheckSpec)
    retention: RetentionSpec = Field(default_factory=RetentionSpec)
    concurrency: ConcurrencySpec = Field(default_factory=ConcurrencySpec)
    fairness: FairnessSpec = Field(default_factory=FairnessSpec)


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a spec: where (file and field) and what."""

    file: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.message}"


def split_test(test: str) -> tuple[str, bool]:
    """A rule's `when` entry as (predicate name, wanted truth): `not NAME` wants False.

    The name is taken as written, spaces and all: every reader of the spec (the
    checker's oracle, another implementation) reads `NAME` or `not NAME` exactly,
    so a name padded with spaces is an unknown predicate, not one of these.
    """
    if test.startswith("not "):
        return test[4:], False
    return test, True


def spec_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the spec file, from the pydantic models."""
    schema = SpecFile.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "workwarden workload spec"
    return schema
