"""The reachability properties (`sometimes`), and the soundness of the spec's policies.

A `sometimes` property is met when some step reaches it; what no step
reaches is named, so that a check or a suite that passes because nothing
happens shows it. `Reached` is what an exploration (the model checker's)
or runs of the stateful suite reached; `unreached(spec, reached)` gives,
for each registered `sometimes` property, what was never reached (empty
when it is met). `check_policies(spec)` checks that each policy is total
and deterministic over the predicates it names.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from workwarden.statemachine.properties.registry import Violation, properties
from workwarden.statemachine.spec import Spec

__all__ = [
    "Reached",
    "check_policies",
    "edges_never_taken",
    "proceeding_rules",
    "rules_never_decided",
    "states_never_at_rest",
    "unreached",
]


@dataclass
class Reached:
    """What some step reached: edges taken, each policy's rules deciding, states at rest.

    `rules` maps a policy's name to the decisions of its rules that decided
    some step.
    """

    edges: Collection[tuple[str, str]] = ()
    rules: Mapping[str, Collection[str]] = field(default_factory=dict)
    at_rest: Collection[str] = ()


def proceeding_rules(spec: Spec) -> dict[str, tuple[str, str]]:
    """Each gated operation's (policy, decision) of the one gate rule that lets it proceed.

    A gate's rule without a target lets the operation take its own edge: an
    accepted call of the operation is that rule deciding (no event records it).
    """
    out: dict[str, tuple[str, str]] = {}
    for name, operation in spec.operations.items():
        gate = operation.gate
        if gate is None:
            continue
        proceeding = [rule for rule in gate.rules if rule.spec.to is None]
        if len(proceeding) == 1:
            out[name] = (gate.name, proceeding[0].spec.decision)
    return out


def edges_never_taken(spec: Spec, taken: Collection[tuple[str, str]]) -> list[tuple[str, str]]:
    """The table's edges not among `taken`, sorted (`every_edge_is_taken`)."""
    return [edge for edge in sorted(spec.edges) if edge not in taken]


def rules_never_decided(spec: Spec, decided: Mapping[str, Collection[str]]) -> dict[str, list[str]]:
    """Each policy's rules (their decisions, in rule order) that decided nothing.

    What the registered `every_rule_decides` has not met, by policy.
    """
    return {
        name: [
            rule.spec.decision
            for rule in policy.rules
            if rule.spec.decision not in decided.get(name, ())
        ]
        for name, policy in sorted(spec.policies.items())
    }


def states_never_at_rest(
    spec: Spec, at_rest: Collection[str], kinds: Collection[str] | None = None
) -> list[str]:
    """The states (of `kinds`, or any kind) never at rest, sorted."""
    return sorted(
        name
        for name, state in spec.states.items()
        if name not in at_rest and (kinds is None or state.kind in kinds)
    )


def unreached(spec: Spec, reached: Reached) -> dict[str, list[str]]:
    """For each registered `sometimes` property, what no step reached (empty: it is met)."""
    lasting = {state.kind for state in spec.states.values()} - {"transient"}
    rules = rules_never_decided(spec, reached.rules)
    found = {
        "every_edge_is_taken": [
            f"{a} -> {b}" for a, b in edges_never_taken(spec, frozenset(reached.edges))
        ],
        "every_rule_decides": [
            f"{policy}.{decision}" for policy, missing in rules.items() for decision in missing
        ],
        "every_terminal_state_is_reached": states_never_at_rest(
            spec, frozenset(reached.at_rest), {"terminal"}
        ),
        "every_lasting_state_is_reached": states_never_at_rest(
            spec, frozenset(reached.at_rest), lasting
        ),
    }
    declared = [prop.name for prop in properties("sometimes")]
    assert sorted(found) == sorted(declared), "a sometimes property has no check here"
    return {name: found[name] for name in declared}


def check_policies(spec: Spec) -> list[Violation]:
    """Each policy is total (some rule matches every combination of the predicates it names)
    and deterministic (the same combination decides the same way)."""
    out: list[Violation] = []
    for name, policy in sorted(spec.policies.items()):
        names = policy.predicates
        for values in itertools.product((False, True), repeat=len(names)):
            truth = dict(zip(names, values, strict=True))
            try:
                first = policy.first_match(truth.__getitem__)
            except AssertionError:
                out.append(
                    Violation(
                        "policies_are_total", None, f"policy {name} decides nothing when {truth}"
                    )
                )
                continue
            again = policy.first_match(truth.__getitem__)
            if again is not first:
                out.append(
                    Violation(
                        "policies_are_deterministic",
                        None,
                        f"policy {name} is not deterministic when {truth}",
                    )
                )
    return out
