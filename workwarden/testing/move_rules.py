"""The stateful suite's moves: the operations a spec adds with the effect `move`.

A spec may add operator operations without code (a pause and a resume, an
approval and a rejection; see `specs/examples/`). `MoveRules` takes them as
an operator, through `Authority.operate`, on any workload: one in a state the
operation has an edge out of when there is one, else any, to be refused.
Which operations there are, and where each leads, is read from the spec's
operations table and transitions; nothing here names an operation or a
state. The shadow model states the shipped rules only, so it predicts
nothing here: an accepted move must take the operation's own edge out of the
state the workload was in, a refused one must be refused with a code the
operation can give (`allowed_refusals`) and change nothing, and the
invariants are checked after every step as after any other.

`authority_machine(...)` mixes it in when the spec has such operations.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from workwarden.statemachine.authority import Authority
from workwarden.statemachine.spec import Spec
from workwarden.testing.machine import WRITERS, MachineBase
from workwarden.testing.support import allowed_refusals

__all__ = ["MoveRules", "move_operations"]


def move_operations(spec: Spec) -> tuple[str, ...]:
    """The operations `spec` adds with the effect `move`, in the table's order."""
    return tuple(name for name, op in spec.operations.items() if op.spec.effect == "move")


class MoveRules(MachineBase):
    """An operator takes an operation of effect `move` on a workload (see the module)."""

    @precondition(lambda self: bool(self._admitted) and bool(move_operations(type(self).spec)))
    @rule(
        writer=WRITERS,
        pick=st.integers(0, 15),
        choice=st.integers(0, 15),
        reason=st.sampled_from((None, "incident review")),
    )
    def move(self, writer: Authority, pick: int, choice: int, reason: str | None) -> None:
        """An operator takes one of the spec's move operations (a pause, a resume, an
        approval...), preferably on a workload in a state the operation has an edge out of,
        else on any workload, to be refused with the operation's `denied` code."""
        spec = type(self).spec
        names = move_operations(spec)
        name = names[choice % len(names)]
        states = tuple(state for state in spec.states if spec.available(state, name))
        key = self._in_state(states, pick)
        before = self._parsed[key][1].state if key in self._parsed else None
        allowed = allowed_refusals(spec)[name]
        reply, error = self._call(
            name,
            f"{name} {key} (operator)",
            lambda: writer.operate(key, name, "operator-1", self.now, reason=reason),
            None,
            allowed,
        )
        if error is not None or before is None:
            return
        edge = spec.own_edge(before, name)
        self._expect(
            edge is not None and reply == edge.to,
            f"{name} of {key} in {before} answered {reply}; the table's edge for it leads to "
            f"{edge.to if edge is not None else 'nowhere'}",
        )
