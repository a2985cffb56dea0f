"""The stateful suite's claims: by id, and the scheduler's best claimable workload.

Each granted claim is checked against the call (and the shadow model's
fencing token) and recorded as the fence the worker holds.
"""

from __future__ import annotations

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from workwarden.statemachine.authority import Authority
from workwarden.statemachine.models import Claim
from workwarden.testing.machine import WORKERS, WRITERS, MachineBase
from workwarden.testing.shadow import Outcome
from workwarden.testing.support import ALLOWED, APPLICATION, LEASES, TENANT, Worker

__all__ = ["ClaimRules"]


class ClaimRules(MachineBase):
    """Claims by id and by `claim_next`, and what a granted claim must carry."""

    # -- claims -----------------------------------------------------------------------------------

    @precondition(lambda self: bool(self._admitted))
    @rule(
        writer=WRITERS,
        worker=WORKERS,
        pick=st.integers(0, 15),
        lease_ms=st.sampled_from(LEASES),
    )
    def claim(self, writer: Authority, worker: Worker, pick: int, lease_ms: int) -> None:
        """Claim a workload by id: a READY one when there is one (else any, to be refused)."""
        self._claim(writer, worker, self._in_state(("READY",), pick), lease_ms)

    def _claim(self, writer: Authority, worker: Worker, workload: str, lease_ms: int) -> None:
        outcome = (
            self.shadow.claim(workload, worker.name, worker.capabilities, lease_ms, self.now)
            if self.shadow
            else None
        )
        reply, error = self._call(
            "claim",
            f"claim {workload} by {worker.name} for {lease_ms} ms",
            lambda: writer.claim(workload, worker.name, worker.capabilities, self.now, lease_ms),
            outcome,
            ALLOWED["claim"],
        )
        if error is None:
            assert isinstance(reply, Claim)
            self._granted(worker, workload, reply, lease_ms, outcome)
        else:
            self._settle(outcome, error)

    def _granted(
        self,
        worker: Worker,
        key: str,
        claim: Claim,
        lease_ms: int,
        outcome: Outcome | None,
    ) -> None:
        # A claim the worker already held is answered again (its reply was lost, as
        # far as the authority can tell): the lease it was granted, not a new one.
        repeated = claim.fence in self._grants.get(key, ())
        self._expect(
            claim.workload_id == key
            and claim.worker_id == worker.name
            and (repeated or claim.expires_at == claim.claimed_at + lease_ms),
            f"claim {claim} does not match the call",
        )
        if outcome is not None and outcome.after is not None:
            self._expect(
                claim.fencing_token == outcome.after.token,
                f"claim token {claim.fencing_token}, the shadow model counts {outcome.after.token}",
                "shadow_model",
            )
            self._settle(outcome.with_claim_id(claim.claim_id), None)
        worker.drop(key)
        worker.held[key] = claim.fence
        grants = self._grants.setdefault(key, [])
        if claim.fence not in grants:
            grants.append(claim.fence)
        note(f"    {worker.name} holds {key} under token {claim.fencing_token}")

    @precondition(lambda self: bool(self._scopes))
    @rule(writer=WRITERS, worker=WORKERS, lease_ms=st.sampled_from(LEASES))
    def claim_next(self, writer: Authority, worker: Worker, lease_ms: int) -> None:
        """Claim the best claimable workload for this worker, or none."""
        self._claim_next(writer, worker, lease_ms)

    def _claim_next(self, writer: Authority, worker: Worker, lease_ms: int) -> None:
        outcomes = (
            self.shadow.claim_next(worker.name, worker.capabilities, lease_ms, self.now)
            if self.shadow
            else None
        )
        reply, _ = self._call(
            "claim_next",
            f"claim_next by {worker.name} for {lease_ms} ms",
            lambda: writer.claim_next(
                TENANT, APPLICATION, worker.name, worker.capabilities, self.now, lease_ms
            ),
            Outcome(None, None, None) if self.shadow else None,
            ALLOWED["claim_next"],
        )
        granted = None
        if outcomes is not None and self.shadow is not None:
            for outcome in outcomes:
                if outcome.code is None:
                    granted = outcome
                else:
                    self.shadow.apply(outcome)
            wanted = granted.key if granted is not None else None
            got = reply.workload_id if isinstance(reply, Claim) else None
            if wanted != got:
                self._fail(
                    "shadow_model",
                    f"claim_next by {worker.name}: the shadow model picks {wanted}, "
                    f"the authority {got}",
                )
        if isinstance(reply, Claim):
            note(f"    claimed {reply.workload_id}")
            self._granted(worker, reply.workload_id, reply, lease_ms, granted)
