"""An explicit-state, breadth-first model checker over the pure core.

`check(spec, universe)` explores every state of a bounded universe (see
`universe.py`) reachable from the initial one, breadth first, so the first
violation found has a shortest trace. States are canonicalised (worker
symmetry reduced) into short keys of numbers (see `Model.canonical`); only
the keys, parent links and the graph's edges are kept, so memory stays
bounded by the number of states.

It checks, and reports:

- **always** (safety): every invariant that is a property of one state, on
  every reachable state, and the step properties of every write (no write from
  a stale or expired fence, or after a deadline had fallen; every write extends
  the history it replaced);
- **sometimes** (reachability): which edges of the table some step takes and
  which none can (reported by name), which rules of each policy decide some
  step, which states are never at rest (seen only inside one commit), whether
  every terminal state is reached;
- **liveness within the bounds**: every reachable state can reach one where
  every workload is terminal (states cut off by the time horizon count as
  able to);
- **policies**: each is total (some rule matches every combination of its
  predicates) and deterministic (the same inputs decide the same way).
"""

from __future__ import annotations

import gc
import itertools
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workwarden.statemachine.check.universe import (
    Action,
    CheckState,
    Model,
    StateKey,
    Step,
    Universe,
)
from workwarden.statemachine.deadlines import deadline_breach
from workwarden.statemachine.models import Workload
from workwarden.statemachine.predicates import attempt_budget
from workwarden.statemachine.properties.invariants import check_workload
from workwarden.statemachine.spec import Spec

__all__ = ["CheckReport", "Finding", "check", "policy_findings", "state_violations"]

_FENCED = frozenset(
    {"start", "heartbeat", "execution_context", "checkpoint", "complete", "fail", "confirm_cancel"}
)
_DEADLINE_GUARDED = frozenset(
    {"start", "heartbeat", "execution_context", "checkpoint", "complete", "fail"}
)
_POLICY_ACTORS = {
    "system.failure": "failure",
    "system.recovery": "recovery",
    "system.deadline": "deadline",
    "system.timeout": "operator_timeout",
    "system.claim": "claim",
}


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
    horizon_cut: int = 0
    cannot_finish: int = 0
    violations: list[Finding] = field(default_factory=list)
    policy_problems: list[str] = field(default_factory=list)
    #: A shortest trace taking each edge (`edge:A -> B`) and deciding by each
    #: rule (`rule:policy.decision`), from the initial state: the checker's
    #: witnesses, from which conformance vectors are made.
    witnesses: dict[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)

    @property
    def states_per_second(self) -> float:
        """Distinct states explored per second of wall time."""
        return self.states / self.seconds if self.seconds > 0 else 0.0

    @property
    def ok(self) -> bool:
        """No violation, no policy problem, no state that cannot finish."""
        return not self.violations and not self.policy_problems and self.cannot_finish == 0

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (keys sorted by the caller's dump)."""
        return {
            "spec": self.spec,
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
            "horizon_cut": self.horizon_cut,
            "cannot_finish": self.cannot_finish,
            "violations": [v.to_dict() for v in self.violations],
            "policy_problems": self.policy_problems,
            "ok": self.ok,
        }


def policy_findings(spec: Spec) -> list[str]:
    """Problems with the policies' totality or determinism (empty when every policy is sound)."""
    problems: list[str] = []
    for name, policy in sorted(spec.policies.items()):
        names = policy.predicates
        for values in itertools.product((False, True), repeat=len(names)):
            truth = dict(zip(names, values, strict=True))
            try:
                first = policy.first_match(truth.__getitem__)
            except AssertionError:
                problems.append(f"policy {name} decides nothing when {truth}")
                continue
            again = policy.first_match(truth.__getitem__)
            if again is not first:
                problems.append(f"policy {name} is not deterministic when {truth}")
    return problems


def state_violations(spec: Spec, workload: Workload) -> list[tuple[str, str]]:
    """The one-state invariants a committed workload breaks: (property, message) pairs.

    The invariants of `statemachine.invariants` (the same definitions the
    stateful suite holds every committed document to), and one more that only
    reachable states keep: READY work has an attempt left (only a document
    written outside the core, an import, can be READY with its budget spent).
    """
    out = [(v.invariant, v.message) for v in check_workload(spec, workload)]
    budget = attempt_budget(workload)
    if workload.state == "READY" and workload.attempt_count >= budget:
        out.append(
            (
                "ready_work_has_an_attempt_left",
                f"READY with {workload.attempt_count} of {budget} attempts used",
            )
        )
    return out


def _step_violations(
    model: Model, state: CheckState, action: Action, step: Step
) -> list[tuple[str, str]]:
    """Properties of one write: who wrote it, when, and on top of what."""
    out: list[tuple[str, str]] = []
    for slot, before, after in step.decision_docs:
        if after is None or after == before:
            continue
        old = model.workload(before)
        new = model.workload(after)
        assert new is not None
        if old is not None:
            prefix = old.execution_history
            if new.execution_history[: len(prefix)] != prefix:
                out.append(
                    ("writes_extend_the_committed_history", f"a write to slot {slot} lost events")
                )
            claim = old.current_claim
            recovered = any(
                e.actor == "system.recovery" for e in new.execution_history[len(prefix) :]
            )
            if recovered and claim is not None and claim.expires_at > state.now:
                out.append(
                    (
                        "recovery_only_of_an_expired_lease",
                        f"slot {slot} recovered at {state.now}, "
                        f"its lease ran to {claim.expires_at}",
                    )
                )
    base = action.label.removeprefix("stale_")
    if action.label == "commit" and step.wrote:
        base = "complete" if step.refusal is None else ""
    if base in _FENCED and step.wrote and step.refusal is None and action.label != "commit":
        slot = action.slot
        old = model.workload(state.docs[slot])
        held, lost = state.workers[action.worker]
        hold = lost if action.label.startswith("stale_") else held
        assert old is not None
        assert hold is not None
        claim = old.current_claim
        if claim is None or claim.claim_id != hold[1] or claim.fencing_token != hold[3]:
            out.append(("no_write_from_a_stale_fence", f"{action.label} by {action.actor}"))
        elif claim.expires_at <= state.now:
            out.append(("no_write_from_an_expired_lease", f"{action.label} by {action.actor}"))
        if base in _DEADLINE_GUARDED and deadline_breach(model.spec, old, state.now) is not None:
            kind, at = deadline_breach(model.spec, old, state.now) or ("", 0)
            out.append(
                (
                    "no_write_after_a_deadline",
                    f"{action.label} at {state.now} though the {kind} deadline fell at {at}",
                )
            )
    return out


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
    is left as it is, and its checks are not frozen.
    """
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
    report = CheckReport(spec=spec.source, universe=model.universe.to_dict())
    report.policy_problems = policy_findings(spec)
    started = time.perf_counter()
    explorer = _Explorer(model, progress)
    init = model.initial()
    init, digest = model.canonical(init)
    seen: dict[StateKey, int] = {digest: 0}
    frontier: deque[tuple[CheckState, int, int]] = deque([(init, 0, 0)])
    edges_taken: dict[tuple[str, str], int] = {}
    rules: dict[str, set[str]] = {name: set() for name in spec.policies}
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
            if step.wrote:
                # Only a write can break a step property or take an edge.
                for name, message in _step_violations(model, state, action, step):
                    violations.append(
                        Finding(name, message, explorer.trace(index, (action, state.now)))
                    )
                found: list[str] = []
                if action.label in ("claim", "claim_next") and step.refusal is None:
                    rules["claim"].add("claimable")
                    found.append("rule:claim.claimable")
                for _slot, before, after in step.decision_docs:
                    if after is None or after == before:
                        continue
                    new = model.workload(after)
                    old = model.workload(before)
                    assert new is not None
                    start = len(old.execution_history) if old is not None else 0
                    for event in new.execution_history[start:]:
                        key = (event.from_state or "", event.to)
                        edges_taken[key] = edges_taken.get(key, 0) + 1
                        found.append(f"edge:{key[0]} -> {key[1]}")
                        decision = event.evidence.get("decision")
                        policy = _POLICY_ACTORS.get(event.actor)
                        if decision is not None and policy is not None:
                            rules[policy].add(decision)
                            found.append(f"rule:{policy}.{decision}")
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
    report.edges_never_taken = [
        f"{a} -> {b}" for (a, b) in sorted(spec.edges) if (a, b) not in edges_taken
    ]
    report.never_at_rest = sorted(set(spec.states) - at_rest)
    report.rules_taken = {name: sorted(found) for name, found in sorted(rules.items())}
    report.rules_never_taken = {
        name: [r.spec.decision for r in policy.rules if r.spec.decision not in rules[name]]
        for name, policy in sorted(spec.policies.items())
    }
    report.terminal_unreached = sorted(terminal - at_rest)
    report.horizon_cut = sum(explorer.cut)
    if report.complete:
        report.cannot_finish = _cannot_finish(explorer, len(seen))
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


def _cannot_finish(explorer: _Explorer, count: int) -> int:
    """States from which no path reaches all-terminal (or the horizon): a reverse search."""
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
    return count - sum(able)
