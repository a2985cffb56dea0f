"""What each effect of the registry does: the code behind the names `effects.py` declares.

The generic step of the core (`core.py`) has found the workload, checked the
deadlines and the fence the operation's row asks for, and consulted its gate
policy; the effect checks what only it knows (eligibility, a lease that has
not expired, the operator re-arm bound), edits the draft, takes the
operation's edge or lets its policy pick one, and builds the reply. An
effect names no state: the edge an operation takes out of a state is found
in the table (`Step.move`), and the states it must recognise are asked of
the spec's roles (`Spec.roles`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from workwarden.statemachine import errors
from workwarden.statemachine.commands import (
    OPERATOR_COMMANDS,
    CancelCommand,
    CheckpointCommand,
    ClaimCommand,
    Command,
    CompleteCommand,
    ConfirmCancelCommand,
    ExecutionContextCommand,
    FailCommand,
    HeartbeatCommand,
    OperatorCommand,
    RetryCommand,
    StartCommand,
    StateReply,
    SweepReply,
    TimeoutCommand,
)
from workwarden.statemachine.deadlines import deadline_breach
from workwarden.statemachine.draft import Draft
from workwarden.statemachine.effects import EFFECTS
from workwarden.statemachine.ids import (
    attempt_id_for,
    checkpoint_id_for,
    claim_id_for,
    lease_id_for,
)
from workwarden.statemachine.models import (
    MAX_INSTANT,
    Attempt,
    Checkpoint,
    Claim,
    ClaimReply,
    Event,
    ExecutionContext,
    Result,
    Workload,
    shallow_copy,
    trusted,
)
from workwarden.statemachine.policies import apply_policy
from workwarden.statemachine.predicates import Facts, attempt_budget, operator_retries
from workwarden.statemachine.safety import check_text
from workwarden.statemachine.spec import CompiledOperation, Spec

__all__ = [
    "REQUEST_ID",
    "REQUEST_OPERATION",
    "STEPS",
    "Decision",
    "Effect",
    "Step",
    "claim_reply",
    "expire",
    "json_copy",
]

REQUEST_ID = "request_id"
"""The evidence key that records the caller's request id on each event its call took."""

REQUEST_OPERATION = "request_operation"
"""The evidence key that records, beside an operator request id, the operation it called."""


def claim_reply(workload: Workload, claim: Claim, request_id: str | None) -> ClaimReply:
    """The reply to a claim: `claim`, with the attempt it opened, the input and the checkpoints.

    The input and checkpoints are copies: nothing the caller receives shares
    a part of `workload`.
    """
    return trusted(
        ClaimReply,
        **claim.__dict__,
        attempt_id=workload.attempts[-1].attempt_id,
        input=json_copy(workload.input),
        checkpoints=tuple(
            shallow_copy(checkpoint, state=json_copy(checkpoint.state))
            for checkpoint in workload.checkpoints
        ),
        request_id=request_id,
    )


_ATOMS = (str, int, float, bool, type(None))


def json_copy(value: Any) -> Any:
    """A copy of a JSON value (dicts and lists of text, numbers, booleans, None) sharing nothing.

    What `copy.deepcopy` makes of it, without its bookkeeping; anything else
    inside is deep-copied as `copy.deepcopy` would.
    """
    kind = type(value)
    if kind is dict:
        return {key: json_copy(item) for key, item in value.items()}
    if kind is list:
        return [json_copy(item) for item in value]
    if kind in _ATOMS:
        return value
    return copy.deepcopy(value)


@dataclass(frozen=True)
class Decision:
    """What the core decided: the workload to write (or None), the reply, a recorded refusal."""

    operation: str
    workload: Workload | None
    reply: Any
    refusal: errors.WorkloadError | None = None
    events: tuple[Event, ...] = field(default_factory=tuple)
    actor: str = "system"
    worker_id: str | None = None


@dataclass
class Step:
    """One operation being decided: the spec, its row, the committed workload, the command."""

    spec: Spec
    operation: CompiledOperation
    workload: Workload
    command: Command
    now: int
    reported_hash: str = ""
    _draft: Draft | None = None

    @property
    def draft(self) -> Draft:
        """The draft this step edits (a copy of the committed workload, made on first use)."""
        if self._draft is None:
            self._draft = Draft(self.spec, self.workload, self.now, self.operation.name)
        return self._draft

    @property
    def acting_as(self) -> str:
        """The actor a system operation records (its `acting_as`, else its class)."""
        return self.operation.spec.acting_as or self.operation.actor

    def denied(self) -> errors.WorkloadError:
        """The refusal for an operation the workload's state has no edge for."""
        return errors.WorkloadError(
            self.operation.spec.denied,
            f"a {self.workload.state} workload cannot be taken by {self.operation.name}",
            {"state": self.workload.state},
        )

    def require_edge(self) -> None:
        """Refuse (the operation's `denied` code) unless the state has an edge for it."""
        if not self.spec.available(self.workload.state, self.operation.name):
            raise self.denied()

    @property
    def attempt_status(self) -> str:
        """The status the operation sets on an attempt (declared, as its effect needs)."""
        status = self.operation.spec.attempt_status
        assert status is not None, "checked at load: the effect marks an attempt"
        return status

    def mark_attempt(self, attempt: Attempt) -> None:
        """Set the operation's `attempt_status` on `attempt`."""
        attempt.status = self.attempt_status

    def move(self, actor: str, evidence: Mapping[str, str] | None = None) -> None:
        """Take the operation's own edge out of the draft's state, as the operation's actor."""
        edge = self.spec.own_edge(self.draft.workload.state, self.operation.name)
        if edge is None:
            raise self.denied()
        self.draft.move(edge.to, actor=actor, actor_class=self.operation.actor, evidence=evidence)

    def decide_by_policy(
        self,
        facts: Facts,
        *,
        via_actor: str,
        via_evidence: Mapping[str, str] | None = None,
    ) -> None:
        """Let the operation's policy move the draft on (through its `via` state)."""
        policy = self.operation.policy
        assert policy is not None, "checked at load: the effect needs a policy"
        apply_policy(
            self.draft,
            policy.name,
            facts,
            actor=policy.spec.actor,
            via_actor=via_actor,
            via_actor_class=self.operation.actor,
            via_evidence=via_evidence,
        )

    def facts(self, **reported: Any) -> Facts:
        """The facts a policy decides on: the draft's workload and what the call reports."""
        return Facts(workload=self.draft.workload, roles=self.spec.roles, **reported)

    def commit(self, reply: Any, actor: str, worker_id: str | None = None) -> Decision:
        """The decision to write the draft and answer `reply`.

        A claim or an operator call that gives a request id has it recorded
        on every event it took (`REQUEST_ID`; an operator's with the
        operation, `REQUEST_OPERATION`), so that its replay rule recognises
        a repeat from the document alone.
        """
        draft = self.draft
        cmd = self.command
        if isinstance(cmd, (ClaimCommand, *OPERATOR_COMMANDS)) and cmd.request_id is not None:
            for event in draft.events:
                event.evidence[REQUEST_ID] = cmd.request_id
                if not isinstance(cmd, ClaimCommand):
                    event.evidence[REQUEST_OPERATION] = self.operation.name
        return Decision(
            operation=draft.operation,
            workload=draft.workload,
            reply=reply,
            events=tuple(draft.events),
            actor=actor,
            worker_id=worker_id,
        )

    def answer(self, reply: Any, actor: str = "system", worker_id: str | None = None) -> Decision:
        """The decision to write nothing and answer `reply`."""
        return Decision(
            operation=self.operation.name,
            workload=None,
            reply=reply,
            actor=actor,
            worker_id=worker_id,
        )

    def state_reply(self) -> StateReply:
        """The workload's id and the state the step left it in."""
        state = self._draft.workload.state if self._draft is not None else self.workload.state
        return StateReply(workload_id=self.workload.workload_id, state=state)


def _within_time(now: int, duration: int, field: str) -> int:
    """`now + duration`, or `WORKLOAD_INVALID` when it passes the largest instant.

    An end past `MAX_INSTANT` could not be written exactly as a JSON number, and
    no sweep could ever reach it: its work would be stuck if its worker died.
    """
    end = now + duration
    if end > MAX_INSTANT:
        raise errors.bad_argument(
            field, f"{field} ends the lease after the largest instant ({MAX_INSTANT})"
        )
    return end


def _lease(step: Step) -> Decision:
    cmd = step.command
    assert isinstance(cmd, ClaimCommand)
    w, now = step.workload, step.now
    expires_at = _within_time(now, cmd.lease_ms, "lease_ms")
    step.require_edge()
    if not w.is_eligible_at(now):
        raise errors.WorkloadError(
            errors.NOT_YET_ELIGIBLE,
            f"workload is not claimable until {w.next_attempt_at}",
            {"eligible_at": w.next_attempt_at},
        )
    missing = sorted(set(w.capability_snapshot) - set(cmd.capabilities))
    if missing:
        raise errors.WorkloadError(
            errors.CAPABILITY_DENIED,
            "worker lacks required capability snapshot",
            {"missing": missing},
        )
    d = step.draft.workload
    d.fencing_token += 1
    d.attempt_count += 1
    # Built of the command's validated fields and the workload's own values.
    claim = trusted(
        Claim,
        claim_id=claim_id_for(d.workload_id, d.fencing_token, cmd.worker_id),
        workload_id=d.workload_id,
        worker_id=cmd.worker_id,
        lease_id=lease_id_for(d.fencing_token),
        fencing_token=d.fencing_token,
        capability_snapshot=d.capability_snapshot,
        claimed_at=now,
        expires_at=expires_at,
        last_heartbeat=now,
    )
    attempt = trusted(
        Attempt,
        attempt_id=attempt_id_for(d.workload_id, d.attempt_count),
        workload_id=d.workload_id,
        worker_id=cmd.worker_id,
        claim_id=claim.claim_id,
        fencing_token=claim.fencing_token,
        input_hash=d.input_hash,
        status=step.attempt_status,
    )
    d.attempts.append(attempt)
    d.current_claim = claim
    step.move(cmd.worker_id, {"fencing_token": str(claim.fencing_token)})
    return step.commit(claim_reply(d, claim, cmd.request_id), cmd.worker_id, cmd.worker_id)


def _start_attempt(step: Step) -> Decision:
    cmd = step.command
    assert isinstance(cmd, StartCommand)
    attempt = step.draft.workload.attempts[-1]
    step.mark_attempt(attempt)
    attempt.started_at = step.now
    step.move(cmd.fence.worker_id)
    return step.commit(shallow_copy(attempt), cmd.fence.worker_id, cmd.fence.worker_id)


def _extend_lease(step: Step) -> Decision:
    cmd = step.command
    assert isinstance(cmd, HeartbeatCommand)
    expires_at = _within_time(step.now, cmd.extend_ms, "extend_ms")
    d = step.draft.workload
    claim = d.current_claim
    assert claim is not None  # the fence checked it
    claim.last_heartbeat = step.now
    claim.expires_at = expires_at
    d.updated_at = step.now
    return step.commit(shallow_copy(claim), cmd.fence.worker_id, cmd.fence.worker_id)


def _read_context(step: Step) -> Decision:
    cmd = step.command
    assert isinstance(cmd, ExecutionContextCommand)
    w = step.workload
    claim = w.current_claim
    assert claim is not None  # the fence checked it
    prefix = step.spec.secrets.reference_prefix
    bad = [
        ref
        for ref in cmd.secret_references
        if not ref.startswith(prefix) or len(ref) <= len(prefix)
    ]
    if bad:
        raise errors.WorkloadError(
            errors.SECRET_REJECTED,
            f"execution context accepts secret references ({prefix}...) only",
            {"rejected": len(bad)},
        )
    context = ExecutionContext(
        workload_id=w.workload_id,
        attempt_id=w.attempts[-1].attempt_id,
        worker_id=cmd.fence.worker_id,
        capabilities=claim.capability_snapshot,
        connection_scopes=w.connection_scopes,
        secret_references=cmd.secret_references,
        expires_at=claim.expires_at,
        fencing_token=claim.fencing_token,
        input=w.input,
        checkpoints=tuple(w.checkpoints),
    )
    return step.answer(context, worker_id=cmd.fence.worker_id)


def _record_checkpoint(step: Step) -> Decision:
    cmd = step.command
    assert isinstance(cmd, CheckpointCommand)
    step.require_edge()
    d = step.draft.workload
    attempt = d.attempts[-1]
    step.mark_attempt(attempt)
    sequence = len(d.checkpoints) + 1
    checkpoint = trusted(
        Checkpoint,
        checkpoint_id=checkpoint_id_for(d.workload_id, sequence),
        workload_id=d.workload_id,
        attempt_id=attempt.attempt_id,
        sequence=sequence,
        state=json_copy(cmd.state),  # the command may still be the caller's to change
        state_hash=step.reported_hash,
        created_at=step.now,
        produced_by=cmd.fence.worker_id,
    )
    d.checkpoints.append(checkpoint)
    step.move(cmd.fence.worker_id, {"checkpoint_sequence": str(sequence)})
    return step.commit(checkpoint, cmd.fence.worker_id, cmd.fence.worker_id)


def _record_result(step: Step) -> Decision:
    cmd = step.command
    assert isinstance(cmd, CompleteCommand)
    step.require_edge()
    d = step.draft.workload
    attempt = d.attempts[-1]
    step.mark_attempt(attempt)
    attempt.ended_at = step.now
    attempt.result_hash = step.reported_hash
    result = trusted(
        Result,
        result_id=cmd.result_id,
        workload_id=d.workload_id,
        attempt_id=attempt.attempt_id,
        # A copy: the command (and its output) may still be the caller's to change.
        output=json_copy(cmd.output),
        output_hash=step.reported_hash,
        artifacts=cmd.artifacts,
        provenance={"claim_id": cmd.fence.claim_id, "fencing_token": str(cmd.fence.token)},
        produced_by=cmd.fence.worker_id,
        created_at=step.now,
        schema_version=cmd.schema_version,
    )
    d.result = result
    d.current_claim = None
    step.move(cmd.fence.worker_id)
    return step.commit(result, cmd.fence.worker_id, cmd.fence.worker_id)


def _record_failure(step: Step) -> Decision:
    cmd = step.command
    assert isinstance(cmd, FailCommand)
    step.require_edge()
    d = step.draft.workload
    attempt = d.attempts[-1]
    # An attempt that never started can have had no effect.
    effect = cmd.effect if cmd.effect is not None or attempt.started_at is not None else "none"
    step.mark_attempt(attempt)
    attempt.ended_at = step.now
    attempt.error = cmd.error
    d.last_failure = f"{cmd.kind}: {cmd.error}"
    d.current_claim = None
    evidence = {"failure_kind": cmd.kind, "attempt_id": attempt.attempt_id}
    if effect is not None:
        evidence["effect"] = effect
    step.decide_by_policy(
        step.facts(failure_kind=cmd.kind, effect=effect),
        via_actor=cmd.fence.worker_id,
        via_evidence=evidence,
    )
    return step.commit(step.state_reply(), cmd.fence.worker_id, cmd.fence.worker_id)


def _cancel(step: Step) -> Decision:
    cmd = step.command
    assert isinstance(cmd, CancelCommand)
    if step.workload.state in step.spec.roles.cancelling:
        return step.answer(step.state_reply(), cmd.actor)
    step.require_edge()
    edge = step.spec.own_edge(step.workload.state, step.operation.name)
    assert edge is not None
    if step.spec.states[edge.to].kind == "terminal":
        step.draft.workload.current_claim = None
    step.move(cmd.actor)
    return step.commit(step.state_reply(), cmd.actor)


def _confirm_cancel(step: Step) -> Decision:
    cmd = step.command
    assert isinstance(cmd, ConfirmCancelCommand)
    step.require_edge()
    d = step.draft.workload
    if d.attempts:
        step.mark_attempt(d.attempts[-1])
        d.attempts[-1].ended_at = step.now
    d.current_claim = None
    step.move(cmd.fence.worker_id)
    return step.commit(step.state_reply(), cmd.fence.worker_id, cmd.fence.worker_id)


def _end_attempt(step: Step) -> Decision:
    cmd = step.command
    assert isinstance(cmd, TimeoutCommand)
    step.require_edge()
    d = step.draft.workload
    # Queued work has no attempt in progress: its last attempt's outcome stands.
    if d.state not in step.spec.roles.queued and d.attempts:
        step.mark_attempt(d.attempts[-1])
        d.attempts[-1].ended_at = step.now
    d.current_claim = None
    step.decide_by_policy(step.facts(), via_actor=cmd.actor)
    return step.commit(step.state_reply(), cmd.actor)


def _rearm(step: Step) -> Decision:
    cmd = step.command
    assert isinstance(cmd, RetryCommand)
    w = step.workload
    step.require_edge()
    previous = operator_retries(w)
    if previous >= w.retry_policy.max_attempts:
        raise errors.WorkloadError(
            errors.RETRY_EXHAUSTED,
            "workload has used every operator retry its policy allows",
            {"operator_retries": previous, "max": w.retry_policy.max_attempts},
        )
    evidence = {
        "retry": "operator",
        "operator_retry": str(previous + 1),
        "attempt_budget": str(w.retry_policy.max_attempts + previous + 1),
    }
    if cmd.reason is not None and cmd.reason.strip():
        check_text(step.spec, cmd.reason, "reason")
        evidence["reason"] = cmd.reason[: step.spec.limits.max_reason_chars]
    step.draft.workload.next_attempt_at = step.now
    step.draft.workload.current_claim = None
    step.move(cmd.actor, evidence)
    return step.commit(step.state_reply(), cmd.actor)


def _sweep_reply(step: Step, changed: bool) -> SweepReply:
    state = step.draft.workload.state if changed else step.workload.state
    return SweepReply(workload_id=step.workload.workload_id, changed=changed, state=state)


def _recover_lease(step: Step) -> Decision:
    w = step.workload
    claim = w.current_claim
    if (
        claim is None
        or claim.expires_at > step.now
        or not step.spec.available(w.state, step.operation.name)
    ):
        return step.answer(_sweep_reply(step, False), step.acting_as)
    d = step.draft.workload
    facts = Facts(workload=w, roles=step.spec.roles)
    d.current_claim = None
    evidence = {
        "recovery_reason": "lease_expired",
        "attempts_used": str(d.attempt_count),
        "attempt_budget": str(attempt_budget(d)),
        "claim_id": claim.claim_id,
        "worker_id": claim.worker_id,
        "lease_expired_at": str(claim.expires_at),
    }
    if d.attempts:
        attempt = d.attempts[-1]
        step.mark_attempt(attempt)
        attempt.ended_at = step.now
        attempt.error = "worker_lost: claim lease expired"
        evidence["attempt_id"] = attempt.attempt_id
    step.decide_by_policy(facts, via_actor=step.acting_as, via_evidence=evidence)
    return step.commit(_sweep_reply(step, True), step.acting_as, claim.worker_id)


def expire(step: Step, kind: str, at: int) -> None:
    """Time the step's draft out for the fallen deadline `kind`; the deadline policy decides."""
    d = step.draft.workload
    lost = d.current_claim
    d.current_claim = None
    if d.state not in step.spec.roles.queued and d.attempts:
        attempt = d.attempts[-1]
        step.mark_attempt(attempt)
        attempt.ended_at = step.now
        attempt.error = f"timeout: {kind} deadline passed"
    evidence = {"deadline": kind, "deadline_at": str(at)}
    if lost is not None:
        evidence["claim_id"] = lost.claim_id
        evidence["worker_id"] = lost.worker_id
    bounds = step.spec.deadline_kinds[kind].bounds
    step.decide_by_policy(
        step.facts(deadline_bounds=bounds), via_actor=step.acting_as, via_evidence=evidence
    )


def _enforce_deadline(step: Step) -> Decision:
    w = step.workload
    breach = deadline_breach(step.spec, w, step.now)
    if breach is None:
        return step.answer(_sweep_reply(step, False), step.acting_as)
    worker = w.current_claim.worker_id if w.current_claim is not None else None
    expire(step, *breach)
    return step.commit(_sweep_reply(step, True), step.acting_as, worker)


def _move(step: Step) -> Decision:
    cmd = step.command
    assert isinstance(cmd, OperatorCommand)
    step.require_edge()
    evidence: dict[str, str] = {}
    if cmd.reason is not None and cmd.reason.strip():
        check_text(step.spec, cmd.reason, "reason")
        evidence["reason"] = cmd.reason[: step.spec.limits.max_reason_chars]
    step.move(cmd.actor, evidence)
    return step.commit(step.state_reply(), cmd.actor)


#: What an effect is: a function of the step that returns the decision.
Effect = Callable[[Step], Decision]

#: Effect name -> the function that does it (admission is decided by `admission.py`).
STEPS: dict[str, Effect] = {
    "lease": _lease,
    "start_attempt": _start_attempt,
    "extend_lease": _extend_lease,
    "read_context": _read_context,
    "record_checkpoint": _record_checkpoint,
    "record_result": _record_result,
    "record_failure": _record_failure,
    "cancel": _cancel,
    "confirm_cancel": _confirm_cancel,
    "end_attempt": _end_attempt,
    "rearm": _rearm,
    "recover_lease": _recover_lease,
    "enforce_deadline": _enforce_deadline,
    "move": _move,
}
assert set(STEPS) | {"admit"} == set(EFFECTS), "every declared effect has its step"
