"""The replay rules: a call repeated after its reply was lost is answered as the first was.

A caller that cannot tell whether its call committed (the connection broke
after the commit, the process died before reading the reply) calls again
with the same arguments. Each operation's `replay` (in the spec's operations
table) names the rule here that recognises such a repeat and answers it
without writing anything. Rules of phase "first" run before the deadline and
fence checks (the first call ended the claim the fence names); rules of
phase "live" run once the fence or the deadlines have been checked.
"""

from __future__ import annotations

from collections.abc import Callable

from workwarden.statemachine import errors
from workwarden.statemachine.commands import (
    OPERATOR_COMMANDS,
    CheckpointCommand,
    ClaimCommand,
    CompleteCommand,
    ConfirmCancelCommand,
    FailCommand,
    StartCommand,
    StateReply,
)
from workwarden.statemachine.deadlines import deadline_breach
from workwarden.statemachine.effects import REPLAYS
from workwarden.statemachine.models import Attempt, Claim, ClaimReply, Fence, Workload
from workwarden.statemachine.spec import Spec
from workwarden.statemachine.steps import (
    REQUEST_ID,
    REQUEST_OPERATION,
    Decision,
    Step,
    claim_reply,
)

__all__ = ["REPLAY_STEPS", "STARTED", "Replay", "claim_request_of", "held_claim"]

STARTED = "started"
"""What `held_claim` answers for a claim its request made whose attempt has started."""


def _attempt_of(workload: Workload, fence: Fence) -> Attempt | None:
    for attempt in workload.attempts:
        if (
            attempt.claim_id == fence.claim_id
            and attempt.worker_id == fence.worker_id
            and attempt.fencing_token == fence.token
        ):
            return attempt
    return None


def _same_result(step: Step) -> Decision | None:
    cmd = step.command
    assert isinstance(cmd, CompleteCommand)
    existing = step.workload.result
    if existing is None or existing.result_id != cmd.result_id:
        return None
    same_report = (
        existing.produced_by == cmd.fence.worker_id
        and existing.provenance.get("claim_id") == cmd.fence.claim_id
        and existing.provenance.get("fencing_token") == str(cmd.fence.token)
        and existing.output_hash == step.reported_hash
    )
    if same_report:
        return step.answer(existing, worker_id=cmd.fence.worker_id)
    raise errors.WorkloadError(
        errors.RESULT_CONFLICT, "the result id was already recorded by a different report"
    )


def _same_failure(step: Step) -> Decision | None:
    cmd = step.command
    assert isinstance(cmd, FailCommand)
    w = step.workload
    attempt = _attempt_of(w, cmd.fence)
    if attempt is None or attempt.status != step.attempt_status or attempt.error != cmd.error:
        return None
    for event in reversed(w.execution_history):
        if event.evidence.get("attempt_id") == attempt.attempt_id and "failure_kind" in (
            event.evidence
        ):
            same_kind = event.evidence.get("failure_kind") == cmd.kind
            same_effect = cmd.effect is None or event.evidence.get("effect") == cmd.effect
            if same_kind and same_effect:
                reply = StateReply(workload_id=w.workload_id, state=w.state)
                return step.answer(reply, worker_id=cmd.fence.worker_id)
            return None
    return None


def _same_confirmation(step: Step) -> Decision | None:
    cmd = step.command
    assert isinstance(cmd, ConfirmCancelCommand)
    w = step.workload
    attempt = _attempt_of(w, cmd.fence)
    if (
        attempt is None
        or attempt.status != step.attempt_status
        or w.current_claim is not None
        or w.attempts[-1] is not attempt
    ):
        return None
    reply = StateReply(workload_id=w.workload_id, state=w.state)
    return step.answer(reply, worker_id=cmd.fence.worker_id)


def _started_attempt(step: Step) -> Decision | None:
    cmd = step.command
    assert isinstance(cmd, StartCommand)
    attempt = step.workload.attempts[-1]  # the fence checked it is the current claim's
    if attempt.started_at is None:
        return None
    return step.answer(attempt.model_copy(), worker_id=cmd.fence.worker_id)


def _same_checkpoint(step: Step) -> Decision | None:
    cmd = step.command
    assert isinstance(cmd, CheckpointCommand)
    w = step.workload
    if cmd.sequence is None:
        return None
    recorded = len(w.checkpoints)
    if cmd.sequence == recorded + 1:
        return None
    if cmd.sequence > recorded + 1:
        raise errors.WorkloadError(
            errors.INVALID,
            f"checkpoint sequence {cmd.sequence} skips ahead of the {recorded} recorded",
            {"field": "sequence", "recorded": recorded},
        )
    existing = w.checkpoints[cmd.sequence - 1]
    if existing.attempt_id == w.attempts[-1].attempt_id and (
        existing.state_hash == step.reported_hash
    ):
        return step.answer(existing, worker_id=cmd.fence.worker_id)
    raise errors.WorkloadError(
        errors.CONFLICT,
        f"checkpoint {cmd.sequence} is already recorded, with another state or attempt",
        {"sequence": cmd.sequence, "recorded": recorded},
    )


def claim_request_of(workload: Workload, claim: Claim) -> str | None:
    """The claim request id `claim` was made with (recorded on its event), or None."""
    token = str(claim.fencing_token)
    for event in reversed(workload.execution_history):
        if event.evidence.get("fencing_token") == token:
            return event.evidence.get(REQUEST_ID)
    return None


def held_claim(
    spec: Spec, workload: Workload, worker_id: str, request_id: str | None, now: int
) -> ClaimReply | str | None:
    """The `own_claim` rule on a document: the claim `worker_id` holds that answers a repeat.

    The reply for the live, unstarted claim `worker_id` holds, made with
    `request_id` (when one is given: a claim made without one, or with
    another, is not this request's); `STARTED` when that claim's request is
    this one and its attempt has started (the request was answered: a repeat
    is refused as the spec refuses a claim of the workload's state); None
    otherwise, or when a deadline has fallen (the call then decides it).
    """
    held = workload.current_claim
    if held is None or held.worker_id != worker_id:
        return None
    if request_id is not None and claim_request_of(workload, held) != request_id:
        return None
    attempt = workload.attempts[-1]
    started_by_claim = _started_by_claim(spec, workload, held)
    if attempt.started_at is not None and not started_by_claim:
        return STARTED if request_id is not None else None
    if held.expires_at <= now or deadline_breach(spec, workload, now) is not None:
        return None
    reply = claim_reply(workload, held, claim_request_of(workload, held))
    if started_by_claim:
        return reply.model_copy(update={"started_at": attempt.started_at})
    return reply


def _started_by_claim(spec: Spec, workload: Workload, held: Claim) -> bool:
    """Did the claim start its attempt in its own commit (`then`), with nothing recorded since?

    Then a repeat of the claim request is still answered with the claim: the
    worker that lost the reply has not seen the attempt it started.
    """
    attempt = workload.attempts[-1]
    return (
        attempt.started_at == held.claimed_at
        and any(op.spec.then is not None for op in spec.operations.values())
        and held.last_heartbeat == held.claimed_at
        and all(checkpoint.attempt_id != attempt.attempt_id for checkpoint in workload.checkpoints)
    )


def _own_claim(step: Step) -> Decision | None:
    cmd = step.command
    assert isinstance(cmd, ClaimCommand)
    held = held_claim(step.spec, step.workload, cmd.worker_id, cmd.request_id, step.now)
    if held is None:
        return None
    if held == STARTED:
        raise errors.WorkloadError(
            step.operation.spec.denied,
            "the claim request was answered and its attempt has started",
            {"state": step.workload.state, "request_id": cmd.request_id},
        )
    return step.answer(held, cmd.worker_id, cmd.worker_id)


def _same_operator_request(step: Step) -> Decision | None:
    cmd = step.command
    assert isinstance(cmd, OPERATOR_COMMANDS)
    if cmd.request_id is None:
        return None
    w = step.workload
    taken = [
        event
        for event in w.execution_history
        if event.evidence.get(REQUEST_ID) == cmd.request_id and REQUEST_OPERATION in event.evidence
    ]
    if not taken:
        return None
    first = taken[0]
    if first.actor != cmd.actor or first.evidence[REQUEST_OPERATION] != step.operation.name:
        raise errors.WorkloadError(
            errors.CONFLICT,
            "the request id was used for another operation or by another operator",
            {
                "request_id": cmd.request_id,
                "operation": first.evidence[REQUEST_OPERATION],
                "workload_id": w.workload_id,
            },
        )
    reply = StateReply(workload_id=w.workload_id, state=taken[-1].to)
    return step.answer(reply, cmd.actor)


#: What a replay rule is: the answer to a repeated call, or None when it is not one.
Replay = Callable[[Step], Decision | None]

#: Replay name -> the function that recognises and answers a repeated call.
REPLAY_STEPS: dict[str, Replay] = {
    "same_result": _same_result,
    "same_failure": _same_failure,
    "same_confirmation": _same_confirmation,
    "started_attempt": _started_attempt,
    "same_checkpoint": _same_checkpoint,
    "own_claim": _own_claim,
    "same_cancel_request": _same_operator_request,
    "same_timeout_request": _same_operator_request,
    "same_retry_request": _same_operator_request,
    "same_move_request": _same_operator_request,
}
assert set(REPLAY_STEPS) == set(REPLAYS), "every declared replay has its rule"
