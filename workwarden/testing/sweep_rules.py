"""The stateful suite's sweeps: recovering expired leases and enforcing fallen deadlines."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from workwarden.statemachine.authority import Authority
from workwarden.testing.machine import WRITERS, MachineBase
from workwarden.testing.shadow import Outcome
from workwarden.testing.support import ALLOWED, SWEEPS

__all__ = ["SweepRules"]


class SweepRules(MachineBase):
    """The recovery and deadline sweeps, run when something is due."""

    # -- sweeps -----------------------------------------------------------------------------------

    @precondition(lambda self: self._anything_due())
    @rule(writer=WRITERS, sweep=st.sampled_from(SWEEPS))
    def sweep(self, writer: Authority, sweep: str) -> None:
        """When something is due, a sweep runs: `recover_expired` hands on every workload
        whose lease has expired (the recovery policy decides), `enforce_deadlines` times out
        every workload with a fallen deadline (the deadline policy decides); either may find
        nothing due of its own kind."""
        self._run_sweep(writer, sweep)

    def _run_sweep(self, writer: Authority, sweep: str) -> None:
        if sweep == "recover_expired":
            outcomes = self.shadow.recover_all(self.now) if self.shadow else None
            self._sweep(writer, sweep, writer.recover_expired, outcomes)
        else:
            outcomes = self.shadow.enforce_all(self.now) if self.shadow else None
            self._sweep(writer, sweep, writer.enforce_deadlines, outcomes)

    def _sweep(
        self,
        writer: Authority,
        op: str,
        sweep: Callable[[int], list[str]],
        outcomes: list[Outcome] | None,
    ) -> None:
        reply, _ = self._call(
            op,
            op,
            lambda: sweep(self.now),
            Outcome(None) if self.shadow else None,
            ALLOWED[op],
        )
        changed = sorted(reply or [])
        note(f"    changed {changed}")
        if outcomes is not None:
            wanted = sorted(o.key or "" for o in outcomes)
            if changed != wanted:
                self._fail(
                    "shadow_model", f"{op}: the shadow model changes {wanted}, the sweep {changed}"
                )
            for outcome in outcomes:
                self._settle(outcome, None)
