"""Pauses: operators stop and restart claiming for a tenant, an application, a definition, a key.

A pause is a scheduler gate, not a state of the workloads it covers: work in
a paused scope stays as it is (READY stays READY, and in-flight work runs on,
heartbeats, checkpoints and completes), and no claim (`claim_next`,
`claim_many`, `claim` by id) takes work of the scope until it is resumed. A
claim already being decided when the pause commits may still commit; every
claim that starts after it sees it. Deadlines keep their declared meaning
while paused (`specs/README.md`, "Scheduler gates": deadlines run while
paused): a queue deadline that falls while paused times the work out, as it
would have.

The gate is the store's: a store that keeps pauses never offers work of a
paused scope as a claim candidate (`Store.claim_candidates`,
`BatchStore.claim_batch`), in the same query that finds the candidates, so
claiming costs no extra round trip; a claim by id (`Authority.claim`) reads
the pauses in force first and is refused with `WORKLOAD_NOT_READY`
(`details["paused"]`, the scope's key).

Pauses are kept by the store (`workwarden.storage.base.Pauses`), each pause
and resume written with an audit record (operation `pause` or `resume`, the
scope's key `pause/TENANT/APP/DEFINITION`, the operator, the instant, the
request id). Pausing a paused scope, or resuming one that is not, writes
nothing and answers with what is in force: both are safe to repeat.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field

from workwarden.statemachine import errors, inputs
from workwarden.statemachine.safety import check_text
from workwarden.storage.base import AuditRecord, PauseRecord, Pauses, PauseScope

# The authority is handed in by `Authority`'s own methods; typed loosely so this
# module does not import the one that imports it.
Authority = Any

__all__ = ["PauseReply", "pause", "pause_record", "pause_reply", "paused", "resume", "scope_of"]


class PauseReply(BaseModel):
    """A pause in force as JSON (`PauseRecord`): its scope, since when, by whom and why.

    The reply of a pause over the HTTP API and in the conformance vectors alike.
    """

    model_config = ConfigDict(extra="forbid")

    scope: str = Field(description="the scope's key, pause/TENANT/APP/DEFINITION[/KEY]")
    tenant: str
    application: str | None
    definition: str | None
    concurrency_key: str | None = Field(
        default=None, description="the concurrency key the pause is narrowed to, if any"
    )
    since: int = Field(description="when it was paused, in ms")
    actor: str = Field(description="the operator who paused it")
    reason: str | None
    request_id: str | None


def pause_reply(record: PauseRecord) -> PauseReply:
    """The JSON model of a pause in force."""
    scope = record.scope
    return PauseReply(
        scope=scope.key,
        tenant=scope.tenant,
        application=scope.application,
        definition=scope.definition,
        concurrency_key=scope.concurrency_key,
        since=record.since,
        actor=record.actor,
        reason=record.reason,
        request_id=record.request_id,
    )


def pause_record(reply: PauseReply) -> PauseRecord:
    """The `PauseRecord` a `PauseReply` carries."""
    scope = PauseScope(reply.tenant, reply.application, reply.definition, reply.concurrency_key)
    return PauseRecord(scope, reply.since, reply.actor, reply.reason, reply.request_id)


def scope_of(
    tenant: Any, application: Any = None, definition: Any = None, concurrency_key: Any = None
) -> PauseScope:
    """The scope named by the arguments, checked (`WORKLOAD_INVALID` for a bad one)."""
    tenant = inputs.as_name(tenant, "tenant")
    application = None if application is None else inputs.as_name(application, "application")
    definition = None if definition is None else inputs.as_name(definition, "definition")
    if definition is not None and application is None:
        raise errors.bad_argument("definition", "a definition's pause names its application")
    key = None if concurrency_key is None else inputs.as_name(concurrency_key, "concurrency_key")
    return PauseScope(tenant, application, definition, key)


def _store(authority: Authority) -> Pauses:
    store = authority.store
    if not isinstance(store, Pauses):
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE,
            f"the store ({type(store).__name__}) does not keep pauses",
        )
    return store


def _audit(
    scope: PauseScope, operation: str, actor: str, now: int, reason: str | None, request_id: Any
) -> AuditRecord:
    body = json.dumps(
        {
            "operation": operation,
            "scope": scope.key,
            "actor": actor,
            "at": now,
            "reason": reason,
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    return AuditRecord(
        transaction_id="tx_" + hashlib.sha256(f"{body}\x1f{request_id}".encode()).hexdigest()[:24],
        key=scope.key,
        version=0,
        actor=actor,
        operation=operation,
        tenant=scope.tenant,
        application=scope.application or "*",
        at=now,
        digest=digest,
        request_id=request_id,
    )


def _current(authority: Authority, scope: PauseScope) -> PauseRecord | None:
    for record in paused(authority, scope.tenant):
        if record.scope == scope:
            return record
    return None


def pause(
    authority: Authority,
    scope: PauseScope,
    actor: Any,
    now: int,
    reason: Any = None,
    request_id: Any = None,
) -> PauseRecord:
    """Pause claiming in `scope`; the pause in force (the earlier one if it was paused)."""
    inputs.check_now(now)
    actor = inputs.as_name(actor, "actor")
    if reason is not None:
        reason = inputs.as_prose(reason, "reason")
        check_text(authority.spec, reason, "reason")
    if request_id is not None:
        request_id = inputs.as_name(request_id, "request_id")
    store = _store(authority)
    record = PauseRecord(scope, now, actor, reason, request_id)
    audit = _audit(scope, "pause", actor, now, reason, request_id)
    changed = authority._store_call(store.set_pause, scope, record, audit)
    if changed:
        return record
    current = _current(authority, scope)
    return current if current is not None else record


def resume(
    authority: Authority, scope: PauseScope, actor: Any, now: int, request_id: Any = None
) -> bool:
    """Resume claiming in `scope`; True when it was paused (False: nothing to resume)."""
    inputs.check_now(now)
    actor = inputs.as_name(actor, "actor")
    if request_id is not None:
        request_id = inputs.as_name(request_id, "request_id")
    store = _store(authority)
    audit = _audit(scope, "resume", actor, now, None, request_id)
    return bool(authority._store_call(store.set_pause, scope, None, audit))


def paused(authority: Authority, tenant: Any = None) -> list[PauseRecord]:
    """The pauses in force, of `tenant` or of every tenant, by scope key.

    A store that keeps no pauses has none in force.
    """
    tenant = None if tenant is None else inputs.as_name(tenant, "tenant")
    if not authority._provides(Pauses):
        return []
    store = cast(Pauses, authority.store)
    records: list[PauseRecord] = authority._store_call(store.paused, tenant)
    return records
