"""Admissions that carry a concurrency key, so claims meet the key's limit.

`ConcurrencyRules` is not part of `AuthorityMachine`: the shadow model does
not count a key's claims, so a suite that mixes these rules in runs with the
shadow model off (`authority_machine(..., shadow=False)`), under a spec whose
`[concurrency]` table limits `CONCURRENCY_KEY`. Every claim, `claim_next`,
`claim_many` and race of the other rules then meets the limit, and the
invariant `claims_within_concurrency_limits` (checked after every step with
the others) holds the store to it; a claim refused at the limit
(`WORKLOAD_CONCURRENCY_LIMITED`) must change nothing, like every refusal.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import multiple, precondition, rule

from workwarden.statemachine.authority import Authority
from workwarden.statemachine.commands import AdmitReply
from workwarden.testing.admission_rules import AdmissionRules
from workwarden.testing.machine import WORKLOADS, WRITERS
from workwarden.testing.support import ALLOWED, SCOPES, WorkloadPlan, workload_plans

__all__ = ["CONCURRENCY_KEY", "ConcurrencyRules"]

CONCURRENCY_KEY = "limited"
"""The concurrency key of the workloads `ConcurrencyRules` admits."""


class ConcurrencyRules(AdmissionRules):
    """Admit new scopes whose workloads carry `CONCURRENCY_KEY` (run with the shadow model off)."""

    @precondition(lambda self: self._room())
    @rule(target=WORKLOADS, writer=WRITERS, scope=st.integers(0, 7), plan=workload_plans())
    def admit_limited(self, writer: Authority, scope: int, plan: WorkloadPlan) -> Any:
        """Admit a request with the concurrency key under an unused scope: it must create it."""
        free = [s for s in SCOPES if s not in self._scopes]
        agent, key = free[scope % len(free)]
        request = plan.request(agent, key, self.now).model_copy(
            update={"concurrency_key": CONCURRENCY_KEY}
        )
        reply, error = self._call(
            "admit",
            f"admit {agent}/{key} (new, concurrency key {CONCURRENCY_KEY}): {plan}",
            lambda: writer.admit(request, self.now),
            None,
            ALLOWED["admit"],
        )
        if error is not None:
            return multiple()
        assert isinstance(reply, AdmitReply)
        self._expect(reply.created, f"a new scope {agent}/{key} was answered as a replay")
        self._expect(
            reply.workload.concurrency_key == CONCURRENCY_KEY,
            f"admitted with concurrency key {reply.workload.concurrency_key}",
        )
        return self._admitted_as(reply.workload.workload_id, (agent, key), plan, request, None)
