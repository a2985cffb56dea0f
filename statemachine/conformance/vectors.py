"""Conformance vectors: which scenarios make the vector file, and what they cover.

The scenarios are the seed behaviours (`seed_scenarios()` in `scenarios.py`,
one or more per behaviour test of the suite), the operators' scope-wide calls
(`scope_scenarios()` in `scope_scenarios.py`: pauses and retention) plus
`extra_scenarios(spec)`,
the hook through which scenarios found by the model checker's exploration
join them. `generate_vectors` runs each through the reference
(`run_scenario`) and `render_vectors` writes the file; `coverage(spec,
vectors)` says which edges of the table and which rules of each policy the
vectors take.

A scenario, the vector format and running one through the reference are
`runner.py`; their names are importable from here too.

A spec that extends the shipped table (new states, edges or operations, such
as the pause and the approval gate of `specs/examples/`) gets its vectors
from `extended_vectors(spec)`: the shipped scenarios that behave under it
exactly as under the shipped spec, then the model checker's witnesses, under
the spec, for every edge and rule those do not take (each operation of effect
`move` among them), with the `moves` budget raised until every edge a move
takes is witnessed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from workwarden.statemachine.conformance.runner import (
    CONFORMANCE_KEY_ID,
    CONFORMANCE_SECRET,
    FORMAT,
    DocumentState,
    Expectation,
    ReferenceImplementation,
    Scenario,
    Snapshot,
    StepCommand,
    StoreEntry,
    VectorScenario,
    VectorStep,
    command_json,
    document_digest,
    normalise_document,
    observe,
    read_vectors,
    render_vectors,
    run_scenario,
    snapshot,
    target_key,
)
from workwarden.statemachine.conformance.scenarios import seed_scenarios
from workwarden.statemachine.conformance.scope_scenarios import scope_scenarios
from workwarden.statemachine.models import Event
from workwarden.statemachine.properties.decisions import decisions_taken
from workwarden.statemachine.spec import Spec, default_spec

__all__ = [
    "CONFORMANCE_KEY_ID",
    "CONFORMANCE_SECRET",
    "FORMAT",
    "Coverage",
    "DocumentState",
    "Expectation",
    "ReferenceImplementation",
    "Scenario",
    "Snapshot",
    "StepCommand",
    "StoreEntry",
    "VectorScenario",
    "VectorStep",
    "all_scenarios",
    "command_json",
    "coverage",
    "document_digest",
    "extended_vectors",
    "extends_the_table",
    "extra_scenarios",
    "generate_vectors",
    "normalise_document",
    "observe",
    "read_vectors",
    "render_vectors",
    "run_scenario",
    "snapshot",
    "target_key",
]


def extra_scenarios(spec: Spec) -> list[Scenario]:
    """Scenarios beyond the seed behaviours: the hook for traces of the model checker.

    Each is a `Scenario` whose steps are `(command, now)` pairs (commands of
    `workwarden.statemachine.commands`, or `ClaimNextCommand` for the
    scheduler; a sweep of one workload is its `RecoverCommand` or
    `EnforceDeadlineCommand`); its store may start empty or hold documents,
    and `grant_keys` names the keys its admissions are signed with. Names
    must not repeat another scenario's (`checker/...` keeps them apart).
    They are appended after the seed scenarios, in the order returned, so the
    vector file stays deterministic as long as this list is.

    These are the model checker's witnesses: in two small universes of one
    workload (one whose retry policy retries everything, one whose policy
    retries only transient connection failures and which has a queue
    deadline), the shortest step sequence that takes each edge of the table
    and the shortest that decides by each rule of each policy. Together they
    take every edge and every rule any step can reach.
    """
    # Imported here: only generating the vectors runs the model checker.
    from workwarden.statemachine.check.checker import check
    from workwarden.statemachine.check.replay import trace_commands
    from workwarden.statemachine.check.universe import CHECKER_KEY, CHECKER_KEY_ID, Universe

    universes = (
        ("a policy that retries", Universe.from_spec(spec, dependent=False)),
        (
            "a policy that retries only transient connection failures",
            Universe.from_spec(
                spec,
                dependent=False,
                first_retry_on=["transient_connection"],
                first_timeouts={"queue_ms": 8, "claim_ms": 4},
            ),
        ),
    )
    scenarios: list[Scenario] = []
    seen: set[str] = set()
    for label, universe in universes:
        report = check(spec, universe)
        for key in sorted(report.witnesses):
            if key in seen:
                continue
            seen.add(key)
            steps = trace_commands(spec, universe, list(report.witnesses[key]))
            what = key.split(":", 1)[1]
            scenarios.append(
                Scenario(
                    name=f"checker/{key.replace(' ', '')}",
                    steps=tuple(steps),
                    about=(
                        f"the shortest sequence the model checker found that "
                        f"{'takes' if key.startswith('edge:') else 'decides by'} {what}, "
                        f"under {label}"
                    ),
                    grant_keys={CHECKER_KEY_ID: CHECKER_KEY},
                )
            )
    return scenarios


def extends_the_table(spec: Spec) -> bool:
    """Does `spec` declare states, edges or operations the shipped spec lacks?"""
    shipped = default_spec()
    return (
        bool(set(spec.states) - set(shipped.states))
        or bool(set(spec.edges) - set(shipped.edges))
        or bool(set(spec.operations) - set(shipped.operations))
    )


#: The largest `moves` budget `extended_vectors` raises the universe to (the
#: `[check]` table's own limit).
MAX_MOVES = 5


def _behaves_the_same(shipped: VectorScenario, under: VectorScenario) -> bool:
    """The same steps, responses, events and documents: all but the spec's name."""
    return shipped.model_dump(exclude={"spec"}) == under.model_dump(exclude={"spec"})


def _missing(spec: Spec, vectors: Sequence[VectorScenario]) -> set[str]:
    """The witness keys (`edge:A -> B`, `rule:policy.decision`) no vector takes."""
    taken = coverage(spec, vectors)
    keys = {f"edge:{a} -> {b}" for a, b in taken.missing_edges}
    keys |= {f"rule:{name}.{decision}" for name, decision in taken.missing_rules}
    return keys


def _witnesses(spec: Spec, wanted: set[str]) -> list[Scenario]:
    """The checker's shortest sequences under `spec` for each key of `wanted` it can reach.

    The universes are `extra_scenarios`'; in each, the `moves` budget is raised
    (up to `MAX_MOVES`) while an edge a move operation takes is still unwitnessed.
    """
    from workwarden.statemachine.check.abstraction import move_edges
    from workwarden.statemachine.check.checker import check
    from workwarden.statemachine.check.replay import trace_commands
    from workwarden.statemachine.check.universe import CHECKER_KEY, CHECKER_KEY_ID, Universe

    moving = {f"edge:{a} -> {b}" for a, b in move_edges(spec)}
    universes = (
        ("a policy that retries", {"dependent": False}),
        (
            "a policy that retries only transient connection failures",
            {
                "dependent": False,
                "first_retry_on": ["transient_connection"],
                "first_timeouts": {"queue_ms": 8, "claim_ms": 4},
            },
        ),
    )
    name = spec.data.spec.name
    scenarios: list[Scenario] = []
    left = set(wanted)
    for label, settings in universes:
        universe = Universe.from_spec(spec, **settings)
        while left:
            report = check(spec, universe)
            for key in sorted(left & set(report.witnesses)):
                left.discard(key)
                steps = trace_commands(spec, universe, list(report.witnesses[key]))
                what = key.split(":", 1)[1]
                scenarios.append(
                    Scenario(
                        name=f"checker/{name}/{key.replace(' ', '')}",
                        steps=tuple(steps),
                        about=(
                            f"the shortest sequence the model checker found under {name} that "
                            f"{'takes' if key.startswith('edge:') else 'decides by'} {what}, "
                            f"under {label}, with {universe.moves} move(s) per workload"
                        ),
                        grant_keys={CHECKER_KEY_ID: CHECKER_KEY},
                    )
                )
            if not left & moving or universe.moves >= MAX_MOVES:
                break
            universe = Universe.from_dict({**universe.to_dict(), "moves": universe.moves + 1})
    return scenarios


def extended_vectors(spec: Spec) -> list[VectorScenario]:
    """The vectors of a spec that extends the shipped table (see the module docstring).

    First every shipped scenario (`all_scenarios()`) whose vector under `spec`
    is the shipped one but for the spec's name, in the shipped order; then the
    witnesses (named `checker/<spec name>/...`) for what those do not take.
    Deterministic, as the shipped vectors are.
    """
    shipped = default_spec()
    kept: list[VectorScenario] = []
    for scenario in all_scenarios(shipped):
        reference = run_scenario(shipped, scenario)
        try:
            under = run_scenario(spec, scenario, check_ends=False)
        except ValueError:
            continue
        if _behaves_the_same(reference, under):
            kept.append(under)
    added = [run_scenario(spec, s) for s in _witnesses(spec, _missing(spec, kept))]
    return [*kept, *added]


def all_scenarios(spec: Spec | None = None) -> list[Scenario]:
    """The seed scenarios, the scope-wide ones (pauses, retention), then `extra_scenarios`.

    Refuses a name used twice.
    """
    spec = spec if spec is not None else default_spec()
    scenarios = [*seed_scenarios(), *scope_scenarios(), *extra_scenarios(spec)]
    seen: set[str] = set()
    for scenario in scenarios:
        if scenario.name in seen:
            raise ValueError(f"two scenarios are named {scenario.name!r}")
        seen.add(scenario.name)
    return scenarios


def generate_vectors(
    spec: Spec | None = None,
    scenarios: Sequence[Scenario] | None = None,
    *,
    check_ends: bool = True,
) -> list[VectorScenario]:
    """Run every scenario (all of them by default) and return its vector, in scenario order."""
    spec = spec if spec is not None else default_spec()
    chosen = all_scenarios(spec) if scenarios is None else scenarios
    return [run_scenario(spec, scenario, check_ends=check_ends) for scenario in chosen]


# -- coverage ---------------------------------------------------------------------------


@dataclass
class Coverage:
    """How often the vectors take each edge of the table and each rule of each policy."""

    edges: Counter[tuple[str, str]]
    rules: Counter[tuple[str, str]]
    missing_edges: list[tuple[str, str]]
    missing_rules: list[tuple[str, str]]
    scenarios: int = 0
    steps: int = 0

    def render(self, spec: Spec) -> list[str]:
        """The report as lines."""
        total_rules = sum(len(p.rules) for p in spec.policies.values())
        lines = [
            f"{self.scenarios} scenarios, {self.steps} steps",
            f"edges taken: {len(spec.edges) - len(self.missing_edges)} of {len(spec.edges)}",
        ]
        for edge in spec.data.transitions:
            pair = (edge.from_state, edge.to)
            lines.append(f"  {edge.from_state:>22} -> {edge.to:<22} {self.edges.get(pair, 0):>5}")
        lines.append(f"rules taken: {total_rules - len(self.missing_rules)} of {total_rules}")
        for name, policy in spec.policies.items():
            for rule in policy.rules:
                key = (name, rule.spec.decision)
                lines.append(f"  {name:>16}  {rule.spec.decision:<32} {self.rules.get(key, 0):>5}")
        for source, target in self.missing_edges:
            lines.append(f"missing edge: {source} -> {target}")
        for name, decision in self.missing_rules:
            lines.append(f"missing rule: {name} {decision}")
        return lines


def coverage(spec: Spec, vectors: Sequence[VectorScenario]) -> Coverage:
    """Which edges and policy rules the vectors' committed events take, and how often."""
    edges: Counter[tuple[str, str]] = Counter()
    rules: Counter[tuple[str, str]] = Counter()
    steps = 0
    for vector in vectors:
        histories: dict[str, list[Event]] = {}
        for step in vector.steps:
            steps += 1
            for key, new in step.expect.events.items():
                histories.setdefault(key, []).extend(Event.model_validate(e) for e in new)
        for history in histories.values():
            for event in history:
                if event.from_state is not None:
                    edges[(event.from_state, event.to)] += 1
            rules.update(decisions_taken(spec, history))
    return Coverage(
        edges=edges,
        rules=rules,
        missing_edges=[pair for pair in spec.edges if pair not in edges],
        missing_rules=[
            (name, rule.spec.decision)
            for name, policy in spec.policies.items()
            for rule in policy.rules
            if (name, rule.spec.decision) not in rules
        ],
        scenarios=len(vectors),
        steps=steps,
    )
