"""The expected decision of a step, derived from the spec's declared data alone.

The checker's other properties hold the core to generic invariants; where
they reuse the core's arithmetic (the deadline instants, the attempt budget),
a mistake there changes the property with it. This module restates what the
spec declares, in code of its own that imports none of the core's decision
modules (`core`, `deadlines`, `policies`, `predicates`, `steps`, `replays`,
`admission`): it reads the raw spec file (`Spec.data`, the TOML as
validated) and the committed workload, and says what the core must answer.

- the deadline table: each kind applies while the workload is in a `while`
  state and its `<kind>_ms` timeout is set, falls at anchor + duration
  (never early), kinds in declared `order`, the first fallen decides; only
  for workloads admitted at the deadline contract version or later;
- the policies: ordered rules over the predicates as the spec's README
  defines them, first match decides; `via` then the target, or straight to
  the target for a `direct` rule; `delay` "backoff" (the n-th retry waits
  initial * multiplier^(n-1), capped at max), "initial" or "none";
- the attempt budget: `max_attempts` plus one per operator re-arm, and
  the numbers events state in their evidence (`STATED`): an operator's
  re-arm states the budget it makes and which re-arm it is, a recovery or a
  gate that moves the workload the budget it decided under, a checkpoint
  the sequence it records;
- each operation's row: the replay rules of the calls the checker makes
  (a checkpoint that names its sequence: the next one is recorded, one
  already recorded by this attempt with the same state is answered with no
  write, with another state or by another attempt `WORKLOAD_CONFLICT`, one
  beyond the next `WORKLOAD_INVALID`), the deadline check, the fence (no
  claim, another claim, an expired lease), the gate policy, the effect's own
  checks and edits, the edge the operation takes out of the state (the
  table's edge listing it that its actor class may take);
- admission: the request's own checks, then the grant it carries (it binds
  the requester, tenant and application, is active, and `issued_at <= now <
  expires_at`, else `WORKLOAD_UNAUTHORIZED`), then a new workload, or, for a
  workload already admitted under the key, the replay: no write when the
  execution fields, the requester and the concurrency key are the same,
  `IDEMPOTENCY_KEY_REUSED` otherwise;
- a decision that writes at an instant earlier than the workload's last
  change is refused with `WORKLOAD_CONFLICT`.

`expect` answers an `Expected`: the refusal code (None: granted), whether
it writes, and the key numbers of the resulting document (`Shape`: state,
the edges and decisions of the new events, attempt and retry counters,
eligibility, fencing token, the lease, the last attempt, checkpoints,
result). `check_step` compares every step the checker explores with it; a
disagreement is the `spec_refinement` property, reported with the trace.
An operation whose effect this module does not restate (the spec's `move`
operations) is not compared, nor the document a new admission writes (only
that it writes). A step where the core raised anything but a coded
`WorkloadError` is reported whatever the spec answers.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from dataclasses import dataclass, field, replace
from typing import Any

from workwarden.statemachine.check.state import CheckState
from workwarden.statemachine.check.universe import (
    CAPABILITY,
    RAISED,
    Action,
    Model,
    Step,
    called,
    claim_request_of,
    worker_name,
)
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
    OperatorCommand,
    RecoverCommand,
    RetryCommand,
    StartCommand,
    TimeoutCommand,
)
from workwarden.statemachine.models import CreateWorkload, Workload
from workwarden.statemachine.properties.refinement import SPEC_REFINEMENT
from workwarden.statemachine.spec import Spec
from workwarden.statemachine.spec_model import PolicySpec, RuleSpec, SpecFile, TransitionSpec

__all__ = ["PROPERTY", "STATED", "Expected", "Shape", "check_step", "expect", "shape_of"]

#: The registered property a disagreement is reported under.
PROPERTY = SPEC_REFINEMENT

# The catalogue codes the oracle answers (the spec's `[errors]` names).
_NOT_FOUND = "WORKLOAD_NOT_FOUND"
_INVALID = "WORKLOAD_INVALID"
_CONFLICT = "WORKLOAD_CONFLICT"
_DENIED = "WORKLOAD_TRANSITION_DENIED"
_NOT_ELIGIBLE = "WORKLOAD_NOT_YET_ELIGIBLE"
_CAPABILITY = "WORKLOAD_CAPABILITY_DENIED"
_CLAIM_INVALID = "WORKLOAD_CLAIM_INVALID"
_STALE = "WORKLOAD_STALE_FENCE"
_EXPIRED = "WORKLOAD_LEASE_EXPIRED"
_RESULT_CONFLICT = "WORKLOAD_RESULT_CONFLICT"
_RETRY_EXHAUSTED = "WORKLOAD_RETRY_EXHAUSTED"
_TIMED_OUT = "WORKLOAD_TIMED_OUT"
_UNAUTHORIZED = "WORKLOAD_UNAUTHORIZED"
_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
_SECRET_REJECTED = "WORKLOAD_SECRET_REJECTED"


@dataclass
class Shape:
    """The key numbers of a workload document, and the edges and decisions a step added."""

    state: str
    updated_at: int
    attempt_count: int
    retry_count: int
    next_attempt_at: int | None
    fencing_token: int
    #: The lease: (worker, claimed_at, expires_at, last_heartbeat), or None.
    claim: tuple[str, int, int, int] | None
    attempts: int
    #: The last attempt: (worker, status, started_at, ended_at), or None.
    last_attempt: tuple[str, str, int | None, int | None] | None
    checkpoints: int
    result: bool
    rearms: int
    edges: list[tuple[str, str]] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    #: The numbers the new events state (`STATED` evidence), in order: (key, value).
    stated: list[tuple[str, str]] = field(default_factory=list)
    #: The request each new event records: (request id, the operator's operation or None).
    requests: list[tuple[str, str | None]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, for messages."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class Expected:
    """What the core must answer: the refusal code (None: granted), a write, the document."""

    code: str | None
    writes: bool
    shape: Shape | None = None
    #: What the reply must say beyond the document (`universe.reply_fact`), when restated.
    reply: tuple[str, str] | None = None


def _rearms(workload: Workload) -> int:
    return sum(1 for e in workload.execution_history if e.evidence.get("retry") == "operator")


def shape_of(workload: Workload, since: int | None = None) -> Shape:
    """The shape of `workload`; with `since`, the events after the first `since` as added."""
    claim = workload.current_claim
    last = workload.attempts[-1] if workload.attempts else None
    added = workload.execution_history[since:] if since is not None else []
    return Shape(
        state=workload.state,
        updated_at=workload.updated_at,
        attempt_count=workload.attempt_count,
        retry_count=workload.retry_count,
        next_attempt_at=workload.next_attempt_at,
        fencing_token=workload.fencing_token,
        claim=(
            (claim.worker_id, claim.claimed_at, claim.expires_at, claim.last_heartbeat)
            if claim is not None
            else None
        ),
        attempts=len(workload.attempts),
        last_attempt=(
            (last.worker_id, last.status, last.started_at, last.ended_at)
            if last is not None
            else None
        ),
        checkpoints=len(workload.checkpoints),
        result=workload.result is not None,
        rearms=_rearms(workload),
        edges=[(e.from_state or "", e.to) for e in added],
        decisions=[e.evidence["decision"] for e in added if "decision" in e.evidence],
        stated=[(k, e.evidence[k]) for e in added for k in STATED if k in e.evidence],
        requests=[
            (e.evidence["request_id"], e.evidence.get("request_operation"))
            for e in added
            if "request_id" in e.evidence
        ],
    )


#: The evidence keys whose values the oracle states for every new event, in this order.
STATED = ("attempt_budget", "operator_retry", "checkpoint_sequence")


def _budget(w: Workload, rearms: int = 0) -> tuple[str, str]:
    """The attempt budget of `w` as evidence states it, after `rearms` more re-arms."""
    return ("attempt_budget", str(w.retry_policy.max_attempts + _rearms(w) + rearms))


# -- the spec's data, read plainly ------------------------------------------------------------


def _kind(data: SpecFile, state: str) -> str:
    return data.states[state].kind


def _own_edge(data: SpecFile, state: str, operation: str) -> TransitionSpec | None:
    """The table's edge out of `state` listing `operation` that its actor class may take."""
    if _kind(data, state) == "transient":
        return None
    actor = data.operations[operation].actor
    for edge in data.transitions:
        if edge.from_state == state and operation in edge.operations and actor in edge.actors:
            return edge
    return None


def _system_edge(data: SpecFile, state: str, target: str, operation: str) -> bool:
    return any(
        e.from_state == state and e.to == target and operation in e.operations
        for e in data.transitions
    )


def _cancelling(data: SpecFile) -> set[str]:
    """Active states a cancellation of active work leads into (the worker confirms it)."""
    return {
        e.to
        for e in data.transitions
        if "cancel" in e.operations
        and _kind(data, e.from_state) == "active"
        and _kind(data, e.to) == "active"
    }


def _anchor(data: SpecFile, name: str, w: Workload) -> int | None:
    claim = w.current_claim
    if name == "admitted":
        return w.created_at
    if name == "ready_or_eligible":
        since = w.created_at
        for event in reversed(w.execution_history):
            if _kind(data, event.to) == "queued":
                since = event.at
                break
        return since if w.next_attempt_at is None else max(since, w.next_attempt_at)
    if name == "claimed":
        return claim.claimed_at if claim is not None else None
    if name == "started":
        return w.attempts[-1].started_at if w.attempts else None
    if name == "last_heartbeat":
        return claim.last_heartbeat if claim is not None else None
    raise KeyError(name)


def deadline_instants(data: SpecFile, w: Workload) -> list[tuple[str, int]]:
    """Each deadline kind that applies to `w`, in declared order, with the instant it falls."""
    table = data.deadlines
    if w.contract_version < table.contract_version:
        return []
    out: list[tuple[str, int]] = []
    for kind in table.order:
        duration = getattr(w.timeouts, f"{kind}_ms")
        row = table.kinds[kind]
        if duration is None or w.state not in row.while_states:
            continue
        anchor = _anchor(data, row.anchor, w)
        if anchor is not None:
            out.append((kind, anchor + duration))
    return out


def _fallen(data: SpecFile, w: Workload, now: int) -> tuple[str, int] | None:
    for kind, at in deadline_instants(data, w):
        if at <= now:
            return kind, at
    return None


def _backoff(data: SpecFile, w: Workload, n: int) -> int:
    """The wait before the n-th retry: initial * multiplier^(n-1), capped at max."""
    policy = w.retry_policy
    multiplier = data.backoff[policy.backoff].multiplier
    delay = policy.initial_delay_ms
    for _ in range(n - 1):
        if delay >= policy.max_delay_ms:
            break
        delay *= multiplier
    return min(delay, policy.max_delay_ms)


@dataclass(frozen=True)
class _Facts:
    failure_kind: str | None = None
    effect: str | None = None
    bounds: str | None = None


def _holds(data: SpecFile, name: str, w: Workload, facts: _Facts) -> bool:
    retry_on = w.retry_policy.retry_on
    if name == "effect_unknown":
        return facts.effect == "unknown"
    if name == "retries_worker_failure":
        return "worker_failure" in retry_on
    if name == "retries_failure_kind":
        return facts.failure_kind is not None and facts.failure_kind in retry_on
    if name == "retries_timeout":
        return "timeout" in retry_on
    if name == "budget_exhausted":
        return w.attempt_count >= w.retry_policy.max_attempts + _rearms(w)
    if name == "cancellation_requested":
        return w.state in _cancelling(data)
    if name == "deadline_bounds_work":
        return facts.bounds == "work"
    raise KeyError(name)


def _rule(data: SpecFile, policy: PolicySpec, w: Workload, facts: _Facts) -> RuleSpec:
    for rule in policy.rules:
        wanted = [(t[4:], False) if t.startswith("not ") else (t, True) for t in rule.when]
        if all(_holds(data, name, w, facts) is truth for name, truth in wanted):
            return rule
    raise AssertionError("a policy's last rule always matches")


def _decide_by(
    data: SpecFile, s: Shape, name: str, w: Workload, facts: _Facts, now: int
) -> RuleSpec:
    """Apply policy `name` (deciding on `w`) to the expected shape `s`."""
    policy = data.policies[name]
    rule = _rule(data, policy, w, facts)
    if rule.to is None:
        return rule
    if policy.via is not None and not rule.direct and s.state != policy.via:
        s.edges.append((s.state, policy.via))
        s.state = policy.via
    s.edges.append((s.state, rule.to))
    s.decisions.append(rule.decision)
    s.state = rule.to
    s.updated_at = now
    if rule.delay == "backoff":
        s.retry_count += 1
        s.next_attempt_at = now + _backoff(data, w, s.retry_count)
    elif rule.delay == "initial":
        s.retry_count += 1
        s.next_attempt_at = now + w.retry_policy.initial_delay_ms
    return rule


def _take(s: Shape, edge: TransitionSpec, now: int) -> None:
    s.edges.append((s.state, edge.to))
    s.state = edge.to
    s.updated_at = now


def _end_attempt(s: Shape, status: str, now: int) -> None:
    assert s.last_attempt is not None
    s.last_attempt = (s.last_attempt[0], status, s.last_attempt[2], now)


# -- the expected decision ---------------------------------------------------------------------


class _Unmodelled(Exception):
    """The step's operation or its arguments are ones this module does not restate."""


def expect(spec: Spec, w: Workload | None, command: Command, now: int) -> Expected | None:
    """What the core must answer to `command` on `w` at `now`; None where not restated."""
    try:
        expected = _expect(spec.data, w, command, now)
    except _Unmodelled:
        return None
    if w is not None and expected.writes and now < w.updated_at:
        return Expected(_CONFLICT, False)
    request = getattr(command, "request_id", None)
    if request is not None and expected.shape is not None and expected.code is None:
        # Every event a granted claim or operator's call writes records its request
        # (a refusal that writes, a deadline's or a gate's, records none).
        operation = None if isinstance(command, ClaimCommand) else command.op
        expected.shape.requests = [(request, operation)] * len(expected.shape.edges)
    then = spec.data.operations[command.op].then if command.op in spec.data.operations else None
    if then is not None and expected.code is None and expected.shape is not None:
        # Its event is the `then` operation's own, which names no request.
        _then(spec.data, expected.shape, then, now)
    return expected


def _then(data: SpecFile, s: Shape, then: str, now: int) -> None:
    """A granted lease whose operation names `then` (`start`) starts its attempt in the same
    commit: the `then` operation's edge out of the state the claim left, when the table has
    one (else the claim stands alone)."""
    edge = _own_edge(data, s.state, then)
    if edge is None or s.last_attempt is None:
        return
    status = data.operations[then].attempt_status or ""
    s.last_attempt = (s.last_attempt[0], status, now, None)
    _take(s, edge, now)


def _started_by_claim(data: SpecFile, w: Workload) -> bool:
    """Did the current claim start its attempt in its own commit, nothing recorded since?"""
    claim = w.current_claim
    assert claim is not None
    last = w.attempts[-1]
    return (
        any(row.then is not None for row in data.operations.values())
        and last.started_at == claim.claimed_at
        and claim.last_heartbeat == claim.claimed_at
        and all(c.attempt_id != last.attempt_id for c in w.checkpoints)
    )


def _expect(data: SpecFile, w: Workload | None, cmd: Command, now: int) -> Expected:
    if isinstance(cmd, OperatorCommand):
        raise _Unmodelled
    name = cmd.op
    row = data.operations.get(name)
    if row is None:
        raise _Unmodelled
    undeclared = isinstance(cmd, FailCommand) and cmd.kind not in data.failures.kinds
    if undeclared and not data.failures.open:
        return Expected(_INVALID, False)
    if isinstance(cmd, AdmitCommand):
        return _admission(data, w, cmd.request, now)
    if w is None:
        return Expected(_NOT_FOUND, False)
    s = shape_of(w, len(w.execution_history))
    claim = w.current_claim
    fence = getattr(cmd, "fence", None)
    # The operator's request sent again: the first call made with its request id
    # answers it, when it was the same operation by the same actor.
    request = getattr(cmd, "request_id", None)
    operator = (CancelCommand, TimeoutCommand, RetryCommand)
    if isinstance(cmd, operator) and request is not None and row.replay is not None:
        taken = [
            e
            for e in w.execution_history
            if e.evidence.get("request_id") == request and "request_operation" in e.evidence
        ]
        if taken:
            first = taken[0]
            if first.actor != cmd.actor or first.evidence["request_operation"] != name:
                return Expected(_CONFLICT, False)
            # Answered with the state the request's last event led to.
            return Expected(None, False, reply=("state", taken[-1].to))
    # Replays of phase "first": the first call ended the claim the fence names.
    recorded = w.result
    if (
        isinstance(cmd, CompleteCommand)
        and recorded is not None
        and recorded.result_id == cmd.result_id
    ):
        same = (
            recorded.produced_by == cmd.fence.worker_id
            and recorded.provenance.get("claim_id") == cmd.fence.claim_id
            and recorded.provenance.get("fencing_token") == str(cmd.fence.token)
            and _canonical(recorded.output) == _canonical(cmd.output)
        )
        return Expected(None if same else _RESULT_CONFLICT, False)
    if fence is not None and isinstance(cmd, (FailCommand, ConfirmCancelCommand)):
        mine = [
            a
            for a in w.attempts
            if (a.claim_id, a.worker_id, a.fencing_token)
            == (fence.claim_id, fence.worker_id, fence.token)
        ]
        attempt = mine[0] if mine else None
        if attempt is not None and attempt.status == row.attempt_status:
            if isinstance(cmd, ConfirmCancelCommand):
                if claim is None and w.attempts[-1].attempt_id == attempt.attempt_id:
                    return Expected(None, False)
            elif attempt.error == cmd.error:
                for event in reversed(w.execution_history):
                    ev = event.evidence
                    if ev.get("attempt_id") == attempt.attempt_id and "failure_kind" in ev:
                        if ev["failure_kind"] == cmd.kind and (
                            cmd.effect is None or ev.get("effect") == cmd.effect
                        ):
                            return Expected(None, False)
                        break
    if row.deadlines:
        fallen = _fallen(data, w, now)
        if fallen is not None:
            _expire(data, s, w, fallen[0], now)
            return Expected(_TIMED_OUT, True, s)
    if row.fenced:
        assert fence is not None
        if claim is None:
            return Expected(_CLAIM_INVALID, False)
        if (claim.claim_id, claim.worker_id, claim.fencing_token) != (
            fence.claim_id,
            fence.worker_id,
            fence.token,
        ):
            return Expected(_STALE, False)
        if claim.expires_at <= now:
            return Expected(_EXPIRED, False)
    # Replays of phase "live".
    if isinstance(cmd, StartCommand) and w.attempts and w.attempts[-1].started_at is not None:
        return Expected(None, False)
    if isinstance(cmd, CheckpointCommand) and cmd.sequence is not None and row.replay is not None:
        assert claim is not None  # the fence was checked
        so_far = len(w.checkpoints)
        if cmd.sequence > so_far + 1:
            return Expected(_INVALID, False)
        if cmd.sequence <= so_far:
            # Named again: the same call when this attempt recorded it with the same state.
            existing = w.checkpoints[cmd.sequence - 1]
            ours = {a.attempt_id for a in w.attempts if a.fencing_token == claim.fencing_token}
            same = existing.attempt_id in ours and _canonical(existing.state) == _canonical(
                cmd.state
            )
            return Expected(None if same else _CONFLICT, False)
    holds = isinstance(cmd, ClaimCommand) and claim is not None and claim.worker_id == cmd.worker_id
    if (
        holds
        and claim is not None
        and (request is None or claim_request_of(w, claim.fencing_token) == request)
    ):
        # The worker's own claim asked for again (with the request id it was made
        # with, or with none): answered while live and unstarted (or started by the
        # claim itself); once started, the request was answered: refused.
        started = w.attempts[-1].started_at is not None and not _started_by_claim(data, w)
        if started and request is not None:
            return Expected(row.denied, False)
        if not started and claim.expires_at > now:
            return Expected(None, False)
    # The gate: a policy without `via`, decided before the operation's own edge.
    policy = data.policies[row.policy] if row.policy is not None else None
    if policy is not None and policy.via is None:
        diverts = any(
            r.to is not None and _system_edge(data, w.state, r.to, name) for r in policy.rules
        )
        if diverts:
            rule = _rule(data, policy, w, _Facts())
            if rule.to is not None:
                s.edges.append((w.state, rule.to))
                s.decisions.append(rule.decision)
                s.stated.append(_budget(w))
                s.state = rule.to
                s.updated_at = now
                return Expected(rule.refuse or _DENIED, True, s)
    return _effect(data, s, w, cmd, now)


def _canonical(value: Any) -> str:
    """A JSON value as one text (keys sorted): equal texts, the same value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _admission(data: SpecFile, w: Workload | None, request: CreateWorkload, now: int) -> Expected:
    """Admission of `request` at `now`, `w` the workload already admitted under its key."""
    if not request.idempotency_key.strip():
        return Expected(_INVALID, False)
    if any(value == 0 for value in request.timeouts.model_dump().values()):
        return Expected(_INVALID, False)
    policy = request.retry_policy
    if not data.failures.open and set(policy.retry_on) - set(data.failures.kinds):
        return Expected(_INVALID, False)
    if policy.initial_delay_ms > policy.max_delay_ms:
        return Expected(_INVALID, False)
    if any(
        d.required_state is not None and d.required_state not in data.states
        for d in request.dependencies
    ):
        return Expected(_INVALID, False)
    # The grant the request carries: it binds the requester, and holds at `now`.
    grant = request.authorization_snapshot.grant
    if (grant.subject, grant.tenant_id, grant.application_id) != (
        request.requested_by,
        request.tenant_id,
        request.application_id,
    ):
        return Expected(_UNAUTHORIZED, False)
    if grant.status != "active" or not grant.issued_at <= now < grant.expires_at:
        return Expected(_UNAUTHORIZED, False)
    if w is None:
        return Expected(None, True)
    if w.workload_id != _workload_id(request):
        # The workload under the request's key is not the one its scope names.
        return Expected(_CONFLICT, False)
    if not _admitted_as(data, w, request):
        return Expected(_KEY_REUSED, False)
    # The replay: the workload admitted before, not created by this call.
    return Expected(None, False, reply=("created", "False"))


def _workload_id(request: CreateWorkload) -> str:
    """The id design.md's recipe gives a request's workload: its scope, hashed."""
    scope = [
        request.tenant_id,
        request.application_id,
        request.requested_by.kind,
        request.requested_by.id,
        request.idempotency_key,
    ]
    text = json.dumps(scope, separators=(",", ":"), ensure_ascii=False)
    return "workload_" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def _succeeded(data: SpecFile) -> str:
    """The state a dependency naming none requires: the first an edge recording a result
    leads to (the spec's declared semantics of `required_state`)."""
    recording = {name for name, row in data.operations.items() if row.effect == "record_result"}
    return min(e.to for e in data.transitions if recording & set(e.operations))


def _admitted_as(data: SpecFile, w: Workload, request: CreateWorkload) -> bool:
    """Was `w` admitted by this very request (the fields a repeat is compared on)?"""
    history = w.execution_history
    recorded_not_before = history[0].evidence.get("not_before") if history else None
    wanted = request.not_before
    named = {d.workload_id: d.required_state for d in request.dependencies}
    held = {d.workload_id: d.required_state for d in w.dependencies}
    required = _succeeded(data) if named else ""
    return (
        w.requested_by == request.requested_by
        and w.definition_id == request.definition_id
        and w.definition_revision == request.definition_revision
        and w.environment == request.environment
        and _canonical(w.input) == _canonical(request.input)
        and sorted(w.capability_snapshot) == sorted(request.capability_snapshot)
        and sorted(w.connection_scopes) == sorted(request.connection_scopes)
        and w.priority == request.priority
        and w.retry_policy == request.retry_policy
        and w.timeouts == request.timeouts
        and set(named) == set(held)
        # A dependency the request names no state for requires the state a result leads to.
        and all(held[wid] == (state or required) for wid, state in named.items())
        and recorded_not_before == (None if wanted is None else str(wanted))
        and w.concurrency_key == request.concurrency_key
    )


def _expire(data: SpecFile, s: Shape, w: Workload, kind: str, now: int) -> None:
    """Time `w` out for the fallen deadline `kind`; the deadline operation's policy decides."""
    sweep = next(r for r in data.operations.values() if r.effect == "enforce_deadline")
    s.claim = None
    if _kind(data, w.state) != "queued" and w.attempts:
        assert sweep.attempt_status is not None
        _end_attempt(s, sweep.attempt_status, now)
    assert sweep.policy is not None
    bounds = data.deadlines.kinds[kind].bounds
    _decide_by(data, s, sweep.policy, w, _Facts(bounds=bounds), now)


def _effect(data: SpecFile, s: Shape, w: Workload, cmd: Command, now: int) -> Expected:
    name = cmd.op
    row = data.operations[name]
    edge = _own_edge(data, w.state, name)
    status = row.attempt_status or ""
    if isinstance(cmd, ClaimCommand):
        if edge is None:
            return Expected(row.denied, False)
        if w.next_attempt_at is not None and w.next_attempt_at > now:
            return Expected(_NOT_ELIGIBLE, False)
        if set(w.capability_snapshot) - set(cmd.capabilities):
            return Expected(_CAPABILITY, False)
        s.fencing_token += 1
        s.attempt_count += 1
        s.claim = (cmd.worker_id, now, now + cmd.lease_ms, now)
        s.attempts += 1
        s.last_attempt = (cmd.worker_id, status, None, None)
        _take(s, edge, now)
        return Expected(None, True, s)
    if isinstance(cmd, StartCommand):
        if edge is None:
            return Expected(row.denied, False)
        assert s.last_attempt is not None
        s.last_attempt = (s.last_attempt[0], status, now, None)
        _take(s, edge, now)
        return Expected(None, True, s)
    if isinstance(cmd, HeartbeatCommand):
        assert s.claim is not None
        s.claim = (s.claim[0], s.claim[1], now + cmd.extend_ms, now)
        s.updated_at = now
        return Expected(None, True, s)
    if isinstance(cmd, ExecutionContextCommand):
        # Only references under the prefix, each naming something after it.
        prefix = data.secrets.reference_prefix
        if any(not (r.startswith(prefix) and r != prefix) for r in cmd.secret_references):
            return Expected(_SECRET_REJECTED, False)
        # The context of the attempt the fence's claim made: the last one.
        return Expected(None, False, reply=("attempt_id", w.attempts[-1].attempt_id))
    if isinstance(cmd, CheckpointCommand):
        if edge is None:
            return Expected(row.denied, False)
        assert s.last_attempt is not None
        s.last_attempt = (s.last_attempt[0], status, s.last_attempt[2], s.last_attempt[3])
        s.checkpoints += 1
        s.stated.append(("checkpoint_sequence", str(s.checkpoints)))
        _take(s, edge, now)
        return Expected(None, True, s)
    if isinstance(cmd, CompleteCommand):
        if edge is None:
            return Expected(row.denied, False)
        _end_attempt(s, status, now)
        s.result = True
        s.claim = None
        _take(s, edge, now)
        return Expected(None, True, s)
    if isinstance(cmd, FailCommand):
        if edge is None:
            return Expected(row.denied, False)
        started = w.attempts[-1].started_at is not None
        effect = cmd.effect if cmd.effect is not None or started else "none"
        _end_attempt(s, status, now)
        s.claim = None
        assert row.policy is not None
        facts = _Facts(failure_kind=cmd.kind, effect=effect)
        _decide_by(data, s, row.policy, w, facts, now)
        return Expected(None, True, s)
    if isinstance(cmd, CancelCommand):
        if w.state in _cancelling(data):
            return Expected(None, False)
        if edge is None:
            return Expected(row.denied, False)
        if _kind(data, edge.to) == "terminal":
            s.claim = None
        _take(s, edge, now)
        return Expected(None, True, s)
    if isinstance(cmd, ConfirmCancelCommand):
        if edge is None:
            return Expected(row.denied, False)
        if w.attempts:
            _end_attempt(s, status, now)
        s.claim = None
        _take(s, edge, now)
        return Expected(None, True, s)
    if isinstance(cmd, TimeoutCommand):
        if edge is None:
            return Expected(row.denied, False)
        if _kind(data, w.state) != "queued" and w.attempts:
            _end_attempt(s, status, now)
        s.claim = None
        assert row.policy is not None
        _decide_by(data, s, row.policy, w, _Facts(), now)
        return Expected(None, True, s)
    if isinstance(cmd, RetryCommand):
        if edge is None:
            return Expected(row.denied, False)
        if _rearms(w) >= w.retry_policy.max_attempts:
            return Expected(_RETRY_EXHAUSTED, False)
        s.next_attempt_at = now
        s.claim = None
        s.rearms += 1
        s.stated += [_budget(w, 1), ("operator_retry", str(_rearms(w) + 1))]
        _take(s, edge, now)
        return Expected(None, True, s)
    if isinstance(cmd, RecoverCommand):
        claim = w.current_claim
        if claim is None or claim.expires_at > now or edge is None:
            return Expected(None, False)
        s.claim = None
        if w.attempts:
            _end_attempt(s, status, now)
        assert row.policy is not None
        if _decide_by(data, s, row.policy, w, _Facts(), now).to is not None:
            s.stated.append(_budget(w))
        return Expected(None, True, s)
    if isinstance(cmd, EnforceDeadlineCommand):
        fallen = _fallen(data, w, now)
        if fallen is None:
            return Expected(None, False)
        _expire(data, s, w, fallen[0], now)
        return Expected(None, True, s)
    raise _Unmodelled


# -- the hook the checker calls at every step --------------------------------------------------

#: Labels of the worker's and the operator's calls, decided by the core on one document.
_CALLS = frozenset(
    {
        "claim",
        "claim_again",
        "start",
        "heartbeat",
        "execution_context",
        "checkpoint",
        "complete",
        "fail",
        "cancel",
        "timeout",
        "retry",
        "confirm_cancel",
        "admit",
    }
)

_memo: weakref.WeakKeyDictionary[Model, dict[tuple[Any, ...], tuple[str, ...]]] = (
    weakref.WeakKeyDictionary()
)


def _disagreement(
    model: Model,
    expected: Expected,
    before: Workload | None,
    document: str | None,
    refusal: str | None,
    what: str,
    reply: tuple[str, str] | None = None,
) -> str | None:
    """Why the core's outcome (`document` written, `refusal`, `reply`) is not `expected`."""
    wrote = document is not None
    if expected.code != refusal or expected.writes != wrote:
        return (
            f"{what}: the spec answers {expected.code or 'granted'} "
            f"({'a write' if expected.writes else 'no write'}), the core "
            f"{refusal or 'granted'} ({'a write' if wrote else 'no write'})"
        )
    if expected.reply is not None and reply != expected.reply:
        return f"{what}: the reply says {reply}, the spec {expected.reply}"
    if expected.reply is None and reply is not None and reply[0] in ("claim_attempt", "state"):
        # Unless restated above, a claim's reply names the attempt its claim made (the
        # workload's last) and a state reply the state the call leaves the workload in.
        after = model.workload(document) if document is not None else before
        named: str | None = None
        if after is not None and reply[0] == "state":
            named = after.state
        elif after is not None and after.attempts:
            named = after.attempts[-1].attempt_id
        if reply[1] != named:
            return f"{what}: the reply says {reply}, the workload after the call {named}"
    if document is None or expected.shape is None:
        return None
    after = model.workload(document)
    assert after is not None
    since = len(before.execution_history) if before is not None else 0
    got = shape_of(after, since)
    if got != expected.shape:
        differ = sorted(k for k, v in expected.shape.to_dict().items() if got.to_dict()[k] != v)
        detail = ", ".join(
            f"{k}: spec {expected.shape.to_dict()[k]!r}, core {got.to_dict()[k]!r}" for k in differ
        )
        return f"{what}: the document differs from the spec's ({detail})"
    index = model.abstraction.doc(document).index
    instants = [at for _, at in deadline_instants(model.spec.data, after)]
    due = min(instants) if instants else None
    if index.next_deadline_at != due:
        return (
            f"{what}: the index's next deadline is {index.next_deadline_at}, "
            f"the spec's deadline table says {due}"
        )
    return None


def _compare(
    model: Model,
    state: CheckState,
    action: Action,
    before_doc: str | None,
    command: Command,
    now: int,
    document: str | None,
    refusal: str | None,
    what: str,
    reply: tuple[str, str] | None = None,
) -> str | None:
    memo = _memo.setdefault(model, {})
    key = (before_doc, model._command_key(state, action), now, document, refusal, reply)
    known = memo.get(key)
    if known is not None:
        return known[0] if known else None
    before = model.workload(before_doc)
    expected = expect(model.spec, before, command, now)
    problem = (
        None
        if expected is None
        else _disagreement(model, expected, before, document, refusal, what, reply)
    )
    if len(memo) > model.cache_limit:
        memo.clear()
    memo[key] = (problem,) if problem is not None else ()
    return problem


def check_step(model: Model, state: CheckState, action: Action, step: Step) -> list[str]:
    """Where the core's answer to the explored step disagrees with the spec's: messages.

    A worker's or the operator's call is compared on its document; the
    sweeps (`recover_expired`, `enforce_deadlines`) on every document, each
    as that sweep's one-workload decision, and their replies must name exactly
    the workloads they wrote; `claim_next` on the document it
    claimed; a repeated admission on its workload's document. The clock,
    crashes, the racing writer and the spec's `move` operations are not
    compared. A step where the core raised (`universe.RAISED`) is reported
    whatever the action.
    """
    if step.cut or step.noop:
        return []
    label = action.label
    if step.refusal is not None and step.refusal.startswith(RAISED):
        return [f"{label}: the core {step.refusal}, where every refusal is a coded WorkloadError"]
    base = called(label)
    out: list[str] = []
    if base in _CALLS:
        command = model._command(state, action)
        ((slot, before, document),) = step.decision_docs
        problem = _compare(
            model,
            state,
            action,
            before,
            command,
            state.now,
            document,
            step.refusal,
            label,
            step.reply,
        )
        if problem is not None:
            out.append(problem)
        return out
    changed = {slot: after for slot, _before, after in step.decision_docs}
    for slot, before in enumerate(state.docs):
        after = changed.get(slot)
        document = after if after is not None and after != before else None
        wid = model.ids[slot]
        sweep: Command
        if label == "recover_expired":
            sweep = RecoverCommand(workload_id=wid)
        elif label == "enforce_deadlines":
            sweep = EnforceDeadlineCommand(workload_id=wid)
        elif label == "claim_next":
            if document is None:
                continue
            sweep = ClaimCommand(
                workload_id=wid,
                worker_id=worker_name(action.worker),
                capabilities=(CAPABILITY,),
                lease_ms=model.universe.lease_ms,
                request_id=model.claim_request(state, action.worker) or None,
            )
        else:
            return out
        expected = expect(model.spec, model.workload(before), sweep, state.now)
        if expected is None:
            continue
        if label == "claim_next":
            expected = replace(expected, code=step.refusal)
        problem = _disagreement(
            model, expected, model.workload(before), document, expected.code, f"{label}[{slot}]"
        )
        if problem is not None:
            out.append(problem)
    if step.reply is not None and step.reply[0] == "changed":
        # A sweep answers with the workloads it changed: exactly those it wrote.
        wrote = sorted(slot for slot, after in changed.items() if after != state.docs[slot])
        said = sorted(int(slot) for slot in step.reply[1].split(",") if slot)
        if said != wrote:
            out.append(
                f"{label}: the reply names {_slots(model, said)} as changed, the sweep wrote "
                f"{_slots(model, wrote)}"
            )
    return out


def _slots(model: Model, slots: list[int]) -> str:
    return "[" + ", ".join(model.ids[slot] for slot in slots) + "]"
