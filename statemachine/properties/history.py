"""Checking a committed workload's history against the spec.

A history is valid when its events are numbered 1, 2, 3, ... without a gap,
each event is a legal edge of the table taken by an actor class the edge
allows, each event starts where the previous one ended, the claims it
records carry strictly increasing fencing tokens (above the admission's
`fencing_floor`, for a workload admitted under a key purged before), and the
workload's current state is where the history ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from workwarden.statemachine.admission import fencing_floor
from workwarden.statemachine.models import Event, Workload
from workwarden.statemachine.spec import Spec

__all__ = ["HistoryProblem", "validate_events", "validate_workload"]


@dataclass(frozen=True, slots=True)
class HistoryProblem:
    """The first thing wrong with a history: which event (by sequence) and why."""

    sequence: int
    message: str

    def __str__(self) -> str:
        return f"event {self.sequence}: {self.message}"


def validate_events(spec: Spec, events: Sequence[Event]) -> HistoryProblem | None:
    """The first problem in `events`, or None when they are a legal path of the table."""
    previous: Event | None = None
    # A workload admitted under a purged key starts past its namesake's tokens.
    last_token = fencing_floor(events)
    for index, event in enumerate(events, start=1):
        if event.sequence != index:
            return HistoryProblem(event.sequence, f"expected sequence {index}")
        edge = spec.edge(event.from_state or "", event.to)
        if edge is None:
            return HistoryProblem(
                event.sequence, f"{event.from_state} -> {event.to} is not an edge of the table"
            )
        if event.type != edge.event:
            return HistoryProblem(
                event.sequence, f"event type {event.type!r} is not {edge.event!r}"
            )
        if event.actor_class not in edge.actors:
            return HistoryProblem(
                event.sequence,
                f"actor class {event.actor_class!r} may not take {event.from_state} -> {event.to}",
            )
        if previous is not None and previous.to != event.from_state:
            return HistoryProblem(
                event.sequence,
                f"starts at {event.from_state} but the previous event ended at {previous.to}",
            )
        if previous is not None and event.at < previous.at:
            return HistoryProblem(event.sequence, "goes back in time")
        token = event.evidence.get("fencing_token")
        if event.to in spec.roles.claimed:
            if token is None or not token.isdigit() or int(token) <= last_token:
                return HistoryProblem(
                    event.sequence, f"fencing token {token} does not increase past {last_token}"
                )
            last_token = int(token)
        previous = event
    return None


def validate_workload(spec: Spec, workload: Workload) -> HistoryProblem | None:
    """The first problem in a committed workload's history, or None."""
    problem = validate_events(spec, workload.execution_history)
    if problem is not None:
        return problem
    history = workload.execution_history
    if history and history[-1].to != workload.state:
        return HistoryProblem(
            history[-1].sequence, f"history ends at {history[-1].to}, workload is {workload.state}"
        )
    claims = sum(1 for e in history if e.to in spec.roles.claimed)
    if workload.fencing_token != fencing_floor(history) + claims:
        return HistoryProblem(
            history[-1].sequence if history else 0, "fencing token does not count the claims"
        )
    return None
