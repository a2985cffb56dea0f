"""Loading the spec file and compiling it for the core: lookups, policies and the machine.

`load_spec(path)` reads a TOML spec, checks its structure (the pydantic
models of `spec_model`) and its meaning against the registries (states,
operations, predicates, anchors, error codes; see `spec_checks`), and returns
a compiled `Spec`. Every problem is reported, each with the file and the
field; a spec with any problem is refused as a whole with
`WORKLOAD_SPEC_INVALID`. The models and registries are re-exported here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from workwarden.statemachine import errors
from workwarden.statemachine.effects import EFFECTS
from workwarden.statemachine.machine import build_machine
from workwarden.statemachine.predicates import PREDICATES, Facts, Roles
from workwarden.statemachine.spec_checks import MAX_SPEC_BYTES, parse_spec_text, raised_codes
from workwarden.statemachine.spec_model import (
    ACTOR_CLASSES,
    BACKOFF_SHAPES,
    CHECK_DEFAULT_DELAYS_MS,
    DEADLINE_KINDS,
    STATE_KINDS,
    BackoffSpec,
    DeadlineKindSpec,
    DeadlinesSpec,
    ErrorSpec,
    FailureKindSpec,
    FailuresSpec,
    LimitsSpec,
    OperationSpec,
    PolicySpec,
    Problem,
    RateSpec,
    RuleSpec,
    SecretsSpec,
    SpecFile,
    SpecHeader,
    StateSpec,
    TextPattern,
    TransitionSpec,
    spec_json_schema,
    split_test,
)

__all__ = [
    "ACTOR_CLASSES",
    "BACKOFF_SHAPES",
    "CHECK_DEFAULT_DELAYS_MS",
    "DEADLINE_KINDS",
    "MAX_SPEC_BYTES",
    "STATE_KINDS",
    "BackoffSpec",
    "CompiledOperation",
    "CompiledPolicy",
    "CompiledRule",
    "DeadlineKindSpec",
    "DeadlinesSpec",
    "ErrorSpec",
    "FailureKindSpec",
    "FailuresSpec",
    "LimitsSpec",
    "OperationSpec",
    "PolicySpec",
    "Problem",
    "Roles",
    "RuleSpec",
    "SecretsSpec",
    "Spec",
    "SpecFile",
    "SpecHeader",
    "StateSpec",
    "TextPattern",
    "TransitionSpec",
    "check_spec_file",
    "default_spec",
    "load_spec",
    "load_spec_text",
    "raised_codes",
    "shipped_spec_text",
    "spec_json_schema",
    "spec_summary",
]


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

    def first_match(self, truth: Callable[[str], bool] | Mapping[str, bool]) -> CompiledRule:
        """The deciding rule under the given predicate truth (the last always matches).

        `truth` gives each named predicate's value: a function of the name, or
        a mapping from name to value (a name it lacks raises `KeyError`).
        """
        value = truth.__getitem__ if isinstance(truth, Mapping) else truth
        for rule in self.rules:
            if rule.matches(value):
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


@dataclass(frozen=True, slots=True)
class CompiledOperation:
    """An operation of the spec's table, with its policy resolved.

    `gate` is the policy consulted before the operation's own edge (a policy
    without `via`); `via_policy` the one whose `via` state the operation
    enters, whose rules then pick the target. At most one of them is set.
    """

    name: str
    spec: OperationSpec
    policy: CompiledPolicy | None

    @property
    def actor(self) -> str:
        """The actor class that may call the operation."""
        return self.spec.actor

    @property
    def gate(self) -> CompiledPolicy | None:
        """The policy decided before the operation's own edge, if any."""
        policy = self.policy
        return policy if policy is not None and policy.spec.via is None else None

    @property
    def via_policy(self) -> CompiledPolicy | None:
        """The policy that decides once the operation has entered its `via` state."""
        policy = self.policy
        return policy if policy is not None and policy.spec.via is not None else None


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
                            for pname, wanted in (split_test(t) for t in rule.when)
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
        #: The concurrency limits (`[concurrency]`): one per listed key, and the default.
        self.concurrency_limits: dict[str, int] = dict(data.concurrency.limits)
        self.concurrency_default: int | None = data.concurrency.default
        #: The rates per concurrency key (`[concurrency] rates`), and the default rate.
        self.concurrency_rates: dict[str, RateSpec] = dict(data.concurrency.rates)
        self.concurrency_default_rate: RateSpec | None = data.concurrency.default_rate
        #: The declared failure kinds (`[failures.kinds]`), and whether others are accepted.
        self.failure_kinds: dict[str, FailureKindSpec] = dict(data.failures.kinds)
        self.failures_open = data.failures.open
        #: The kinds the default retry policy retries (`retry_by_default = true`), sorted.
        self.default_retry_on: tuple[str, ...] = tuple(
            sorted(name for name, kind in data.failures.kinds.items() if kind.retry_by_default)
        )
        self.backoff_multiplier: dict[str, int] = {
            name: shape.multiplier for name, shape in data.backoff.items()
        }
        self.terminal_states = frozenset(n for n, s in data.states.items() if s.kind == "terminal")
        #: The states in which a worker holds the work (kind "active").
        self.claimed_states = frozenset(n for n, s in data.states.items() if s.kind == "active")
        self.operations: dict[str, CompiledOperation] = {
            name: CompiledOperation(
                name=name,
                spec=operation,
                policy=self.policies[operation.policy] if operation.policy is not None else None,
            )
            for name, operation in data.operations.items()
        }
        #: The operation each policy decides for (the first that names it).
        self.policy_operation: dict[str, str] = {}
        for name, row in data.operations.items():
            if row.policy is not None:
                self.policy_operation.setdefault(row.policy, name)
        #: The operation that enforces fallen deadlines (its row is used at worker calls too).
        self.deadline_operation = next(
            (n for n, op in data.operations.items() if op.effect == "enforce_deadline"), ""
        )
        self.roles = _roles(data)
        self._own: dict[tuple[str, str], TransitionSpec] = {}
        for (source, name), edges in self._by_operation.items():
            declared = data.operations.get(name)
            if declared is None or data.states[source].kind == "transient":
                continue
            own = [edge for edge in edges if declared.actor in edge.actors]
            if own:
                self._own[(source, name)] = own[0]
        #: The state a workload is created in: where the admitting operation's edge starts.
        self.initial_state = self.roles.initial
        self.machine = build_machine(list(data.states), data.transitions)

    def concurrency_limit(self, key: str | None) -> int | None:
        """How many workloads of concurrency key `key` may hold a claim at once (None: no limit).

        A key listed in `[concurrency] limits` has its own limit; any other key
        has `[concurrency] default`; a workload without a key (None) has none.
        """
        if key is None:
            return None
        return self.concurrency_limits.get(key, self.concurrency_default)

    def concurrency_rate(self, key: str | None) -> RateSpec | None:
        """The rate claims of concurrency key `key` are held to (None: no rate).

        A key listed in `[concurrency] rates` has its own; any other key has
        `[concurrency] default_rate`; a workload without a key (None) has none.
        """
        if key is None:
            return None
        return self.concurrency_rates.get(key, self.concurrency_default_rate)

    def edges_for(self, state: str, operation: str) -> list[TransitionSpec]:
        """The edges out of `state` that `operation` may take."""
        return self._by_operation.get((state, operation), [])

    def own_edge(self, state: str, operation: str) -> TransitionSpec | None:
        """The edge `operation` itself takes out of `state` (not one its policy decides).

        It is the edge out of `state` listing the operation that the operation's
        actor class may take (the loader checks there is at most one); an edge
        only the system may take, from a caller's operation, is its policy's.
        None when there is none: the operation is not available there. An
        operation is never available from a transient state (those exist only
        inside the commit that entered them).
        """
        return self._own.get((state, operation))

    def available(self, state: str, operation: str) -> bool:
        """May `operation` be called on a workload in `state`?"""
        return (state, operation) in self._own

    def effect_command(self, operation: CompiledOperation) -> type:
        """The command type an operation takes (the one its effect is declared with)."""
        return EFFECTS[operation.spec.effect].command

    def check_failure_kind(self, kind: str, field: str = "kind") -> None:
        """Refuse a failure kind the spec does not declare (`WORKLOAD_INVALID`, naming the valid).

        Any kind passes when the spec opens the vocabulary (`[failures] open = true`).
        Nothing is decided or written before this refusal.

        >>> spec = default_spec()
        >>> spec.check_failure_kind("transient_connection")
        >>> spec.check_failure_kind("transient_conection")
        Traceback (most recent call last):
        ...
        workwarden.statemachine.errors.WorkloadError: WORKLOAD_INVALID: kind: unknown failure kind \
'transient_conection' (valid: timeout, transient_connection, validation, worker_failure)
        """
        if self.failures_open or kind in self.failure_kinds:
            return
        valid = sorted(self.failure_kinds)
        message = f"unknown failure kind {kind!r} (valid: {', '.join(valid)})"
        raise errors.WorkloadError(
            errors.INVALID,
            f"{field}: {message}",
            {"field": field, "valid": valid, "errors": [{"field": field, "message": message}]},
        )

    def check_retry_on(
        self, retry_on: tuple[str, ...], field: str = "retry_policy.retry_on"
    ) -> None:
        """Refuse a retry policy's `retry_on` naming an undeclared kind, as `check_failure_kind`."""
        for index, kind in enumerate(retry_on):
            self.check_failure_kind(kind, f"{field}[{index}]")

    def edge(self, source: str, target: str) -> TransitionSpec | None:
        """The edge from `source` to `target`, if the table has one."""
        return self.edges.get((source, target))

    def __repr__(self) -> str:
        return f"<Spec {self.data.spec.name} from {self.source}>"


def _roles(data: SpecFile) -> Roles:
    """What the core needs to know of the states by what they are for, derived from the table."""
    effects = {name: op.effect for name, op in data.operations.items()}

    def targets(effect: str) -> frozenset[str]:
        return frozenset(
            edge.to
            for edge in data.transitions
            if any(effects.get(op) == effect for op in edge.operations)
        )

    kinds = {name: state.kind for name, state in data.states.items()}
    initial = sorted(
        edge.from_state
        for edge in data.transitions
        if any(effects.get(op) == "admit" for op in edge.operations)
    )
    return Roles(
        initial=initial[0] if initial else "",
        queued=frozenset(n for n, k in kinds.items() if k == "queued"),
        claimed=targets("lease") - frozenset(n for n, k in kinds.items() if k != "active"),
        succeeded=targets("record_result"),
        cancelling=frozenset(s for s in targets("cancel") if kinds.get(s) == "active"),
    )


def check_spec_file(path: str | Path) -> list[Problem]:
    """Every problem in the spec file at `path` (an empty list when it is valid)."""
    file = str(path)
    text = _read(path)
    if isinstance(text, Problem):
        return [text]
    return parse_spec_text(text, file)[1]


def _read(path: str | Path) -> str | Problem:
    """The text of the file at `path`, or the problem that prevents reading it."""
    if not isinstance(path, (str, os.PathLike)):
        return Problem(
            repr(path), "(file)", f"a spec path is a str or a path, not {type(path).__name__}"
        )
    name = os.fspath(path)
    if not isinstance(name, str):
        return Problem(repr(path), "(file)", "a spec path is a str or a path to str, not bytes")
    if "\x00" in name:
        return Problem(repr(name), "(file)", "a spec path holds no NUL character")
    try:
        # At most one byte past the bound: a device that never ends (/dev/zero) or a
        # file of gigabytes is refused for its size, not read into memory.
        with open(name, "rb") as file:
            data = file.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        return Problem(str(path), "(file)", f"cannot read the file: {exc.strerror or exc}")
    if len(data) > MAX_SPEC_BYTES:
        return Problem(str(path), "(file)", f"larger than {MAX_SPEC_BYTES:,} bytes: not a spec")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Problem(str(path), "(file)", f"not UTF-8 text: {exc.reason} at byte {exc.start}")


def load_spec_text(text: str, source: str = "<text>") -> Spec:
    """Load a spec from TOML text; refuse it with `WORKLOAD_SPEC_INVALID` on any problem."""
    if not isinstance(text, str) or not isinstance(source, str):
        raise errors.invalid(
            "text" if not isinstance(text, str) else "source",
            "spec text and its source name are str",
        )
    data, problems = parse_spec_text(text, source)
    if problems or data is None:
        raise errors.WorkloadError(
            errors.SPEC_INVALID,
            f"{len(problems)} problem(s) in {source}: " + "; ".join(str(p) for p in problems[:5]),
            {
                "problems": [
                    {"file": p.file, "field": p.field, "message": p.message} for p in problems
                ]
            },
        )
    return Spec(data, source)


def load_spec(path: str | Path | None = None) -> Spec:
    """Load and compile the spec at `path` (the shipped spec when `None`)."""
    if path is None:
        return default_spec()
    text = _read(path)
    if isinstance(text, Problem):
        raise errors.WorkloadError(
            errors.SPEC_INVALID,
            f"cannot read spec {text.file}: {text.message}",
            {"problems": [{"file": text.file, "field": text.field, "message": text.message}]},
        )
    return load_spec_text(text, str(path))


def shipped_spec_text() -> str:
    """The text of the spec shipped with the package."""
    return resources.files("workwarden.specs").joinpath("workload.toml").read_text("utf-8")


@cache
def default_spec() -> Spec:
    """The shipped spec (`specs/workload.toml`), loaded once and shared."""
    return load_spec_text(shipped_spec_text(), "specs/workload.toml")


def spec_summary(spec: Spec) -> Mapping[str, int]:
    """Counts of what a spec declares (states, transitions, policies, error codes)."""
    return {
        "states": len(spec.states),
        "transitions": len(spec.edges),
        "operations": len(spec.operations),
        "policies": len(spec.policies),
        "errors": len(spec.errors),
        "failure_kinds": len(spec.failure_kinds),
    }
