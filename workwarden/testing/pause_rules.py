"""The stateful suite's pauses: an operator stops and restarts claiming, between every other call.

A pause is a scheduler gate, not a state (`workwarden.statemachine.pauses`):
it writes no workload, no claim takes work of its scope while it is in force,
and work already held runs on. `PauseRules` pauses and resumes the scopes
that cover the suite's work (its tenant; its tenant and application; those
and its definition) and one that covers none of it (another application),
and has a holder report while its work is paused. The shadow model knows
whether the suite's work is paused, and predicts every claim accordingly
(`claim_next` and `claim_many` find nothing, a claim by id is refused
`WORKLOAD_NOT_READY`).

Two checks hold after every step:

- `no_claim_is_granted_in_a_paused_scope`: while the suite's work is paused,
  no claim is committed that was decided after the pause (a claim prepared
  before it may still commit, as in a deployment; the clock moves on one
  millisecond after each pause, so the two are told apart by their instant);
- `in_flight_work_of_a_paused_scope_reports_normally`: a pause or a resume
  writes no workload document, and while paused every holder's report
  (`paused_holder_reports`) is answered as the shadow model predicts without
  knowing of the pause, never refused for it.
"""

from __future__ import annotations

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from workwarden.statemachine.authority import Authority
from workwarden.statemachine.properties.operations import operation_roles
from workwarden.storage.base import PauseRecord, Pauses, PauseScope
from workwarden.testing.machine import WRITERS
from workwarden.testing.support import APPLICATION, HOLDER_CALLS, LEASES, TENANT
from workwarden.testing.worker_rules import WorkerRules

__all__ = ["DEFINITION", "PAUSE_SCOPES", "PauseRules"]

#: The definition of every workload the suite admits (`WorkloadPlan.request`).
DEFINITION = "send"

#: The scopes the suite pauses: (tenant, application, definition). The last covers none
#: of the suite's work, so its pause must change nothing the suite sees.
PAUSE_SCOPES: tuple[tuple[str, str | None, str | None], ...] = (
    (TENANT, None, None),
    (TENANT, APPLICATION, None),
    (TENANT, APPLICATION, DEFINITION),
    (TENANT, "another-app", None),
)


def _covers(scope: tuple[str, str | None, str | None]) -> bool:
    """Does a pause of `scope` cover the suite's work?"""
    return PauseScope(*scope).covers(TENANT, APPLICATION, DEFINITION)


class PauseRules(WorkerRules):
    """An operator's pause and resume of a scope, and holders reporting while paused."""

    def __init__(self) -> None:
        super().__init__()
        #: The scopes paused by this run (by index into PAUSE_SCOPES), and the pause's record.
        self._pauses: dict[int, PauseRecord] = {}
        #: While the suite's work is paused: the instant it became so, and the audit log's
        #: length then (what `no_claim_is_granted_in_a_paused_scope` reads on from).
        self._paused_from: tuple[int, int] | None = None

    def _pauses_kept(self) -> bool:
        return isinstance(self.store, Pauses)

    def _work_paused(self) -> bool:
        return any(_covers(PAUSE_SCOPES[i]) for i in self._pauses)

    def _gate_changed(self) -> None:
        """The suite's work became paused, or free: tell the shadow model and the check."""
        paused = self._work_paused()
        if self.shadow is not None:
            self.shadow.paused = paused
        if paused and self._paused_from is None:
            self._paused_from = (self.now, len(self.store.audit_log()))
        elif not paused:
            self._paused_from = None

    @precondition(lambda self: self._pauses_kept())
    @rule(writer=WRITERS, which=st.integers(0, len(PAUSE_SCOPES) - 1), reason=st.booleans())
    def pause(self, writer: Authority, which: int, reason: bool) -> None:
        """An operator pauses a scope (the suite's tenant, application or definition, or
        another application); pausing a paused scope answers the pause in force and writes
        nothing. Then the clock moves on 1 ms, so a claim decided after the pause is told
        apart from one a writer prepared before it."""
        tenant, application, definition = PAUSE_SCOPES[which]
        earlier = self._pauses.get(which)
        documents = self._documents()
        reply, error = self._call(
            "pause",
            f"pause {PauseScope(tenant, application, definition).key} (operator)",
            lambda: writer.pause(
                "operator-1",
                self.now,
                tenant=tenant,
                application=application,
                definition=definition,
                reason="maintenance" if reason else None,
            ),
            None,
            frozenset(),
        )
        if error is not None:
            return
        assert isinstance(reply, PauseRecord)
        self._expect(
            self._documents() == documents,
            "a pause wrote a workload document",
            "in_flight_work_of_a_paused_scope_reports_normally",
        )
        if earlier is not None:
            self._expect(
                reply == earlier,
                f"pausing a paused scope answered {reply}, not the pause in force {earlier}",
            )
        else:
            self._expect(reply.since == self.now, f"a new pause answered since {reply.since}")
            self._pauses[which] = reply
        self._gate_changed()
        self.now += 1
        note(f"[{self.now}] clock +1 after the pause")

    @precondition(lambda self: self._pauses_kept())
    @rule(writer=WRITERS, which=st.integers(0, len(PAUSE_SCOPES) - 1))
    def resume(self, writer: Authority, which: int) -> None:
        """An operator resumes a scope: True when it was paused; a scope not paused answers
        False and nothing is written."""
        tenant, application, definition = PAUSE_SCOPES[which]
        documents = self._documents()
        reply, error = self._call(
            "resume",
            f"resume {PauseScope(tenant, application, definition).key} (operator)",
            lambda: writer.resume(
                "operator-1",
                self.now,
                tenant=tenant,
                application=application,
                definition=definition,
            ),
            None,
            frozenset(),
        )
        if error is not None:
            return
        self._expect(
            reply is (which in self._pauses),
            f"resume answered {reply}; the scope was {'' if which in self._pauses else 'not '}"
            "paused",
        )
        self._expect(
            self._documents() == documents,
            "a resume wrote a workload document",
            "in_flight_work_of_a_paused_scope_reports_normally",
        )
        self._pauses.pop(which, None)
        self._gate_changed()

    @precondition(lambda self: self._work_paused() and self._holding())
    @rule(
        writer=WRITERS,
        pick=st.integers(0, 15),
        call=st.sampled_from(HOLDER_CALLS),
        extend_ms=st.sampled_from(LEASES),
    )
    def paused_holder_reports(
        self, writer: Authority, pick: int, call: str, extend_ms: int
    ) -> None:
        """While the suite's work is paused, a holder makes one call with its fence: it is
        answered as if nothing were paused (the shadow model predicts it knowing no pause)."""
        worker, key, fence = self._pick_held(pick)
        # The shadow model's pause gates its claims only: the call is predicted without it.
        self._holder(writer, worker, key, fence, call, extend_ms, f"{call} while paused")

    def _documents(self) -> list[tuple[str, int]]:
        return [(doc.key, doc.version) for doc in self.store.scan()]

    @invariant()
    def no_claim_is_granted_in_a_paused_scope(self) -> None:
        """While the suite's work is paused, no claim decided after the pause is committed."""
        if self._paused_from is None:
            return
        since, mark = self._paused_from
        claiming = operation_roles(type(self).spec).claiming
        for record in self.store.audit_log()[mark:]:
            if record.operation in claiming and record.at > since:
                self._fail(
                    "no_claim_is_granted_in_a_paused_scope",
                    f"{record.key} was claimed ({record.operation} by {record.worker} at "
                    f"{record.at}) while its scope has been paused since {since}",
                )

    @invariant()
    def in_flight_work_of_a_paused_scope_reports_normally(self) -> None:
        """The store's pauses in force are the run's, so the holders' calls the shadow model
        predicts without them were made under them (a pause or resume that wrote a document
        fails at its own step)."""
        if not self._pauses_kept():
            return
        assert isinstance(self.store, Pauses)
        in_force = {record.scope.key for record in self.store.paused(TENANT)}
        expected = {PauseScope(*PAUSE_SCOPES[i]).key for i in self._pauses}
        if in_force != expected:
            self._fail(
                "in_flight_work_of_a_paused_scope_reports_normally",
                f"the store's pauses in force are {sorted(in_force)}, the run's {sorted(expected)}",
            )
