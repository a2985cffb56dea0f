"""The stateful suite's races: two writers' decisions on one workload, committed in turn.

`race` holds two prepared calls on the same workload at the same instant
(often the instant a lease expires or a deadline falls) and commits them
one after the other; `hand_on` lets a holder go silent until its lease
lapses, races two recoveries, and hands the work to another worker.
"""

from __future__ import annotations

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from workwarden.statemachine.authority import Authority
from workwarden.statemachine.models import Fence
from workwarden.testing.held_rules import HeldCallRules
from workwarden.testing.machine import WORKERS, WRITERS
from workwarden.testing.support import (
    LEASES,
    OPERATOR_TARGETS,
    RACED,
    RACES,
    SWEEPS,
    WORKER_CALLS,
    Held,
    Worker,
)

__all__ = ["RaceRules"]


class RaceRules(HeldCallRules):
    """Two writers racing on one workload, and work that changes hands."""

    # -- races ------------------------------------------------------------------------------------

    def _boundaries(self, calls: tuple[str, str]) -> list[tuple[int, str]]:
        """Upcoming instants, (instant, key), soonest first: deadlines when the deadline sweep
        races, lease expiries when the recovery sweep does, else both; of held work, when a
        worker's call races and some work is held."""
        fields = [
            field
            for sweep, field in (
                ("enforce_deadlines", "next_deadline_at"),
                ("recover_expired", "lease_expires_at"),
            )
            if sweep in calls
        ] or ["lease_expires_at", "next_deadline_at"]
        upcoming = sorted(
            (value, key)
            for key, index in self._index.items()
            for field in fields
            if (value := getattr(index, field)) is not None and value > self.now
        )
        if not any(call in WORKER_CALLS for call in calls):
            return upcoming
        # A worker's call races: prefer work a worker holds.
        held = {key for _, key, _ in self._held_claims()}
        return [(at, key) for at, key in upcoming if key in held] or upcoming

    @precondition(lambda self: bool(self._admitted))
    @rule(
        first_writer=WRITERS,
        second_writer=WRITERS,
        pick=st.integers(0, 15),
        calls=st.sampled_from(RACES),
        worker=WORKERS,
        lease_ms=st.sampled_from(LEASES),
        at_the_boundary=st.booleans(),
    )
    def race(
        self,
        first_writer: Authority,
        second_writer: Authority,
        pick: int,
        calls: tuple[str, str],
        worker: Worker,
        lease_ms: int,
        at_the_boundary: bool,
    ) -> None:
        """Two writers each read and decide a call on the same workload at the same instant,
        then commit in turn: when both write, the second is WORKLOAD_CONFLICT and writes
        nothing (a heartbeat against the recovery of its lease, a completion against the
        deadline sweep, two claims, a cancel against a failure, ...). When a sweep races
        `at_the_boundary`, the clock first jumps to the instant a deadline falls (for the
        deadline sweep) or a lease expires (for the recovery sweep), and the race is on that
        workload, at that instant; otherwise, when a sweep races, the workload is one it
        finds due. A worker call is made by the workload's latest known holder, or
        becomes a claim by `worker` if none."""
        first, second = calls
        sweeping = [call for call in calls if call in SWEEPS]
        boundaries = self._boundaries(calls) if at_the_boundary and sweeping else []
        if boundaries:
            self.now, key = boundaries[pick % len(boundaries)]
            note(f"[{self.now}] the clock reaches a lease expiry or deadline of {key}")
        else:
            due_now = [call for call in sweeping if self._due(call)]
            due = self._due(due_now[0]) if due_now else []
            wanted = OPERATOR_TARGETS.get(first) or RACED
            key = due[pick % len(due)] if due else self._in_state(wanted, pick)
        held = [
            self._hold(writer, *self._racer(call, key, worker), lease_ms)
            for writer, call in ((first_writer, first), (second_writer, second))
        ]
        for one in held:
            if isinstance(one, Held):
                self._commit(one)

    def _racer(
        self, call: str, key: str, worker: Worker
    ) -> tuple[str, str, Worker | None, Fence | None]:
        """(call, key, worker, fence) for `call` on `key` in a race."""
        if call not in WORKER_CALLS:
            return call, key, worker if call == "claim" else None, None
        grants = self._grants.get(key)
        if not grants:
            return "claim", key, worker, None
        fence = grants[-1]
        return call, key, self._worker_named(fence.worker_id), fence

    @precondition(lambda self: self._holding())
    @rule(writer=WRITERS, pick=st.integers(0, 15), taker=WORKERS, wakes=st.booleans())
    def hand_on(self, writer: Authority, pick: int, taker: Worker, wakes: bool) -> None:
        """The work changes hands: a holder (of a current claim, when there is one) goes
        silent (a long pause; it still believes it holds the claim), the clock reaches its
        lease's expiry, the recovery sweeps of two writers find it at once (both decide; the
        second to commit must be WORKLOAD_CONFLICT), and `taker` claims it by id and starts
        it. When `wakes`, the silent holder then wakes up and completes under its old fence
        (the fencing token's whole reason to be: WORKLOAD_STALE_FENCE, nothing written);
        otherwise its later calls are stale."""
        live = self._live_claims()
        worker, key, old = live[pick % len(live)] if live else self._pick_held(pick)
        index = self._index.get(key)
        expiry = index.lease_expires_at if index is not None else None
        if expiry is None:
            note(f"[{self.now}] {key} has no lease to lapse")
            return
        note(f"[{self.now}] {worker.name} goes silent on {key}")
        self.now = max(self.now, expiry)
        other = self._writers[(self._writers.index(writer) + 1) % len(self._writers)]
        held = [self._hold(w, "recover_expired", key, None, None, 0) for w in (writer, other)]
        for one in held:
            if isinstance(one, Held):
                self._commit(one)
        self._claim(writer, taker, key, 1000)
        fence = taker.held.get(key)
        if fence is None or fence == old:
            return
        self._start(writer, taker, key, fence, "hand_on: start")
        if wakes:
            self._complete(writer, worker, key, old, 0, "hand_on: the silent holder completes")
