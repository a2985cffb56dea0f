"""The registry of effects the spec's operations may name, and the command each takes.

An operation of the spec (`[operations.NAME]`) names its effect: what it
does to a workload. Loading a spec that names an effect not registered here
fails, with the field and the valid names, exactly as for predicates. Each
effect is implemented in `steps.py` under the same name; this module only
declares them, so that the spec loader can check names without depending
on the code that runs them.
"""

from __future__ import annotations

from dataclasses import dataclass

from workwarden.statemachine.commands import (
    AdmitCommand,
    CancelCommand,
    CheckpointCommand,
    ClaimCommand,
    CompleteCommand,
    ConfirmCancelCommand,
    EnforceDeadlineCommand,
    ExecutionContextCommand,
    FailCommand,
    HeartbeatCommand,
    OperatorCommand,
    RecoverCommand,
    RetryCommand,
    StartCommand,
    TimeoutCommand,
)

__all__ = ["EFFECTS", "REPLAYS", "EffectInfo", "ReplayInfo"]


@dataclass(frozen=True, slots=True)
class EffectInfo:
    """An effect's declaration: the command it takes, whether it needs a policy, its meaning.

    `policy`: "via" (the effect enters the policy's `via` state and lets it
    decide), "gate" (a gate policy may be consulted before it), "none" (it
    consults no policy), or "any" (either kind, or none). `sets_attempt`: the
    effect marks an attempt with the operation's `attempt_status`, which the
    operation must then declare.
    """

    command: type
    policy: str
    meaning: str
    #: Does it set an attempt's status (the operation must then declare `attempt_status`)?
    sets_attempt: bool = False


#: Effect name -> its declaration. Operations name these.
EFFECTS: dict[str, EffectInfo] = {
    "admit": EffectInfo(AdmitCommand, "none", "create the workload and take the admitting edge"),
    "lease": EffectInfo(
        ClaimCommand,
        "gate",
        "lease to the worker: a new fencing token, a claim and an attempt (eligibility and"
        " capabilities checked first)",
        sets_attempt=True,
    ),
    "start_attempt": EffectInfo(
        StartCommand, "none", "mark the claimed attempt started", sets_attempt=True
    ),
    "extend_lease": EffectInfo(
        HeartbeatCommand, "none", "extend the current claim's lease and record the heartbeat"
    ),
    "read_context": EffectInfo(
        ExecutionContextCommand,
        "none",
        "answer the input, checkpoints and scopes through the fence (writes nothing)",
    ),
    "record_checkpoint": EffectInfo(
        CheckpointCommand, "none", "append a checkpoint of the running attempt", sets_attempt=True
    ),
    "record_result": EffectInfo(
        CompleteCommand,
        "none",
        "record the result, end the attempt and release the claim",
        sets_attempt=True,
    ),
    "record_failure": EffectInfo(
        FailCommand,
        "via",
        "end the attempt with the reported failure; the policy decides what follows",
        sets_attempt=True,
    ),
    "cancel": EffectInfo(
        CancelCommand,
        "none",
        "cancel, or ask the holding worker to confirm (already asked: answered unchanged)",
    ),
    "confirm_cancel": EffectInfo(
        ConfirmCancelCommand,
        "none",
        "end the attempt as cancelled and release the claim",
        sets_attempt=True,
    ),
    "end_attempt": EffectInfo(
        TimeoutCommand,
        "via",
        "end the attempt in progress and release the claim; the policy decides what follows",
        sets_attempt=True,
    ),
    "rearm": EffectInfo(
        RetryCommand,
        "none",
        "re-arm the work for one more attempt, within the operator re-arm bound",
    ),
    "recover_lease": EffectInfo(
        RecoverCommand,
        "via",
        "when the lease has expired, release it and let the policy decide (else unchanged)",
        sets_attempt=True,
    ),
    "enforce_deadline": EffectInfo(
        EnforceDeadlineCommand,
        "via",
        "when a deadline has fallen, time the work out and let the policy decide (else unchanged)",
        sets_attempt=True,
    ),
    "move": EffectInfo(
        OperatorCommand,
        "none",
        "take the operation's edge, recording the reason (operations added without code)",
    ),
}


@dataclass(frozen=True, slots=True)
class ReplayInfo:
    """A replay rule: how a repeated call (its reply lost) is answered as the first was.

    `effect`: the effect whose calls it answers. `phase`: "first" (before the
    deadline and fence checks: the first call ended the claim, so the fence is
    no longer current) or "live" (once the fence has been checked: the claim
    the first call used is still current). A replay writes nothing.
    """

    effect: str
    phase: str
    meaning: str


_OPERATOR_REQUEST = (
    "the workload's history records the call's operator request id: by the same operator and"
    " operation, answer the state that call left; by another operator or operation:"
    " WORKLOAD_CONFLICT (the store's audit log refuses the id on another workload too)"
)

#: Replay name -> its declaration. An operation's `replay` names one of these.
REPLAYS: dict[str, ReplayInfo] = {
    "same_result": ReplayInfo(
        "record_result",
        "first",
        "the result id is recorded for this workload by the same report (worker, claim, token,"
        " output): answer the recorded result; by a different report: WORKLOAD_RESULT_CONFLICT",
    ),
    "same_failure": ReplayInfo(
        "record_failure",
        "first",
        "the fence's attempt ended with this failure (kind, error, effect): answer the state",
    ),
    "same_confirmation": ReplayInfo(
        "confirm_cancel",
        "first",
        "the fence's attempt ended as cancelled: answer the state",
    ),
    "started_attempt": ReplayInfo(
        "start_attempt",
        "live",
        "the fence's attempt has started: answer the attempt",
    ),
    "same_checkpoint": ReplayInfo(
        "record_checkpoint",
        "live",
        "the call names a checkpoint sequence already recorded by this attempt with the same"
        " state: answer that checkpoint; recorded with another state or by another attempt:"
        " WORKLOAD_CONFLICT",
    ),
    "own_claim": ReplayInfo(
        "lease",
        "live",
        "the worker already holds a live claim of this workload, not yet started, made with the"
        " call's claim request id (or the call gives none): answer that claim; made with that"
        " request id and started: the operation's denied code (the request was answered)."
        " claim_next first asks the store for the claims the worker holds in its scope",
    ),
    "same_cancel_request": ReplayInfo(
        "cancel",
        "first",
        _OPERATOR_REQUEST,
    ),
    "same_timeout_request": ReplayInfo(
        "end_attempt",
        "first",
        _OPERATOR_REQUEST,
    ),
    "same_retry_request": ReplayInfo(
        "rearm",
        "first",
        _OPERATOR_REQUEST,
    ),
    "same_move_request": ReplayInfo(
        "move",
        "first",
        _OPERATOR_REQUEST,
    ),
}
