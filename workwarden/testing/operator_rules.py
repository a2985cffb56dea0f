"""The stateful suite's operators: cancelling, timing out and re-arming work.

What each call may be refused with and which workloads it prefers are read
from the machine's spec (`allowed_refusals`, `operator_targets`), so a spec
that adds states keeps them right; the operations a spec adds with the
effect `move` are `move_rules`'.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from workwarden.statemachine.authority import Authority
from workwarden.testing.machine import WRITERS, MachineBase
from workwarden.testing.shadow import Outcome
from workwarden.testing.support import allowed_refusals, operator_targets

__all__ = ["OperatorRules"]


class OperatorRules(MachineBase):
    """An operator's cancel, timeout and re-arm, and the shadow model's prediction of each."""

    # -- operators --------------------------------------------------------------------------------

    @precondition(lambda self: bool(self._admitted))
    @rule(
        writer=WRITERS,
        pick=st.integers(0, 15),
        call=st.sampled_from(("cancel", "timeout", "retry")),
    )
    def operator(self, writer: Authority, pick: int, call: str) -> None:
        """An operator cancels (preferably work a worker holds, by asking the holder; queued
        work is cancelled at once), times any workload out (the operator-timeout policy
        decides), or re-arms dead-lettered work (one more attempt, at most max_attempts
        times). With no workload in a preferred state it picks any, to be refused."""
        workload = self._in_state(operator_targets(type(self).spec)[call], pick)
        self._operator(writer, call, workload)

    def _operator(self, writer: Authority, op: str, key: str) -> None:
        calls: dict[str, Callable[[], str]] = {
            "cancel": lambda: writer.cancel(key, "operator-1", self.now),
            "timeout": lambda: writer.timeout(key, "operator-1", self.now),
            "retry": lambda: writer.retry(key, "operator-1", self.now, reason="re-arm"),
        }
        outcome = self._predict_operator(op, key)
        allowed = allowed_refusals(type(self).spec)[op]
        reply, error = self._call(op, f"{op} {key} (operator)", calls[op], outcome, allowed)
        if error is None and outcome is not None:
            self._expect(
                reply == outcome.state,
                f"{op} answered {reply}, the shadow model decides {outcome.state}",
                "shadow_model",
            )
        self._settle(outcome, error)

    def _predict_operator(self, op: str, key: str) -> Outcome | None:
        if self.shadow is None:
            return None
        if op == "cancel":
            return self.shadow.cancel(key, self.now)
        if op == "timeout":
            return self.shadow.timeout(key, self.now)
        return self.shadow.retry(key, self.now)
