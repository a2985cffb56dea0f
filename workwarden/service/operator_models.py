"""The bodies and replies of the operators' scope-wide calls: pauses and retention.

The models of `workwarden.service.operators` (the routes) and of
`HttpAuthority.pause`, `resume`, `pauses` and `purge` (the client), kept apart
from the routes so the client loads no web framework. `PauseRecord` and
`PurgeReport` are the store's and the library's dataclasses; their JSON is
given here, with the conversions both ways. `authorize_operator` is the one
check every such call makes: these calls are not operations of a workload,
so the spec's operations table has no row for them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from workwarden.service.auth import Caller, forbidden
from workwarden.statemachine.models import Duration, Name, Prose
from workwarden.statemachine.pauses import PauseReply, pause_record, pause_reply
from workwarden.statemachine.retention import PurgeReport

__all__ = [
    "OPERATOR_CALLS",
    "PauseReply",
    "PauseRequest",
    "PurgeReply",
    "PurgeRequest",
    "ResumeReply",
    "ResumeRequest",
    "authorize_operator",
    "pause_record",
    "pause_reply",
    "purge_reply",
    "purge_report",
]

#: The operators' scope-wide calls, each an operator's only.
OPERATOR_CALLS = ("pause", "resume", "pauses", "purge")


class PauseRequest(BaseModel):
    """`Authority.pause`'s arguments: the scope, the operator, and why."""

    model_config = ConfigDict(extra="forbid")

    tenant: Name
    application: Name | None = Field(default=None, description="None: every application")
    definition: Name | None = Field(
        default=None, description="None: every definition (a definition needs its application)"
    )
    concurrency_key: Name | None = Field(
        default=None, description="None: work of every concurrency key in the scope"
    )
    actor: Name = Field(description="the operator: the token's subject")
    reason: Prose | None = None
    request_id: Name | None = None


class ResumeRequest(BaseModel):
    """`Authority.resume`'s arguments: the scope and the operator."""

    model_config = ConfigDict(extra="forbid")

    tenant: Name
    application: Name | None = None
    definition: Name | None = None
    concurrency_key: Name | None = None
    actor: Name = Field(description="the operator: the token's subject")
    request_id: Name | None = None


class ResumeReply(BaseModel):
    """What a resume did: whether the scope was paused (False: nothing was written)."""

    resumed: bool


class PurgeRequest(BaseModel):
    """`Authority.purge`'s arguments, less `export` (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    older_than_ms: Duration | None = Field(
        default=None, description="None: the spec's [retention] after_ms"
    )
    tenant: Name | None = None
    application: Name | None = None
    actor: Name | None = Field(
        default=None,
        description="the operator (the token's subject); None: the token's subject, or"
        " system.retention for a token whose subject is *",
    )
    dry_run: bool = Field(
        default=False, strict=True, description="report what would go, write nothing"
    )
    limit: Annotated[int, Field(strict=True, ge=1)] | None = None


class PurgeReply(BaseModel):
    """A `PurgeReport`: the workloads purged (or, in a dry run, that would be), and those kept."""

    purged: list[str]
    kept: int = Field(description="terminal workloads in a [retention] keep state")
    young: int = Field(description="terminal workloads younger than the retention age")
    changed: int = Field(description="workloads changed between being found and being purged")


def purge_reply(report: PurgeReport) -> PurgeReply:
    """The JSON model of a purge's report."""
    return PurgeReply(
        purged=report.purged, kept=report.kept, young=report.young, changed=report.changed
    )


def purge_report(reply: PurgeReply) -> PurgeReport:
    """The `PurgeReport` a `PurgeReply` carries (what `HttpAuthority.purge` returns)."""
    return PurgeReport(
        purged=list(reply.purged), kept=reply.kept, young=reply.young, changed=reply.changed
    )


def authorize_operator(caller: Caller, operation: str, actor: str | None = None) -> None:
    """Refuse `caller` unless it is an operator whose subject may act as `actor`."""
    if caller.actor_class != "operator":
        raise forbidden(
            "wrong_actor_class",
            f"{operation} is an operator's call; this token is a {caller.actor_class}'s",
            operation=operation,
            actor_class=caller.actor_class,
        )
    if actor is not None and not caller.may_act_as(actor):
        raise forbidden(
            "subject_mismatch",
            "the call names another actor than the token's subject",
            operation=operation,
        )
