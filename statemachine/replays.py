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
    CheckpointCommand,
    ClaimCommand,
    CompleteCommand,
    ConfirmCancelCommand,
    FailCommand,
    StartCommand,
    StateReply,
)
from workwarden.statemachine.effects import REPLAYS
from workwarden.statemachine.models import Attempt, Fence, Workload
from workwarden.statemachine.steps import Decision, Step

__all__ = ["REPLAY_STEPS", "Replay"]


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


def _own_claim(step: Step) -> Decision | None:
    cmd = step.command
    assert isinstance(cmd, ClaimCommand)
    w = step.workload
    held = w.current_claim
    if (
        held is None
        or held.worker_id != cmd.worker_id
        or held.expires_at <= step.now
        or w.attempts[-1].started_at is not None
    ):
        return None
    return step.answer(held.model_copy(), cmd.worker_id, cmd.worker_id)


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
}
assert set(REPLAY_STEPS) == set(REPLAYS), "every declared replay has its rule"
