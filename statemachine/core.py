"""The pure core: `decide(spec, workload, command, now)`.

Given the committed workload (or `None`), a command and the instant, `decide`
returns a `Decision`: the new workload to write (or `None` when nothing
changes), the reply, and for the two refusals that record their decision
(`WORKLOAD_TIMED_OUT`, `WORKLOAD_ATTEMPTS_EXHAUSTED`) the error to raise once
the write has committed. Every other refusal is raised as a `WorkloadError`
before anything is decided. No I/O, no clock, no randomness: ids are derived
by hashing. Same inputs, same output.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from workwarden.statemachine import errors
from workwarden.statemachine.admission import decide_admission
from workwarden.statemachine.commands import (
    AdmitCommand,
    CancelCommand,
    CheckpointCommand,
    ClaimCommand,
    Command,
    CompleteCommand,
    ConfirmCancelCommand,
    EnforceDeadlineCommand,
    ExecutionContextCommand,
    FailCommand,
    HeartbeatCommand,
    RecoverCommand,
    RetryCommand,
    StartCommand,
    StateReply,
    SweepReply,
    TimeoutCommand,
)
from workwarden.statemachine.deadlines import deadline_breach
from workwarden.statemachine.draft import Draft
from workwarden.statemachine.models import (
    Attempt,
    Checkpoint,
    Claim,
    Event,
    ExecutionContext,
    Fence,
    Result,
    Workload,
)
from workwarden.statemachine.policies import apply_policy
from workwarden.statemachine.predicates import Facts, attempt_budget, operator_retries
from workwarden.statemachine.safety import check_json, check_text, text_digest
from workwarden.statemachine.spec import Spec

__all__ = ["Decision", "claim_id_for", "decide"]


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


def _short_hash(*parts: Any) -> str:
    text = json.dumps(list(parts), separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def claim_id_for(workload_id: str, token: int, worker_id: str) -> str:
    """The claim id of `worker_id`'s claim of a workload under fencing token `token`."""
    return "claim_" + _short_hash(workload_id, token, worker_id)[:20]


def _require(workload: Workload | None, workload_id: str) -> Workload:
    if workload is None:
        raise errors.WorkloadError(
            errors.NOT_FOUND, "workload not found", {"workload_id": workload_id}
        )
    return workload


def _fence(workload: Workload, fence: Fence, now: int) -> Claim:
    claim = workload.current_claim
    if claim is None:
        raise errors.WorkloadError(errors.CLAIM_INVALID, "no active claim")
    if (
        claim.claim_id != fence.claim_id
        or claim.worker_id != fence.worker_id
        or claim.fencing_token != fence.token
    ):
        raise errors.WorkloadError(
            errors.STALE_FENCE,
            "claim or fencing token is stale",
            {"current_token": claim.fencing_token, "presented_token": fence.token},
        )
    if claim.expires_at <= now:
        raise errors.WorkloadError(
            errors.LEASE_EXPIRED, "claim lease expired", {"expired_at": claim.expires_at}
        )
    return claim


def _expire(draft: Draft, kind: str, at: int) -> None:
    """Time the draft out for the fallen deadline `kind` and let the deadline policy decide."""
    w = draft.workload
    lost = w.current_claim
    w.current_claim = None
    if w.state != "READY" and w.attempts:
        attempt = w.attempts[-1]
        attempt.status = "TIMED_OUT"
        attempt.ended_at = draft.now
        attempt.error = f"timeout: {kind} deadline passed"
    evidence = {"deadline": kind, "deadline_at": str(at)}
    if lost is not None:
        evidence["claim_id"] = lost.claim_id
        evidence["worker_id"] = lost.worker_id
    bounds = draft.spec.deadline_kinds[kind].bounds
    facts = Facts(workload=draft.workload, deadline_bounds=bounds)
    apply_policy(
        draft,
        "deadline",
        facts,
        actor="system.deadline",
        via_actor="system.deadline",
        via_actor_class="system",
        via_evidence=evidence,
    )


def _deadline_refusal(spec: Spec, workload: Workload, now: int, operation: str) -> Decision | None:
    """At a worker call: when a deadline has fallen, the decision that times the workload out."""
    breach = deadline_breach(spec, workload, now)
    if breach is None:
        return None
    kind, at = breach
    draft = Draft(spec, workload, now, "enforce_deadlines")
    _expire(draft, kind, at)
    refusal = errors.WorkloadError(
        errors.TIMED_OUT,
        f"the workload's {kind} deadline passed",
        {"deadline": kind, "deadline_at": at},
    )
    return Decision(
        operation=operation,
        workload=draft.workload,
        reply=None,
        refusal=refusal,
        events=tuple(draft.events),
        actor="system.deadline",
    )


def _commit(draft: Draft, reply: Any, actor: str, worker_id: str | None = None) -> Decision:
    return Decision(
        operation=draft.operation,
        workload=draft.workload,
        reply=reply,
        events=tuple(draft.events),
        actor=actor,
        worker_id=worker_id,
    )


def _claim(spec: Spec, w: Workload, cmd: ClaimCommand, now: int) -> Decision:
    if w.state == "READY":
        rule = spec.policies["claim"].decide(Facts(workload=w))
        if rule.spec.to is not None:
            draft = Draft(spec, w, now, "claim")
            budget = attempt_budget(w)
            apply_policy(
                draft,
                "claim",
                Facts(workload=w),
                actor="system.claim",
                via_evidence={
                    "reason": rule.spec.decision,
                    "attempts_used": str(w.attempt_count),
                    "attempt_budget": str(budget),
                },
            )
            code = rule.spec.refuse or errors.TRANSITION_DENIED
            refusal = errors.WorkloadError(
                code,
                f"workload decided {rule.spec.decision} at claim",
                {
                    "decision": rule.spec.decision,
                    "attempts_used": w.attempt_count,
                    "attempt_budget": budget,
                },
            )
            return Decision(
                operation="claim",
                workload=draft.workload,
                reply=None,
                refusal=refusal,
                events=tuple(draft.events),
                actor="system.claim",
            )
    if not any(edge.to == "CLAIMED" for edge in spec.edges_for(w.state, "claim")):
        raise errors.WorkloadError(errors.NOT_READY, "workload is not eligible", {"state": w.state})
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
    draft = Draft(spec, w, now, "claim")
    d = draft.workload
    d.fencing_token += 1
    d.attempt_count += 1
    claim = Claim(
        claim_id=claim_id_for(d.workload_id, d.fencing_token, cmd.worker_id),
        workload_id=d.workload_id,
        worker_id=cmd.worker_id,
        lease_id=f"lease_{d.fencing_token}",
        fencing_token=d.fencing_token,
        capability_snapshot=d.capability_snapshot,
        claimed_at=now,
        expires_at=now + cmd.lease_ms,
        last_heartbeat=now,
    )
    d.attempts.append(
        Attempt(
            attempt_id=f"attempt_{d.workload_id}_{d.attempt_count}",
            workload_id=d.workload_id,
            worker_id=cmd.worker_id,
            claim_id=claim.claim_id,
            fencing_token=claim.fencing_token,
            input_hash=d.input_hash,
            status="CLAIMED",
        )
    )
    d.current_claim = claim
    draft.move(
        "CLAIMED",
        actor=cmd.worker_id,
        actor_class="worker",
        evidence={"fencing_token": str(claim.fencing_token)},
    )
    return _commit(draft, claim.model_copy(), cmd.worker_id, cmd.worker_id)


def _start(spec: Spec, w: Workload, cmd: StartCommand, now: int) -> Decision:
    _fence(w, cmd.fence, now)
    draft = Draft(spec, w, now, "start")
    attempt = draft.workload.attempts[-1]
    attempt.status = "RUNNING"
    attempt.started_at = now
    draft.move("RUNNING", actor=cmd.fence.worker_id, actor_class="worker")
    return _commit(draft, attempt.model_copy(), cmd.fence.worker_id, cmd.fence.worker_id)


def _heartbeat(spec: Spec, w: Workload, cmd: HeartbeatCommand, now: int) -> Decision:
    _fence(w, cmd.fence, now)
    draft = Draft(spec, w, now, "heartbeat")
    claim = draft.workload.current_claim
    assert claim is not None  # the fence checked it
    claim.last_heartbeat = now
    claim.expires_at = now + cmd.extend_ms
    draft.workload.updated_at = now
    return _commit(draft, claim.model_copy(), cmd.fence.worker_id, cmd.fence.worker_id)


def _execution_context(spec: Spec, w: Workload, cmd: ExecutionContextCommand, now: int) -> Decision:
    claim = _fence(w, cmd.fence, now)
    prefix = spec.secrets.reference_prefix
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
    return Decision(
        operation="execution_context", workload=None, reply=context, worker_id=cmd.fence.worker_id
    )


def _checkpoint(
    spec: Spec, w: Workload, cmd: CheckpointCommand, now: int, state_hash: str
) -> Decision:
    _fence(w, cmd.fence, now)
    if not any(edge.to == "CHECKPOINTED" for edge in spec.edges_for(w.state, "checkpoint")):
        raise errors.WorkloadError(
            errors.TRANSITION_DENIED, "checkpoint requires a running workload", {"state": w.state}
        )
    draft = Draft(spec, w, now, "checkpoint")
    d = draft.workload
    attempt = d.attempts[-1]
    attempt.status = "CHECKPOINTED"
    sequence = len(d.checkpoints) + 1
    checkpoint = Checkpoint(
        checkpoint_id=f"checkpoint_{d.workload_id}_{sequence}",
        workload_id=d.workload_id,
        attempt_id=attempt.attempt_id,
        sequence=sequence,
        state=cmd.state,
        state_hash=state_hash,
        created_at=now,
        produced_by=cmd.fence.worker_id,
    )
    d.checkpoints.append(checkpoint)
    draft.move(
        "CHECKPOINTED",
        actor=cmd.fence.worker_id,
        actor_class="worker",
        evidence={"checkpoint_sequence": str(sequence)},
    )
    return _commit(draft, checkpoint, cmd.fence.worker_id, cmd.fence.worker_id)


def _complete(spec: Spec, w: Workload, cmd: CompleteCommand, output_hash: str) -> Decision | None:
    existing = w.result
    if existing is not None and existing.result_id == cmd.result_id:
        same_report = (
            existing.produced_by == cmd.fence.worker_id
            and existing.provenance.get("claim_id") == cmd.fence.claim_id
            and existing.provenance.get("fencing_token") == str(cmd.fence.token)
            and existing.output_hash == output_hash
        )
        if same_report:
            return Decision(
                operation="complete", workload=None, reply=existing, worker_id=cmd.fence.worker_id
            )
        raise errors.WorkloadError(
            errors.RESULT_CONFLICT, "the result id was already recorded by a different report"
        )
    return None


def _complete_fresh(
    spec: Spec, w: Workload, cmd: CompleteCommand, now: int, output_hash: str
) -> Decision:
    _fence(w, cmd.fence, now)
    if not any(edge.to == "SUCCEEDED" for edge in spec.edges_for(w.state, "complete")):
        raise errors.WorkloadError(
            errors.TRANSITION_DENIED, "completion requires running state", {"state": w.state}
        )
    draft = Draft(spec, w, now, "complete")
    d = draft.workload
    attempt = d.attempts[-1]
    attempt.status = "SUCCEEDED"
    attempt.ended_at = now
    attempt.result_hash = output_hash
    result = Result(
        result_id=cmd.result_id,
        workload_id=d.workload_id,
        attempt_id=attempt.attempt_id,
        output=cmd.output,
        output_hash=output_hash,
        artifacts=cmd.artifacts,
        provenance={"claim_id": cmd.fence.claim_id, "fencing_token": str(cmd.fence.token)},
        produced_by=cmd.fence.worker_id,
        created_at=now,
        schema_version=cmd.schema_version,
    )
    d.result = result
    d.current_claim = None
    draft.move("SUCCEEDED", actor=cmd.fence.worker_id, actor_class="worker")
    return _commit(draft, result, cmd.fence.worker_id, cmd.fence.worker_id)


def _reported_attempt(w: Workload, fence: Fence) -> Attempt | None:
    for attempt in w.attempts:
        if (
            attempt.claim_id == fence.claim_id
            and attempt.worker_id == fence.worker_id
            and attempt.fencing_token == fence.token
            and attempt.status in ("FAILED", "SUCCEEDED")
        ):
            return attempt
    return None


def _fail_replay(w: Workload, cmd: FailCommand) -> Decision | None:
    attempt = _reported_attempt(w, cmd.fence)
    if attempt is None or attempt.status != "FAILED" or attempt.error != cmd.error:
        return None
    for event in reversed(w.execution_history):
        if event.to == "FAILED" and event.evidence.get("attempt_id") == attempt.attempt_id:
            same_kind = event.evidence.get("failure_kind") == cmd.kind
            same_effect = cmd.effect is None or event.evidence.get("effect") == cmd.effect
            if same_kind and same_effect:
                reply = StateReply(workload_id=w.workload_id, state=w.state)
                return Decision(
                    operation="fail", workload=None, reply=reply, worker_id=cmd.fence.worker_id
                )
            return None
    return None


def _fail(spec: Spec, w: Workload, cmd: FailCommand, now: int) -> Decision:
    _fence(w, cmd.fence, now)
    if not any(edge.to == "FAILED" for edge in spec.edges_for(w.state, "fail")):
        raise errors.WorkloadError(
            errors.TRANSITION_DENIED, f"{w.state} cannot transition to FAILED", {"state": w.state}
        )
    effect = cmd.effect if cmd.effect is not None or w.state != "CLAIMED" else "none"
    draft = Draft(spec, w, now, "fail")
    d = draft.workload
    attempt = d.attempts[-1]
    attempt.status = "FAILED"
    attempt.ended_at = now
    attempt.error = cmd.error
    d.last_failure = f"{cmd.kind}: {cmd.error}"
    d.current_claim = None
    evidence = {"failure_kind": cmd.kind, "attempt_id": attempt.attempt_id}
    if effect is not None:
        evidence["effect"] = effect
    draft.move("FAILED", actor=cmd.fence.worker_id, actor_class="worker", evidence=evidence)
    apply_policy(
        draft,
        "failure",
        Facts(workload=d, failure_kind=cmd.kind, effect=effect),
        actor="system.failure",
    )
    reply = StateReply(workload_id=d.workload_id, state=d.state)
    return _commit(draft, reply, cmd.fence.worker_id, cmd.fence.worker_id)


def _cancel(spec: Spec, w: Workload, cmd: CancelCommand, now: int) -> Decision:
    if w.state == "CANCELLATION_REQUESTED":
        reply = StateReply(workload_id=w.workload_id, state=w.state)
        return Decision(operation="cancel", workload=None, reply=reply, actor=cmd.actor)
    edges = spec.edges_for(w.state, "cancel")
    if not edges:
        raise errors.WorkloadError(
            errors.TRANSITION_DENIED,
            f"a {w.state} workload cannot be cancelled",
            {"state": w.state},
        )
    draft = Draft(spec, w, now, "cancel")
    target = edges[0].to
    if spec.states[target].kind == "terminal":
        draft.workload.current_claim = None
    draft.move(target, actor=cmd.actor, actor_class="operator")
    reply = StateReply(workload_id=w.workload_id, state=draft.workload.state)
    return _commit(draft, reply, cmd.actor)


def _confirm_cancel(spec: Spec, w: Workload, cmd: ConfirmCancelCommand, now: int) -> Decision:
    _fence(w, cmd.fence, now)
    if not spec.edges_for(w.state, "confirm_cancel"):
        raise errors.WorkloadError(
            errors.TRANSITION_DENIED, "cancellation was not requested", {"state": w.state}
        )
    draft = Draft(spec, w, now, "confirm_cancel")
    d = draft.workload
    if d.attempts:
        d.attempts[-1].status = "CANCELLED"
        d.attempts[-1].ended_at = now
    d.current_claim = None
    draft.move("CANCELLED", actor=cmd.fence.worker_id, actor_class="worker")
    reply = StateReply(workload_id=w.workload_id, state=d.state)
    return _commit(draft, reply, cmd.fence.worker_id, cmd.fence.worker_id)


def _timeout(spec: Spec, w: Workload, cmd: TimeoutCommand, now: int) -> Decision:
    if not any(edge.to == "TIMED_OUT" for edge in spec.edges_for(w.state, "timeout")):
        raise errors.WorkloadError(
            errors.TRANSITION_DENIED,
            "workload cannot time out in its current state",
            {"state": w.state},
        )
    draft = Draft(spec, w, now, "timeout")
    d = draft.workload
    # A READY workload has no attempt in progress: its last attempt's outcome stands.
    if d.state != "READY" and d.attempts:
        d.attempts[-1].status = "TIMED_OUT"
        d.attempts[-1].ended_at = now
    d.current_claim = None
    apply_policy(
        draft,
        "operator_timeout",
        Facts(workload=d),
        actor="system.timeout",
        via_actor=cmd.actor,
        via_actor_class="operator",
    )
    reply = StateReply(workload_id=w.workload_id, state=d.state)
    return _commit(draft, reply, cmd.actor)


def _retry(spec: Spec, w: Workload, cmd: RetryCommand, now: int) -> Decision:
    if not any(edge.to == "READY" for edge in spec.edges_for(w.state, "retry")):
        raise errors.WorkloadError(
            errors.TRANSITION_DENIED, "workload is not retryable", {"state": w.state}
        )
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
        check_text(spec, cmd.reason, "reason")
        evidence["reason"] = cmd.reason[: spec.limits.max_reason_chars]
    draft = Draft(spec, w, now, "retry")
    draft.workload.next_attempt_at = now
    draft.workload.current_claim = None
    draft.move("READY", actor=cmd.actor, actor_class="operator", evidence=evidence)
    reply = StateReply(workload_id=w.workload_id, state=draft.workload.state)
    return _commit(draft, reply, cmd.actor)


def _recover(spec: Spec, w: Workload, cmd: RecoverCommand, now: int) -> Decision:
    claim = w.current_claim
    if claim is None or claim.expires_at > now or not spec.edges_for(w.state, "recover_expired"):
        reply = SweepReply(workload_id=w.workload_id, changed=False, state=w.state)
        return Decision(
            operation="recover_expired", workload=None, reply=reply, actor="system.recovery"
        )
    draft = Draft(spec, w, now, "recover_expired")
    d = draft.workload
    facts = Facts(workload=w)
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
        attempt.status = "WORKER_LOST"
        attempt.ended_at = now
        attempt.error = "worker_lost: claim lease expired"
        evidence["attempt_id"] = attempt.attempt_id
    apply_policy(
        draft,
        "recovery",
        facts,
        actor="system.recovery",
        via_actor="system.recovery",
        via_evidence=evidence,
    )
    reply = SweepReply(workload_id=w.workload_id, changed=True, state=d.state)
    return _commit(draft, reply, "system.recovery", claim.worker_id)


def _enforce(spec: Spec, w: Workload, cmd: EnforceDeadlineCommand, now: int) -> Decision:
    breach = deadline_breach(spec, w, now)
    if breach is None:
        reply = SweepReply(workload_id=w.workload_id, changed=False, state=w.state)
        return Decision(
            operation="enforce_deadlines", workload=None, reply=reply, actor="system.deadline"
        )
    draft = Draft(spec, w, now, "enforce_deadlines")
    worker = w.current_claim.worker_id if w.current_claim is not None else None
    _expire(draft, *breach)
    reply = SweepReply(workload_id=w.workload_id, changed=True, state=draft.workload.state)
    return _commit(draft, reply, "system.deadline", worker)


_FENCED_WITH_DEADLINE = (
    StartCommand,
    HeartbeatCommand,
    ExecutionContextCommand,
    CheckpointCommand,
    CompleteCommand,
    FailCommand,
)


def decide(spec: Spec, workload: Workload | None, command: Command, now: int) -> Decision:
    """Decide `command` on the committed `workload` at `now`.

    Raises `WorkloadError` for a refusal that changes nothing. Returns a
    `Decision` otherwise; its `refusal`, when set, is raised by the caller
    after `Decision.workload` has been committed.

    A call whose `now` is earlier than the workload's last change
    (`updated_at`) writes nothing: a decision that would write is refused
    with `WORKLOAD_CONFLICT`, so a history never goes back in time. (Another
    process committed after this caller read its clock; its next call, at
    a later instant, decides on what was committed.) Answers that write
    nothing (replays, reads, sweeps that find nothing due) are given.
    """
    decision = _decide(spec, workload, command, now)
    if workload is not None and decision.workload is not None and now < workload.updated_at:
        raise errors.WorkloadError(
            errors.CONFLICT,
            "the workload changed after this call's instant; nothing was committed",
            {"workload_id": workload.workload_id, "now": now, "updated_at": workload.updated_at},
        )
    return decision


def _decide(spec: Spec, workload: Workload | None, command: Command, now: int) -> Decision:
    if isinstance(command, AdmitCommand):
        new, reply, draft = decide_admission(spec, workload, command.request, now)
        events = tuple(draft.events) if draft is not None else ()
        return Decision(
            operation="admit",
            workload=new,
            reply=reply,
            events=events,
            actor=command.request.requested_by.id,
        )
    w = _require(workload, command.workload_id)
    # The hash of the checkpoint state or the output, taken of the canonical
    # text the size check already made.
    reported_hash = ""
    if isinstance(command, CheckpointCommand):
        reported_hash = text_digest(check_json(spec, command.state, "state"))
    elif isinstance(command, CompleteCommand):
        reported_hash = text_digest(check_json(spec, command.output, "output"))
        replay = _complete(spec, w, command, reported_hash)
        if replay is not None:
            return replay
    elif isinstance(command, FailCommand):
        check_text(spec, command.error, "error")
        replay = _fail_replay(w, command)
        if replay is not None:
            return replay
    if isinstance(command, (ClaimCommand, *_FENCED_WITH_DEADLINE)):
        refusal = _deadline_refusal(spec, w, now, command.op)
        if refusal is not None:
            return refusal
    if isinstance(command, ClaimCommand):
        return _claim(spec, w, command, now)
    if isinstance(command, StartCommand):
        return _start(spec, w, command, now)
    if isinstance(command, HeartbeatCommand):
        return _heartbeat(spec, w, command, now)
    if isinstance(command, ExecutionContextCommand):
        return _execution_context(spec, w, command, now)
    if isinstance(command, CheckpointCommand):
        return _checkpoint(spec, w, command, now, reported_hash)
    if isinstance(command, CompleteCommand):
        return _complete_fresh(spec, w, command, now, reported_hash)
    if isinstance(command, FailCommand):
        return _fail(spec, w, command, now)
    if isinstance(command, CancelCommand):
        return _cancel(spec, w, command, now)
    if isinstance(command, ConfirmCancelCommand):
        return _confirm_cancel(spec, w, command, now)
    if isinstance(command, TimeoutCommand):
        return _timeout(spec, w, command, now)
    if isinstance(command, RetryCommand):
        return _retry(spec, w, command, now)
    if isinstance(command, RecoverCommand):
        return _recover(spec, w, command, now)
    if isinstance(command, EnforceDeadlineCommand):
        return _enforce(spec, w, command, now)
    raise errors.WorkloadError(errors.INVALID, f"unknown command {type(command).__name__}")
