"""Breadth-first exploration of the compiled model (`compiled.py`), reported as `check` reports.

`check_compiled` explores the same universe as `checker.check`, in the same
order, through the compiled model's tables instead of the core: the same
states (by the same keys), transitions, edge and rule coverage, witnesses
and violations, at a fraction of the cost. A concrete state is rebuilt only
when a table lacks an entry, by replaying its path through the reference
model from the nearest state kept; each rebuilt state must compile to the
compiled state it stands for, or the check reports a refinement failure
(`CheckReport.refinement`) with the trace to it. `refinement.refine` then
holds witnesses, counterexamples and random traces to the real `Authority`.

A complete exploration is then searched for liveness counterexamples under
weak fairness (`liveness.py`): each is reported as a violation whose trace
is a lasso, a stem and then its loop twice.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Callable

from workwarden.statemachine import errors
from workwarden.statemachine.check import compiled as compiled_module
from workwarden.statemachine.check.abstraction import keep
from workwarden.statemachine.check.checker import (
    CheckReport,
    Finding,
    _cannot_finish,
    _Explorer,
    _first_per_property,
    policy_findings,
    refuse_max_states,
)
from workwarden.statemachine.check.compiled import (
    CLOCK,
    CONCRETE_LIMIT,
    CompiledModel,
    Helpers,
    RefinementError,
)
from workwarden.statemachine.check.liveness import LivenessGraph, find_lassos
from workwarden.statemachine.check.state import CheckState, Universe
from workwarden.statemachine.check.universe import Action, Model
from workwarden.statemachine.properties.coverage import (
    Reached,
    edges_never_taken,
    rules_never_decided,
    states_never_at_rest,
    unreached,
)
from workwarden.statemachine.spec import Spec

__all__ = ["check_compiled", "concrete_along"]


def concrete_along(compiled: CompiledModel, steps: list[tuple[Action, int]]) -> CheckState:
    """The concrete state the reference model reaches along `steps` from the initial one."""
    state = compiled.initial_concrete
    for action, _now in steps:
        state = compiled.take(state, action).state
    return state


def check_compiled(
    spec: Spec,
    universe: Universe | None = None,
    *,
    model: Model | None = None,
    compiled: CompiledModel | None = None,
    max_states: int | None = None,
    stop_at_first: bool = True,
    progress: Callable[[int, int, int], None] | None = None,
    liveness: bool = True,
    processes: int = 1,
) -> CheckReport:
    """Explore the universe through the compiled model; the report `checker.check` makes.

    `compiled` (made from `model`, or from a model of `universe` under
    `spec`) may be given to keep its tables for later (`refinement.refine`
    walks them). The collector is frozen as `checker.check` does. With
    `liveness` (the default), a complete exploration is searched for lassos
    (`liveness.find_lassos`), each reported as a violation of its property;
    the search's time is `report.tables["liveness_seconds"]`.

    With `processes` above 1, that many helper processes (`compiled.Helpers`,
    forked: POSIX only) ask the reference model for the entries each level of
    the exploration lacks, all at once, while this process rebuilds the
    concrete states they are asked at and numbers the answers in the order it
    found them. The report is the one a single process makes: the same states,
    transitions, coverage, witnesses and violations, with the same traces. A
    count below 1, or above 1 where the system cannot fork, is `WORKLOAD_INVALID`
    (field `processes`); a helper that stops mid-check raises
    `compiled.HelperStopped`. A `max_states` below 1 is `WORKLOAD_INVALID`
    (`checker.refuse_max_states`).
    """
    refuse_max_states(max_states)
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise errors.bad_argument("processes", "must be a whole number, 1 or more")
    freeze = gc.get_freeze_count() == 0
    if compiled is None:
        compiled = CompiledModel(model or Model(spec, universe or Universe.from_spec(spec)))
    if processes > 1 and not compiled_module.can_fork():
        raise errors.bad_argument(
            "processes", "above 1 forks helper processes, which this system cannot"
        )
    if processes > 1 and compiled.verify_shared:
        raise errors.bad_argument(
            "processes", "verify_shared asks every shared entry in this process: one process"
        )
    helpers = Helpers(compiled, processes) if processes > 1 else None
    try:
        return _explore(
            spec, compiled, max_states, stop_at_first, progress, freeze, liveness, helpers
        )
    finally:
        if helpers is not None:
            helpers.close()
        if freeze:
            gc.unfreeze()


def _explore(
    spec: Spec,
    compiled: CompiledModel,
    max_states: int | None,
    stop_at_first: bool,
    progress: Callable[[int, int, int], None] | None,
    freeze: bool,
    liveness: bool = True,
    helpers: Helpers | None = None,
) -> CheckReport:
    model = compiled.model
    report = CheckReport(
        spec=spec.source, spec_name=spec.data.spec.name, universe=model.universe.to_dict()
    )
    report.policy_problems = policy_findings(spec)
    started = time.perf_counter()
    explorer = _Explorer(model, progress)
    horizon = model.universe.horizon_ms
    init = compiled.initial
    seen: dict[tuple[int, ...], int] = {compiled.key(init): 0}
    # Compiled states already placed (finer than keys: a quick first look).
    placed: dict[tuple[int, ...], int] = {init: 0}
    frontier: deque[tuple[tuple[int, ...], int, int, int]] = deque([(init, 0, 0, 0)])
    edges_taken: dict[tuple[str, str], int] = {}
    rules: dict[str, set[str]] = {name: set() for name in spec.policies}
    at_rest: set[str] = set()
    checked: set[int] = set()
    classes = compiled.classes
    n = compiled.slots
    explorer.finished.append(1 if compiled.all_terminal(init) else 0)
    explorer.cut.append(0)
    graph = LivenessGraph(compiled) if liveness else None
    if graph is not None:
        graph.add_state(init)
    for doc in compiled.initial_concrete.docs:
        w = model.workload(doc)
        if w is not None:
            at_rest.add(w.state)
            for event in w.execution_history:
                edge = (event.from_state or "", event.to)
                edges_taken[edge] = edges_taken.get(edge, 0) + 1
                report.witnesses.setdefault(f"edge:{edge[0]} -> {edge[1]}", ())
    for d in init[:n]:
        if d >= 0:
            checked.add(d)
    kept: dict[int, CheckState] = {}
    violations: list[Finding] = []
    depth = 0
    index = 0
    # With helpers: the last level whose missing entries were asked for and kept.
    settled = -1

    def kept_before(index: int) -> tuple[CheckState, list[tuple[int, Action]]]:
        # The nearest state kept on the path to `index`, and each state after it (its
        # number and the action that reached it), in order.
        chain: list[tuple[int, Action]] = []
        j = index
        while j > 0 and j not in kept:
            via = explorer.via[j]
            assert via is not None
            chain.append((j, via[0]))
            j = explorer.parent[j]
        chain.reverse()
        return (kept[j] if j > 0 else compiled.initial_concrete), chain

    def held(index: int, c: tuple[int, ...], state: CheckState) -> None:
        # The concrete state rebuilt for `index` must compile to `c`.
        rebuilt = compiled.compact(state)
        if rebuilt != c:
            raise RefinementError(
                "the compiled state differs from the reference model's state on the "
                f"same path: compiled {c}, reference {rebuilt}",
                explorer.trace(index),
            )

    def concrete_of(index: int, c: tuple[int, ...]) -> Callable[[], CheckState]:
        def rebuild() -> CheckState:
            state, chain = kept_before(index)
            for i, action in chain:
                state = compiled.take(state, action).state
                keep(kept, i, state, CONCRETE_LIMIT)
            held(index, c, state)
            return state

        return rebuild

    def path_of(index: int) -> tuple[CheckState, tuple[Action, ...]]:
        # Where a helper rebuilds the state from: the nearest state kept, and the path on.
        start, chain = kept_before(index)
        return start, tuple(action for _, action in chain)

    def reached(index: int, c: tuple[int, ...], state: CheckState) -> None:
        # A state a helper rebuilt: held to `c`, then kept.
        held(index, c, state)
        keep(kept, index, state, CONCRETE_LIMIT)

    try:
        while frontier:
            c, index, level, now = frontier.popleft()
            if helpers is not None and level > settled:
                if settled < 0:
                    compiled.look_ahead(helpers, [(c, index)], path_of)
                # The helpers were asked as the level's states were found (below).
                settled = level
                compiled.settle(helpers, path_of, reached)
            depth = max(depth, level)
            if progress is not None and index % 2000 == 0:
                progress(len(seen), report.transitions, level)
            if freeze and index % 4096 == 0:
                gc.freeze()
            for outcome in compiled.outcomes(c, concrete_of(index, c)):
                action = outcome.action
                at = now
                if outcome.rel:
                    at = now + outcome.rel
                    action = Action("jump", "clock", to=at)
                    if at > horizon:
                        explorer.cut[index] = 1
                        continue
                elif outcome.cut:
                    explorer.cut[index] = 1
                    continue
                if outcome.noop:
                    continue
                report.transitions += 1
                findings = outcome.findings
                if findings is not None:
                    for name, message in findings.violations:
                        violations.append(
                            Finding(name, message, explorer.trace(index, (action, now)))
                        )
                    for edge in findings.edges:
                        edges_taken[edge] = edges_taken.get(edge, 0) + 1
                    for policy, decision in findings.rules:
                        rules[policy].add(decision)
                    fresh = [name for name in findings.names if name not in report.witnesses]
                    if fresh:
                        trace = explorer.trace(index, (action, now))
                        for name in fresh:
                            report.witnesses[name] = trace
                nxt = compiled.apply(c, outcome)
                if nxt is c:
                    target = index
                else:
                    known = placed.get(nxt)
                    if known is None:
                        digest = compiled.key(nxt)
                        known = seen.get(digest)
                        if known is None:
                            known = len(seen)
                            seen[digest] = known
                            explorer.parent.append(index)
                            explorer.via.append((action, now))
                            explorer.finished.append(1 if compiled.all_terminal(nxt) else 0)
                            explorer.cut.append(0)
                            if graph is not None:
                                graph.add_state(nxt)
                            for d in nxt[:n]:
                                if d < 0 or d in checked:
                                    continue
                                checked.add(d)
                                at_rest.add(classes[d].state)
                                for name, message in compiled.class_violations(d):
                                    violations.append(Finding(name, message, explorer.trace(known)))
                            frontier.append((nxt, known, level + 1, at))
                            if helpers is not None:
                                compiled.look_ahead(helpers, ((nxt, known),), path_of)
                        placed[nxt] = known
                    target = known
                explorer.edges.append(index)
                explorer.edges.append(target)
                if graph is not None:
                    graph.add_edge(action, bool(outcome.rel))
                if violations and stop_at_first:
                    break
            if violations and stop_at_first:
                break
            if max_states is not None and len(seen) >= max_states:
                report.complete = False
                break
    except RefinementError as failure:
        # A shared outcome the core answers otherwise names no trace: the state's.
        trace = failure.trace or explorer.trace(index)
        report.refinement.append(Finding("refinement", failure.message, trace))
        report.complete = False
    report.seconds = time.perf_counter() - started
    report.states = len(seen)
    report.depth = depth
    report.violations = _first_per_property(violations)
    if violations and stop_at_first:
        report.complete = False
    report.edges_taken = {
        f"{a} -> {b}": k for (a, b), k in sorted(edges_taken.items()) if (a, b) in spec.edges
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
            report.violations.append(
                Finding(
                    "work_can_always_finish",
                    f"{report.cannot_finish} reachable states cannot reach one where every "
                    "workload is terminal",
                    explorer.trace(stuck),
                )
            )
    report.engine = "compiled"
    report.tables = {
        "classes": len(compiled.classes),
        "entries": sum(len(table) for table in compiled.tables) + len(compiled.one_doc),
        "misses": list(compiled.misses),
        # Entries asked of the core (the clock's are worked out from the classes).
        "asked": sum(compiled.misses) - compiled.misses[CLOCK],
        "shared": list(compiled.shared),
        "shared_steps": compiled.shared_steps,
        # Processes that asked the core: this one, or the helpers (`processes`).
        "processes": helpers.processes if helpers is not None else 1,
    }
    if graph is not None and report.complete:
        searched = time.perf_counter()
        lassos = find_lassos(graph, explorer.edges, seen, explorer.trace)
        report.violations += [lasso.finding() for lasso in lassos]
        report.tables["liveness_seconds"] = round(time.perf_counter() - searched, 3)
    return report
