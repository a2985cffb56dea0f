"""The one `transitions.Machine`, built from the spec's table, that every state change goes through.

The machine has no models of its own. To change a workload's state the core
hands it a small cursor holding the current state and triggers the edge's
event on it; the machine moves the cursor or raises, and an illegal change
becomes `WORKLOAD_TRANSITION_DENIED`. Nothing is injected onto our objects.

The machine is built once per spec and never changed after (no conditions,
no callbacks, no models of its own), so its answer to "where does event E
take a workload in state S?" is a function of (S, E) alone. `TableMachine`
keeps each answer it gave, in `answers`: the first `fire` of (S, E) asks
the machine by triggering E on a cursor in S, and records the state the
cursor was left in (or that the machine refused); later ones read the
record. The record is only ever written from a trigger of the machine, so
it is the machine's answer, asked once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transitions import Machine, MachineError

from workwarden.statemachine import errors
from workwarden.statemachine.spec_model import TransitionSpec

__all__ = ["StateCursor", "TableMachine", "ask", "build_machine", "fire"]


class StateCursor:
    """The machine's view of one workload: only its state."""

    __slots__ = ("state",)

    def __init__(self, state: str) -> None:
        self.state = state


class TableMachine(Machine):
    """A `transitions.Machine` that keeps each answer it gave to a (state, event) question.

    `answers` maps (source state, event) to the state the machine moved a
    cursor in that state to, or None where it refused. It is filled only by
    `ask`, which triggers the event on a cursor; see the module docstring for
    why the record is the machine's own answer.
    """

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.answers: dict[tuple[str, str], str | None] = {}
        """(source state, event) -> the destination the machine gave, or None: it refused."""


def ask(machine: Any, state: str, event: str) -> str | None:
    """Trigger `event` on a cursor in `state`: the state the machine left it in, or None.

    None when the machine refuses (it raises, or the event does not move the
    cursor). This is the machine itself answering, every time it is called.
    """
    cursor = StateCursor(state)
    try:
        moved = machine.events[event].trigger(cursor)
    except MachineError:
        return None
    return cursor.state if moved else None


def build_machine(states: Sequence[str], transitions: Sequence[TransitionSpec]) -> TableMachine:
    """A machine with the spec's states and one trigger per event (sources to target)."""
    return TableMachine(
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
    state, target, event = edge.from_state, edge.to, edge.event
    if type(machine) is TableMachine:
        answers = machine.answers
        key = (state, event)
        if key in answers:
            moved = answers[key]
        else:
            # Concurrent first asks give the same answer: the machine is immutable.
            moved = answers.setdefault(key, ask(machine, state, event))
    else:
        moved = ask(machine, state, event)
    if moved is None or moved != target:
        raise errors.WorkloadError(
            errors.TRANSITION_DENIED,
            f"{state} cannot transition to {target}",
            {"from": state, "to": target},
        )
    return moved, event
