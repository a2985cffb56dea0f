"""The batch endpoints: `admit_many`, `claim_many` and `report_many` over HTTP.

Each is `Authority`'s batch call of the same name (`workwarden.statemachine.
batches`), one round trip for many workloads. A batch body is validated as
a whole (a malformed item is `WORKLOAD_INVALID` naming `requests.N.field`,
and nothing runs); then every item is decided on its own, and the reply has
one slot per item, in order: `{"ok": reply}`, the reply its one-call
endpoint gives, or `{"problem": document}`, the problem document its
one-call endpoint answers with (the catalogue code, class and the HTTP
status that call would have). A refused slot never stops the others.
`claim_many` answers a list of claims, as `Authority.claim_many` does.

A batch is authorized as its items' one calls would be, every item before
any of them runs: admission as `admit` is, claims as `claim_next` (a
worker's, as the token's subject), each report as its operation (`start`,
`complete`, ...: a worker's, with the fence's `worker_id` the token's
subject). A batch with one item the token may not make is refused whole,
`WORKWARDEN_FORBIDDEN`, and writes nothing.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from workwarden.service import tracing
from workwarden.service.problems import Problem, problem_body
from workwarden.service.routing import Authed, Now, json_reply
from workwarden.service.state import Service
from workwarden.statemachine import errors
from workwarden.statemachine.batches import MAX_BATCH
from workwarden.statemachine.commands import (
    AdmitReply,
    CheckpointCommand,
    CompleteCommand,
    ConfirmCancelCommand,
    FailCommand,
    HeartbeatCommand,
    LeaseMs,
    RequestId,
    StartCommand,
    StateReply,
)
from workwarden.statemachine.models import (
    Attempt,
    Checkpoint,
    Claim,
    ClaimReply,
    CreateWorkload,
    Name,
    Result,
    StrSet,
)

__all__ = [
    "AdmitBatch",
    "AdmitSlot",
    "ClaimBatch",
    "ReportBatch",
    "ReportSlot",
    "WireReport",
    "batch_routes",
    "slot",
]

WireReport = Annotated[
    StartCommand
    | HeartbeatCommand
    | CheckpointCommand
    | CompleteCommand
    | FailCommand
    | ConfirmCancelCommand,
    Field(discriminator="op"),
]
"""One report of a `report_many` body, told apart by its `op` (which it must carry)."""


class AdmitBatch(BaseModel):
    """The body of `POST /v1/admit_many`: the requests, as `POST /v1/admit` takes each."""

    model_config = ConfigDict(extra="forbid")

    requests: list[CreateWorkload] = Field(
        json_schema_extra={"maxItems": MAX_BATCH},
        description=f"at most {MAX_BATCH} (a longer batch is WORKLOAD_INVALID, nothing written)",
    )


class ClaimBatch(BaseModel):
    """The body of `POST /v1/claim_many`: `claim_next`'s fields and the most claims to take."""

    model_config = ConfigDict(extra="forbid")

    tenant_id: Name
    application_id: Name
    worker_id: Name
    capabilities: StrSet = ()
    lease_ms: LeaseMs
    limit: int = Field(
        strict=True,
        json_schema_extra={"minimum": 1, "maximum": MAX_BATCH},
        description=f"the most claims to take, 1 to {MAX_BATCH}",
    )
    request_id: RequestId | None = None


class ReportBatch(BaseModel):
    """The body of `POST /v1/report_many`: the worker's fenced reports, each with its `op`."""

    model_config = ConfigDict(extra="forbid")

    reports: list[WireReport] = Field(
        json_schema_extra={"maxItems": MAX_BATCH},
        description=f"at most {MAX_BATCH}: start, heartbeat, checkpoint, complete, fail or"
        " confirm_cancel commands",
    )


class AdmitSlot(BaseModel):
    """One slot of `admit_many`'s reply: the admission's reply, or its problem document."""

    ok: AdmitReply | None = None
    problem: Problem | None = None


class ReportSlot(BaseModel):
    """One slot of `report_many`'s reply: the report's reply (by its `op`), or its problem."""

    ok: Attempt | Claim | Checkpoint | Result | StateReply | None = None
    problem: Problem | None = None


def slot(outcome: Any) -> dict[str, Any]:
    """One slot of a batch reply as JSON data: `{"ok": reply}` or `{"problem": document}`."""
    if isinstance(outcome, errors.WorkloadError):
        return {"problem": problem_body(outcome)}
    if isinstance(outcome, BaseModel):
        return {"ok": outcome.model_dump(mode="json", by_alias=True)}
    return {"ok": outcome}


def _code(outcome: Any) -> str | None:
    return outcome.code if isinstance(outcome, errors.WorkloadError) else None


def batch_routes(router: APIRouter, service: Service) -> None:
    """Add the batch endpoints over `service` to the `/v1` router."""

    @router.post(
        "/admit_many", response_model=list[AdmitSlot], summary="Admit many workloads at once"
    )
    def admit_many(body: AdmitBatch, who: Authed, at: Now) -> Response:
        """`Authority.admit_many`: each slot what `POST /v1/admit` answers for its request."""
        outcomes = service.batch(
            "admit_many",
            who,
            [("admit", None)],
            lambda: service.authority.admit_many(body.requests, at),
        )
        tracing.annotate_batch(
            [o.workload.workload_id for o in outcomes if isinstance(o, AdmitReply)],
            [_code(o) for o in outcomes],
        )
        return json_reply([slot(o) for o in outcomes])

    @router.post(
        "/claim_many", response_model=list[ClaimReply], summary="Claim many workloads at once"
    )
    def claim_many(body: ClaimBatch, who: Authed, at: Now) -> Response:
        """`Authority.claim_many`: up to `limit` claims, each as `claim_next` gives one."""
        claims = service.batch(
            "claim_many",
            who,
            [("claim_next", body.worker_id)],
            lambda: service.authority.claim_many(
                body.tenant_id,
                body.application_id,
                body.worker_id,
                body.capabilities,
                at,
                body.lease_ms,
                body.limit,
                request_id=body.request_id,
            ),
        )
        tracing.annotate_batch([c.workload_id for c in claims], [None for _ in claims])
        return json_reply(claims)

    @router.post(
        "/report_many", response_model=list[ReportSlot], summary="Report for many workloads at once"
    )
    def report_many(body: ReportBatch, who: Authed, at: Now) -> Response:
        """`Authority.report_many`: each slot what the report's one-call endpoint answers."""
        reports = body.reports
        kinds = {r.workload_id: r.kind for r in reports if isinstance(r, FailCommand)}
        outcomes = service.batch(
            "report_many",
            who,
            [(r.op, r.fence.worker_id) for r in reports],
            lambda: service.authority.report_many(reports, at),
            kinds=kinds,
        )
        tracing.annotate_batch([r.workload_id for r in reports], [_code(o) for o in outcomes])
        return json_reply([slot(o) for o in outcomes])
