"""Admission: checking a request, deriving its identity, and answering a replay.

The idempotency scope is (tenant, application, requester kind, requester id,
key), encoded as a JSON array so that no choice of values makes two scopes
coincide; the workload id is derived from it by hashing, so competing
admissions of one scope contend on one require-absent write. A repeated key is
answered with the original workload only when the eleven execution fields are
equal after normalisation; otherwise `IDEMPOTENCY_KEY_REUSED` names each
conflicting field.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from workwarden.statemachine import errors
from workwarden.statemachine.commands import AdmitReply
from workwarden.statemachine.draft import Draft
from workwarden.statemachine.models import CreateWorkload, Dependency, Event, Workload
from workwarden.statemachine.safety import check_json, digest, text_digest
from workwarden.statemachine.spec import Spec

__all__ = [
    "FENCING_FLOOR",
    "admission_scope",
    "decide_admission",
    "execution_fields",
    "fencing_floor",
    "workload_id_for",
]

#: The execution fields compared on replay, in the order they are reported.
EXECUTION_FIELDS: tuple[str, ...] = (
    "definition_id",
    "definition_revision",
    "environment",
    "input",
    "capability_snapshot",
    "connection_scopes",
    "priority",
    "retry_policy",
    "timeouts",
    "dependencies",
    "not_before",
)


def admission_scope(request: CreateWorkload) -> str:
    """The idempotency scope of a request, unambiguously encoded."""
    return json.dumps(
        [
            request.tenant_id,
            request.application_id,
            request.requested_by.kind,
            request.requested_by.id,
            request.idempotency_key,
        ],
        separators=(",", ":"),
        ensure_ascii=False,
    )


def workload_id_for(request: CreateWorkload) -> str:
    """The workload id a request admits under: derived from its scope."""
    scope = admission_scope(request).encode("utf-8")
    return "workload_" + hashlib.sha256(scope).hexdigest()[:24]


def with_required_states(spec: Spec, deps: tuple[Dependency, ...]) -> tuple[Dependency, ...]:
    """The dependencies with each omitted `required_state` filled in: where a result leads."""
    if all(d.required_state is not None for d in deps):
        return deps
    succeeded = min(spec.roles.succeeded)
    return tuple(
        d if d.required_state is not None else d.model_copy(update={"required_state": succeeded})
        for d in deps
    )


def _dependencies(deps: Any) -> list[list[str]]:
    return sorted([d.workload_id, d.required_state] for d in deps)


def execution_fields(
    *,
    definition_id: str,
    definition_revision: str,
    environment: str,
    input_hash: str,
    capability_snapshot: tuple[str, ...],
    connection_scopes: tuple[str, ...],
    priority: int,
    retry_policy: Any,
    timeouts: Any,
    dependencies: Any,
    not_before: int | None,
) -> dict[str, Any]:
    """The normalised execution fields of an admission, by name."""
    return {
        "definition_id": definition_id,
        "definition_revision": definition_revision,
        "environment": environment,
        "input": input_hash,
        "capability_snapshot": list(capability_snapshot),
        "connection_scopes": list(connection_scopes),
        "priority": priority,
        "retry_policy": retry_policy.model_dump(mode="json"),
        "timeouts": timeouts.model_dump(mode="json"),
        "dependencies": _dependencies(dependencies),
        "not_before": not_before,
    }


#: The admission event's evidence naming the tombstone of the key's purged
#: namesake, when it had one: every token this workload issues is above it.
FENCING_FLOOR = "fencing_floor"


def fencing_floor(events: Sequence[Event]) -> int:
    """The token a history's first claim must exceed: its admission's `fencing_floor`, or 0.

    A workload admitted under a key purged before continues the purged
    one's tokens past the purge's tombstone (a version, above every token
    the purged workload issued, since each claim was one of its writes), so
    that no fence of the purged workload is issued again.
    """
    value = events[0].evidence.get(FENCING_FLOOR) if events else None
    return int(value) if value is not None and value.isdigit() else 0


def admitted_not_before(workload: Workload) -> int | None:
    """The `not_before` a workload was admitted with (from its admission event)."""
    history = workload.execution_history
    if not history:
        return None
    # The admitting edge is the first event of every history.
    value = history[0].evidence.get("not_before")
    return int(value) if value is not None else None


def _replay(spec: Spec, existing: Workload, request: CreateWorkload) -> AdmitReply:
    recorded = execution_fields(
        definition_id=existing.definition_id,
        definition_revision=existing.definition_revision,
        environment=existing.environment,
        input_hash=existing.input_hash,
        capability_snapshot=existing.capability_snapshot,
        connection_scopes=existing.connection_scopes,
        priority=existing.priority,
        retry_policy=existing.retry_policy,
        timeouts=existing.timeouts,
        dependencies=existing.dependencies,
        not_before=admitted_not_before(existing),
    )
    requested = execution_fields(
        definition_id=request.definition_id,
        definition_revision=request.definition_revision,
        environment=request.environment,
        input_hash=digest(request.input),
        capability_snapshot=request.capability_snapshot,
        connection_scopes=request.connection_scopes,
        priority=request.priority,
        retry_policy=request.retry_policy,
        timeouts=request.timeouts,
        dependencies=with_required_states(spec, request.dependencies),
        not_before=request.not_before,
    )
    conflicting = [name for name in EXECUTION_FIELDS if recorded[name] != requested[name]]
    if existing.concurrency_key != request.concurrency_key:
        conflicting.append("concurrency_key")
    if existing.requested_by != request.requested_by:
        conflicting.insert(0, "requested_by")
    if conflicting:
        raise errors.WorkloadError(
            errors.IDEMPOTENCY_KEY_REUSED,
            "idempotency key was already used for a different request",
            {"fields": conflicting},
        )
    return AdmitReply(workload=existing, created=False)


def _check_request(spec: Spec, request: CreateWorkload, now: int) -> str:
    """Refuse a request that may not be admitted; return its input's canonical JSON."""
    canonical_input = check_json(spec, request.input, "input")
    if not request.idempotency_key.strip():
        raise errors.WorkloadError(
            errors.INVALID, "idempotency key is required", {"field": "idempotency_key"}
        )
    zero = [name for name, value in request.timeouts.model_dump().items() if value == 0]
    if zero:
        raise errors.WorkloadError(
            errors.INVALID,
            "a timeout must be at least 1 ms; omit it for no deadline",
            {"fields": [f"timeouts.{name}" for name in zero]},
        )
    policy = request.retry_policy
    spec.check_retry_on(policy.retry_on)
    if policy.initial_delay_ms > policy.max_delay_ms:
        raise errors.WorkloadError(
            errors.INVALID,
            "retry_policy.initial_delay_ms exceeds max_delay_ms",
            {"field": "retry_policy.initial_delay_ms"},
        )
    for index, dependency in enumerate(request.dependencies):
        if dependency.required_state is not None and dependency.required_state not in spec.states:
            raise errors.WorkloadError(
                errors.INVALID,
                f"unknown required_state {dependency.required_state!r}",
                {"field": f"dependencies[{index}].required_state"},
            )
    grant = request.authorization_snapshot.grant
    if (
        grant.subject != request.requested_by
        or grant.tenant_id != request.tenant_id
        or grant.application_id != request.application_id
    ):
        raise errors.WorkloadError(
            errors.UNAUTHORIZED, "authorization snapshot does not bind the requester"
        )
    if grant.status != "active" or not grant.issued_at <= now < grant.expires_at:
        raise errors.WorkloadError(
            errors.UNAUTHORIZED,
            "authorization snapshot is not active at the admission instant",
            {"status": grant.status, "issued_at": grant.issued_at, "expires_at": grant.expires_at},
        )
    return canonical_input


def decide_admission(
    spec: Spec,
    existing: Workload | None,
    request: CreateWorkload,
    now: int,
    tombstone: int | None = None,
) -> tuple[Workload | None, AdmitReply, Draft | None]:
    """Check and admit `request`, or answer the replay of an earlier admission.

    `tombstone`: the key was purged before, at that version; the new
    workload's fencing tokens start past it (`fencing_floor`).
    """
    canonical_input = _check_request(spec, request, now)
    workload_id = workload_id_for(request)
    if existing is not None:
        if existing.workload_id != workload_id:
            raise errors.WorkloadError(
                errors.CONFLICT, "the stored workload does not match the admission scope"
            )
        return None, _replay(spec, existing, request), None
    created = Workload(
        contract_version=spec.contract_version,
        workload_id=workload_id,
        tenant_id=request.tenant_id,
        application_id=request.application_id,
        environment=request.environment,
        definition_id=request.definition_id,
        definition_revision=request.definition_revision,
        trigger=request.trigger,
        input=request.input,
        input_hash=text_digest(canonical_input),
        requested_by=request.requested_by,
        session_id=request.session_id,
        authorization_snapshot=request.authorization_snapshot,
        capability_snapshot=request.capability_snapshot,
        connection_scopes=request.connection_scopes,
        priority=request.priority,
        idempotency_key=request.idempotency_key,
        created_at=now,
        updated_at=now,
        state=spec.initial_state,
        retry_policy=request.retry_policy,
        timeouts=request.timeouts,
        next_attempt_at=request.not_before,
        dependencies=with_required_states(spec, request.dependencies),
        concurrency_key=request.concurrency_key,
        fencing_token=tombstone or 0,
    )
    draft = Draft(spec, created, now, "admit", adopt=True)
    evidence = {} if request.not_before is None else {"not_before": str(request.not_before)}
    if tombstone:
        evidence[FENCING_FLOOR] = str(tombstone)
    admit = spec.operations[draft.operation]
    # Checked at load: the admitting operation takes one edge, out of the initial state.
    edge = spec.edges_for(created.state, admit.name)[0]
    draft.move(
        edge.to,
        actor=admit.spec.acting_as or admit.actor,
        actor_class=admit.actor,
        evidence=evidence,
    )
    return draft.workload, AdmitReply(workload=draft.workload, created=True), draft
