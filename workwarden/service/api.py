"""The HTTP JSON API: one endpoint per `Authority` operation, under `/v1`.

Every request body is a model of `workwarden.statemachine` (a command of
`commands.py`, `CreateWorkload` for an admission) and every reply the model
the authority answers with, so `/openapi.json` is generated from them. Each
call's instant is the service's clock (or the test clock's
`X-Workwarden-Now`), never a field of the body. Each call needs a bearer
token whose actor class the spec's operations table allows
(`workwarden.service.auth`); a refusal is a problem document
(`workwarden.service.problems`). The batch endpoints are added from
`workwarden.service.batches`, the operators' pauses and purge from
`workwarden.service.operators`. `docs/service.md` lists the endpoints.
"""

import dataclasses
import json
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from workwarden.service import tracing
from workwarden.service.auth import Caller, forbidden
from workwarden.service.batches import batch_routes
from workwarden.service.operators import operator_routes
from workwarden.service.routing import Authed, GuardedRoute, Now, json_reply
from workwarden.service.state import Service
from workwarden.statemachine import errors, inputs, listing
from workwarden.statemachine.commands import (
    AdmitReply,
    CancelCommand,
    CheckpointCommand,
    ClaimCommand,
    ClaimNextCommand,
    CompleteCommand,
    ConfirmCancelCommand,
    ExecutionContextCommand,
    FailCommand,
    HeartbeatCommand,
    OperatorCommand,
    RetryCommand,
    StartCommand,
    StateReply,
    TimeoutCommand,
    WorkloadPage,
)
from workwarden.statemachine.conformance.runner import ReferenceImplementation
from workwarden.statemachine.core import operation_of
from workwarden.statemachine.models import (
    Attempt,
    Checkpoint,
    Claim,
    ClaimReply,
    CreateWorkload,
    ExecutionContext,
    Name,
    Result,
    Workload,
)

__all__ = ["SweepRequest", "api_router"]


class SweepRequest(BaseModel):
    """The scope of a sweep: a tenant and/or application, or every workload (both omitted)."""

    model_config = ConfigDict(extra="forbid")

    tenant: Name | None = None
    application: Name | None = None


def api_router(service: Service) -> APIRouter:
    """The `/v1` routes over `service`."""
    router = APIRouter(prefix="/v1", tags=["authority"], route_class=GuardedRoute)

    def run(command: Any, at: int) -> Any:
        return service.authority.execute(command, at)

    @router.post("/admit", response_model=AdmitReply, summary="Admit a workload")
    def admit(body: CreateWorkload, who: Authed, at: Now) -> Response:
        """`Authority.admit`: admit the request, or answer the original admission of its key."""
        reply = service.call("admit", who, lambda: service.authority.admit(body, at))
        tracing.annotate(workload_id=reply.workload.workload_id)
        return json_reply(reply)

    @router.post("/claim", response_model=ClaimReply, summary="Claim READY work by id")
    def claim(body: ClaimCommand, who: Authed, at: Now) -> Response:
        """`Authority.claim`: a lease until now + lease_ms under a new fencing token.

        Refused `WORKLOAD_NOT_READY` (`details.paused`) while the work's scope
        is paused, as through `/v1/execute` and `/v1/claim_next`.
        """

        def go() -> ClaimReply:
            return service.authority.claim(
                body.workload_id,
                body.worker_id,
                body.capabilities,
                at,
                body.lease_ms,
                request_id=body.request_id,
            )

        return json_reply(
            service.call(
                "claim",
                who,
                go,
                acting_as=body.worker_id,
                workload_id=body.workload_id,
            )
        )

    @router.post(
        "/claim_next", response_model=ClaimReply | None, summary="Claim the best claimable work"
    )
    def claim_next(body: ClaimNextCommand, who: Authed, at: Now) -> Response:
        """`Authority.claim_next`: the claim, or `null` when nothing is claimable."""

        def go() -> ClaimReply | None:
            return service.authority.claim_next(
                body.tenant_id,
                body.application_id,
                body.worker_id,
                body.capabilities,
                at,
                body.lease_ms,
                request_id=body.request_id,
            )

        return json_reply(service.call("claim_next", who, go, acting_as=body.worker_id))

    def fenced(op: str, reply: type[BaseModel], summary: str, model: type[BaseModel]) -> None:
        def endpoint(body: Any, who: Authed, at: Now) -> Response:
            kind = getattr(body, "kind", None)
            return json_reply(
                service.call(
                    op,
                    who,
                    lambda: run(body, at),
                    acting_as=body.fence.worker_id,
                    kind=kind,
                    workload_id=body.workload_id,
                )
            )

        endpoint.__annotations__ = {"body": model, "who": Authed, "at": Now, "return": Response}
        endpoint.__doc__ = f"`Authority.{op}`: {summary.lower()}, through the fence."
        endpoint.__name__ = op
        router.post(f"/{op}", response_model=reply, summary=summary)(endpoint)

    fenced("start", Attempt, "Start the claimed attempt", StartCommand)
    fenced("heartbeat", Claim, "Extend the lease", HeartbeatCommand)
    fenced(
        "execution_context",
        ExecutionContext,
        "Read the execution context",
        ExecutionContextCommand,
    )
    fenced("checkpoint", Checkpoint, "Record a checkpoint", CheckpointCommand)
    fenced("complete", Result, "Record the result", CompleteCommand)
    fenced("fail", StateReply, "Report a failure", FailCommand)
    fenced("confirm_cancel", StateReply, "Confirm a requested cancellation", ConfirmCancelCommand)

    def operator(op: str, summary: str, model: type[BaseModel]) -> None:
        def endpoint(body: Any, who: Authed, at: Now) -> Response:
            name = _authorized_as(service, body) if isinstance(body, OperatorCommand) else op
            return json_reply(
                service.call(
                    name,
                    who,
                    lambda: run(body, at),
                    acting_as=body.actor,
                    workload_id=body.workload_id,
                )
            )

        endpoint.__annotations__ = {"body": model, "who": Authed, "at": Now, "return": Response}
        endpoint.__doc__ = f"`Authority.{op}`: {summary.lower()}; the actor is the token's subject."
        endpoint.__name__ = op
        router.post(f"/{op}", response_model=StateReply, summary=summary)(endpoint)

    operator("cancel", "Cancel, or request cancellation", CancelCommand)
    operator("timeout", "Time the workload out", TimeoutCommand)
    operator("retry", "Re-arm failed, timed-out or dead-lettered work", RetryCommand)
    operator("operate", "Take an operation the spec adds (effect move)", OperatorCommand)

    @router.post("/recover_expired", response_model=list[str], summary="Recover expired leases")
    def recover_expired(who: Authed, at: Now, body: SweepRequest | None = None) -> Response:
        """`Authority.recover_expired`: the ids of the workloads recovered."""
        scope = body or SweepRequest()
        return json_reply(
            service.call(
                "recover_expired",
                who,
                lambda: service.authority.recover_expired(
                    at, tenant=scope.tenant, application=scope.application
                ),
            )
        )

    @router.post("/enforce_deadlines", response_model=list[str], summary="Enforce fallen deadlines")
    def enforce_deadlines(who: Authed, at: Now, body: SweepRequest | None = None) -> Response:
        """`Authority.enforce_deadlines`: the ids of the workloads timed out."""
        scope = body or SweepRequest()
        return json_reply(
            service.call(
                "enforce_deadlines",
                who,
                lambda: service.authority.enforce_deadlines(
                    at, tenant=scope.tenant, application=scope.application
                ),
            )
        )

    @router.post("/execute", summary="Decide a command of the core, told apart by its op")
    def execute(body: dict[str, Any], who: Authed, at: Now) -> Response:
        """`Authority.execute`: a command of the core (the JSON of a command model, with `op`).

        The typed endpoints above are the API; this one takes a command as
        the conformance protocol carries it, and refuses a malformed one
        with `WORKLOAD_INVALID`, as it refuses an `op` that is not a command
        of the core (`claim_next`, which chooses its workload, the batch
        calls, the pauses, `purge`, the reads: each has its own route).
        """
        # Parsed first: an op that is no command of the core, or a malformed command, is
        # WORKLOAD_INVALID whoever calls (not WORKWARDEN_FORBIDDEN for one token class).
        command = inputs.as_command(body)
        op = body.get("op")
        name = op if isinstance(op, str) else "-"
        if isinstance(command, OperatorCommand):
            name = _authorized_as(service, command)
        actor = body.get("actor")
        wid = body.get("workload_id")
        fence = body.get("fence")
        if isinstance(fence, dict) and isinstance(fence.get("worker_id"), str):
            actor = fence["worker_id"]
        elif isinstance(body.get("worker_id"), str):
            actor = body["worker_id"]
        return json_reply(
            service.call(
                name,
                who,
                lambda: run(command, at),
                acting_as=actor if isinstance(actor, str) else None,
                # A failure report's kind labels the failures metric, as on `/v1/fail`.
                kind=command.kind if isinstance(command, FailCommand) else None,
                workload_id=wid if isinstance(wid, str) else None,
            )
        )

    @router.get("/workloads/{workload_id:path}", response_model=Workload, summary="Read one")
    def get(
        workload_id: str,
        who: Authed,
        tenant: Annotated[str | None, Query()] = None,
        application: Annotated[str | None, Query()] = None,
    ) -> Response:
        """`Authority.get`: the committed workload (scoped: another scope's is not found)."""
        return json_reply(
            service.call(
                "get",
                who,
                lambda: service.authority.get(workload_id, tenant=tenant, application=application),
                workload_id=workload_id,
            )
        )

    @router.get("/workloads", response_model=list[Workload], summary="List a scope's workloads")
    def list_(
        who: Authed,
        tenant: Annotated[str, Query()],
        application: Annotated[str, Query()],
    ) -> Response:
        """`Authority.list`: every workload of a tenant and application."""
        return json_reply(
            service.call("list", who, lambda: service.authority.list(tenant, application))
        )

    @router.get(
        "/list_page", response_model=WorkloadPage, summary="List a scope's workloads by pages"
    )
    def list_page(
        who: Authed,
        tenant: Annotated[str, Query()],
        application: Annotated[str, Query()],
        limit: Annotated[str, Query()],
        after: Annotated[str | None, Query()] = None,
    ) -> Response:
        """`Authority.list_page`: the next `limit` workloads after `after`, and the next cursor."""
        return json_reply(
            service.call(
                "list_page",
                who,
                lambda: service.authority.list_page(tenant, application, _page_limit(limit), after),
            )
        )

    batch_routes(router, service)
    operator_routes(router, service)
    if service.config.allow_reset:
        _test_routes(router, service)
    return router


def _page_limit(text: str) -> int:
    """`limit` of `/v1/list_page` as a number: ASCII digits only (not `+5`, `1_000` or `²`),
    else `WORKLOAD_INVALID` naming it; its range is `Authority.list_page`'s to check."""
    if not (text.isascii() and text.isdigit()) or len(text) > 8:
        raise errors.bad_argument(
            "limit", f"limit must be a whole number from 1 to {listing.MAX_PAGE}"
        )
    return int(text)


def _authorized_as(service: Service, command: OperatorCommand) -> str:
    """The operation an `operate` call is authorized (and its span named) as: the one it
    names, unless the spec has that operation with an effect `operate` does not take
    (`claim`, a worker's row). That call is authorized as `operate`, which no row names, so
    the authority refuses it `WORKLOAD_INVALID`, as the library does, whichever token calls,
    not `WORKWARDEN_FORBIDDEN`. (An operation the spec lacks is let through as it is.)"""
    if command.operation not in service.spec.operations:
        return command.operation
    try:
        operation_of(service.spec, command)
    except errors.WorkloadError:
        return "operate"
    return command.operation


def _test_routes(router: APIRouter, service: Service) -> None:
    @router.post("/test/reset", tags=["test"], summary="Empty the store (serve --allow-reset)")
    def reset(body: dict[str, Any], who: Authed) -> Response:
        """Start a fresh memory store holding `store`, verifying grants with `grant_keys`.

        The conformance protocol's `reset` request, less its `type`. Served
        only by `workwarden serve --allow-reset` over a memory store, and
        only to operators.
        """
        _operator(who)
        reference = ReferenceImplementation(service.spec)
        answer = reference.handle({**body, "type": "reset"})
        if "error" in answer:
            raise errors.WorkloadError(errors.INVALID, answer["error"]["message"])
        keys = {str(k): bytes.fromhex(v) for k, v in dict(body.get("grant_keys") or {}).items()}
        service.use(reference.store, keys or None)
        return json_reply(None)

    @router.get("/test/store", tags=["test"], summary="Every document (serve --allow-reset)")
    def store(who: Authed) -> Response:
        """Every document with its key and version, as the conformance protocol's `store`."""
        _operator(who)
        return json_reply(
            [
                {"key": d.key, "version": d.version, "document": json.loads(d.document)}
                for d in service.store.scan()
            ]
        )

    @router.get("/test/audit", tags=["test"], summary="Every audit record (serve --allow-reset)")
    def audit(who: Authed) -> Response:
        """Every audit record, in order, as JSON: what a test compares before and after a call."""
        _operator(who)
        return json_reply([dataclasses.asdict(r) for r in service.store.audit_log()])


def _operator(caller: Caller) -> None:
    if caller.actor_class != "operator":
        raise forbidden(
            "wrong_actor_class",
            "the test routes are an operator's",
            actor_class=caller.actor_class,
        )
