"""Checking a recorded history against the spec, decisions included.

`check_history(spec, events, workload)` checks a history recorded by any
implementation: the structural checks of `history.validate_events` (legal
edges taken by allowed actor classes, contiguous sequence numbers,
increasing fencing tokens; with the document, `history.validate_workload`),
that a transient state is left in the commit that entered it, and that
every decision a policy recorded is the one the policy gives.

A decision is recomputed from the evidence and the history before it (see
`recorded_decisions`): what the failure report said, the deadline that
fell, the state cancellation was requested in, the attempts used against
the budget. With the workload document, the retry policy is known too and
every decision is recomputed exactly; with events alone, a predicate that
needs the retry policy is unknown, and a decision passes when some value of
the unknown predicates gives it. A claim counts as the claim policy
deciding to let it proceed, so a claim past the budget is caught too.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from workwarden.statemachine.models import Event, Workload
from workwarden.statemachine.properties.history import (
    HistoryProblem,
    validate_events,
    validate_workload,
)
from workwarden.statemachine.spec import CompiledPolicy, Spec

__all__ = ["RecordedDecision", "check_history", "decisions_taken", "recorded_decisions"]


@dataclass(frozen=True)
class RecordedDecision:
    """A policy decision found in a history, and what the policy gives on what is known.

    `possible` holds every decision the policy gives for some value of the
    `unknown` predicates (exactly one when nothing is unknown).
    """

    sequence: int
    policy: str
    decision: str
    target: str
    possible: frozenset[str]
    unknown: tuple[str, ...]

    @property
    def agrees(self) -> bool:
        """Is the recorded decision one the policy gives?"""
        return self.decision in self.possible


def _policy_for(spec: Spec, events: Sequence[Event], index: int, decision: str) -> str | None:
    """Which policy recorded the decision of `events[index]` (None when none can have)."""
    event = events[index]
    entering = events[index - 1] if index > 0 else None
    via = [
        name
        for name, policy in spec.policies.items()
        if policy.spec.via is not None and policy.spec.via == event.from_state
    ]
    if via and entering is not None and entering.to == event.from_state:
        if len(via) == 1:
            return via[0]
        # The same via state entered by an operator's operation or by the system's:
        # the policy is the one consulted by an operation of the class that entered it.
        chosen = sorted(
            {
                op.policy.name
                for op in spec.operations.values()
                if op.policy is not None
                and op.policy.name in via
                and op.actor == entering.actor_class
            }
        )
        return chosen[0] if len(chosen) == 1 else None
    direct = [
        name
        for name, policy in spec.policies.items()
        for rule in policy.rules
        if rule.spec.decision == decision
        and rule.spec.to == event.to
        and (rule.spec.direct or policy.spec.via is None)
    ]
    return direct[0] if len(set(direct)) == 1 else None


def _proceed_policy(spec: Spec, event: Event) -> tuple[str, str] | None:
    """A policy whose rule lets an operation proceed, consulted by the operation of `event`."""
    if event.actor_class == "system" or "decision" in event.evidence or event.from_state is None:
        return None
    edge = spec.edge(event.from_state, event.to)
    if edge is None:
        return None
    for name, policy in spec.policies.items():
        consulting = {
            op.name
            for op in spec.operations.values()
            if op.policy is not None and op.policy.name == name
        }
        proceed = [rule for rule in policy.rules if rule.spec.to is None]
        if proceed and consulting & set(edge.operations) and policy.spec.via is None:
            return name, proceed[0].spec.decision
    return None


def _truths(
    spec: Spec,
    policy: CompiledPolicy,
    facts: Mapping[str, bool | None],
) -> tuple[frozenset[str], dict[str, str], tuple[str, ...]]:
    unknown = tuple(name for name in policy.predicates if facts.get(name) is None)
    outcomes: dict[str, str] = {}
    for values in itertools.product((False, True), repeat=len(unknown)):
        truth = {name: bool(facts.get(name)) for name in policy.predicates}
        truth.update(zip(unknown, values, strict=True))
        rule = policy.first_match(truth)
        outcomes[rule.spec.decision] = rule.spec.to or ""
    return frozenset(outcomes), outcomes, unknown


def recorded_decisions(
    spec: Spec, events: Sequence[Event], workload: Workload | None = None
) -> list[RecordedDecision]:
    """Every policy decision in `events`, recomputed from the evidence and the history before it.

    Recomputed: `effect_unknown` (the failure report's `effect`),
    `deadline_bounds_work` (the fallen deadline's `bounds` in the spec),
    `cancellation_requested` (the state the commit started in) and
    `budget_exhausted` (claims so far against `max_attempts` plus operator
    re-arms so far; without the workload, the budget recorded in the
    evidence, and the attempts it records if more than the history's
    claims). The `retries_*` predicates need the workload's retry policy
    and are unknown without it. A claim is the claim policy letting the
    operation proceed, so it is checked as a decision too.
    """
    policy_of_workload = workload.retry_policy if workload is not None else None
    claims_total = sum(1 for e in events if e.to in spec.roles.claimed)
    # Attempts a document records beyond the claims in its history were made before it.
    offset = max(workload.attempt_count - claims_total, 0) if workload is not None else 0
    claims = 0
    rearms = 0
    out: list[RecordedDecision] = []
    for index, event in enumerate(events):
        recorded = event.evidence.get("decision")
        proceed = _proceed_policy(spec, event) if recorded is None else None
        name = (
            _policy_for(spec, events, index, recorded)
            if recorded is not None
            else (proceed[0] if proceed is not None else None)
        )
        if name is not None:
            decision = recorded if recorded is not None else proceed[1]  # type: ignore[index]
            policy = spec.policies[name]
            direct = policy.spec.via is None or event.from_state != policy.spec.via
            entering = event if direct else events[index - 1]
            budget_recorded = entering.evidence.get("attempt_budget")
            max_attempts = policy_of_workload.max_attempts if policy_of_workload else None
            budget: int | None = max_attempts + rearms if max_attempts is not None else None
            if budget is None and budget_recorded is not None and budget_recorded.isdigit():
                budget = int(budget_recorded)
            used = claims + offset
            recorded_used = entering.evidence.get("attempts_used")
            if workload is None and recorded_used is not None and recorded_used.isdigit():
                # Without the document, attempts its evidence records beyond the
                # history's claims were made before the history began.
                used = max(used, int(recorded_used))
            retry_on = set(policy_of_workload.retry_on) if policy_of_workload else None
            kind = entering.evidence.get("failure_kind") if name == "failure" else None
            deadline = entering.evidence.get("deadline")
            facts: dict[str, bool | None] = {
                "effect_unknown": name == "failure"
                and entering.evidence.get("effect") == "unknown",
                "retries_worker_failure": None
                if retry_on is None
                else "worker_failure" in retry_on,
                "retries_failure_kind": None
                if retry_on is None
                else kind is not None and kind in retry_on,
                "retries_timeout": None if retry_on is None else "timeout" in retry_on,
                "budget_exhausted": None if budget is None else used >= budget,
                "cancellation_requested": entering.from_state in spec.roles.cancelling,
                "deadline_bounds_work": deadline is not None
                and deadline in spec.deadline_kinds
                and spec.deadline_kinds[deadline].bounds == "work",
            }
            possible, targets, unknown = _truths(spec, policy, facts)
            target = targets.get(decision, "") if recorded is not None else ""
            out.append(
                RecordedDecision(
                    sequence=event.sequence,
                    policy=name,
                    decision=decision,
                    target=target,
                    possible=possible,
                    unknown=unknown,
                )
            )
        if event.to in spec.roles.claimed:
            claims += 1
        if event.evidence.get("retry") == "operator":
            rearms += 1
    return out


def decisions_taken(spec: Spec, events: Sequence[Event]) -> Counter[tuple[str, str]]:
    """How often each (policy, decision) decides in `events` (a claim counts as `claimable`)."""
    return Counter((d.policy, d.decision) for d in recorded_decisions(spec, events))


def _decision_problem(
    spec: Spec, events: Sequence[Event], workload: Workload | None
) -> HistoryProblem | None:
    by_sequence = {event.sequence: event for event in events}
    found_all = recorded_decisions(spec, events, workload)
    for found in found_all:
        event = by_sequence[found.sequence]
        if not found.agrees:
            gives = " or ".join(sorted(found.possible))
            unknown = f" (not knowing {', '.join(found.unknown)})" if found.unknown else ""
            return HistoryProblem(
                found.sequence,
                f"records {found.policy} decision {found.decision!r}, but the {found.policy} "
                f"policy gives {gives}{unknown}",
            )
        if found.target and found.target != event.to:
            return HistoryProblem(
                found.sequence,
                f"{found.policy} decision {found.decision!r} goes to {found.target}, "
                f"not {event.to}",
            )
    for event in events:
        if "decision" in event.evidence and not any(
            d.sequence == event.sequence for d in found_all
        ):
            return HistoryProblem(
                event.sequence,
                f"records decision {event.evidence['decision']!r}, which no policy decides on "
                f"{event.from_state} -> {event.to}",
            )
    return None


def _transient_problem(spec: Spec, events: Sequence[Event]) -> HistoryProblem | None:
    for index, event in enumerate(events):
        state = spec.states.get(event.to)
        if state is None or state.kind != "transient":
            continue
        following = events[index + 1] if index + 1 < len(events) else None
        if following is None or following.at != event.at:
            return HistoryProblem(
                event.sequence, f"rests in {event.to}, a state that exists only inside one commit"
            )
    return None


def check_history(
    spec: Spec, events: Sequence[Event], workload: Workload | None = None
) -> HistoryProblem | None:
    """The first problem of a recorded history, or None when it is valid against `spec`.

    With `workload`, its document is checked too (`history.validate_workload`)
    and every decision is recomputed with its retry policy.
    """
    if workload is not None:
        problem = validate_workload(spec, workload)
    else:
        problem = validate_events(spec, events)
    candidates = [
        p
        for p in (
            problem,
            _transient_problem(spec, events),
            _decision_problem(spec, events, workload),
        )
        if p is not None
    ]
    return min(candidates, key=lambda p: p.sequence) if candidates else None
