"""The pure core: `decide(spec, workload, command, now)`.

Given the committed workload (or `None`), a command and the instant, `decide`
returns a `Decision`: the new workload to write (or `None` when nothing
changes), the reply, and for the two refusals that record their decision
(`WORKLOAD_TIMED_OUT`, `WORKLOAD_ATTEMPTS_EXHAUSTED`) the error to raise once
the write has committed. Every other refusal is raised as a `WorkloadError`
before anything is decided. No I/O, no clock, no randomness: ids are derived
by hashing (`ids.py`). Same inputs, same output.

The core is one generic step driven by the spec's operations table: the
command names its operation; the operation's row says whether a fallen
deadline is enforced first, whether the caller must present the fence,
which policy gates it or decides after it, and which effect (`steps.py`)
changes the workload. The edge it takes out of a state is found in the
transition table. Nothing here names a state.
"""

from __future__ import annotations

from workwarden.statemachine import errors
from workwarden.statemachine.admission import decide_admission
from workwarden.statemachine.commands import (
    CARRIES_FENCE,
    AdmitCommand,
    CheckpointCommand,
    Command,
    CompleteCommand,
    FailCommand,
    OperatorCommand,
    StartCommand,
)
from workwarden.statemachine.deadlines import deadline_breach
from workwarden.statemachine.draft import Draft
from workwarden.statemachine.effects import REPLAYS
from workwarden.statemachine.ids import claim_id_for
from workwarden.statemachine.models import Claim, ClaimReply, Fence, Workload
from workwarden.statemachine.policies import apply_policy
from workwarden.statemachine.predicates import Facts, attempt_budget
from workwarden.statemachine.replays import REPLAY_STEPS
from workwarden.statemachine.safety import check_json, check_text, text_digest
from workwarden.statemachine.spec import CompiledOperation, Spec
from workwarden.statemachine.steps import STEPS, Decision, Step, expire

__all__ = ["Decision", "claim_id_for", "decide", "operation_of"]


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


def operation_of(spec: Spec, command: Command) -> CompiledOperation:
    """The spec's operation a command calls; `WORKLOAD_INVALID` when the spec has none.

    A built-in command calls the operation of its `op`; an `OperatorCommand`
    names its operation, whose effect must be `move`.
    """
    name = command.operation if isinstance(command, OperatorCommand) else command.op
    operation = spec.operations.get(name)
    if operation is None or not isinstance(command, spec.effect_command(operation)):
        takes = (
            f"takes a {spec.effect_command(operation).__name__}"
            if operation is not None
            else "is not an operation of the spec"
        )
        raise errors.WorkloadError(
            errors.INVALID,
            f"operation {name!r} {takes}",
            {"operation": name, "valid": sorted(spec.operations)},
        )
    return operation


def _deadline_refusal(spec: Spec, step: Step) -> Decision | None:
    """At a worker call: when a deadline has fallen, the decision that times the workload out."""
    breach = deadline_breach(spec, step.workload, step.now)
    if breach is None:
        return None
    kind, at = breach
    sweep = spec.operations[spec.deadline_operation]
    timing_out = Step(spec, sweep, step.workload, step.command, step.now)
    expire(timing_out, kind, at)
    refusal = errors.WorkloadError(
        errors.TIMED_OUT,
        f"the workload's {kind} deadline passed",
        {"deadline": kind, "deadline_at": at},
    )
    draft = timing_out.draft
    return Decision(
        operation=step.operation.name,
        workload=draft.workload,
        reply=None,
        refusal=refusal,
        events=tuple(draft.events),
        actor=timing_out.acting_as,
    )


def _gate(spec: Spec, step: Step) -> Decision | None:
    """Consult the operation's gate policy; the decision when a rule diverts the workload."""
    gate = step.operation.gate
    if gate is None:
        return None
    w = step.workload
    name = step.operation.name
    diverting = [rule for rule in gate.rules if rule.spec.to is not None]
    if not any(
        (edge := spec.edge(w.state, rule.spec.to or "")) is not None and name in edge.operations
        for rule in diverting
    ):
        return None
    facts = Facts(workload=w, roles=spec.roles)
    rule = gate.decide(facts)
    if rule.spec.to is None:
        return None
    draft = Draft(spec, w, step.now, name)
    budget = attempt_budget(w)
    apply_policy(
        draft,
        gate.name,
        facts,
        actor=gate.spec.actor,
        via_evidence={
            "reason": rule.spec.decision,
            "attempts_used": str(w.attempt_count),
            "attempt_budget": str(budget),
        },
    )
    refusal = errors.WorkloadError(
        rule.spec.refuse or errors.TRANSITION_DENIED,
        f"workload decided {rule.spec.decision} at {name}",
        {
            "decision": rule.spec.decision,
            "attempts_used": w.attempt_count,
            "attempt_budget": budget,
        },
    )
    return Decision(
        operation=name,
        workload=draft.workload,
        reply=None,
        refusal=refusal,
        events=tuple(draft.events),
        actor=gate.spec.actor,
    )


def decide(
    spec: Spec,
    workload: Workload | None,
    command: Command,
    now: int,
    *,
    tombstone: int | None = None,
) -> Decision:
    """Decide `command` on the committed `workload` at `now`.

    `tombstone`, for an admission of a key the store purged before: the
    version its purge left (`Tombstones.tombstone`). The new workload's
    fencing tokens start past it, so that a fence of the purged workload
    is never issued again (its admission event records it as
    `fencing_floor`).

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
    decision = _decide(spec, workload, command, now, tombstone)
    then = operation_of(spec, command).spec.then if decision.workload is not None else None
    if then is not None and decision.refusal is None:
        decision = _then(spec, decision, now)
    if workload is not None and decision.workload is not None and now < workload.updated_at:
        raise errors.WorkloadError(
            errors.CONFLICT,
            "the workload changed after this call's instant; nothing was committed",
            {"workload_id": workload.workload_id, "now": now, "updated_at": workload.updated_at},
        )
    return decision


def _then(spec: Spec, first: Decision, now: int) -> Decision:
    """The lease `first` granted, and its attempt started, as one decision for one commit.

    The operation named by `then` (checked at load: the fenced operation
    that starts the attempt) is decided by the core on the workload the
    claim left, with the fence the claim issued, exactly as the worker's own
    call would be; the history records both events. When the start is not
    granted, the claim stands alone.
    """
    claimed = first.workload
    assert claimed is not None
    assert claimed.current_claim is not None
    claim = claimed.current_claim
    start = StartCommand(workload_id=claimed.workload_id, fence=claim.fence)
    try:
        second = _decide(spec, claimed, start, now)
    except errors.WorkloadError:
        return first
    started = second.workload
    if started is None or second.refusal is not None or not isinstance(first.reply, ClaimReply):
        return first
    reply = first.reply.model_copy(update={"started_at": started.attempts[-1].started_at})
    return Decision(
        operation=first.operation,
        workload=started,
        reply=reply,
        events=first.events + second.events,
        actor=first.actor,
        worker_id=first.worker_id,
    )


def _decide(
    spec: Spec, workload: Workload | None, command: Command, now: int, tombstone: int | None = None
) -> Decision:
    operation = operation_of(spec, command)
    if isinstance(command, AdmitCommand):
        new, reply, draft = decide_admission(spec, workload, command.request, now, tombstone)
        events = tuple(draft.events) if draft is not None else ()
        return Decision(
            operation=operation.name,
            workload=new,
            reply=reply,
            events=events,
            actor=command.request.requested_by.id,
        )
    # What the command carries is checked first, before the workload is looked
    # up, as the seed does: the hash of the checkpoint state or the output is
    # taken of the canonical text the size check already made.
    reported_hash = ""
    if isinstance(command, CheckpointCommand):
        reported_hash = text_digest(check_json(spec, command.state, "state"))
    elif isinstance(command, CompleteCommand):
        reported_hash = text_digest(check_json(spec, command.output, "output"))
    elif isinstance(command, FailCommand):
        check_text(spec, command.error, "error")
        spec.check_failure_kind(command.kind)
    w = _require(workload, command.workload_id)
    step = Step(spec, operation, w, command, now, reported_hash)
    row = operation.spec
    # A call repeated after a lost reply is answered as the first was
    # (`replays.py`): a report that ended the claim, before the fence is checked.
    replay = REPLAY_STEPS[row.replay] if row.replay is not None else None
    live = replay is not None and REPLAYS[row.replay or ""].phase == "live"
    if replay is not None and not live:
        answered = replay(step)
        if answered is not None:
            return answered
    if row.deadlines:
        refusal = _deadline_refusal(spec, step)
        if refusal is not None:
            return refusal
    if row.fenced:
        # Checked at load: the effect of a fenced operation takes a command with a fence.
        assert isinstance(command, CARRIES_FENCE)
        _fence(w, command.fence, now)
    if replay is not None and live:
        answered = replay(step)
        if answered is not None:
            return answered
    diverted = _gate(spec, step)
    if diverted is not None:
        return diverted
    return STEPS[row.effect](step)
