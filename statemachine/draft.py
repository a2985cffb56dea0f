"""A workload being changed inside one decision: every state change through the machine.

`Draft` copies the committed workload, and the core edits the copy. A state
change goes through `Draft.move`, which checks the edge's operations and
actor classes in the spec, fires the edge through the shared machine, and
appends the event with the next sequence number. Nothing else sets a state.
"""

from __future__ import annotations

from collections.abc import Mapping

from workwarden.statemachine import errors
from workwarden.statemachine.machine import fire
from workwarden.statemachine.models import Event, Workload, shallow_copy, trusted
from workwarden.statemachine.spec import Spec

__all__ = ["Draft", "editable_copy"]


def editable_copy(workload: Workload) -> Workload:
    """A copy of `workload` whose parts the core edits are its own.

    The core edits top-level fields, the attempts and the current claim, and
    appends to the history and the checkpoints; events, checkpoints and
    results, once made, are never edited. So those lists are copied and their
    items shared, which is much cheaper than a deep copy.
    """
    claim = workload.current_claim
    return shallow_copy(
        workload,
        execution_history=list(workload.execution_history),
        checkpoints=list(workload.checkpoints),
        attempts=[shallow_copy(attempt) for attempt in workload.attempts],
        current_claim=shallow_copy(claim) if claim is not None else None,
    )


class Draft:
    """A mutable copy of a workload and the events this decision added to it."""

    __slots__ = ("events", "now", "operation", "spec", "workload")

    def __init__(
        self, spec: Spec, workload: Workload, now: int, operation: str, *, adopt: bool = False
    ) -> None:
        """A draft of a copy of `workload`; with `adopt`, of `workload` itself.

        Adopt only a workload the core has just built and no one else holds.
        """
        self.spec = spec
        self.workload = workload if adopt else editable_copy(workload)
        self.now = now
        self.operation = operation
        self.events: list[Event] = []

    def move(
        self,
        target: str,
        *,
        actor: str,
        actor_class: str,
        evidence: Mapping[str, str] | None = None,
        operation: str | None = None,
    ) -> Event:
        """Take the edge from the current state to `target` and record it."""
        w = self.workload
        op = operation or self.operation
        edge = self.spec.edge(w.state, target)
        if edge is None or op not in edge.operations or actor_class not in edge.actors:
            raise errors.WorkloadError(
                errors.TRANSITION_DENIED,
                f"{w.state} cannot transition to {target} by {op}",
                {"from": w.state, "to": target, "operation": op},
            )
        source = w.state
        w.state, event_type = fire(self.spec.machine, edge)
        w.updated_at = self.now
        history = w.execution_history
        # Every value is the core's own: the spec's names, the actor, the instant, text evidence.
        event = trusted(
            Event,
            sequence=history[-1].sequence + 1 if history else 1,
            type=event_type,
            from_state=source,
            to=target,
            actor=actor,
            actor_class=actor_class,
            at=self.now,
            evidence=dict(evidence or {}),
        )
        history.append(event)
        self.events.append(event)
        return event
