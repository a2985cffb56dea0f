"""Loading the spec file and compiling it for the core: lookups, policies and the machine.

`load_spec(path)` reads a TOML spec, checks its structure (the pydantic
models of `spec_model`) and its meaning against the registries (states,
operations, predicates, anchors, error codes; see `spec_checks`), and returns
a compiled `Spec`. Every problem is reported, each with the file and the
field; a spec with any problem is refused as a whole with
`WORKLOAD_SPEC_INVALID`. The models and registries are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from workwarden.statemachine import errors
from workwarden.statemachine.predicates import PREDICATES, Facts
from workwarden.statemachine.spec_checks import parse_spec_text, raised_codes
from workwarden.statemachine.spec_model import (
    ACTOR_CLASSES,
    BACKOFF_SHAPES,
    DEADLINE_KINDS,
    OPERATIONS,
    POLICIES,
    REQUIRED_STATES,
    BackoffSpec,
    DeadlineKindSpec,
    DeadlinesSpec,
    ErrorSpec,
    LimitsSpec,
    PolicySpec,
    Problem,
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
    "DEADLINE_KINDS",
    "OPERATIONS",
    "POLICIES",
    "REQUIRED_STATES",
    "BackoffSpec",
    "CompiledPolicy",
    "CompiledRule",
    "DeadlineKindSpec",
    "DeadlinesSpec",
    "ErrorSpec",
    "LimitsSpec",
    "PolicySpec",
    "Problem",
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
        self.backoff_multiplier: dict[str, int] = {
            name: shape.multiplier for name, shape in data.backoff.items()
        }
        self.terminal_states = frozenset(n for n, s in data.states.items() if s.kind == "terminal")
        #: The states in which a worker holds the work (kind "active").
        self.claimed_states = frozenset(n for n, s in data.states.items() if s.kind == "active")
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


def check_spec_file(path: str | Path) -> list[Problem]:
    """Every problem in the spec file at `path` (an empty list when it is valid)."""
    file = str(path)
    text = _read(path)
    if isinstance(text, Problem):
        return [text]
    return parse_spec_text(text, file)[1]


def _read(path: str | Path) -> str | Problem:
    """The text of the file at `path`, or the problem that prevents reading it."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        return Problem(str(path), "(file)", f"cannot read the file: {exc.strerror or exc}")
    except UnicodeDecodeError as exc:
        return Problem(str(path), "(file)", f"not UTF-8 text: {exc.reason} at byte {exc.start}")


def load_spec_text(text: str, source: str = "<text>") -> Spec:
    """Load a spec from TOML text; refuse it with `WORKLOAD_SPEC_INVALID` on any problem."""
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
            f"cannot read spec {path}: {text.message}",
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
        "policies": len(spec.policies),
        "errors": len(spec.errors),
    }
