"""An explicit-state, breadth-first model checker over the pure core.

`check(spec, universe)` explores every state of a bounded universe (see
`universe.py`) reachable from the initial one, breadth first, so the first
violation found has a shortest trace. States are canonicalised (worker
symmetry reduced) into short keys of numbers (see `Model.canonical`); only
the keys, parent links and the graph's edges are kept, so memory stays
bounded by the number of states.

It holds the model to the registered properties
(`statemachine/properties/registry.py`), through the same check functions
the stateful suite and the chaos audit use, and reports each violation
under its registered name:

- **always** (safety): the properties of one workload (`check_workload`,
  and `check_reached` for what only reachable states keep) on every
  document of every reachable state, and the properties of one write
  (`check_write`) on every write a step makes, with the audit record the
  step would commit (its operation, the fence its worker presented, its
  instant);
- **sometimes** (reachability, `properties.coverage`): which edges of the
  table some step takes and which none can (reported by name), which rules
  of each policy decide some step, which states are never at rest (seen
  only inside one commit), whether every terminal state is reached
  (`CheckReport.sometimes`, by property);
- **eventually** (`work_can_always_finish`, within the bounds): every
  reachable state can reach one where every workload is terminal (states
  cut off by the time horizon count as able to);
- **the spec** (`policies_are_total`, `policies_are_deterministic`): each
  policy decides every combination of its predicates, the same way each
  time.
"""

from __future__ import annotations

import gc
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from workwarden.statemachine import errors
from workwarden.statemachine.check.oracle import PROPERTY
from workwarden.statemachine.check.oracle import check_step as spec_refinement
from workwarden.statemachine.check.universe import (
    APPLICATION,
    TENANT,
    Action,
    CheckState,
    Model,
    StateKey,
    Step,
    Universe,
    called,
)
from workwarden.statemachine.models import Workload
from workwarden.statemachine.properties.coverage import (
    Reached,
    check_policies,
    edges_never_taken,
    proceeding_rules,
    rules_never_decided,
    states_never_at_rest,
    unreached,
)
from workwarden.statemachine.properties.invariants import check_reached, check_workload
from workwarden.statemachine.properties.operations import operation_roles
from workwarden.statemachine.properties.writes import check_write
from workwarden.statemachine.spec import Spec
from workwarden.storage.base import AuditRecord

__all__ = [
    "CheckReport",
    "Finding",
    "StepFindings",
    "check",
    "policy_findings",
    "refuse_max_states",
    "state_violations",
    "step_findings",
    "with_spec_refinement",
]


@dataclass(frozen=True)
class Finding:
    """A violated property: its name, what was wrong, and the shortest trace to it."""

    property: str
    message: str
    trace: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"property": self.property, "message": self.message, "trace": list(self.trace)}


@dataclass
class CheckReport:
    """What an exploration covered and found."""

    spec: str
    universe: dict[str, Any]
    #: The spec's `[spec] name`: what a diagram of the report checks it is drawn on.
    spec_name: str = ""
    states: int = 0
    transitions: int = 0
    depth: int = 0
    seconds: float = 0.0
    complete: bool = True
    edges_taken: dict[str, int] = field(default_factory=dict)
    edges_never_taken: list[str] = field(default_factory=list)
    never_at_rest: list[str] = field(default_factory=list)
    rules_taken: dict[str, list[str]] = field(default_factory=dict)
    rules_never_taken: dict[str, list[str]] = field(default_factory=dict)
    terminal_unreached: list[str] = field(default_factory=list)
    #: Each registered `sometimes` property, with what no step reached (empty: met).
    sometimes: dict[str, list[str]] = field(default_factory=dict)
    horizon_cut: int = 0
    cannot_finish: int = 0
    violations: list[Finding] = field(default_factory=list)
    policy_problems: list[str] = field(default_factory=list)
    #: A shortest trace taking each edge (`edge:A -> B`) and deciding by each
    #: rule (`rule:policy.decision`), from the initial state: the checker's
    #: witnesses, from which conformance vectors are made.
    witnesses: dict[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    #: Steps where the compiled model and the real core disagree (`refinement.py`),
    #: each with its trace: a failure of the check itself.
    refinement: list[Finding] = field(default_factory=list)
    #: Which model explored: `reference` (the core at every step) or `compiled`.
    engine: str = "reference"
    #: For the compiled engine: the sizes of its tables and how often each was asked.
    tables: dict[str, Any] = field(default_factory=dict)

    @property
    def states_per_second(self) -> float:
        """Distinct states explored per second of wall time."""
        return self.states / self.seconds if self.seconds > 0 else 0.0

    @property
    def ok(self) -> bool:
        """No violation, no policy problem, no state that cannot finish, no refinement failure."""
        return (
            not self.violations
            and not self.policy_problems
            and self.cannot_finish == 0
            and not self.refinement
        )

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (keys sorted by the caller's dump)."""
        return {
            "spec": self.spec,
            "spec_name": self.spec_name,
            "universe": self.universe,
            "states": self.states,
            "transitions": self.transitions,
            "depth": self.depth,
            "seconds": round(self.seconds, 3),
            "states_per_second": round(self.states_per_second, 1),
            "complete": self.complete,
            "edges_taken": self.edges_taken,
            "edges_never_taken": self.edges_never_taken,
            "never_at_rest": self.never_at_rest,
            "rules_taken": self.rules_taken,
            "rules_never_taken": self.rules_never_taken,
            "terminal_unreached": self.terminal_unreached,
            "sometimes": self.sometimes,
            "horizon_cut": self.horizon_cut,
            "cannot_finish": self.cannot_finish,
            "violations": [v.to_dict() for v in self.violations],
            "policy_problems": self.policy_problems,
            "refinement": [v.to_dict() for v in self.refinement],
            "engine": self.engine,
            "tables": self.tables,
            "ok": self.ok,
        }


def policy_findings(spec: Spec) -> list[str]:
    """Problems with the policies' totality or determinism (empty when every policy is sound).

    Each names its registered property (`policies_are_total`,
    `policies_are_deterministic`; see `properties.coverage.check_policies`).
    """
    return [str(violation) for violation in check_policies(spec)]


def state_violations(spec: Spec, workload: Workload) -> list[tuple[str, str]]:
    """The properties a committed workload of a reachable state breaks: (property, message).

    The registered properties of one workload (`check_workload`, the same
    definitions the stateful suite and the chaos audit hold every committed
    document to) and of a workload the core reached (`check_reached`: queued
    work has an attempt left, which only an imported document can break).
    """
    found = check_workload(spec, workload) + check_reached(spec, workload)
    return [(violation.property, violation.message) for violation in found]


def _write_record(
    model: Model, state: CheckState, action: Action, slot: int, written: Workload
) -> AuditRecord:
    """The audit record of a step's write to `slot`, as the real authority would commit it.

    Its operation is the action's; a worker's call through a fence carries
    the fence the worker presented (held, or lost for a stale call); its
    instant is the step's, or for the racing writer's commit the instant
    the held decision was made at (its document's `updated_at`).
    """
    label = action.label
    # A move names its operation (an operation the spec adds with the effect `move`).
    operation = action.arg if label == "move" else called(label)
    at = written.updated_at if label == "commit" else state.now
    worker: str | None = None
    token: int | None = None
    if operation in operation_roles(model.spec).fenced and action.worker >= 0:
        held, lost = state.workers[action.worker]
        hold = lost if label.startswith("stale_") else held
        assert hold is not None
        worker, token = hold[2], hold[3]
    return AuditRecord(
        transaction_id="checker",
        key=model.ids[slot],
        version=0,
        actor=action.actor,
        operation=operation,
        tenant=TENANT,
        application=APPLICATION,
        at=at,
        digest="",
        worker=worker,
        fencing_token=token,
    )


def _step_violations(
    model: Model, state: CheckState, action: Action, step: Step
) -> list[tuple[str, str]]:
    """The properties of each write a step made (`check_write`): (property, message) pairs.

    Each write is checked with the record `_write_record` makes of it: who
    wrote it, through which fence, when, and on top of which version.
    """
    out: list[tuple[str, str]] = []
    for slot, before, after in step.decision_docs:
        if after is None or after == before:
            continue
        new = model.workload(after)
        assert new is not None
        record = _write_record(model, state, action, slot, new)
        for violation in check_write(model.spec, model.workload(before), new, record):
            out.append((violation.property, violation.message))
    return out


@dataclass(frozen=True)
class StepFindings:
    """What one writing step showed: broken step properties, edges taken, rules deciding.

    `names` are the coverage names (`edge:A -> B`, `rule:policy.decision`) in
    the order the step reached them, for the checker's witnesses.
    """

    violations: tuple[tuple[str, str], ...]
    edges: tuple[tuple[str, str], ...]
    rules: tuple[tuple[str, str], ...]
    names: tuple[str, ...]


def step_findings(
    model: Model,
    state: CheckState,
    action: Action,
    step: Step,
    proceeds: dict[str, tuple[str, str]],
    policy_of_actor: dict[str, str],
) -> StepFindings:
    """The findings of a step that wrote (see `StepFindings`).

    `proceeds` is `proceeding_rules(spec)` and `policy_of_actor` the
    operation roles' map, passed in so a caller works them out once.
    """
    violations = tuple(_step_violations(model, state, action, step))
    edges: list[tuple[str, str]] = []
    rules: list[tuple[str, str]] = []
    names: list[str] = []
    proceed = proceeds.get(action.label)
    if proceed is not None and step.refusal is None:
        rules.append(proceed)
        names.append(f"rule:{proceed[0]}.{proceed[1]}")
    for _slot, before, after in step.decision_docs:
        if after is None or after == before:
            continue
        new = model.workload(after)
        old = model.workload(before)
        assert new is not None
        start = len(old.execution_history) if old is not None else 0
        for event in new.execution_history[start:]:
            key = (event.from_state or "", event.to)
            edges.append(key)
            names.append(f"edge:{key[0]} -> {key[1]}")
            decision = event.evidence.get("decision")
            policy = policy_of_actor.get(event.actor)
            if decision is not None and policy is not None:
                rules.append((policy, decision))
                names.append(f"rule:{policy}.{decision}")
    return StepFindings(violations, tuple(edges), tuple(rules), tuple(names))


def with_spec_refinement(
    model: Model, state: CheckState, action: Action, step: Step, found: StepFindings | None
) -> StepFindings | None:
    """`found` with the step's disagreements with the spec (`oracle.check_step`) added."""
    problems = spec_refinement(model, state, action, step)
    if not problems:
        return found
    extra = tuple((PROPERTY, message) for message in problems)
    if found is None:
        return StepFindings(extra, (), (), ())
    return replace(found, violations=found.violations + extra)


def _action_dict(action: Action, now: int) -> dict[str, Any]:
    out: dict[str, Any] = {"action": action.label, "actor": action.actor, "now": now}
    if action.slot >= 0:
        out["slot"] = action.slot
    if action.worker >= 0:
        out["worker"] = action.worker
    if action.arg:
        out["arg"] = action.arg
    if action.to >= 0:
        out["to"] = action.to
    return out


class _Explorer:
    def __init__(self, model: Model, progress: Callable[[int, int, int], None] | None) -> None:
        self.model = model
        self.progress = progress
        self.parent = array("q", [-1])
        self.via: list[tuple[Action, int] | None] = [None]
        self.edges = array("q")
        self.finished = array("b")
        self.cut = array("b")

    def trace(
        self, index: int, last: tuple[Action, int] | None = None
    ) -> tuple[dict[str, Any], ...]:
        steps: list[dict[str, Any]] = []
        if last is not None:
            steps.append(_action_dict(*last))
        while index > 0:
            via = self.via[index]
            assert via is not None
            steps.append(_action_dict(*via))
            index = self.parent[index]
        steps.reverse()
        return tuple(steps)


def refuse_max_states(max_states: int | None) -> None:
    """`WORKLOAD_INVALID` (field `max_states`) unless `max_states` is None or a whole number,
    1 or more: a limit of 0 or less stops a check before its first level and reports it
    incomplete, as if the universe were too big, and one of another type fails mid-check."""
    if max_states is not None and (
        isinstance(max_states, bool) or not isinstance(max_states, int) or max_states < 1
    ):
        raise errors.bad_argument(
            "max_states", f"max_states is a whole number, 1 or more, not {max_states!r}"
        )


def check(
    spec: Spec,
    universe: Universe | None = None,
    *,
    model: Model | None = None,
    max_states: int | None = None,
    stop_at_first: bool = True,
    progress: Callable[[int, int, int], None] | None = None,
) -> CheckReport:
    """Explore the universe breadth first and report what holds and what does not.

    While it runs, what the exploration keeps (caches, graph, frontier) is
    frozen for Python's cycle collector (`gc.freeze`) as it grows, so that
    the collector does not walk it again at every full collection; it is
    unfrozen when the check returns. A process that freezes objects itself
    is left as it is, and its checks are not frozen. A `max_states` below 1 is
    `WORKLOAD_INVALID` (`refuse_max_states`).
    """
    refuse_max_states(max_states)
    freeze = gc.get_freeze_count() == 0
    try:
        return _check(spec, universe, model, max_states, stop_at_first, progress, freeze)
    finally:
        if freeze:
            # Back to the oldest generation; what is garbage by now goes by
            # reference counting, without a full collection.
            gc.unfreeze()


def _check(
    spec: Spec,
    universe: Universe | None,
    model: Model | None,
    max_states: int | None,
    stop_at_first: bool,
    progress: Callable[[int, int, int], None] | None,
    freeze: bool,
) -> CheckReport:
    model = model or Model(spec, universe or Universe.from_spec(spec))
    report = CheckReport(
        spec=spec.source, spec_name=spec.data.spec.name, universe=model.universe.to_dict()
    )
    report.policy_problems = policy_findings(spec)
    started = time.perf_counter()
    explorer = _Explorer(model, progress)
    init = model.initial()
    init, digest = model.canonical(init)
    seen: dict[StateKey, int] = {digest: 0}
    frontier: deque[tuple[CheckState, int, int]] = deque([(init, 0, 0)])
    edges_taken: dict[tuple[str, str], int] = {}
    rules: dict[str, set[str]] = {name: set() for name in spec.policies}
    policy_of_actor = operation_roles(spec).policy_of_actor
    proceeds = proceeding_rules(spec)
    at_rest: set[str] = set()
    checked_docs: set[str] = set()
    terminal = spec.terminal_states
    explorer.finished.append(1 if _all_terminal(model, init, terminal) else 0)
    explorer.cut.append(0)
    for doc in init.docs:
        w = model.workload(doc)
        if w is not None:
            at_rest.add(w.state)
            for event in w.execution_history:
                key = (event.from_state or "", event.to)
                edges_taken[key] = edges_taken.get(key, 0) + 1
                # Taken by the admissions that make the initial state: no steps.
                report.witnesses.setdefault(f"edge:{key[0]} -> {key[1]}", ())
    depth = 0
    violations: list[Finding] = []
    while frontier:
        state, index, level = frontier.popleft()
        depth = max(depth, level)
        if progress is not None and index % 2000 == 0:
            progress(len(seen), report.transitions, level)
        if freeze and index % 512 == 0:
            # What the exploration has kept so far lives on: the cycle
            # collector need not walk it again.
            gc.freeze()
        for action in model.actions(state):
            step = model.step(state, action)
            if step.cut:
                explorer.cut[index] = 1
                continue
            if step.noop:
                continue
            report.transitions += 1
            for message in spec_refinement(model, state, action, step):
                violations.append(
                    Finding(PROPERTY, message, explorer.trace(index, (action, state.now)))
                )
            if step.wrote:
                # Only a write can break a step property or take an edge.
                findings = step_findings(model, state, action, step, proceeds, policy_of_actor)
                for name, message in findings.violations:
                    violations.append(
                        Finding(name, message, explorer.trace(index, (action, state.now)))
                    )
                for key in findings.edges:
                    edges_taken[key] = edges_taken.get(key, 0) + 1
                for policy, decision in findings.rules:
                    rules[policy].add(decision)
                found = findings.names
                fresh = [name for name in found if name not in report.witnesses]
                if fresh:
                    trace = explorer.trace(index, (action, state.now))
                    for name in fresh:
                        report.witnesses[name] = trace
            if step.state is state:
                # Nothing changed (a refusal, a read): a step back to this state.
                target = index
            else:
                nxt, digest = model.canonical(step.state)
                known = seen.get(digest)
                if known is not None:
                    target = known
                else:
                    target = len(seen)
                    seen[digest] = target
                    explorer.parent.append(index)
                    explorer.via.append((action, state.now))
                    explorer.finished.append(1 if _all_terminal(model, nxt, terminal) else 0)
                    explorer.cut.append(0)
                    for doc in nxt.docs:
                        if doc is None or doc in checked_docs:
                            continue
                        checked_docs.add(doc)
                        w = model.workload(doc)
                        assert w is not None
                        at_rest.add(w.state)
                        for name, message in state_violations(spec, w):
                            violations.append(Finding(name, message, explorer.trace(target)))
                    frontier.append((nxt, target, level + 1))
            explorer.edges.append(index)
            explorer.edges.append(target)
            if violations and stop_at_first:
                break
        if violations and stop_at_first:
            break
        if max_states is not None and len(seen) >= max_states:
            report.complete = False
            break
    report.seconds = time.perf_counter() - started
    report.states = len(seen)
    report.depth = depth
    report.violations = _first_per_property(violations)
    if violations and stop_at_first:
        report.complete = False
    report.edges_taken = {
        f"{a} -> {b}": n for (a, b), n in sorted(edges_taken.items()) if (a, b) in spec.edges
    }
    report.edges_never_taken = [f"{a} -> {b}" for a, b in edges_never_taken(spec, edges_taken)]
    report.never_at_rest = states_never_at_rest(spec, at_rest)
    report.rules_taken = {name: sorted(found) for name, found in sorted(rules.items())}
    report.rules_never_taken = rules_never_decided(spec, rules)
    report.terminal_unreached = states_never_at_rest(spec, at_rest, {"terminal"})
    report.sometimes = unreached(spec, Reached(edges_taken, rules, at_rest))
    report.horizon_cut = sum(explorer.cut)
    if report.complete:
        report.cannot_finish, stuck = _cannot_finish(explorer, len(seen))
        if stuck is not None:
            # Reported under its registered name too, with a shortest trace to one such state.
            report.violations.append(
                Finding(
                    "work_can_always_finish",
                    f"{report.cannot_finish} reachable states cannot reach one where every "
                    "workload is terminal",
                    explorer.trace(stuck),
                )
            )
    return report


def _all_terminal(model: Model, state: CheckState, terminal: frozenset[str]) -> bool:
    for doc in state.docs:
        w = model.workload(doc)
        if w is not None and w.state not in terminal:
            return False
    return True


def _first_per_property(violations: list[Finding]) -> list[Finding]:
    first: dict[str, Finding] = {}
    for finding in violations:
        current = first.get(finding.property)
        if current is None or len(finding.trace) < len(current.trace):
            first[finding.property] = finding
    return sorted(first.values(), key=lambda f: (len(f.trace), f.property))


def _cannot_finish(explorer: _Explorer, count: int) -> tuple[int, int | None]:
    """States from which no path reaches all-terminal (or the horizon): a reverse search.

    Returns their number and the first of them found breadth first (None when none is).
    """
    incoming: list[list[int]] = [[] for _ in range(count)]
    edges = explorer.edges
    for i in range(0, len(edges), 2):
        incoming[edges[i + 1]].append(edges[i])
    able = bytearray(count)
    queue: deque[int] = deque()
    for i in range(count):
        if explorer.finished[i] or explorer.cut[i]:
            able[i] = 1
            queue.append(i)
    while queue:
        node = queue.popleft()
        for source in incoming[node]:
            if not able[source]:
                able[source] = 1
                queue.append(source)
    stuck = able.find(0)
    return count - sum(able), (stuck if stuck >= 0 else None)
