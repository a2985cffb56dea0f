"""The one `transitions.Machine`, built from the spec's table, that every state change goes through.

The machine has no models of its own. To change a workload's state the core
hands it a small cursor holding the current state and triggers the edge's
event on it; the machine moves the cursor or raises, and an illegal change
becomes `WORKLOAD_TRANSITION_DENIED`. Nothing is injected onto our objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transitions import Machine, MachineError

from workwarden.statemachine import errors
from workwarden.statemachine.spec_model import TransitionSpec

__all__ = ["StateCursor", "build_machine", "fire"]


class StateCursor:
    """The machine's view of one workload: only its state."""

    __slots__ = ("state",)

    def __init__(self, state: str) -> None:
        self.state = state


def build_machine(states: Sequence[str], transitions: Sequence[TransitionSpec]) -> Any:
    """A machine with the spec's states and one trigger per event (sources to target)."""
    return Machine(
        model=None,
        states=list(states),
        initial=None,
        transitions=[
            {"trigger": edge.event, "source": edge.from_state, "dest": edge.to}
            for edge in transitions
        ],
        auto_transitions=False,
        ignore_invalid_triggers=False,
        send_event=False,
    )


def fire(machine: Any, edge: TransitionSpec) -> tuple[str, str]:
    """Take `edge` through `machine`; return (new state, event name).

    Raises `WORKLOAD_TRANSITION_DENIED` when the machine refuses it.
    """
    state, target = edge.from_state, edge.to
    cursor = StateCursor(state)
    try:
        moved = machine.events[edge.event].trigger(cursor)
    except MachineError:
        moved = False
    if not moved or cursor.state != target:
        raise errors.WorkloadError(
            errors.TRANSITION_DENIED,
            f"{state} cannot transition to {target}",
            {"from": state, "to": target},
        )
    return cursor.state, edge.event
