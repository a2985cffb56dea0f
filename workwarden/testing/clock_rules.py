"""The stateful suite's clock: steps, leaps, and jumps exactly to the next instant that matters."""

from __future__ import annotations

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from workwarden.testing.machine import MachineBase

__all__ = ["ClockRules"]


class ClockRules(MachineBase):
    """The clock: it moves on a little or far, or jumps to (or 1 ms before) the next instant."""

    # -- time -------------------------------------------------------------------------------------

    @precondition(lambda self: bool(self._scopes))
    @rule(ms=st.integers(1, 250) | st.sampled_from((1_000, 5_000, 30_000)))
    def advance(self, ms: int) -> None:
        """The clock moves on: a little, or far past leases and deadlines."""
        self.now += ms
        note(f"[{self.now}] clock +{ms}")

    def _upcoming(self) -> list[int]:
        instants: set[int] = set()
        for index in self._index.values():
            for value in (index.lease_expires_at, index.next_deadline_at, index.eligible_at):
                if value is not None and value > self.now:
                    instants.add(value)
        return sorted(instants)

    @precondition(lambda self: bool(self._upcoming()))
    @rule(pick=st.integers(0, 3), early=st.booleans())
    def jump_to_next_instant(self, pick: int, early: bool) -> None:
        """The clock jumps exactly to an upcoming lease expiry, deadline or eligibility (or 1 ms
        before it), so calls and sweeps race at the boundary instant."""
        upcoming = self._upcoming()
        target = upcoming[min(pick, len(upcoming) - 1)] - (1 if early else 0)
        if target > self.now:
            self.now = target
        note(f"[{self.now}] clock jumps to {'1 ms before ' if early else ''}an instant")
