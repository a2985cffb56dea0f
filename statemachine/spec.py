"""Loading and validating the spec file: the states, the table, the policies, the deadlines.

`load_spec(path)` reads a TOML spec, checks its structure with the pydantic
models below and its meaning against the registries (states, operations,
predicates, anchors, error codes), and returns a compiled `Spec`. Every
problem is reported, each with the file and the field; a spec with any
problem is refused as a whole with `WORKLOAD_SPEC_INVALID`.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workwarden.statemachine import errors
from workwarden.statemachine.predicates import ANCHORS, PREDICATES, Facts

__all__ = [
    "ACTOR_CLASSES",
    "OPERATIONS",
    "POLICIES",
    "REQUIRED_STATES",
    "CompiledPolicy",
    "CompiledRule",
    "Problem",
    "Spec",
    "SpecFile",
    "check_spec_file",
    "default_spec",
    "load_spec",
    "spec_json_schema",
]

ActorClass = Literal["worker", "system", "operator"]
ACTOR_CLASSES: tuple[str, ...] = ("worker", "system", "operator")

#: The operations the core implements; edges name the ones that take them.
OPERATIONS: dict[str, str] = {
    "admit": "admit a workload (idempotent per requester-scoped key)",
    "claim": "claim a READY workload by id",
    "claim_next": "claim the next claimable workload of a tenant and application",
    "start": "start the claimed attempt",
    "heartbeat": "extend the lease of the current claim",
    "execution_context": "read the input, checkpoints and scopes through a fence",
    "checkpoint": "record progress of the running attempt",
    "complete": "record the attempt's result",
    "fail": "report the attempt's failure",
    "cancel": "cancel the workload, or request cancellation from its worker",
    "confirm_cancel": "the worker confirms a requested cancellation",
    "timeout": "an operator times the workload out",
    "retry": "an operator re-arms failed, timed-out or dead-lettered work",
    "recover_expired": "the sweep recovers work whose lease expired",
    "enforce_deadlines": "a fallen deadline is enforced (by the sweep, or at a worker call)",
}

#: The policies the core consults, and the operation each decides for.
POLICIES: dict[str, str] = {
    "failure": "fail",
    "recovery": "recover_expired",
    "deadline": "enforce_deadlines",
    "operator_timeout": "timeout",
    "claim": "claim",
}

#: States the core refers to by name; a spec must declare each.
REQUIRED_STATES: tuple[str, ...] = (
    "CREATED",
    "READY",
    "CLAIMED",
    "RUNNING",
    "CHECKPOINTED",
    "RECOVERING",
    "CANCELLATION_REQUESTED",
    "SUCCEEDED",
    "FAILED",
    "CANCELLED",
    "TIMED_OUT",
    "DEAD_LETTER",
)

#: Deadline kinds, one per field of `Timeouts` (`<kind>_ms`).
DEADLINE_KINDS: tuple[str, ...] = ("overall", "queue", "claim", "execution", "heartbeat")

_STATE_NAME = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$")
_EVENT_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
_ERROR_CODE = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SpecHeader(_Strict):
    """`[spec]`: the spec's name, the seed behaviour it reproduces, its contract version."""

    name: str
    seed_version: str
    contract_version: Annotated[int, Field(ge=1)]


class StateSpec(_Strict):
    """`[states.NAME]`: a state's kind and one-line meaning."""

    kind: Literal["queued", "active", "terminal", "transient"]
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
    """`[policies.NAME]`: ordered rules, first match decides."""

    via: str | None = None
    meaning: str
    rules: list[RuleSpec] = Field(min_length=1)


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

    contract_version: Annotated[int, Field(ge=1)]
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

    max_json_bytes: Annotated[int, Field(ge=1)]
    max_json_depth: Annotated[int, Field(ge=1, le=512)]
    max_reason_chars: Annotated[int, Field(ge=1)]


class ErrorSpec(_Strict):
    """`[errors.CODE]`: what the code means and what the caller should do."""

    meaning: str
    action: Literal["retry_later", "give_up", "fix_request"]
    records: bool = False


class SpecFile(_Strict):
    """The whole spec file, as written in TOML."""

    spec: SpecHeader
    states: dict[str, StateSpec]
    transitions: list[TransitionSpec]
    policies: dict[str, PolicySpec]
    backoff: dict[str, BackoffSpec]
    deadlines: DeadlinesSpec
    secrets: SecretsSpec
    limits: LimitsSpec
    errors: dict[str, ErrorSpec]


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a spec: where (file and field) and what."""

    file: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.message}"


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """A rule with its predicates resolved: (function, wanted truth, name)."""

    index: int
    tests: tuple[tuple[Callable[[Facts], bool], bool, str], ...]
    spec: RuleSpec

    def matches(self, truth: Callable[[str], bool]) -> bool:
        """Does this rule match, given the truth of each named predicate?"""
        return all(truth(name) == wanted for _, wanted, name in self.tests)


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    """A policy whose rules name only registered predicates."""

    name: str
    spec: PolicySpec
    rules: tuple[CompiledRule, ...]

    @property
    def predicates(self) -> tuple[str, ...]:
        """Every predicate the policy's rules name, in first-use order."""
        seen: dict[str, None] = {}
        for rule in self.rules:
            for _, _, name in rule.tests:
                seen.setdefault(name, None)
        return tuple(seen)

    def first_match(self, truth: Callable[[str], bool]) -> CompiledRule:
        """The deciding rule under the given predicate truth (the last always matches)."""
        for rule in self.rules:
            if rule.matches(truth):
                return rule
        raise AssertionError(f"policy {self.name} has no rule that always matches")

    def decide(self, facts: Facts) -> CompiledRule:
        """The deciding rule for these facts."""
        cache: dict[str, bool] = {}

        def truth(name: str) -> bool:
            if name not in cache:
                cache[name] = PREDICATES[name][0](facts)
            return cache[name]

        return self.first_match(truth)


def _split_test(test: str) -> tuple[str, bool]:
    if test.startswith("not "):
        return test[4:].strip(), False
    return test.strip(), True


class Spec:
    """A validated spec, compiled for the core: lookups, policies and the machine.

    Build one with `load_spec` (or `default_spec()` for the shipped file). It is
    immutable and shared: the transitions machine is built once, here.
    """

    def __init__(self, data: SpecFile, source: str) -> None:
        self.data = data
        self.source = source
        self.contract_version = data.spec.contract_version
        self.states: dict[str, StateSpec] = dict(data.states)
        self.edges: dict[tuple[str, str], TransitionSpec] = {
            (edge.from_state, edge.to): edge for edge in data.transitions
        }
        self._by_operation: dict[tuple[str, str], list[TransitionSpec]] = {}
        for edge in data.transitions:
            for operation in edge.operations:
                self._by_operation.setdefault((edge.from_state, operation), []).append(edge)
        self.policies: dict[str, CompiledPolicy] = {
            name: CompiledPolicy(
                name=name,
                spec=policy,
                rules=tuple(
                    CompiledRule(
                        index=index,
                        tests=tuple(
                            (PREDICATES[pname][0], wanted, pname)
                            for pname, wanted in (_split_test(t) for t in rule.when)
                        ),
                        spec=rule,
                    )
                    for index, rule in enumerate(policy.rules)
                ),
            )
            for name, policy in data.policies.items()
        }
        self.deadline_order: tuple[str, ...] = tuple(data.deadlines.order)
        self.deadline_kinds: dict[str, DeadlineKindSpec] = dict(data.deadlines.kinds)
        self.deadline_contract_version = data.deadlines.contract_version
        self.secrets = data.secrets
        self.limits = data.limits
        self.errors: dict[str, ErrorSpec] = dict(data.errors)
        self.backoff_multiplier: dict[str, int] = {
            name: shape.multiplier for name, shape in data.backoff.items()
        }
        self.terminal_states = frozenset(n for n, s in data.states.items() if s.kind == "terminal")
        self.claimed_states = frozenset(
            edge.from_state for edge in data.transitions if "heartbeat" in edge.operations
        ) or frozenset({"CLAIMED", "RUNNING", "CHECKPOINTED", "CANCELLATION_REQUESTED"})
        # Imported here: the machine module depends on the compiled spec's tables.
        from workwarden.statemachine.machine import build_machine

        self.machine = build_machine(self)

    def edges_for(self, state: str, operation: str) -> list[TransitionSpec]:
        """The edges out of `state` that `operation` may take."""
        return self._by_operation.get((state, operation), [])

    def edge(self, source: str, target: str) -> TransitionSpec | None:
        """The edge from `source` to `target`, if the table has one."""
        return self.edges.get((source, target))

    def __repr__(self) -> str:
        return f"<Spec {self.data.spec.name} from {self.source}>"


def _field_path(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(root)"


def _semantic_problems(data: SpecFile, file: str) -> list[Problem]:
    problems: list[Problem] = []

    def add(field: str, message: str) -> None:
        problems.append(Problem(file, field, message))

    states = data.states
    valid_states = ", ".join(states)
    for name in states:
        if not _STATE_NAME.match(name):
            add(f"states.{name}", "a state name is SCREAMING_SNAKE_CASE")
    for name in REQUIRED_STATES:
        if name not in states:
            add("states", f"missing state {name!r}, which the core refers to")

    seen_edges: dict[tuple[str, str], int] = {}
    seen_events: dict[tuple[str, str], int] = {}
    for i, edge in enumerate(data.transitions):
        where = f"transitions[{i}]"
        for attr, value in (("from", edge.from_state), ("to", edge.to)):
            if value not in states:
                add(f"{where}.{attr}", f"unknown state {value!r} (valid: {valid_states})")
        key = (edge.from_state, edge.to)
        if key in seen_edges:
            add(
                where,
                f"duplicate edge {edge.from_state} -> {edge.to} "
                f"(first at transitions[{seen_edges[key]}])",
            )
        else:
            seen_edges[key] = i
        if not _EVENT_NAME.match(edge.event):
            add(f"{where}.event", f"event name {edge.event!r} is not like 'workload.claimed'")
        event_key = (edge.from_state, edge.event)
        if event_key in seen_events and seen_edges.get(key) == i:
            # Same event out of the same state to two targets.
            add(
                f"{where}.event",
                f"event {edge.event!r} already leaves {edge.from_state} "
                f"(transitions[{seen_events[event_key]}]): the machine would be ambiguous",
            )
        else:
            seen_events.setdefault(event_key, i)
        for j, operation in enumerate(edge.operations):
            if operation not in OPERATIONS:
                add(
                    f"{where}.operations[{j}]",
                    f"unknown operation {operation!r} (valid: {', '.join(OPERATIONS)})",
                )
        source = states.get(edge.from_state)
        target = states.get(edge.to)
        if source is not None and source.kind == "terminal":
            if edge.exit is None:
                add(
                    where,
                    f"edge {edge.from_state} -> {edge.to} leaves terminal state "
                    f"{edge.from_state} but is not declared as a re-arm "
                    '(set exit = "rearm" or exit = "close")',
                )
            elif edge.exit == "rearm" and target is not None and target.kind != "queued":
                add(f"{where}.exit", "a re-arm must lead to a queued state")
            elif edge.exit == "close" and target is not None and target.kind != "terminal":
                add(f"{where}.exit", "a close must lead to a terminal state")
        elif edge.exit is not None and source is not None:
            add(f"{where}.exit", f"exit is only for edges out of a terminal state, not {edge.from_state}")

    for name in POLICIES:
        if name not in data.policies:
            add("policies", f"missing policy {name!r}, which the core consults")
    for name, policy in data.policies.items():
        where = f"policies.{name}"
        if name not in POLICIES:
            add(where, f"unknown policy {name!r} (valid: {', '.join(POLICIES)})")
        if policy.via is not None and policy.via not in states:
            add(f"{where}.via", f"unknown state {policy.via!r} (valid: {valid_states})")
        for r, rule in enumerate(policy.rules):
            rwhere = f"{where}.rules[{r}]"
            for t, test in enumerate(rule.when):
                pname, _ = _split_test(test)
                if pname not in PREDICATES:
                    add(
                        f"{rwhere}.when[{t}]",
                        f"unknown predicate {pname!r} (valid: {', '.join(PREDICATES)})",
                    )
            if rule.to is not None:
                if rule.to not in states:
                    add(f"{rwhere}.to", f"unknown state {rule.to!r} (valid: {valid_states})")
                elif (
                    not rule.direct
                    and policy.via is not None
                    and policy.via in states
                    and (policy.via, rule.to) not in seen_edges
                ):
                    add(f"{rwhere}.to", f"no edge {policy.via} -> {rule.to} in the table")
            if rule.refuse is not None and rule.refuse not in data.errors:
                add(f"{rwhere}.refuse", f"unknown error code {rule.refuse!r}")
            if rule.direct and policy.via is None:
                add(f"{rwhere}.direct", "direct only makes sense in a policy with `via`")
        if policy.rules and policy.rules[-1].when:
            add(
                f"{where}.rules",
                f"policy {name!r} lacks a final rule that always matches (when = [])",
            )

    for shape in ("fixed", "exponential"):
        if shape not in data.backoff:
            add("backoff", f"missing backoff shape {shape!r}")
    for shape in data.backoff:
        if shape not in ("fixed", "exponential"):
            add(f"backoff.{shape}", "unknown backoff shape (valid: fixed, exponential)")

    kinds = data.deadlines.kinds
    for kind in DEADLINE_KINDS:
        if kind not in kinds:
            add("deadlines.kinds", f"missing deadline {kind!r} (a Timeouts field)")
    for kind, spec in kinds.items():
        where = f"deadlines.kinds.{kind}"
        if kind not in DEADLINE_KINDS:
            add(where, f"unknown deadline {kind!r} (valid: {', '.join(DEADLINE_KINDS)})")
        if spec.anchor not in ANCHORS:
            add(f"{where}.anchor", f"unknown anchor {spec.anchor!r} (valid: {', '.join(ANCHORS)})")
        for s, state in enumerate(spec.while_states):
            if state not in states:
                add(f"{where}.while[{s}]", f"unknown state {state!r} (valid: {valid_states})")
    if sorted(data.deadlines.order) != sorted(kinds):
        add("deadlines.order", "must list every deadline kind exactly once")

    for i, pattern in enumerate(data.secrets.forbidden_text):
        if (pattern.contains is None) == (pattern.prefix is None):
            add(f"secrets.forbidden_text[{i}]", "set exactly one of `contains` or `prefix`")

    for code in data.errors:
        if not _ERROR_CODE.match(code):
            add(f"errors.{code}", "an error code is SCREAMING_SNAKE_CASE")
    for code in _raised_codes():
        if code not in data.errors:
            add("errors", f"missing error code {code!r}, which the core raises")
    return problems


def _raised_codes() -> list[str]:
    return [value for name, value in vars(errors).items() if name.isupper() and isinstance(value, str)]


def _parse(text: str, file: str) -> tuple[SpecFile | None, list[Problem]]:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return None, [Problem(file, "(toml)", str(exc))]
    try:
        data = SpecFile.model_validate(raw)
    except ValidationError as exc:
        return None, [
            Problem(file, _field_path(err["loc"]), err["msg"]) for err in exc.errors()
        ]
    return data, _semantic_problems(data, file)


def check_spec_file(path: str | Path) -> list[Problem]:
    """Every problem in the spec file at `path` (an empty list when it is valid)."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [Problem(file, "(file)", f"cannot read: {exc}")]
    return _parse(text, file)[1]


def load_spec_text(text: str, source: str = "<text>") -> Spec:
    """Load a spec from TOML text; refuse it with `WORKLOAD_SPEC_INVALID` on any problem."""
    data, problems = _parse(text, source)
    if problems or data is None:
        raise errors.WorkloadError(
            errors.SPEC_INVALID,
            f"{len(problems)} problem(s) in {source}: " + "; ".join(str(p) for p in problems[:5]),
            {"problems": [{"file": p.file, "field": p.field, "message": p.message} for p in problems]},
        )
    return Spec(data, source)


def load_spec(path: str | Path | None = None) -> Spec:
    """Load and compile the spec at `path` (the shipped spec when `None`)."""
    if path is None:
        return default_spec()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.WorkloadError(
            errors.SPEC_INVALID, f"cannot read spec {path}: {exc}", {"file": str(path)}
        ) from None
    return load_spec_text(text, str(path))


def shipped_spec_text() -> str:
    """The text of the spec shipped with the package."""
    return resources.files("workwarden.specs").joinpath("workload.toml").read_text("utf-8")


@cache
def default_spec() -> Spec:
    """The shipped spec (`specs/workload.toml`), loaded once and shared."""
    return load_spec_text(shipped_spec_text(), "specs/workload.toml")


def spec_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the spec file, from the pydantic models."""
    schema = SpecFile.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "workwarden workload spec"
    return schema


def spec_summary(spec: Spec) -> Mapping[str, int]:
    """Counts of what a spec declares (states, transitions, policies, error codes)."""
    return {
        "states": len(spec.states),
        "transitions": len(spec.edges),
        "policies": len(spec.policies),
        "errors": len(spec.errors),
    }
