"""The stateful suite's admissions: new scopes, replays, and conflicting requests."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize, multiple, precondition, rule

from workwarden.statemachine import errors
from workwarden.statemachine.authority import Authority
from workwarden.statemachine.commands import AdmitReply
from workwarden.statemachine.models import CreateWorkload
from workwarden.testing.machine import WORKLOADS, WRITERS, MachineBase
from workwarden.testing.shadow import Outcome
from workwarden.testing.support import ALLOWED, SCOPES, WorkloadPlan, shadow_plan, workload_plans

__all__ = ["AdmissionRules"]


class AdmissionRules(MachineBase):
    """Admissions: the first workload of every run, new scopes, and the same scope again."""

    # -- admission --------------------------------------------------------------------------------

    @initialize(target=WORKLOADS, writer=WRITERS, plan=workload_plans())
    def admit_first(self, writer: Authority, plan: WorkloadPlan) -> Any:
        """Every run starts with one admitted workload."""
        return self.admit_new(writer, 0, plan)

    @precondition(lambda self: self._room())
    @rule(target=WORKLOADS, writer=WRITERS, scope=st.integers(0, 7), plan=workload_plans())
    def admit_new(self, writer: Authority, scope: int, plan: WorkloadPlan) -> Any:
        """Admit a request under an unused idempotency scope: it must create the workload."""
        free = [s for s in SCOPES if s not in self._scopes]
        agent, key = free[scope % len(free)]
        request = plan.request(agent, key, self.now)
        planned = shadow_plan(plan, request)
        outcome = self.shadow.admit((agent, key), planned, self.now) if self.shadow else None
        reply, error = self._call(
            "admit",
            f"admit {agent}/{key} (new): {plan}",
            lambda: writer.admit(request, self.now),
            outcome,
            ALLOWED["admit"],
        )
        if error is not None:
            return multiple()
        assert isinstance(reply, AdmitReply)
        self._expect(reply.created, f"a new scope {agent}/{key} was answered as a replay")
        return self._admitted_as(reply.workload.workload_id, (agent, key), plan, request, outcome)

    def _admitted_as(
        self,
        key: str,
        scope: tuple[str, str],
        plan: WorkloadPlan,
        request: CreateWorkload,
        outcome: Outcome | None,
    ) -> Any:
        self._scopes[scope] = key
        self._admitted[key] = (scope, plan, request)
        if self.shadow is not None and outcome is not None:
            self.shadow.register_scope(scope, key)
            self.shadow.apply(outcome, key=key)
        return key

    @rule(writer=WRITERS, workload=WORKLOADS, change=st.sampled_from((0, 0, 1, 2)))
    def admit_again(self, writer: Authority, workload: str, change: int) -> None:
        """Send an admitted scope's request again: unchanged (`change=0`) it is a replay that
        answers the original and writes nothing; with another input it is refused with
        IDEMPOTENCY_KEY_REUSED naming `input`. A purged workload's scope admits its request
        afresh: it must create the workload again, under the same id."""
        scope, plan, request = self._admitted[workload]
        # A purged workload's scope admits afresh: its own request creates it again.
        purged = self.store.read(workload) is None
        if change and not purged:
            request = request.model_copy(update={"input": {"payload": plan.payload + change}})
        outcome = (
            self.shadow.admit(scope, shadow_plan(plan, request), self.now) if self.shadow else None
        )
        how = "with another input (conflict)" if change else "again (replay)"
        reply, error = self._call(
            "admit",
            f"admit {scope[0]}/{scope[1]} {how}",
            lambda: writer.admit(request, self.now),
            outcome,
            ALLOWED["admit"] if change else frozenset(),
        )
        if error is not None and error.code == errors.IDEMPOTENCY_KEY_REUSED:
            fields = (error.details or {}).get("fields")
            self._expect(fields == ["input"], f"the conflict names {fields}, not ['input']")
        elif error is None and purged:
            assert isinstance(reply, AdmitReply)
            self._expect(
                reply.created and reply.workload.workload_id == workload,
                f"admitting purged {workload} again answered {reply.workload.workload_id} "
                f"created={reply.created}",
            )
            self._admitted_as(workload, scope, plan, request, outcome)
        elif error is None:
            assert isinstance(reply, AdmitReply)
            self._expect(
                not change and not reply.created and reply.workload.workload_id == workload,
                f"admitting {workload} {how} answered {reply.workload.workload_id} "
                f"created={reply.created}",
            )
