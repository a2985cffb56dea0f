"""The semantic checks of a spec file: every name it uses must exist, and its parts must agree.

`parse_spec_text` parses TOML text, validates its structure with the models
of `spec_model` and then its meaning: states, operations, predicates,
anchors and error codes are resolved against the registries, edges out of
terminal states must be declared, every policy must end in a rule that
always matches and may only decide what the table lets it do. The semantic
checks run on whatever parsed, so one run reports every problem it can,
each with the file and the field path.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from workwarden.statemachine import errors
from workwarden.statemachine.catalogue import shipped_classes, shipped_default_retry_on
from workwarden.statemachine.commands import CARRIES_FENCE
from workwarden.statemachine.effects import EFFECTS, REPLAYS
from workwarden.statemachine.predicates import ANCHORS, PREDICATES
from workwarden.statemachine.spec_model import (
    BACKOFF_SHAPES,
    DEADLINE_KINDS,
    KIND_PREDICATES,
    REQUIRED_OPERATIONS,
    BackoffSpec,
    DeadlineKindSpec,
    ErrorSpec,
    FailureKindSpec,
    OperationSpec,
    PolicySpec,
    Problem,
    RuleSpec,
    SpecFile,
    StateSpec,
    TextPattern,
    TransitionSpec,
    split_test,
)

__all__ = ["MAX_SPEC_BYTES", "parse_spec_text", "raised_codes"]

#: The largest spec read, in bytes of UTF-8 (the shipped one is about 30 KiB): a
#: bigger file is refused whole, before it is parsed, so a wrong path (a disk image,
#: a device that never ends) costs no memory and no time.
MAX_SPEC_BYTES = 4 * 1024 * 1024

_STATE_NAME = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$")
_EVENT_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
_ERROR_CODE = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$")
_FAILURE_KIND = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
_FAILURE_KIND_MAX = 256  # the longest `Name`, as `FailCommand.kind` takes it
#: An operation name as a call gives one (`models.Name`): 1 to 256 printable characters.
_OPERATION_NAME = re.compile(r"^[^\x00-\x1f\x7f]{1,256}\Z")


#: How many valid names a message lists before it says how many more there are: a
#: spec of thousands of states would otherwise repeat them all in every problem that
#: names an unknown one, and its report would grow with the square of the file.
_LISTED = 20


def _listed(names: Iterable[str]) -> str:
    """Names for a message, comma-separated: the first `_LISTED`, then how many more."""
    names = list(names)
    shown = ", ".join(names[:_LISTED])
    rest = len(names) - _LISTED
    return f"{shown}, ... ({rest} more)" if rest > 0 else shown


def _field_path(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(root)"


def _type_message(err: Any) -> str:
    """Pydantic's message, with the value it refused when that is a short scalar."""
    value = err.get("input")
    if err["type"] in ("missing", "extra_forbidden") or not isinstance(
        value, (str, int, float, bool)
    ):
        return str(err["msg"])
    shown = repr(value)
    return f"{err['msg']} (got {shown if len(shown) <= 40 else shown[:37] + '...'})"


_M = TypeVar("_M", bound=BaseModel)


def _model(model: type[_M], value: Any) -> _M | None:
    try:
        return model.model_validate(value)
    except ValidationError:
        return None


def _table(model: type[_M], value: Any) -> dict[str, _M | None] | None:
    """A TOML table of entries; an entry that does not parse is kept by name, as None."""
    if not isinstance(value, dict):
        return None
    return {str(name): _model(model, entry) for name, entry in value.items()}


def _items(model: type[_M], value: Any) -> tuple[list[tuple[int, _M]], bool] | None:
    """The entries of an array that parse, by index, and whether all of them did."""
    if not isinstance(value, list):
        return None
    parsed = [(i, _model(model, item)) for i, item in enumerate(value)]
    kept = [(i, item) for i, item in parsed if item is not None]
    return kept, len(kept) == len(parsed)


@dataclass(frozen=True, slots=True)
class _PolicyParts:
    via: str | None
    rules: list[tuple[int, RuleSpec]]
    complete: bool


@dataclass(frozen=True, slots=True)
class _Parts:
    """What could be read of each section of a spec, for the semantic checks.

    The semantic checks run even when the structure is broken in places, so
    that one run reports every problem: a section is None when it is missing
    or of the wrong shape, and an entry of a table that does not parse is
    kept by name as None, so references to it are not reported as unknown.
    Checks that need a whole section (is every edge a policy needs there?)
    run only when that section parsed completely.
    """

    states: dict[str, StateSpec | None] | None
    transitions: list[tuple[int, TransitionSpec]]
    transitions_complete: bool
    policies: dict[str, _PolicyParts | None] | None
    operations: dict[str, OperationSpec | None] | None
    backoff: dict[str, BackoffSpec | None] | None
    deadline_order: list[str] | None
    deadline_kinds: dict[str, DeadlineKindSpec | None] | None
    forbidden_text: list[tuple[int, TextPattern]]
    forbidden_keys: list[tuple[int, str]]
    errors: dict[str, ErrorSpec | None] | None
    failure_kinds: dict[str, FailureKindSpec | None] | None
    failures_open: bool
    check_retry_on: dict[str, list[str]]
    retention_keep: list[str]


def _policy_parts(value: Any) -> _PolicyParts | None:
    whole = _model(PolicySpec, value)
    if whole is not None:
        return _PolicyParts(whole.via, list(enumerate(whole.rules)), True)
    if not isinstance(value, dict):
        return None
    via = value.get("via")
    rules = _items(RuleSpec, value.get("rules"))
    return _PolicyParts(via if isinstance(via, str) else None, rules[0] if rules else [], False)


def _parts(raw: Mapping[str, Any]) -> _Parts:
    transitions = _items(TransitionSpec, raw.get("transitions"))
    policies = raw.get("policies")
    deadlines = raw.get("deadlines")
    deadlines = deadlines if isinstance(deadlines, dict) else {}
    order = deadlines.get("order")
    secrets = raw.get("secrets")
    failures = raw.get("failures")
    failures = failures if isinstance(failures, dict) else {}
    check = raw.get("check")
    check = check if isinstance(check, dict) else {}
    retention = raw.get("retention")
    keep = retention.get("keep") if isinstance(retention, dict) else None
    patterns = (
        _items(TextPattern, secrets.get("forbidden_text")) if isinstance(secrets, dict) else None
    )
    keys = secrets.get("forbidden_keys") if isinstance(secrets, dict) else None
    return _Parts(
        states=_table(StateSpec, raw.get("states")),
        transitions=transitions[0] if transitions else [],
        transitions_complete=transitions is not None and transitions[1],
        policies=(
            {str(name): _policy_parts(p) for name, p in policies.items()}
            if isinstance(policies, dict)
            else None
        ),
        operations=_table(OperationSpec, raw.get("operations")),
        backoff=_table(BackoffSpec, raw.get("backoff")),
        deadline_order=(
            order if isinstance(order, list) and all(isinstance(k, str) for k in order) else None
        ),
        deadline_kinds=_table(DeadlineKindSpec, deadlines.get("kinds")),
        forbidden_text=patterns[0] if patterns else [],
        forbidden_keys=(
            [(i, key) for i, key in enumerate(keys) if isinstance(key, str)]
            if isinstance(keys, list)
            else []
        ),
        errors=_table(ErrorSpec, raw.get("errors")),
        failure_kinds=_table(FailureKindSpec, failures.get("kinds")),
        failures_open=failures.get("open") is True,
        check_retry_on={
            key: value
            for key in ("first_retry_on", "second_retry_on")
            if isinstance(value := check.get(key), list) and all(isinstance(k, str) for k in value)
        },
        retention_keep=[k for k in keep if isinstance(k, str)] if isinstance(keep, list) else [],
    )


class _Checker:
    """The semantic checks: every name a field uses must exist, and the parts must agree."""

    def __init__(self, parts: _Parts, file: str) -> None:
        self.parts = parts
        self.file = file
        self.problems: list[Problem] = []
        states = parts.states
        self.valid_states = _listed(states) if states is not None else ""
        self.edges: dict[tuple[str, str], TransitionSpec] = {}
        for _, edge in parts.transitions:
            self.edges.setdefault((edge.from_state, edge.to), edge)
        # The edges by what they answer, looked up once per rule, operation and deadline
        # rather than searched each time (a spec of many edges and rules would take the
        # product of the two).
        #: Operation -> the edges listing it, in table order.
        self.listing: dict[str, list[TransitionSpec]] = {}
        #: (from, to, operation) of every edge the system may take by that operation.
        self.system_edges: set[tuple[str, str, str]] = set()
        #: (to, operation) of every edge the system may take by that operation.
        self.system_entries: set[tuple[str, str]] = set()
        for edge in self.edges.values():
            for operation in dict.fromkeys(edge.operations):
                self.listing.setdefault(operation, []).append(edge)
                if "system" in edge.actors:
                    self.system_edges.add((edge.from_state, edge.to, operation))
                    self.system_entries.add((edge.to, operation))
        operations = parts.operations or {}
        self.valid_operations = _listed(operations)
        #: Policy name -> the operations that consult it, in declaration order.
        self.consulted_by: dict[str, list[str]] = {}
        for name, op in operations.items():
            if op is not None and op.policy is not None:
                self.consulted_by.setdefault(op.policy, []).append(name)

    def add(self, field: str, message: str) -> None:
        self.problems.append(Problem(self.file, field, message))

    def kind(self, state: str) -> str | None:
        """The state's kind, or None when it is not known."""
        entry = self.parts.states.get(state) if self.parts.states is not None else None
        return entry.kind if entry is not None else None

    def check_state(self, field: str, state: str) -> bool:
        """Report `state` at `field` if it is not declared; True when it is known to exist."""
        if self.parts.states is None:
            return False
        if state not in self.parts.states:
            self.add(field, f"unknown state {state!r} (valid: {self.valid_states})")
            return False
        return True

    def run(self) -> list[Problem]:
        self.states()
        self.transitions()
        self.entered()
        self.operations()
        self.policies()
        self.backoff()
        self.deadlines()
        self.secrets()
        self.errors()
        self.failures()
        self.retention()
        return self.problems

    def retention(self) -> None:
        """`[retention] keep` names terminal states (only finished work is ever purged)."""
        for index, state in enumerate(self.parts.retention_keep):
            field = f"retention.keep[{index}]"
            if self.check_state(field, state) and self.kind(state) != "terminal":
                self.add(field, f"{state} is not a terminal state: only finished work is purged")

    def states(self) -> None:
        states = self.parts.states
        if states is None:
            return
        for name in states:
            if not _STATE_NAME.match(name):
                self.add(f"states.{name}", "a state name is SCREAMING_SNAKE_CASE")

    def entered(self) -> None:
        """Every state is reached by a path of edges from the initial one: no workload is elsewhere.

        A state no edge enters is reported as such (usually a typo in the edge meant
        to reach it); one that edges enter only from states no path reaches (two
        states leading only to each other) is reported as not reached.
        """
        states, operations = self.parts.states, self.parts.operations
        if states is None or operations is None or not self.parts.transitions_complete:
            return
        if any(op is None for op in operations.values()):
            return  # which operation admits is not known
        admits = {
            name for name, op in operations.items() if op is not None and op.effect == "admit"
        }
        entered = {edge.to for edge in self.edges.values()}
        initial = {edge.from_state for edge in self.edges.values() if admits & set(edge.operations)}
        if not initial:
            return  # reported as the admitting operation's problem
        leaving: dict[str, list[str]] = {}
        for edge in self.edges.values():
            leaving.setdefault(edge.from_state, []).append(edge.to)
        reached, frontier = set(initial), list(initial)
        while frontier:
            for target in leaving.get(frontier.pop(), []):
                if target not in reached:
                    reached.add(target)
                    frontier.append(target)
        for name in states:
            if name not in entered and name not in initial:
                self.add(
                    f"states.{name}",
                    f"no edge enters {name}, so no workload can ever be in it: add an edge into"
                    " it, or remove the state",
                )
            elif name not in reached:
                self.add(
                    f"states.{name}",
                    f"no path of edges from {_listed(sorted(initial))}, where work is admitted,"
                    f" reaches {name}, so no workload can ever be in it: add an edge into it"
                    " from a state work reaches, or remove the state",
                )

    def transitions(self) -> None:
        first_edge: dict[tuple[str, str], int] = {}
        first_event: dict[tuple[str, str], tuple[int, str]] = {}
        for i, edge in self.parts.transitions:
            where = f"transitions[{i}]"
            self.check_state(f"{where}.from", edge.from_state)
            self.check_state(f"{where}.to", edge.to)
            key = (edge.from_state, edge.to)
            if key in first_edge:
                self.add(
                    where,
                    f"duplicate edge {edge.from_state} -> {edge.to} "
                    f"(first at transitions[{first_edge[key]}])",
                )
            else:
                first_edge[key] = i
            if not _EVENT_NAME.match(edge.event):
                self.add(
                    f"{where}.event", f"event name {edge.event!r} is not like 'workload.claimed'"
                )
            # One event out of one state must lead to one target, or the machine
            # would move to whichever edge it met first.
            seen = first_event.setdefault((edge.from_state, edge.event), (i, edge.to))
            if seen[1] != edge.to:
                self.add(
                    f"{where}.event",
                    f"event {edge.event!r} already leaves {edge.from_state} for {seen[1]} "
                    f"(transitions[{seen[0]}]): the machine would be ambiguous",
                )
            for j, operation in enumerate(edge.operations):
                if self.parts.operations is not None and operation not in self.parts.operations:
                    self.add(
                        f"{where}.operations[{j}]",
                        f"unknown operation {operation!r} (valid: {self.valid_operations})",
                    )
            self.exit(where, edge)

    def exit(self, where: str, edge: TransitionSpec) -> None:
        source, target = self.kind(edge.from_state), self.kind(edge.to)
        if source == "terminal":
            if edge.exit is None:
                self.add(
                    where,
                    f"edge {edge.from_state} -> {edge.to} leaves terminal state "
                    f"{edge.from_state} but is not declared as a re-arm or a close "
                    '(set exit = "rearm" or exit = "close")',
                )
            elif edge.exit == "rearm" and target not in (None, "queued"):
                self.add(f"{where}.exit", "a re-arm must lead to a queued state")
            elif edge.exit == "close" and target not in (None, "terminal"):
                self.add(f"{where}.exit", "a close must lead to a terminal state")
        elif edge.exit is not None and source is not None:
            self.add(
                f"{where}.exit",
                f"exit is only for edges out of a terminal state, not {edge.from_state}",
            )

    def edge_taking(self, source: str | None, target: str, operation: str) -> bool:
        """Does an edge into `target` (from `source`, or from anywhere) let the system take it?"""
        if source is None:
            return (target, operation) in self.system_entries
        return (source, target, operation) in self.system_edges

    def operations(self) -> None:
        operations = self.parts.operations
        if operations is None:
            return
        for name, effect in REQUIRED_OPERATIONS.items():
            if name not in operations:
                self.add("operations", f"missing operation {name!r}, which the commands call")
                continue
            entry = operations[name]
            if entry is not None and entry.effect != effect:
                self.add(
                    f"operations.{name}.effect",
                    f"the {name!r} command needs the effect {effect!r}, not {entry.effect!r}",
                )
        for name, entry in operations.items():
            if not _OPERATION_NAME.match(name):
                # Callers name an operation (`Authority.operate`, `OperatorCommand`, the HTTP
                # API) and the audit log records it, each as a name: one no call could
                # give would be an edge no one takes.
                shown = repr(name)[1:-1]
                self.add(
                    f"operations.{shown if len(shown) <= 40 else shown[:37] + '...'}",
                    "an operation name is what `operate` is called with: 1 to 256 characters,"
                    " no control character (a line break, a tab)",
                )
            if entry is not None:
                self.operation(f"operations.{name}", name, entry)
        self.same_command(operations)
        self.results_lead_somewhere(operations)

    def same_command(self, operations: Mapping[str, OperationSpec | None]) -> None:
        """An operation the core decides by another's row (they share a command) agrees with it.

        `claim_next` sends the command `claim` sends (`ClaimCommand`, for the workload
        the scheduler picked), and the core decides a command by the row its `op`
        names: a key or an edge of `claim_next` that differed from `claim`'s would be
        a rule the file states and the core never applies.
        """
        for name, effect in REQUIRED_OPERATIONS.items():
            command = EFFECTS[effect].command
            assert issubclass(command, BaseModel), "every effect takes a command model"
            decided_by = command.model_fields["op"].default
            row, by = operations.get(name), operations.get(decided_by)
            if decided_by == name or row is None or by is None:
                continue
            why = f"{name!r} is decided by the row of {decided_by!r} (they send one command)"
            for key in OperationSpec.model_fields:
                if key != "meaning" and getattr(row, key) != getattr(by, key):
                    self.add(
                        f"operations.{name}.{key}",
                        f"{why}: its {key} must equal that of {decided_by!r},"
                        f" {getattr(by, key)!r}, not {getattr(row, key)!r}",
                    )
            if not self.parts.transitions_complete:
                continue
            listing = {(e.from_state, e.to) for e in self.listing.get(name, [])}
            wanted = {(e.from_state, e.to) for e in self.listing.get(decided_by, [])}
            for source, target in sorted(listing ^ wanted):
                lists, lacks = name, decided_by
                if (source, target) in wanted:
                    lists, lacks = decided_by, name
                self.add(
                    f"operations.{name}",
                    f"{why}: an edge lists both or neither, and {source} -> {target} lists"
                    f" {lists!r} but not {lacks!r}",
                )

    def results_lead_somewhere(self, operations: Mapping[str, OperationSpec | None]) -> None:
        """Some edge takes an operation of effect `record_result`: where results lead.

        A dependency admitted without a `required_state` waits for that state
        (`Spec.roles.succeeded`), so a table where no result leads anywhere
        could admit no such dependency.
        """
        if not self.parts.transitions_complete or any(op is None for op in operations.values()):
            return
        recording = [n for n, op in operations.items() if op and op.effect == "record_result"]
        if recording and not any(self.listing.get(name) for name in recording):
            self.add(
                f"operations.{recording[0]}",
                f"no edge lists {', '.join(map(repr, recording))}, so no result leads to a"
                " state: a dependency waits, by default, for the state a result leads to",
            )

    def chained(self, where: str, op: OperationSpec) -> None:
        """`then`: a lease that starts its attempt in the same commit, and nothing else."""
        operations = self.parts.operations or {}
        then = operations.get(op.then or "")
        if op.effect != "lease":
            self.add(
                f"{where}.then", f"only a claim (effect 'lease') may name `then`, not {op.effect!r}"
            )
        elif then is None:
            self.add(
                f"{where}.then",
                f"unknown operation {op.then!r} (valid: {_listed(sorted(operations))})",
            )
        elif op.then != "start" or then.effect != "start_attempt" or not then.fenced:
            self.add(
                f"{where}.then",
                f"`then` names 'start', the fenced operation that starts the attempt (effect "
                f"'start_attempt'), not {op.then!r}",
            )

    def operation(self, where: str, name: str, op: OperationSpec) -> None:
        info = EFFECTS.get(op.effect)
        if info is None:
            self.add(
                f"{where}.effect",
                f"unknown effect {op.effect!r} (valid: {', '.join(EFFECTS)})",
            )
        else:
            if op.fenced and not issubclass(info.command, CARRIES_FENCE):
                self.add(f"{where}.fenced", f"the effect {op.effect!r} takes no fence")
            if info.sets_attempt and op.attempt_status is None:
                self.add(
                    f"{where}.attempt_status",
                    f"the effect {op.effect!r} marks an attempt: say with which status",
                )
        if op.replay is not None:
            replay = REPLAYS.get(op.replay)
            if replay is None:
                self.add(
                    f"{where}.replay",
                    f"unknown replay {op.replay!r} (valid: {', '.join(REPLAYS)})",
                )
            elif replay.effect != op.effect:
                self.add(
                    f"{where}.replay",
                    f"the replay {op.replay!r} answers calls of the effect {replay.effect!r}",
                )
        policy = None
        if op.policy is not None and self.parts.policies is not None:
            if op.policy not in self.parts.policies:
                self.add(
                    f"{where}.policy",
                    f"unknown policy {op.policy!r} (valid: {_listed(self.parts.policies)})",
                )
            else:
                policy = self.parts.policies[op.policy]
        if info is not None:
            kind = "none" if op.policy is None else None
            if policy is not None:
                kind = "via" if policy.via is not None else "gate"
            if kind is not None and info.policy not in ("any", kind):
                wanted = {
                    "via": "a policy with `via`",
                    "gate": "no policy, or one without `via`",
                    "none": "no policy",
                }[info.policy]
                self.add(f"{where}.policy", f"the effect {op.effect!r} takes {wanted}")
        if self.parts.errors is not None and op.denied not in self.parts.errors:
            self.add(f"{where}.denied", f"unknown error code {op.denied!r}")
        elif self.parts.errors is not None:
            entry = self.parts.errors[op.denied]
            if entry is not None and entry.records:
                # A denial is raised before anything is decided or written; a code marked
                # records = true tells the caller the workload changed.
                self.add(
                    f"{where}.denied",
                    f"{op.denied} says records = true (raised after a committed decision), but"
                    " a denial changes nothing: name a code whose entry does not record",
                )
        if op.then is not None:
            self.chained(where, op)
        if not self.parts.transitions_complete:
            return
        edges = self.listing.get(name, [])
        if op.stays and edges:
            self.add(f"{where}.stays", f"{name!r} is listed on edges, so it does not stay")
        elif not op.stays and not edges:
            self.add(where, f"no edge lists {name!r} (set stays = true if it takes none)")
        for edge in edges:
            if op.actor not in edge.actors and "system" not in edge.actors:
                self.add(
                    where,
                    f"the edge {edge.from_state} -> {edge.to} lets neither {op.actor!r} nor the"
                    " system take it",
                )
        if op.policy is None or policy is not None:
            self.resolution(where, name, op, edges)

    def resolution(
        self,
        where: str,
        name: str,
        op: OperationSpec,
        edges: list[TransitionSpec],
    ) -> None:
        """Each (state, operation) pair resolves to at most one edge its actor takes.

        The other edges out of a state that list the operation are taken by the
        system, as its policy decides (out of the policy's `via` state, or where
        a gate policy diverts the workload).
        """
        own: dict[str, list[str]] = {}
        known = self.parts.states or {}
        for edge in edges:
            if edge.from_state not in known or edge.to not in known:
                continue
            if op.actor in edge.actors and self.kind(edge.from_state) != "transient":
                own.setdefault(edge.from_state, []).append(edge.to)
        if op.effect == "admit":
            sources = {edge.from_state for edge in edges if edge.from_state in known}
            if len(sources) != 1:
                self.add(where, "the admitting operation must leave exactly one (initial) state")
            return
        if op.effect == "lease":
            # A claim's own edge is where a worker holds the work under its lease.
            for target in sorted({t for targets in own.values() for t in targets}):
                if self.kind(target) != "active":
                    self.add(
                        where,
                        f"{name!r} leases the work into {target}, of kind {self.kind(target)!r}:"
                        " a claim leads to an active state (one a worker holds)",
                    )
        for source, targets in sorted(own.items()):
            if len(targets) > 1:
                self.add(
                    where,
                    f"{name!r} leaves {source} for {', '.join(sorted(targets))} as "
                    f"{op.actor!r}: one edge, or let only the system take all but one "
                    f"(its policy decides those)",
                )

    def policies(self) -> None:
        policies = self.parts.policies
        if policies is None:
            return
        for name, policy in policies.items():
            where = f"policies.{name}"
            users = self.consulted_by.get(name)
            if self.parts.operations is not None and not users:
                self.add(where, f"no operation consults the policy {name!r}")
            if policy is not None:
                self.policy(where, users[0] if users else None, policy)

    def policy(self, where: str, operation: str | None, policy: _PolicyParts) -> None:
        via = policy.via
        via_known = via is not None and self.check_state(f"{where}.via", via)
        if via is not None and via_known and self.kind(via) not in (None, "transient"):
            self.add(
                f"{where}.via",
                f"{via} is passed through within one commit, so it must be of kind transient",
            )
        if (
            via_known
            and via is not None
            and operation is not None
            and self.parts.transitions_complete
            and not any(e.to == via for e in self.listing.get(operation, []))
        ):
            self.add(f"{where}.via", f"no edge into {via} lists the operation {operation!r}")
        always: int | None = None
        for r, rule in policy.rules:
            rwhere = f"{where}.rules[{r}]"
            if always is not None:
                self.add(rwhere, f"never reached: rules[{always}] before it always matches")
            elif not rule.when:
                always = r
            self.rule(rwhere, rule, policy, operation, via if via_known else None)
        if policy.complete and always is None:
            name = where.removeprefix("policies.")
            self.add(
                f"{where}.rules",
                f"policy {name!r} lacks a final rule that always matches (when = [])",
            )

    def rule(
        self,
        where: str,
        rule: RuleSpec,
        policy: _PolicyParts,
        operation: str | None,
        via: str | None,
    ) -> None:
        for t, test in enumerate(rule.when):
            pname, _ = split_test(test)
            if pname not in PREDICATES:
                spaced = (
                    ": write NAME or `not NAME`, with no other space"
                    if pname.strip() in PREDICATES
                    else ""
                )
                self.add(
                    f"{where}.when[{t}]",
                    f"unknown predicate {pname!r}{spaced} (valid: {', '.join(PREDICATES)})",
                )
        if rule.to is None:
            if policy.via is not None:
                self.add(
                    f"{where}.to", f"a rule of a policy with `via` must move on from {policy.via}"
                )
            elif rule.direct or rule.delay != "none":
                self.add(where, "`direct` and `delay` need a target (`to`)")
        elif self.check_state(f"{where}.to", rule.to) and operation is not None:
            source = via if via is not None and not rule.direct else None
            if self.parts.transitions_complete and not self.edge_taking(source, rule.to, operation):
                start = f"{source} -> " if source is not None else "into "
                self.add(
                    f"{where}.to",
                    f"no edge {start}{rule.to} in the table lets the system take it "
                    f"by {operation!r}",
                )
        if rule.direct and policy.complete and policy.via is None:
            self.add(f"{where}.direct", "direct only makes sense in a policy with `via`")
        if rule.refuse is not None and self.parts.errors is not None:
            if rule.refuse not in self.parts.errors:
                self.add(f"{where}.refuse", f"unknown error code {rule.refuse!r}")
            else:
                entry = self.parts.errors[rule.refuse]
                if entry is not None and not entry.records:
                    self.add(
                        f"{where}.refuse",
                        f"{rule.refuse} is raised after the decision is committed, "
                        "so its catalogue entry must say records = true",
                    )

    def backoff(self) -> None:
        backoff = self.parts.backoff
        if backoff is None:
            return
        for shape in BACKOFF_SHAPES:
            if shape not in backoff:
                self.add("backoff", f"missing backoff shape {shape!r}")
        for shape in backoff:
            if shape not in BACKOFF_SHAPES:
                self.add(
                    f"backoff.{shape}",
                    f"unknown backoff shape (valid: {', '.join(BACKOFF_SHAPES)})",
                )
        fixed = backoff.get("fixed")
        if fixed is not None and fixed.multiplier != 1:
            self.add("backoff.fixed.multiplier", "a fixed backoff does not grow: multiplier = 1")

    def deadlines(self) -> None:
        kinds = self.parts.deadline_kinds
        if kinds is not None:
            for kind in DEADLINE_KINDS:
                if kind not in kinds:
                    self.add("deadlines.kinds", f"missing deadline {kind!r} (a Timeouts field)")
            for kind, entry in kinds.items():
                where = f"deadlines.kinds.{kind}"
                if kind not in DEADLINE_KINDS:
                    self.add(
                        where, f"unknown deadline {kind!r} (valid: {', '.join(DEADLINE_KINDS)})"
                    )
                if entry is not None:
                    self.deadline(where, entry)
        order = self.parts.deadline_order
        if order is not None and kinds is not None:
            for k, kind in enumerate(order):
                if kind not in kinds:
                    self.add(f"deadlines.order[{k}]", f"unknown deadline {kind!r}")
                elif kind in order[:k]:
                    self.add(f"deadlines.order[{k}]", f"deadline {kind!r} is listed twice")
            for kind in kinds:
                if kind not in order:
                    self.add("deadlines.order", f"deadline {kind!r} is not in the order")

    @property
    def deadline_operation(self) -> str:
        """The operation that enforces deadlines (the one whose effect is enforce_deadline)."""
        operations = self.parts.operations or {}
        return next(
            (n for n, op in operations.items() if op and op.effect == "enforce_deadline"), ""
        )

    def deadline(self, where: str, entry: DeadlineKindSpec) -> None:
        if entry.anchor not in ANCHORS:
            self.add(
                f"{where}.anchor",
                f"unknown anchor {entry.anchor!r} (valid: {', '.join(ANCHORS)})",
            )
        operations = self.parts.operations or {}
        row = operations.get(self.deadline_operation)
        name = row.policy if row is not None else None
        policy = (
            self.parts.policies.get(name)
            if self.parts.policies is not None and name is not None
            else None
        )
        via = policy.via if policy is not None else None
        for s, state in enumerate(entry.while_states):
            known = self.check_state(f"{where}.while[{s}]", state)
            if (
                known
                and via is not None
                and self.parts.transitions_complete
                and not self.edge_taking(state, via, self.deadline_operation)
            ):
                self.add(
                    f"{where}.while[{s}]",
                    f"no edge {state} -> {via} lets the system take it by "
                    f"{self.deadline_operation!r}",
                )

    def secrets(self) -> None:
        for i, pattern in self.parts.forbidden_text:
            if (pattern.contains is None) == (pattern.prefix is None):
                self.add(
                    f"secrets.forbidden_text[{i}]", "set exactly one of `contains` or `prefix`"
                )
            elif pattern.contains == "" or pattern.prefix == "":
                # Every text contains and starts with "": all free text would be a secret.
                self.add(f"secrets.forbidden_text[{i}]", "a pattern must not be empty")
        for i, key in self.parts.forbidden_keys:
            if not key:
                self.add(f"secrets.forbidden_keys[{i}]", "a forbidden key must not be empty")

    def errors(self) -> None:
        catalogue = self.parts.errors
        if catalogue is None:
            return
        for code in catalogue:
            if not _ERROR_CODE.match(code):
                self.add(f"errors.{code}", "an error code is SCREAMING_SNAKE_CASE")
        for code in raised_codes():
            if code not in catalogue:
                self.add("errors", f"missing error code {code!r}, which the core raises")
        shipped = shipped_classes()
        for code, entry in catalogue.items():
            if entry is not None and code in shipped and entry.error_class != shipped[code]:
                self.add(
                    f"errors.{code}.class",
                    f"{code} is of class {shipped[code]!r} in every spec (programs sort by it)",
                )

    def failures(self) -> None:
        """The failure kinds: well named, every kind a policy or `[check]` names declared.

        The default retry policy is built with a request, before a spec is
        chosen, so a spec keeps the shipped spec's `retry_by_default` kinds.
        """
        kinds = self.parts.failure_kinds
        if kinds is None:
            return
        valid = _listed(sorted(kinds))
        for name in kinds:
            if not _FAILURE_KIND.match(name):
                self.add(f"failures.kinds.{name}", "a failure kind is snake_case")
            elif len(name) > _FAILURE_KIND_MAX:
                # A worker's `fail` names its kind in at most that many characters.
                self.add(
                    f"failures.kinds.{name[:40]}...",
                    f"a failure kind is at most {_FAILURE_KIND_MAX} characters, as fail()"
                    " takes it; no failure could ever be reported of this one",
                )
        for name, policy in (self.parts.policies or {}).items():
            for r, rule in policy.rules if policy is not None else []:
                for t, test in enumerate(rule.when):
                    kind = KIND_PREDICATES.get(split_test(test)[0])
                    if kind is not None and kind not in kinds:
                        self.add(
                            f"policies.{name}.rules[{r}].when[{t}]",
                            f"{test!r} asks about the failure kind {kind!r}, which "
                            f"[failures.kinds] does not declare (valid: {valid})",
                        )
        if not self.parts.failures_open:
            for key, names in self.parts.check_retry_on.items():
                for k, kind in enumerate(names):
                    if kind not in kinds:
                        self.add(
                            f"check.{key}[{k}]", f"unknown failure kind {kind!r} (valid: {valid})"
                        )
        if all(entry is not None for entry in kinds.values()):
            default = tuple(
                sorted(n for n, entry in kinds.items() if entry and entry.retry_by_default)
            )
            shipped = shipped_default_retry_on()
            if default != shipped:
                self.add(
                    "failures.kinds",
                    "the default retry policy is built with the request, before a spec is "
                    f"chosen, so retry_by_default must mark exactly {', '.join(shipped)} "
                    f"(here: {', '.join(default) or 'none'})",
                )


def raised_codes() -> tuple[str, ...]:
    """Every error code the core may raise (the constants of `errors`)."""
    return tuple(
        value for name, value in vars(errors).items() if name.isupper() and isinstance(value, str)
    )


_TOML_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")
_TOML_AT_END = re.compile(r"\s*\(at end of document\)$")


def _toml_problem(exc: tomllib.TOMLDecodeError, text: str, file: str) -> Problem:
    """A TOML syntax error, with its line and column in the field (the message says where)."""
    message = str(exc)
    at = _TOML_AT.search(message)
    if at is not None:
        where = f"line {at[1]}, column {at[2]}"
        message = message[: at.start()]
    else:
        line, column = text.count("\n") + 1, len(text) - text.rfind("\n")
        where = f"line {line}, column {column} (end of file)"
        message = _TOML_AT_END.sub("", message)
    return Problem(file, f"(toml) {where}", f"not valid TOML: {message}")


def parse_spec_text(text: str, file: str) -> tuple[SpecFile | None, list[Problem]]:
    """Parse and check spec text: its model (None if its structure is broken), every problem."""
    if len(text) > MAX_SPEC_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        return None, [Problem(file, "(file)", f"larger than {MAX_SPEC_BYTES:,} bytes: not a spec")]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        # A file read as UTF-8 has none, but text given to `load_spec_text` may (read with
        # errors="surrogateescape"): a name or meaning holding one could be written to no
        # file, diagram or store.
        message = f"not UTF-8 text: {exc.reason} at character {exc.start}"
        return None, [Problem(file, "(file)", message)]
    if text.startswith("\ufeff"):
        # TOML has no byte order mark: the parser would only say "Invalid statement".
        message = "not valid TOML: the file starts with a byte order mark (U+FEFF)"
        return None, [Problem(file, "(toml) line 1, column 1", message + "; save it without one")]
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return None, [_toml_problem(exc, text, file)]
    except RecursionError:
        return None, [Problem(file, "(toml)", "not valid TOML: nested too deeply to read")]
    problems: list[Problem] = []
    data: SpecFile | None = None
    try:
        data = SpecFile.model_validate(raw)
    except ValidationError as exc:
        problems.extend(
            Problem(file, _field_path(err["loc"]), _type_message(err))
            for err in exc.errors(include_url=False)
        )
    problems.extend(_Checker(_parts(raw), file).run())
    return data, problems
