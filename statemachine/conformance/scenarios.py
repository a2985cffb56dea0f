"""The seed scenarios of the conformance vectors, as data.

One or more scenarios per behaviour the test suite pins down (admission and
replay, the lifecycle, fencing, eligibility, cancellation, completion
replay, failures with each effect, retries and backoff, recovery, operator
re-arms and timeouts, exhausted budgets, each deadline, the scheduler), each
a list of `(command, now)` steps. Ids are derived, never invented: a workload
id from its admission scope (`workload_id_for`), a claim id from workload,
token and worker (`claim_id_for`), so a step can name the fence of a claim
made two steps earlier. `Work` builds the steps for one workload.

Instants follow the tests: admission at 10_000, a claim at 11_000, leases of
10_000 ms unless a scenario says otherwise.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Any

from workwarden.statemachine import errors
from workwarden.statemachine.admission import workload_id_for
from workwarden.statemachine.commands import (
    AdmitCommand,
    CancelCommand,
    CheckpointCommand,
    ClaimCommand,
    ClaimNextCommand,
    CompleteCommand,
    ConfirmCancelCommand,
    EnforceDeadlineCommand,
    ExecutionContextCommand,
    FailCommand,
    HeartbeatCommand,
    RecoverCommand,
    RetryCommand,
    StartCommand,
    TimeoutCommand,
)
from workwarden.statemachine.conformance.runner import (
    CONFORMANCE_KEY_ID,
    CONFORMANCE_SECRET,
    Scenario,
    StepCommand,
    command_json,
)
from workwarden.statemachine.core import claim_id_for, decide
from workwarden.statemachine.grants import Grant, GrantSigner, SignedGrant, Subject
from workwarden.statemachine.models import (
    DEFAULT_RETRY_ON,
    CreateWorkload,
    Dependency,
    Fence,
    RetryPolicy,
    Timeouts,
    Workload,
)
from workwarden.statemachine.spec import default_spec

__all__ = ["Work", "admitted", "grant", "request", "seed_scenarios"]

Step = tuple[StepCommand, int]

LEASE = 10_000
CAPS = ("email:send",)
SIGNER = GrantSigner(CONFORMANCE_KEY_ID, CONFORMANCE_SECRET)


def grant(
    requester: str = "a1",
    *,
    tenant: str = "t",
    application: str = "app",
    expires_at: int = 9_999_000_000,
) -> Grant:
    """A grant for requester `requester` in one tenant and application (the suite's fixture)."""
    return Grant(
        id="g",
        issuer=Subject(kind="human", id="h"),
        subject=Subject(kind="agent", id=requester),
        tenant_id=tenant,
        application_id=application,
        capabilities=("workload:execute",),
        issued_at=1_000,
        expires_at=expires_at,
    )


def request(
    key: str = "one", requester: str = "a1", *, signer: GrantSigner = SIGNER, **changes: Any
) -> CreateWorkload:
    """The suite's fixture request under idempotency key `key`, with `changes` applied.

    Its grant is signed by `signer` (by default with the conformance key).
    """
    tenant = changes.pop("tenant_id", "t")
    application = changes.pop("application_id", "app")
    fields: dict[str, Any] = {
        "tenant_id": tenant,
        "application_id": application,
        "environment": "production",
        "definition_id": "send",
        "definition_revision": "r1",
        "trigger": "manual",
        "input": {"id": 1},
        "requested_by": Subject(kind="agent", id=requester),
        "session_id": "session-1",
        "authorization_snapshot": signer.sign(
            grant(requester, tenant=tenant, application=application)
        ),
        "capability_snapshot": CAPS,
        "idempotency_key": key,
    }
    fields.update(changes)
    return CreateWorkload.model_validate(fields)


def admitted(req: CreateWorkload, now: int, **changes: Any) -> Workload:
    """The document `req` admits at `now`, with `changes` (as an older release left it)."""
    decision = decide(default_spec(), None, AdmitCommand(request=req), now)
    assert decision.workload is not None
    return decision.workload.model_copy(update=changes)


class Work:
    """The steps of one workload's life: each method returns a `(command, now)` step.

    A fence is named by its worker and token: `fence("a", 1)` is worker a's
    claim under token 1.
    """

    def __init__(self, req: CreateWorkload) -> None:
        self.request = req
        self.id = workload_id_for(req)

    def admit(self, now: int) -> Step:
        return AdmitCommand(request=self.request), now

    def fence(self, worker: str, token: int) -> Fence:
        return Fence(claim_id=claim_id_for(self.id, token, worker), worker_id=worker, token=token)

    def claim(
        self,
        worker: str,
        now: int,
        *,
        lease: int = LEASE,
        caps: Any = CAPS,
        request_id: str | None = None,
    ) -> Step:
        command = ClaimCommand(
            workload_id=self.id,
            worker_id=worker,
            capabilities=caps,
            lease_ms=lease,
            request_id=request_id,
        )
        return command, now

    def start(self, worker: str, token: int, now: int) -> Step:
        return StartCommand(workload_id=self.id, fence=self.fence(worker, token)), now

    def heartbeat(self, worker: str, token: int, now: int, extend: int = LEASE) -> Step:
        fence = self.fence(worker, token)
        return HeartbeatCommand(workload_id=self.id, fence=fence, extend_ms=extend), now

    def context(self, worker: str, token: int, now: int, refs: tuple[str, ...] = ()) -> Step:
        fence = self.fence(worker, token)
        return (
            ExecutionContextCommand(workload_id=self.id, fence=fence, secret_references=refs),
            now,
        )

    def checkpoint(
        self, worker: str, token: int, now: int, state: Any = None, sequence: int | None = None
    ) -> Step:
        fence = self.fence(worker, token)
        body = {"step": 1} if state is None else state
        command = CheckpointCommand(workload_id=self.id, fence=fence, state=body, sequence=sequence)
        return command, now

    def complete(
        self, worker: str, token: int, now: int, result: str = "r1", output: Any = None, **kw: Any
    ) -> Step:
        fence = self.fence(worker, token)
        body = {"sent": 1} if output is None else output
        command = CompleteCommand(
            workload_id=self.id, fence=fence, result_id=result, output=body, **kw
        )
        return command, now

    def fail(
        self, worker: str, token: int, now: int, kind: str, error: str = "x", effect: Any = None
    ) -> Step:
        fence = self.fence(worker, token)
        command = FailCommand(
            workload_id=self.id, fence=fence, kind=kind, error=error, effect=effect
        )
        return command, now

    def confirm_cancel(self, worker: str, token: int, now: int) -> Step:
        return ConfirmCancelCommand(workload_id=self.id, fence=self.fence(worker, token)), now

    def cancel(self, now: int, actor: str = "operator-1", request_id: str | None = None) -> Step:
        return CancelCommand(workload_id=self.id, actor=actor, request_id=request_id), now

    def timeout(self, now: int, actor: str = "operator-1", request_id: str | None = None) -> Step:
        return TimeoutCommand(workload_id=self.id, actor=actor, request_id=request_id), now

    def retry(
        self,
        now: int,
        reason: str | None = None,
        actor: str = "operator-1",
        request_id: str | None = None,
    ) -> Step:
        command = RetryCommand(
            workload_id=self.id, actor=actor, reason=reason, request_id=request_id
        )
        return command, now

    def recover(self, now: int) -> Step:
        return RecoverCommand(workload_id=self.id), now

    def enforce(self, now: int) -> Step:
        return EnforceDeadlineCommand(workload_id=self.id), now


def claim_next(
    worker: str,
    now: int,
    *,
    tenant: str = "t",
    application: str = "app",
    caps: Any = CAPS,
    request_id: str | None = None,
) -> Step:
    """The scheduler's claim for `worker` in one tenant and application."""
    command = ClaimNextCommand(
        tenant_id=tenant,
        application_id=application,
        worker_id=worker,
        capabilities=caps,
        lease_ms=LEASE,
        request_id=request_id,
    )
    return command, now


def _s(name: str, *steps: Step, ends: str | None = None, **kw: Any) -> Scenario:
    return Scenario(name=name, steps=steps, ends=ends, **kw)


# -- admission ---------------------------------------------------------------------------


def _admission() -> list[Scenario]:
    w = Work(request())
    different = Work(request(input={"id": 2}, priority=5))
    theirs = Work(request(requester="a2"))
    borrowed = Work(request(authorization_snapshot=SIGNER.sign(grant("a2"))))
    original = request(input={"a": 1, "b": 2}, dependencies=(Dependency(workload_id="w1"),))
    equivalent = command_json(AdmitCommand(request=original))
    equivalent["request"]["capability_snapshot"] = [*CAPS, *CAPS]
    equivalent["request"]["retry_policy"]["retry_on"] = [
        "worker_failure",
        "transient_connection",
        "timeout",
    ]
    equivalent["request"]["trigger"] = "retried-by-client"
    changed = Work(
        request(
            input={"a": 1, "b": 2},
            dependencies=(Dependency(workload_id="w1"),),
            environment="staging",
            priority=1,
            not_before=7_000,
        )
    )
    scheduled = Work(request(not_before=20_000))
    unsigned = request().authorization_snapshot
    forged = SignedGrant(grant=unsigned.grant, key_id=unsigned.key_id, signature="0" * 64)
    missing = command_json(AdmitCommand(request=request()))
    del missing["request"]["tenant_id"]
    return [
        _s(
            "admission/the_same_request_replays_the_original_without_creating_another",
            w.admit(10_000),
            w.admit(11_000),
            w.claim("a", 12_000),
            w.admit(13_000),
            ends="CLAIMED",
        ),
        _s(
            "admission/the_same_key_for_a_different_request_is_refused_and_creates_nothing",
            w.admit(10_000),
            different.admit(11_000),
            ends=errors.IDEMPOTENCY_KEY_REUSED,
        ),
        _s(
            "admission/another_requesters_identical_key_is_its_own_workload",
            w.admit(10_000),
            theirs.admit(10_000),
            w.admit(10_001),
            ends="READY",
        ),
        _s(
            "admission/a_snapshot_that_does_not_bind_the_requester_is_refused_before_any_replay",
            w.admit(10_000),
            borrowed.admit(11_000),
            ends=errors.UNAUTHORIZED,
        ),
        _s(
            "admission/an_equivalent_request_replays_after_normalisation",
            (AdmitCommand(request=original), 10_000),
            (equivalent, 99_000),
            ends="READY",
        ),
        _s(
            "admission/every_changed_execution_field_is_named_in_order",
            (AdmitCommand(request=original), 10_000),
            changed.admit(11_000),
            ends=errors.IDEMPOTENCY_KEY_REUSED,
        ),
        _s(
            "admission/a_not_before_is_compared_as_admitted_not_as_retries_moved_it",
            scheduled.admit(10_000),
            scheduled.claim("w", 20_000, lease=1_000),
            scheduled.fail("w", 1, 20_500, "timeout", "slow"),
            scheduled.admit(30_000),
            w.admit(30_000),
            ends=errors.IDEMPOTENCY_KEY_REUSED,
        ),
        _s(
            "admission/a_zero_timeout_is_refused",
            Work(request(timeouts=Timeouts(queue_ms=0))).admit(10_000),
            ends=errors.INVALID,
        ),
        _s(
            "admission/a_one_millisecond_timeout_is_accepted",
            Work(request(timeouts=Timeouts(claim_ms=1))).admit(10_000),
            ends="READY",
        ),
        _s(
            "admission/plaintext_secrets_in_the_input_are_refused",
            Work(request(input={"outer": {"Password": "hunter2"}})).admit(10_000),
            Work(request(input={"note": "sk-live-123"})).admit(10_000),
            ends=errors.SECRET_REJECTED,
        ),
        _s(
            "admission/a_blank_idempotency_key_is_refused",
            Work(request("   ")).admit(10_000),
            ends=errors.INVALID,
        ),
        _s(
            "admission/a_grant_whose_signature_does_not_verify_is_refused",
            Work(request(authorization_snapshot=forged)).admit(10_000),
            ends=errors.UNAUTHORIZED,
        ),
        _s(
            "admission/an_expired_grant_is_refused",
            Work(request(authorization_snapshot=SIGNER.sign(grant(expires_at=20_000)))).admit(
                20_000
            ),
            ends=errors.UNAUTHORIZED,
        ),
        _s(
            "admission/a_malformed_request_is_invalid_and_creates_nothing",
            (missing, 10_000),
            ends=errors.INVALID,
        ),
    ]


# -- the lifecycle, fencing and eligibility -------------------------------------------


def _lifecycle() -> list[Scenario]:
    w = Work(request())
    return [
        _s(
            "lifecycle/a_workload_goes_from_admission_through_checkpoints_to_success",
            w.admit(10_000),
            w.claim("w", 11_000),
            w.start("w", 1, 12_000),
            w.context("w", 1, 12_500),
            w.checkpoint("w", 1, 13_000, {"step": 1}),
            w.checkpoint("w", 1, 13_500, {"step": 2}),
            w.heartbeat("w", 1, 14_000),
            w.context("w", 1, 14_500),
            w.complete("w", 1, 15_000, artifacts=("artifact://report",), schema_version=2),
            ends="SUCCEEDED",
        ),
        _s(
            "lifecycle/a_workload_without_checkpoints_completes_from_running",
            w.admit(10_000),
            w.claim("w", 11_000),
            w.start("w", 1, 12_000),
            w.complete("w", 1, 13_000),
            ends="SUCCEEDED",
        ),
        _s(
            "lifecycle/a_finished_workload_stays_finished",
            w.admit(10_000),
            w.claim("w", 11_000),
            w.start("w", 1, 12_000),
            w.complete("w", 1, 13_000),
            w.admit(14_000),
            w.claim("v", 14_000),
            w.cancel(14_000),
            ends=errors.TRANSITION_DENIED,
        ),
        _s(
            "lifecycle/completion_needs_a_started_attempt",
            w.admit(10_000),
            w.claim("w", 11_000),
            w.complete("w", 1, 12_000),
            ends=errors.TRANSITION_DENIED,
        ),
        _s(
            "lifecycle/a_checkpoint_needs_a_started_attempt",
            w.admit(10_000),
            w.claim("w", 11_000),
            w.checkpoint("w", 1, 12_000),
            ends=errors.TRANSITION_DENIED,
        ),
        _s(
            "lifecycle/plaintext_secrets_in_a_checkpoint_or_output_are_refused",
            w.admit(10_000),
            w.claim("w", 11_000),
            w.start("w", 1, 12_000),
            w.checkpoint("w", 1, 13_000, {"token": "abc"}),
            w.complete("w", 1, 14_000, output={"note": "BEGIN PRIVATE KEY"}),
            ends=errors.SECRET_REJECTED,
        ),
        _s(
            "lifecycle/a_heartbeat_extends_the_lease_from_its_own_instant",
            w.admit(10_000),
            w.claim("w", 11_000, lease=1_000),
            w.heartbeat("w", 1, 11_900, extend=5_000),
            w.recover(12_000),
            w.recover(16_899),
            w.recover(16_900),
            ends="READY",
        ),
        _s(
            "lifecycle/a_call_at_an_instant_before_the_last_change_writes_nothing",
            w.admit(10_000),
            w.claim("w", 11_000),
            w.start("w", 1, 10_999),
            w.start("w", 1, 11_000),
            w.start("w", 1, 10_500),
            w.checkpoint("w", 1, 10_999),
            ends=errors.CONFLICT,
        ),
        _s(
            "lifecycle/a_workload_that_does_not_exist_is_not_found",
            w.start("w", 1, 10_000),
            w.cancel(10_000),
            w.recover(10_000),
            ends=errors.NOT_FOUND,
        ),
    ]


def _fencing() -> list[Scenario]:
    w = Work(request())
    lost_and_reclaimed = (
        w.admit(10_000),
        w.claim("a", 11_000, lease=1_000),
        w.start("a", 1, 11_000),
        w.recover(13_000),
        w.claim("b", 13_000),
    )
    scoped = Work(request(connection_scopes=("crm", "billing")))
    forged = Fence(claim_id=w.fence("w", 1).claim_id, worker_id="intruder", token=1)
    return [
        _s(
            "fencing/after_recovery_a_new_claim_has_a_larger_token_and_the_old_fence_is_stale",
            *lost_and_reclaimed,
            w.heartbeat("a", 1, 13_500),
            w.complete("a", 1, 14_000, result="stale"),
            ends=errors.STALE_FENCE,
        ),
        _s(
            "fencing/once_nobody_holds_the_work_a_lost_fence_has_no_claim_at_all",
            w.admit(10_000),
            w.claim("a", 11_000, lease=1_000),
            w.recover(13_000),
            w.start("a", 1, 13_500),
            ends=errors.CLAIM_INVALID,
        ),
        _s(
            "fencing/a_fence_for_work_that_was_never_claimed_has_no_claim",
            w.admit(10_000),
            w.start("w", 1, 11_000),
            ends=errors.CLAIM_INVALID,
        ),
        _s(
            "fencing/each_part_of_the_fence_must_match_the_current_claim",
            w.admit(10_000),
            w.claim("w", 11_000),
            (StartCommand(workload_id=w.id, fence=forged), 12_000),
            w.start("w", 2, 12_000),
            w.start("w", 0, 12_000),
            (
                StartCommand(
                    workload_id=w.id,
                    fence=w.fence("w", 1).model_copy(update={"claim_id": "claim_other"}),
                ),
                12_000,
            ),
            ends=errors.STALE_FENCE,
        ),
        _s(
            "fencing/a_stale_worker_cannot_checkpoint_or_confirm_a_cancellation",
            *lost_and_reclaimed,
            w.start("b", 2, 13_000),
            w.checkpoint("a", 1, 13_500),
            w.cancel(14_000),
            w.confirm_cancel("a", 1, 14_500),
            w.checkpoint("a", 1, 14_600),
            ends=errors.STALE_FENCE,
        ),
        _s(
            "fencing/an_expired_lease_refuses_a_start",
            w.admit(10_000),
            w.claim("w", 11_000, lease=5_000),
            w.start("w", 1, 16_000),
            ends=errors.LEASE_EXPIRED,
        ),
        _s(
            "fencing/an_expired_lease_refuses_every_call_of_its_running_worker",
            w.admit(10_000),
            w.claim("w", 11_000, lease=5_000),
            w.start("w", 1, 12_000),
            w.checkpoint("w", 1, 16_000),
            w.context("w", 1, 16_000),
            w.fail("w", 1, 16_000, "timeout", "slow"),
            ends=errors.LEASE_EXPIRED,
        ),
        _s(
            "fencing/an_expired_lease_refuses_a_cancel_confirmation",
            w.admit(10_000),
            w.claim("w", 11_000, lease=5_000),
            w.start("w", 1, 12_000),
            w.cancel(13_000),
            w.confirm_cancel("w", 1, 16_000),
            ends=errors.LEASE_EXPIRED,
        ),
        _s(
            "fencing/an_expired_lease_refuses_its_own_worker",
            w.admit(10_000),
            w.claim("w", 11_000, lease=5_000),
            w.start("w", 1, 12_000),
            w.heartbeat("w", 1, 16_000),
            w.checkpoint("w", 1, 15_999),
            w.complete("w", 1, 16_000),
            ends=errors.LEASE_EXPIRED,
        ),
        _s(
            "fencing/a_resumed_attempt_reads_the_input_and_the_lost_attempts_checkpoints",
            w.admit(10_000),
            w.claim("a", 11_000, lease=1_000),
            w.start("a", 1, 11_000),
            w.checkpoint("a", 1, 11_500, {"step": "reserve", "status": "done"}),
            w.recover(13_000),
            w.claim("b", 13_000),
            w.context("b", 2, 13_000),
            w.context("a", 1, 13_000),
            ends=errors.STALE_FENCE,
        ),
        _s(
            "fencing/the_execution_context_hands_out_secret_references_only",
            scoped.admit(10_000),
            scoped.claim("w", 11_000),
            scoped.context("w", 1, 12_000, ("secret://db", "secret://smtp")),
            scoped.context("w", 1, 12_000, ("hunter2",)),
            scoped.context("w", 1, 12_000, ("secret://",)),
            ends=errors.SECRET_REJECTED,
        ),
    ]


def _eligibility() -> list[Scenario]:
    scheduled = Work(request(not_before=20_000))
    past = Work(request(not_before=5_000))
    w = Work(request())
    needs_sms = Work(request(capability_snapshot=("email:send", "sms:send")))
    return [
        _s(
            "eligibility/scheduled_work_is_ready_but_not_claimable_before_its_instant",
            scheduled.admit(10_000),
            scheduled.claim("w", 19_999),
            scheduled.claim("w", 20_000),
            ends="CLAIMED",
        ),
        _s(
            "eligibility/a_not_before_in_the_past_is_the_same_as_none",
            past.admit(10_000),
            past.claim("w", 10_000),
            ends="CLAIMED",
        ),
        _s(
            "eligibility/of_several_workers_at_the_instant_exactly_one_claims_the_work",
            w.admit(10_000),
            w.claim("a", 10_000),
            w.claim("b", 10_000),
            ends=errors.NOT_READY,
        ),
        _s(
            "eligibility/a_worker_without_the_capability_snapshot_cannot_claim",
            needs_sms.admit(10_000),
            needs_sms.claim("w", 11_000),
            needs_sms.claim("w", 11_000, caps=("email:send", "sms:send", "push")),
            needs_sms.claim("v", 11_000, caps=()),
            ends=errors.NOT_READY,
        ),
    ]


# -- cancellation and completion -------------------------------------------------------


def _cancellation() -> list[Scenario]:
    w = Work(request())
    scheduled = Work(request(not_before=50_000))
    one = Work(request(retry_policy=RetryPolicy(max_attempts=1, retry_on=DEFAULT_RETRY_ON)))
    return [
        _s(
            "cancellation/cancelling_before_the_eligibility_instant_prevents_execution",
            scheduled.admit(10_000),
            scheduled.cancel(11_000),
            scheduled.claim("w", 50_000),
            ends=errors.NOT_READY,
        ),
        _s(
            "cancellation/a_cancellation_racing_a_running_worker_is_confirmed_not_completed",
            w.admit(10_000),
            w.claim("w", 11_000),
            w.start("w", 1, 12_000),
            w.cancel(13_000),
            w.complete("w", 1, 14_000),
            w.heartbeat("w", 1, 14_500),
            w.confirm_cancel("w", 1, 15_000),
            ends="CANCELLED",
        ),
        _s(
            "cancellation/cancelling_claimed_work_asks_its_worker_and_keeps_the_claim",
            w.admit(10_000),
            w.claim("w", 11_000),
            w.cancel(12_000),
            w.cancel(12_500),
            w.confirm_cancel("w", 1, 13_000),
            ends="CANCELLED",
        ),
        _s(
            "cancellation/cancelling_checkpointed_work_asks_its_worker",
            w.admit(10_000),
            w.claim("w", 11_000),
            w.start("w", 1, 12_000),
            w.checkpoint("w", 1, 12_500),
            w.cancel(13_000),
            w.checkpoint("w", 1, 13_500),
            w.confirm_cancel("w", 1, 14_000),
            ends="CANCELLED",
        ),
        _s(
            "cancellation/only_a_requested_cancellation_can_be_confirmed",
            w.admit(10_000),
            w.claim("w", 11_000),
            w.start("w", 1, 12_000),
            w.confirm_cancel("w", 1, 13_000),
            ends=errors.TRANSITION_DENIED,
        ),
        _s(
            "cancellation/finished_work_cannot_be_cancelled",
            w.admit(10_000),
            w.cancel(11_000),
            w.cancel(12_000),
            ends=errors.TRANSITION_DENIED,
        ),
        _s(
            "cancellation/an_operator_closes_a_dead_letter_by_cancelling_it",
            one.admit(10_000),
            one.claim("w", 11_000),
            one.fail("w", 1, 12_000, "validation", "bad"),
            one.cancel(13_000),
            one.retry(14_000),
            ends=errors.TRANSITION_DENIED,
        ),
    ]


def _completion() -> list[Scenario]:
    w = Work(request())
    other = Work(request("two"))
    lost_then_completed = (
        w.admit(10_000),
        w.claim("a", 11_000, lease=1_000),
        w.start("a", 1, 11_000),
        w.recover(13_000),
        w.claim("b", 13_000),
        w.start("b", 2, 13_000),
        w.complete("b", 2, 14_000, output={"sent": 1}),
    )
    return [
        _s(
            "completion/the_same_report_repeated_replays_the_result_without_a_new_version",
            *lost_then_completed,
            w.complete("b", 2, 15_000, output={"sent": 1}),
            w.complete("b", 2, 99_000, output={"sent": 1}),
            ends="SUCCEEDED",
        ),
        _s(
            "completion/the_same_result_id_with_a_different_output_is_a_conflict",
            *lost_then_completed,
            w.complete("b", 2, 15_000, output={"sent": 2}),
            ends=errors.RESULT_CONFLICT,
        ),
        _s(
            "completion/a_stale_worker_naming_the_winners_result_id_learns_nothing_landed",
            *lost_then_completed,
            w.complete("a", 1, 15_000, output={"sent": 1}),
            ends=errors.RESULT_CONFLICT,
        ),
        _s(
            "completion/only_the_fence_that_produced_a_result_replays_it",
            *lost_then_completed,
            (
                CompleteCommand(
                    workload_id=w.id,
                    fence=w.fence("b", 2).model_copy(update={"worker_id": "c"}),
                    result_id="r1",
                    output={"sent": 1},
                ),
                15_000,
            ),
            ends=errors.RESULT_CONFLICT,
        ),
        _s(
            "completion/a_second_result_id_for_finished_work_is_refused_on_the_fence",
            *lost_then_completed,
            w.complete("b", 2, 15_000, result="r2"),
            ends=errors.CLAIM_INVALID,
        ),
        _s(
            "completion/a_result_id_recorded_for_another_workload_is_a_duplicate",
            *lost_then_completed,
            other.admit(20_000),
            other.claim("c", 21_000),
            other.start("c", 1, 21_000),
            other.complete("c", 1, 22_000, result="r1"),
            other.complete("c", 1, 22_000, result="r2"),
            ends="SUCCEEDED",
        ),
    ]


# -- failures, retries and backoff --------------------------------------------------------


def _failures() -> list[Scenario]:
    w = Work(request())
    no_worker_failure = Work(request(retry_policy=RetryPolicy(retry_on=("timeout",))))
    two = Work(request(retry_policy=RetryPolicy(max_attempts=2, retry_on=DEFAULT_RETRY_ON)))
    one = Work(request(retry_policy=RetryPolicy(max_attempts=1, retry_on=DEFAULT_RETRY_ON)))
    exponential = Work(
        request(
            retry_policy=RetryPolicy(
                max_attempts=6,
                initial_delay_ms=1_000,
                max_delay_ms=4_000,
                retry_on=DEFAULT_RETRY_ON,
            )
        )
    )
    fixed = Work(
        request(
            retry_policy=RetryPolicy(
                max_attempts=4, initial_delay_ms=700, backoff="fixed", retry_on=DEFAULT_RETRY_ON
            )
        )
    )
    invalid_effect = command_json(w.fail("w", 1, 13_000, "x", "y")[0])
    invalid_effect["effect"] = "maybe"
    backoff_steps: list[Step] = [exponential.admit(10_000)]
    now = 11_000
    for token, delay in enumerate((1_000, 2_000, 4_000, 4_000), start=1):
        backoff_steps += [
            exponential.claim("w", now),
            exponential.fail("w", token, now + 100, "transient_connection"),
        ]
        now += 100 + delay
    backoff_steps.append(exponential.claim("w", now - 1))
    backoff_steps.append(exponential.claim("w", now))
    return [
        _s(
            "failures/a_worker_that_could_not_start_reports_a_failure_with_no_effect",
            w.admit(10_000),
            w.claim("a", 11_000),
            w.fail("a", 1, 12_000, "transient_connection", "no route"),
            ends="READY",
        ),
        _s(
            "failures/the_identical_failure_report_repeated_replays_its_outcome_and_commits_nothing",
            w.admit(10_000),
            w.claim("a", 11_000),
            w.fail("a", 1, 12_000, "transient_connection", "no route"),
            w.fail("a", 1, 13_000, "transient_connection", "no route"),
            w.fail("a", 1, 13_000, "transient_connection", "no route", effect="none"),
            ends="READY",
        ),
        _s(
            "failures/a_different_report_from_an_attempt_that_already_failed_is_claim_invalid",
            w.admit(10_000),
            w.claim("a", 11_000),
            w.fail("a", 1, 12_000, "transient_connection", "no route"),
            w.fail("a", 1, 13_000, "transient_connection", "no route", effect="unknown"),
            w.fail("a", 1, 13_000, "timeout", "other"),
            w.complete("a", 1, 13_000),
            ends=errors.CLAIM_INVALID,
        ),
        _s(
            "failures/another_workers_claim_fences_the_failed_attempt_out",
            w.admit(10_000),
            w.claim("a", 11_000),
            w.fail("a", 1, 12_000, "transient_connection", "no route"),
            w.claim("b", 14_000),
            w.fail("a", 1, 15_000, "timeout", "late"),
            ends=errors.STALE_FENCE,
        ),
        _s(
            "failures/a_failure_kind_the_policy_does_not_retry_dead_letters",
            w.admit(10_000),
            w.claim("a", 11_000),
            w.start("a", 1, 12_000),
            w.fail("a", 1, 13_000, "validation", "bad input", effect="none"),
            ends="DEAD_LETTER",
        ),
        _s(
            "failures/an_unknown_effect_is_not_retried_when_the_policy_does_not_retry_worker_failure",
            no_worker_failure.admit(10_000),
            no_worker_failure.claim("a", 11_000),
            no_worker_failure.start("a", 1, 12_000),
            no_worker_failure.fail("a", 1, 13_000, "timeout", "charge sent", effect="unknown"),
            ends="DEAD_LETTER",
        ),
        _s(
            "failures/an_unknown_effect_is_retried_whatever_the_kind_when_worker_failure_is_retried",
            w.admit(10_000),
            w.claim("a", 11_000),
            w.start("a", 1, 12_000),
            w.checkpoint("a", 1, 12_500),
            w.fail("a", 1, 13_000, "validation", "x", effect="unknown"),
            ends="READY",
        ),
        _s(
            "failures/a_started_attempt_reporting_no_effect_is_decided_by_kind",
            w.admit(10_000),
            w.claim("a", 11_000),
            w.start("a", 1, 12_000),
            w.fail("a", 1, 13_000, "timeout", "slow"),
            ends="READY",
        ),
        _s(
            "failures/the_attempt_budget_bounds_failure_retries",
            two.admit(10_000),
            two.claim("a", 11_000),
            two.fail("a", 1, 12_000, "timeout"),
            two.claim("a", 12_999),
            two.claim("a", 13_000),
            two.fail("a", 2, 13_000, "timeout"),
            two.claim("b", 20_000),
            ends=errors.NOT_READY,
        ),
        _s(
            "failures/a_single_attempt_policy_dead_letters_a_retryable_failure",
            one.admit(10_000),
            one.claim("a", 11_000),
            one.start("a", 1, 12_000),
            one.fail("a", 1, 13_000, "worker_failure", "crashed"),
            ends="DEAD_LETTER",
        ),
        _s(
            "failures/an_effect_other_than_none_or_unknown_is_invalid_and_changes_nothing",
            w.admit(10_000),
            w.claim("w", 11_000),
            w.start("w", 1, 12_000),
            (invalid_effect, 13_000),
            ends=errors.INVALID,
        ),
        _s(
            "failures/exponential_backoff_doubles_each_delay_exactly_and_is_capped",
            *backoff_steps,
            ends="CLAIMED",
        ),
        _s(
            "failures/fixed_backoff_waits_the_initial_delay_every_time",
            fixed.admit(10_000),
            fixed.claim("w", 11_000),
            fixed.fail("w", 1, 11_000, "timeout"),
            fixed.claim("w", 11_699),
            fixed.claim("w", 11_700),
            fixed.fail("w", 2, 11_700, "timeout"),
            fixed.claim("w", 12_400),
            ends="CLAIMED",
        ),
    ]


# -- recovery ------------------------------------------------------------------------------


def _recovery() -> list[Scenario]:
    w = Work(request())
    no_worker_failure = Work(request(retry_policy=RetryPolicy(retry_on=("timeout",))))
    exhausted = admitted(request(), 10_000, attempt_count=7)
    budget: list[Step] = [w.admit(10_000)]
    for token in (1, 2, 3):
        budget += [w.claim("worker-a", 100_000 * token), w.recover(100_000 * token + LEASE)]
    budget.append(w.claim("worker-b", 1_000_000))
    return [
        _s(
            "recovery/lease_recovery_records_the_lost_worker_and_is_bounded_by_the_budget",
            *budget,
            ends=errors.NOT_READY,
        ),
        _s(
            "recovery/a_lease_is_not_recovered_a_millisecond_before_it_expires",
            w.admit(10_000),
            w.claim("a", 11_000, lease=1_500),
            w.recover(12_499),
            w.recover(12_500),
            w.claim("b", 12_500),
            ends="CLAIMED",
        ),
        _s(
            "recovery/a_lost_checkpointed_attempt_is_recovered",
            w.admit(10_000),
            w.claim("a", 11_000, lease=1_000),
            w.start("a", 1, 11_100),
            w.checkpoint("a", 1, 11_200),
            w.recover(12_000),
            ends="READY",
        ),
        _s(
            "recovery/a_policy_that_does_not_retry_worker_failure_dead_letters_a_lost_attempt",
            no_worker_failure.admit(10_000),
            no_worker_failure.claim("worker-a", 11_000),
            no_worker_failure.recover(21_000),
            ends="DEAD_LETTER",
        ),
        _s(
            "recovery/recovering_a_workload_whose_cancellation_was_requested_cancels_it",
            w.admit(10_000),
            w.claim("a", 11_000, lease=1_000),
            w.start("a", 1, 11_500),
            w.cancel(11_600, actor="user"),
            w.recover(12_000),
            w.recover(20_000),
            ends="CANCELLED",
        ),
        _s(
            "recovery/claiming_exhausted_ready_work_dead_letters_it_instead",
            w.claim("worker-a", 11_000),
            w.claim("worker-b", 12_000),
            store=(exhausted,),
            ends=errors.NOT_READY,
        ),
        _s(
            "recovery/a_worker_dying_after_a_claim_returns_the_work_and_it_executes_once",
            w.admit(10_000),
            w.claim("worker-a", 10_000, lease=1_000),
            w.start("worker-a", 1, 10_000),
            w.recover(12_000),
            w.claim("worker-b", 12_000),
            w.start("worker-b", 2, 13_000),
            w.complete("worker-b", 2, 14_000, result="result-recovered", output={"ok": True}),
            w.complete("worker-a", 1, 15_000, result="resurrected"),
            ends=errors.CLAIM_INVALID,
        ),
    ]


# -- operator re-arms and timeouts -----------------------------------------------------


def _lose_leases(work: Work, count: int, now: int) -> tuple[list[Step], int]:
    """`count` claims by worker-a from `now` on, each lost when its lease ends; the last instant."""
    steps: list[Step] = []
    for _ in range(count):
        now += 100
        steps += [work.claim("worker-a", now), work.recover(now + LEASE)]
        now += LEASE
    return steps, now


def _operator() -> list[Scenario]:
    w = Work(request())
    one = Work(request(retry_policy=RetryPolicy(max_attempts=1, retry_on=DEFAULT_RETRY_ON)))
    no_timeouts = Work(request(retry_policy=RetryPolicy(retry_on=("worker_failure",))))
    unknown = Work(request(retry_policy=RetryPolicy(retry_on=("timeout",))))
    three_lost, t3 = _lose_leases(w, 3, 10_000)
    fourth_lost, t4 = _lose_leases(w, 1, t3 + 100)
    one_lost, t1 = _lose_leases(one, 1, 10_000)
    again_lost, t2 = _lose_leases(one, 1, t1 + 100)
    return [
        _s(
            "operator/each_operator_retry_grants_exactly_one_attempt_and_is_recorded",
            w.admit(10_000),
            *three_lost,
            w.retry(t3 + 100, "dependency restored"),
            *fourth_lost,
            w.claim("worker-a", t4 + 100),
            ends=errors.NOT_READY,
        ),
        _s(
            "operator/operator_retries_are_bounded_by_max_attempts",
            one.admit(10_000),
            *one_lost,
            one.retry(t1 + 100),
            *again_lost,
            one.retry(t2 + 100),
            ends=errors.RETRY_EXHAUSTED,
        ),
        _s(
            "operator/an_operator_retry_reason_is_capped_at_256_characters",
            one.admit(10_000),
            *one_lost,
            one.retry(t1 + 100, "\u00e9" * 200 + "x" * 100),
            ends="READY",
        ),
        _s(
            "operator/an_operator_retry_without_a_reason_records_none",
            one.admit(10_000),
            *one_lost,
            one.retry(t1 + 100, "   "),
            ends="READY",
        ),
        _s(
            "operator/an_operator_retry_reason_carrying_a_secret_is_refused",
            one.admit(10_000),
            *one_lost,
            one.retry(t1 + 100, "sk-live-key"),
            ends=errors.SECRET_REJECTED,
        ),
        _s(
            "operator/an_operator_can_rearm_a_dead_letter_whose_effect_was_unknown",
            unknown.admit(10_000),
            unknown.claim("a", 11_000),
            unknown.start("a", 1, 12_000),
            unknown.fail("a", 1, 13_000, "timeout", "charge sent, no answer", effect="unknown"),
            unknown.retry(14_000, "verified: not charged"),
            unknown.claim("b", 14_000),
            ends="CLAIMED",
        ),
        _s(
            "operator/an_operator_retry_of_work_that_has_not_stopped_is_denied",
            w.admit(10_000),
            w.retry(11_000),
            w.claim("a", 11_000),
            w.start("a", 1, 12_000),
            w.retry(13_000),
            ends=errors.TRANSITION_DENIED,
        ),
        _s(
            "operator/an_operator_timeout_of_ready_work_leaves_the_last_attempts_outcome",
            w.admit(10_000),
            w.claim("a", 11_000),
            w.fail("a", 1, 12_000, "transient_connection", "no route"),
            w.timeout(15_000),
            w.claim("b", 15_999),
            w.claim("b", 16_000),
            ends="CLAIMED",
        ),
        _s(
            "operator/an_operator_timeout_of_running_work_times_the_attempt_out_and_ends_its_claim",
            w.admit(10_000),
            w.claim("a", 11_000),
            w.start("a", 1, 12_000),
            w.timeout(13_000),
            w.complete("a", 1, 13_500, result="late"),
            ends=errors.CLAIM_INVALID,
        ),
        _s(
            "operator/an_operator_timeout_of_checkpointed_work_is_retried",
            w.admit(10_000),
            w.claim("a", 11_000),
            w.start("a", 1, 12_000),
            w.checkpoint("a", 1, 12_500),
            w.timeout(13_000),
            ends="READY",
        ),
        _s(
            "operator/an_operator_timeout_dead_letters_when_the_policy_does_not_retry_timeouts",
            no_timeouts.admit(10_000),
            no_timeouts.claim("a", 11_000),
            no_timeouts.start("a", 1, 12_000),
            no_timeouts.timeout(13_000),
            ends="DEAD_LETTER",
        ),
        _s(
            "operator/an_operator_timeout_dead_letters_when_the_attempt_budget_is_spent",
            one.admit(10_000),
            one.claim("a", 11_000),
            one.timeout(12_000),
            ends="DEAD_LETTER",
        ),
        _s(
            "operator/an_operator_timeout_of_work_that_cannot_time_out_is_denied",
            w.admit(10_000),
            w.claim("a", 11_000),
            w.start("a", 1, 12_000),
            w.cancel(13_000, actor="user"),
            w.timeout(14_000),
            ends=errors.TRANSITION_DENIED,
        ),
    ]


# -- deadlines --------------------------------------------------------------------------------


def _deadlines() -> list[Scenario]:
    def timed(key: str, retry: RetryPolicy | None = None, **timeouts: int) -> Work:
        changes: dict[str, Any] = {"timeouts": Timeouts(**timeouts)}
        if retry is not None:
            changes["retry_policy"] = retry
        return Work(request(key, **changes))

    execution = timed("execution", execution_ms=5_000)
    heartbeat = timed("heartbeat", heartbeat_ms=3_000)
    claim_only = timed("claim", RetryPolicy(retry_on=("worker_failure",)), claim_ms=2_000)
    claim = timed("claim-retried", claim_ms=2_000)
    queue = timed("queue", queue_ms=4_000)
    overall = timed("overall", overall_ms=10_000)
    one = timed("one", RetryPolicy(max_attempts=1, retry_on=DEFAULT_RETRY_ON), execution_ms=5_000)
    legacy_request = request("legacy", timeouts=Timeouts(execution_ms=1_000, overall_ms=2_000))
    legacy = Work(legacy_request)
    return [
        _s(
            "deadlines/the_execution_deadline_times_a_late_completion_out_once",
            execution.admit(10_000),
            execution.claim("a", 11_000),
            execution.start("a", 1, 12_000),
            execution.heartbeat("a", 1, 16_000),
            execution.enforce(16_999),
            execution.complete("a", 1, 17_000, result="late"),
            execution.enforce(30_000),
            execution.complete("a", 1, 30_000, result="late"),
            ends=errors.CLAIM_INVALID,
        ),
        _s(
            "deadlines/a_completion_a_millisecond_before_the_execution_deadline_lands",
            execution.admit(10_000),
            execution.claim("a", 11_000),
            execution.start("a", 1, 12_000),
            execution.complete("a", 1, 16_999),
            execution.enforce(100_000),
            ends="SUCCEEDED",
        ),
        _s(
            "deadlines/the_execution_deadline_dead_letters_when_the_budget_is_spent",
            one.admit(10_000),
            one.claim("a", 11_000),
            one.start("a", 1, 12_000),
            one.checkpoint("a", 1, 17_000),
            ends=errors.TIMED_OUT,
        ),
        _s(
            "deadlines/the_heartbeat_deadline_runs_from_the_last_heartbeat",
            heartbeat.admit(10_000),
            heartbeat.claim("a", 11_000),
            heartbeat.start("a", 1, 12_000),
            heartbeat.heartbeat("a", 1, 13_000),
            heartbeat.enforce(15_999),
            heartbeat.enforce(16_000),
            heartbeat.heartbeat("a", 1, 16_000),
            ends=errors.CLAIM_INVALID,
        ),
        _s(
            "deadlines/without_a_heartbeat_the_heartbeat_deadline_runs_from_the_claim",
            heartbeat.admit(10_000),
            heartbeat.claim("a", 11_000),
            heartbeat.enforce(13_999),
            heartbeat.enforce(14_000),
            ends="READY",
        ),
        _s(
            "deadlines/a_heartbeat_deadline_of_checkpointed_work_is_enforced_by_the_sweep",
            heartbeat.admit(10_000),
            heartbeat.claim("a", 11_000),
            heartbeat.start("a", 1, 12_000),
            heartbeat.checkpoint("a", 1, 13_000),
            heartbeat.enforce(14_000),
            ends="READY",
        ),
        _s(
            "deadlines/the_claim_deadline_times_out_work_claimed_but_never_started",
            claim_only.admit(10_000),
            claim_only.claim("a", 11_000),
            claim_only.start("a", 1, 13_000),
            ends=errors.TIMED_OUT,
        ),
        _s(
            "deadlines/a_start_a_millisecond_before_the_claim_deadline_passes",
            claim.admit(10_000),
            claim.claim("a", 11_000),
            claim.start("a", 1, 12_999),
            claim.enforce(20_000),
            claim.heartbeat("a", 1, 20_000),
            ends="RUNNING",
        ),
        _s(
            "deadlines/a_claim_deadline_found_by_the_sweep_is_retried",
            claim.admit(10_000),
            claim.claim("a", 11_000),
            claim.enforce(12_999),
            claim.enforce(13_000),
            claim.claim("b", 13_999),
            claim.claim("b", 14_000),
            ends="CLAIMED",
        ),
        _s(
            "deadlines/a_claim_a_millisecond_before_the_queue_deadline_passes",
            queue.admit(10_000),
            queue.claim("a", 13_999),
            ends="CLAIMED",
        ),
        _s(
            "deadlines/the_queue_deadline_dead_letters_unclaimed_work_and_no_attempt_is_made",
            queue.admit(10_000),
            queue.claim("a", 14_000),
            ends=errors.TIMED_OUT,
        ),
        _s(
            "deadlines/the_queue_deadline_runs_from_eligibility_and_leaves_the_last_attempt_alone",
            queue.admit(10_000),
            queue.claim("a", 11_000),
            queue.fail("a", 1, 12_000, "transient_connection", "no route"),
            queue.enforce(16_999),
            queue.enforce(17_000),
            ends="DEAD_LETTER",
        ),
        _s(
            "deadlines/the_overall_deadline_bounds_the_work",
            overall.admit(10_000),
            overall.claim("a", 11_000),
            overall.start("a", 1, 12_000),
            overall.enforce(19_999),
            overall.enforce(20_000),
            ends="DEAD_LETTER",
        ),
        _s(
            "deadlines/a_failure_at_the_overall_deadline_instant_is_timed_out",
            overall.admit(10_000),
            overall.claim("a", 11_000),
            overall.start("a", 1, 12_000),
            overall.fail("a", 1, 20_000, "timeout"),
            ends=errors.TIMED_OUT,
        ),
        _s(
            "deadlines/a_workload_admitted_before_deadlines_is_never_timed_out",
            legacy.claim("a", 11_000, lease=60_000),
            legacy.start("a", 1, 11_500),
            legacy.enforce(1_000_000),
            legacy.heartbeat("a", 1, 50_000, extend=60_000),
            legacy.checkpoint("a", 1, 60_000),
            legacy.complete("a", 1, 70_000),
            store=(admitted(legacy_request, 10_000, contract_version=1),),
            ends="SUCCEEDED",
        ),
        _s(
            "deadlines/a_workload_admitted_under_the_deadline_contract_is_timed_out",
            legacy.admit(10_000),
            legacy.claim("a", 11_000, lease=60_000),
            legacy.start("a", 1, 11_500),
            legacy.heartbeat("a", 1, 50_000, extend=60_000),
            ends=errors.TIMED_OUT,
        ),
    ]


# -- the scheduler ------------------------------------------------------------------------------


def _scheduler() -> list[Scenario]:
    low = Work(request("low"))
    high = Work(request("high", priority=5))
    later = Work(request("later"))
    scheduled = Work(request("scheduled", not_before=50_000))
    needs_sms = Work(request("sms", priority=9, capability_snapshot=("email:send", "sms:send")))
    parent = Work(request("parent"))
    child = Work(request("child", priority=9, dependencies=(Dependency(workload_id=parent.id),)))
    cancelled_parent = Work(request("cancelled-parent"))
    after_cancel = Work(
        request(
            "after-cancel",
            dependencies=(Dependency(workload_id=cancelled_parent.id, required_state="CANCELLED"),),
        )
    )
    after_success = Work(
        request("after-success", dependencies=(Dependency(workload_id=cancelled_parent.id),))
    )
    orphan = Work(request("orphan", dependencies=(Dependency(workload_id="no-such-workload"),)))
    foreign = Work(request("foreign", tenant_id="other"))
    foreign_child = Work(request("child", dependencies=(Dependency(workload_id=foreign.id),)))
    theirs = Work(request("theirs", tenant_id="other", priority=9))
    billing = Work(request("billing", application_id="billing", priority=9))
    ours = Work(request("ours"))
    exhausted = request("exhausted", priority=9)
    plain = Work(request("plain"))
    queued = Work(request("queued", priority=9, timeouts=Timeouts(queue_ms=500)))
    # Equal priority, admitted at the same instant: ids 0616..., 33d8..., 34be..., 910e...
    ties = [Work(request(f"tie-{key}")) for key in "cadb"]
    return [
        _s(
            "scheduler/the_highest_priority_is_claimed_first_then_the_oldest",
            low.admit(10_000),
            later.admit(10_001),
            high.admit(10_002),
            claim_next("w1", 11_000),
            claim_next("w2", 11_000),
            claim_next("w3", 11_000),
            claim_next("w4", 11_000),
            ends=None,
        ),
        _s(
            "scheduler/equal_priority_and_age_are_claimed_smallest_workload_id_first",
            *(tie.admit(10_000) for tie in ties),
            claim_next("w1", 11_000),
            claim_next("w2", 11_000),
            claim_next("w3", 11_000),
            claim_next("w4", 11_000),
            ends="CLAIMED",
        ),
        _s(
            "scheduler/the_scheduler_skips_work_that_is_not_yet_eligible",
            scheduled.admit(10_000),
            low.admit(10_001),
            claim_next("w1", 11_000),
            claim_next("w2", 11_000),
            claim_next("w3", 50_000),
            ends="CLAIMED",
        ),
        _s(
            "scheduler/the_scheduler_skips_work_needing_a_capability_the_worker_lacks",
            needs_sms.admit(10_000),
            plain.admit(10_000),
            claim_next("w1", 11_000),
            claim_next("w2", 11_000),
            claim_next("w3", 11_000, caps=("email:send", "sms:send")),
            ends="CLAIMED",
        ),
        _s(
            "scheduler/the_scheduler_waits_for_dependencies_and_claims_the_child_once_met",
            parent.admit(10_000),
            child.admit(10_000),
            claim_next("w1", 11_000),
            claim_next("w2", 11_000),
            parent.start("w1", 1, 11_500),
            claim_next("w2", 11_600),
            parent.complete("w1", 1, 12_000, result="parent-result"),
            claim_next("w2", 12_000),
            ends="CLAIMED",
        ),
        _s(
            "scheduler/a_dependency_names_the_state_it_waits_for",
            cancelled_parent.admit(10_000),
            after_cancel.admit(10_000),
            after_success.admit(10_000),
            cancelled_parent.cancel(10_500, actor="user"),
            claim_next("w1", 12_000),
            claim_next("w2", 12_000),
        ),
        _s(
            "scheduler/a_dependency_on_a_missing_workload_is_never_met",
            orphan.admit(10_000),
            claim_next("w1", 11_000),
        ),
        _s(
            "scheduler/a_dependency_on_another_tenants_workload_never_counts_as_met",
            foreign.admit(10_000),
            foreign.claim("w", 11_000),
            foreign.start("w", 1, 11_000),
            foreign.complete("w", 1, 11_000, result="foreign-result"),
            foreign_child.admit(12_000),
            claim_next("w1", 12_000),
        ),
        _s(
            "scheduler/the_scheduler_never_returns_another_tenants_or_applications_work",
            theirs.admit(10_000),
            billing.admit(10_000),
            ours.admit(10_000),
            claim_next("w1", 11_000),
            claim_next("w2", 11_000),
            claim_next("w3", 11_000, tenant="other"),
            claim_next("w4", 11_000, application="billing"),
            claim_next("w5", 11_000, tenant="nobody"),
        ),
        _s(
            "scheduler/an_exhausted_candidate_is_dead_lettered_and_skipped_without_an_error",
            plain.admit(10_000),
            claim_next("w1", 11_000),
            store=(admitted(exhausted, 9_000, attempt_count=3),),
            ends="CLAIMED",
        ),
        _s(
            "scheduler/a_candidate_whose_deadline_passed_is_timed_out_and_skipped",
            queued.admit(10_000),
            plain.admit(10_000),
            claim_next("w1", 11_000),
            ends="CLAIMED",
        ),
    ]


# -- replays: a call repeated after its reply was lost -------------------------------------


def _replays() -> list[Scenario]:
    w = Work(request())
    other = Work(request("two"))
    one = Work(request(retry_policy=RetryPolicy(max_attempts=1, retry_on=DEFAULT_RETRY_ON)))
    return [
        _s(
            "replays/a_repeated_claim_request_answers_its_claim_until_the_attempt_starts",
            w.admit(10_000),
            w.claim("a", 11_000, request_id="claim-1"),
            w.claim("a", 11_500, request_id="claim-1"),
            w.claim("a", 11_600, request_id="claim-2"),
            w.start("a", 1, 12_000),
            w.claim("a", 12_500, request_id="claim-1"),
            ends=errors.NOT_READY,
        ),
        _s(
            "replays/a_repeated_claim_next_request_answers_its_claim_until_the_attempt_starts",
            w.admit(10_000),
            claim_next("a", 11_000, request_id="next-1"),
            claim_next("a", 11_500, request_id="next-1"),
            w.start("a", 1, 12_000),
            claim_next("a", 12_500, request_id="next-1"),
            ends=errors.NOT_READY,
        ),
        _s(
            "replays/a_repeated_cancel_request_answers_what_it_did",
            w.admit(10_000),
            w.claim("a", 11_000),
            w.start("a", 1, 12_000),
            w.cancel(12_500, request_id="op-1"),
            w.cancel(12_600, request_id="op-1"),
            w.confirm_cancel("a", 1, 13_000),
            w.cancel(13_500, request_id="op-1"),
            w.cancel(13_600, actor="operator-2", request_id="op-1"),
            ends=errors.CONFLICT,
        ),
        _s(
            "replays/repeated_timeout_and_retry_requests_answer_what_they_did",
            one.admit(10_000),
            one.claim("a", 11_000),
            one.start("a", 1, 12_000),
            one.timeout(12_500, request_id="op-1"),
            one.timeout(12_600, request_id="op-1"),
            one.retry(13_000, request_id="op-1"),
            one.retry(13_100, request_id="op-2"),
            one.retry(13_200, request_id="op-2"),
            one.claim("b", 14_000),
            ends="CLAIMED",
        ),
        _s(
            "replays/a_request_id_used_for_another_workload_is_a_conflict",
            w.admit(10_000),
            other.admit(10_000),
            w.cancel(11_000, request_id="op-1"),
            other.cancel(11_500, request_id="op-1"),
            ends=errors.CONFLICT,
        ),
        _s(
            "replays/a_repeated_claim_by_the_holding_worker_answers_its_claim",
            w.admit(10_000),
            w.claim("a", 11_000),
            w.claim("a", 11_500),
            w.claim("b", 11_600),
            ends=errors.NOT_READY,
        ),
        _s(
            "replays/a_repeated_start_answers_the_started_attempt",
            w.admit(10_000),
            w.claim("a", 11_000),
            w.start("a", 1, 12_000),
            w.start("a", 1, 12_500),
            ends="RUNNING",
        ),
        _s(
            "replays/a_repeated_checkpoint_with_its_sequence_records_one",
            w.admit(10_000),
            w.claim("a", 11_000),
            w.start("a", 1, 12_000),
            w.checkpoint("a", 1, 13_000, {"step": 1}, sequence=1),
            w.checkpoint("a", 1, 13_500, {"step": 1}, sequence=1),
            w.checkpoint("a", 1, 13_600, {"step": 2}, sequence=1),
            w.checkpoint("a", 1, 13_700, {"step": 2}, sequence=3),
            w.checkpoint("a", 1, 14_000, {"step": 2}, sequence=2),
            ends="CHECKPOINTED",
        ),
        _s(
            "replays/a_repeated_failure_report_answers_the_decision",
            w.admit(10_000),
            w.claim("a", 11_000),
            w.start("a", 1, 12_000),
            w.fail("a", 1, 13_000, "timeout", "slow"),
            w.fail("a", 1, 13_500, "timeout", "slow"),
            ends="READY",
        ),
        _s(
            "replays/a_repeated_cancel_confirmation_answers_cancelled",
            w.admit(10_000),
            w.claim("a", 11_000),
            w.start("a", 1, 12_000),
            w.cancel(12_500),
            w.confirm_cancel("a", 1, 13_000),
            w.confirm_cancel("a", 1, 13_500),
            ends="CANCELLED",
        ),
    ]


@cache
def _all() -> tuple[Scenario, ...]:
    scenarios = (
        *_admission(),
        *_lifecycle(),
        *_fencing(),
        *_eligibility(),
        *_cancellation(),
        *_completion(),
        *_failures(),
        *_recovery(),
        *_operator(),
        *_deadlines(),
        *_scheduler(),
        *_replays(),
    )
    return tuple(
        replace(
            s,
            about=f"seed behaviour; the suite pins it down in tests/test_{s.name.split('/')[0]}.py",
        )
        for s in scenarios
    )


def seed_scenarios() -> list[Scenario]:
    """Every seed scenario, grouped by behaviour (`group/behaviour` names), in a fixed order."""
    return list(_all())
