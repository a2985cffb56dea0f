"""The commands the core decides on, and the replies it gives.

A command is data: which operation, on which workload, with which arguments.
The instant `now` is passed beside it, never read from a clock. Every command
model refuses unknown fields, so a typo is `WORKLOAD_INVALID`, not silence.
`ClaimNextCommand` is the scheduler's, outside `Command`: the core never
decides it alone, but the conformance protocol and checker traces send it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, JsonValue

from workwarden.statemachine.errors import ValidatedModel
from workwarden.statemachine.models import (
    MAX_LIST,
    PRINTABLE,
    CreateWorkload,
    Fence,
    Name,
    Prose,
    RequestSet,
    Workload,
)

__all__ = [
    "CARRIES_FENCE",
    "OPERATOR_COMMANDS",
    "AdmitCommand",
    "AdmitReply",
    "CancelCommand",
    "CheckpointCommand",
    "ClaimCommand",
    "ClaimNextCommand",
    "Command",
    "CompleteCommand",
    "ConfirmCancelCommand",
    "EnforceDeadlineCommand",
    "ExecutionContextCommand",
    "FailCommand",
    "HeartbeatCommand",
    "OperatorCommand",
    "RecoverCommand",
    "RequestId",
    "RetryCommand",
    "StartCommand",
    "StateReply",
    "SweepReply",
    "TimeoutCommand",
    "WorkloadPage",
]

LeaseMs = Annotated[int, Field(strict=True, ge=1, le=2**53 - 1)]

RequestId = Name
"""A caller's request id: the same id on a repeated call marks it as the same request.

A claim request id (`claim`, `claim_next`) or an operator request id
(`cancel`, `timeout`, `retry`, an operation of effect `move`); the
operation's replay rule answers a repeat as the first call was answered
(`specs/README.md`, "Replays")."""


class _Command(ValidatedModel):
    # Built by a caller, bad input is WORKLOAD_INVALID (`ValidatedModel`).
    model_config = ConfigDict(extra="forbid", frozen=True)


class AdmitCommand(_Command):
    """Admit `request` (or answer the original admission under the same scoped key)."""

    op: Literal["admit"] = "admit"
    request: CreateWorkload


class ClaimCommand(_Command):
    """Claim READY work by id for `worker_id`, leased for `lease_ms`.

    `request_id`, when given, is the claim request id: the same worker
    repeating it is answered with the claim it made (`own_claim`).
    """

    op: Literal["claim"] = "claim"
    workload_id: Name
    worker_id: Name
    capabilities: RequestSet = ()
    lease_ms: LeaseMs
    request_id: RequestId | None = None


class StartCommand(_Command):
    """Start the claimed attempt."""

    op: Literal["start"] = "start"
    workload_id: Name
    fence: Fence


class HeartbeatCommand(_Command):
    """Extend the lease to `now + extend_ms`."""

    op: Literal["heartbeat"] = "heartbeat"
    workload_id: Name
    fence: Fence
    extend_ms: LeaseMs


class ExecutionContextCommand(_Command):
    """Read what the attempt needs; `secret_references` must all be `secret://` references."""

    op: Literal["execution_context"] = "execution_context"
    workload_id: Name
    fence: Fence
    secret_references: Annotated[
        tuple[Annotated[str, Field(strict=True, max_length=1024, pattern=PRINTABLE)], ...],
        Field(max_length=MAX_LIST),
    ] = ()


class CheckpointCommand(_Command):
    """Record progress of the running attempt.

    `sequence`, when given, is the sequence number this checkpoint is to have
    (the workload's checkpoints so far, over every attempt, plus one): a call
    repeated after a lost reply names the same one and is answered with the
    checkpoint it recorded, instead of recording a second.
    """

    op: Literal["checkpoint"] = "checkpoint"
    workload_id: Name
    fence: Fence
    state: JsonValue
    sequence: Annotated[int, Field(strict=True, ge=1, le=2**31 - 1)] | None = None


class CompleteCommand(_Command):
    """Record the attempt's result under `result_id`."""

    op: Literal["complete"] = "complete"
    workload_id: Name
    fence: Fence
    result_id: Name
    output: JsonValue
    artifacts: Annotated[tuple[Name, ...], Field(max_length=MAX_LIST)] = ()
    schema_version: Annotated[int, Field(strict=True, ge=1, le=2**31 - 1)] = 1


class FailCommand(_Command):
    """Report the attempt's failure: its `kind`, its `error` text, what is known of its effect."""

    op: Literal["fail"] = "fail"
    workload_id: Name
    fence: Fence
    kind: Name
    error: Prose
    effect: Literal["none", "unknown"] | None = None


class CancelCommand(_Command):
    """Cancel, or request cancellation from the worker that holds it.

    `request_id`, when given, is the operator request id (as for every operator command).
    """

    op: Literal["cancel"] = "cancel"
    workload_id: Name
    actor: Name
    request_id: RequestId | None = None


class ConfirmCancelCommand(_Command):
    """The holding worker confirms a requested cancellation."""

    op: Literal["confirm_cancel"] = "confirm_cancel"
    workload_id: Name
    fence: Fence


class TimeoutCommand(_Command):
    """An operator times the workload out; the operator-timeout policy decides what follows."""

    op: Literal["timeout"] = "timeout"
    workload_id: Name
    actor: Name
    request_id: RequestId | None = None


class RetryCommand(_Command):
    """An operator re-arms failed, timed-out or dead-lettered work, granting one attempt."""

    op: Literal["retry"] = "retry"
    workload_id: Name
    actor: Name
    reason: Prose | None = None
    request_id: RequestId | None = None


class RecoverCommand(_Command):
    """Recover the workload if its lease has expired (the recovery sweep, one workload)."""

    op: Literal["recover_expired"] = "recover_expired"
    workload_id: Name


class EnforceDeadlineCommand(_Command):
    """Time the workload out if one of its deadlines has fallen (the sweep, one workload)."""

    op: Literal["enforce_deadlines"] = "enforce_deadlines"
    workload_id: Name


class OperatorCommand(_Command):
    """An operator takes `operation`, an operation of the spec whose effect is `move`.

    The command of the operations a spec adds without code (a pause and a
    resume, an approval and a rejection): the operation's edge out of the
    workload's state is found in the table, and `reason` is recorded with it.
    """

    op: Literal["operator"] = "operator"
    operation: Name
    workload_id: Name
    actor: Name
    reason: Prose | None = None
    request_id: RequestId | None = None


#: The commands a worker sends through its fence (a fenced operation takes one of these).
CARRIES_FENCE = (
    StartCommand,
    HeartbeatCommand,
    ExecutionContextCommand,
    CheckpointCommand,
    CompleteCommand,
    FailCommand,
    ConfirmCancelCommand,
)

#: The commands an operator sends, each with an optional operator request id.
OPERATOR_COMMANDS = (CancelCommand, TimeoutCommand, RetryCommand, OperatorCommand)

Command = Annotated[
    AdmitCommand
    | ClaimCommand
    | StartCommand
    | HeartbeatCommand
    | ExecutionContextCommand
    | CheckpointCommand
    | CompleteCommand
    | FailCommand
    | CancelCommand
    | ConfirmCancelCommand
    | TimeoutCommand
    | RetryCommand
    | RecoverCommand
    | EnforceDeadlineCommand
    | OperatorCommand,
    Field(discriminator="op"),
]
"""Any command, told apart by `op`."""


class ClaimNextCommand(_Command):
    """The scheduler as one command: claim the best claimable workload of a tenant and application.

    Not a command of the pure core (it reads many workloads); the conformance
    protocol carries it so that priority, eligibility, capability, dependency
    and tenant gating are held to the reference too. The reply is the claim,
    or `null` when nothing is claimable. `request_id` is the claim request id,
    as for `ClaimCommand`.
    """

    op: Literal["claim_next"] = "claim_next"
    tenant_id: Name
    application_id: Name
    worker_id: Name
    capabilities: RequestSet = ()
    lease_ms: LeaseMs
    request_id: RequestId | None = None


class AdmitReply(ValidatedModel):
    """The admitted workload, and whether this call created it (False: a replay)."""

    model_config = ConfigDict(extra="forbid")

    workload: Workload
    created: bool


class WorkloadPage(ValidatedModel):
    """One page of a scope's workloads (`Authority.list_page`), and the cursor of the next.

    `next` is None when this page is the last: it held fewer than the
    `limit` asked. A full page's `next` may lead to an empty page.
    """

    model_config = ConfigDict(extra="forbid")

    workloads: list[Workload]
    next: str | None


class StateReply(ValidatedModel):
    """The workload's state after the call."""

    model_config = ConfigDict(extra="forbid")

    workload_id: str
    state: str


class SweepReply(ValidatedModel):
    """Whether the sweep changed the workload, and its state after."""

    model_config = ConfigDict(extra="forbid")

    workload_id: str
    changed: bool
    state: str
