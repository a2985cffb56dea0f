"""The operators' scope-wide calls as conformance commands: pause, resume and purge.

A pause and a purge are not operations of one workload, so they are not
commands of the core (`workwarden.statemachine.commands`); the conformance
protocol carries them as commands all the same, told apart by their `op`, so
the vectors can say what they do to the workloads around them:

- `{"op": "pause", "tenant", "application"?, "definition"?, "actor",
  "reason"?, "request_id"?}` is `Authority.pause`; its reply is the pause in
  force (`PauseReply`).
- `{"op": "resume", "tenant", "application"?, "definition"?, "actor",
  "request_id"?}` is `Authority.resume`; its reply says whether the scope was
  paused (`ResumeReply`).
- `{"op": "purge", "older_than_ms"?, "tenant"?, "application"?, "actor"?,
  "dry_run"?, "limit"?}` is `Authority.purge`; its reply is the report
  (`PurgeReply`).

The fields are the service's request bodies (`POST /v1/pause`, `/v1/resume`,
`/v1/purge`) plus the `op`, and the replies are the service's replies, so the
HTTP adapter forwards each as it is. A command that does not fit its model is
`WORKLOAD_INVALID`, decided before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workwarden.statemachine import errors
from workwarden.statemachine.authority import Authority
from workwarden.statemachine.models import Duration, Name, Prose
from workwarden.statemachine.pauses import PauseReply, pause_reply

__all__ = [
    "SCOPE_COMMAND_MODELS",
    "SCOPE_REPLY_MODELS",
    "PauseCommand",
    "PauseReply",
    "PurgeCommand",
    "PurgeReply",
    "ResumeCommand",
    "ResumeReply",
    "run_scope_command",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PauseCommand(_Strict):
    """`Authority.pause` as a conformance command: the scope, the operator, and why."""

    op: Literal["pause"] = "pause"
    tenant: Name
    application: Name | None = Field(default=None, description="None: every application")
    definition: Name | None = Field(
        default=None, description="None: every definition (a definition needs its application)"
    )
    concurrency_key: Name | None = Field(
        default=None, description="None: work of every concurrency key in the scope"
    )
    actor: Name = Field(description="the operator")
    reason: Prose | None = None
    request_id: Name | None = None


class ResumeCommand(_Strict):
    """`Authority.resume` as a conformance command: the scope and the operator."""

    op: Literal["resume"] = "resume"
    tenant: Name
    application: Name | None = None
    definition: Name | None = None
    concurrency_key: Name | None = None
    actor: Name = Field(description="the operator")
    request_id: Name | None = None


class PurgeCommand(_Strict):
    """`Authority.purge` as a conformance command (there is no `export` on the wire)."""

    op: Literal["purge"] = "purge"
    older_than_ms: Duration | None = Field(
        default=None, description="None: the spec's [retention] after_ms"
    )
    tenant: Name | None = None
    application: Name | None = None
    actor: Name | None = Field(default=None, description="None: system.retention")
    # Strict, as the service's body is: a lax `"false"` would purge for real where an
    # implementation reading any non-empty string as true would only report.
    dry_run: bool = Field(
        default=False, strict=True, description="report what would go, write nothing"
    )
    limit: Annotated[int, Field(strict=True, ge=1)] | None = None


class ResumeReply(_Strict):
    """What a resume did: whether the scope was paused (False: nothing was written)."""

    resumed: bool


class PurgeReply(_Strict):
    """A purge's report: the workloads purged (in a dry run, that would be), and those kept."""

    purged: list[str]
    kept: int = Field(description="terminal workloads in a [retention] keep state")
    young: int = Field(description="terminal workloads younger than the retention age")
    changed: int = Field(description="workloads changed between being found and being purged")


#: The model of each scope-wide command, by its `op`.
SCOPE_COMMAND_MODELS: dict[str, type[BaseModel]] = {
    "pause": PauseCommand,
    "resume": ResumeCommand,
    "purge": PurgeCommand,
}

#: The model of the reply to each scope-wide command, by its `op`.
SCOPE_REPLY_MODELS: dict[str, type[BaseModel]] = {
    "pause": PauseReply,
    "resume": ResumeReply,
    "purge": PurgeReply,
}


def _parse(model: type[BaseModel], command: Mapping[str, Any]) -> Any:
    try:
        return model.model_validate(dict(command))
    except ValidationError as exc:
        raise errors.invalid_from_validation(exc) from None


def run_scope_command(authority: Authority, command: Mapping[str, Any], now: int) -> Any:
    """Run one scope-wide command on `authority` at `now`; its reply as JSON data.

    `command["op"]` must be a key of `SCOPE_COMMAND_MODELS`. Refusals are the
    authority's `WorkloadError`s (a malformed command is `WORKLOAD_INVALID`).
    """
    op = command.get("op")
    if op == "pause":
        pause: PauseCommand = _parse(PauseCommand, command)
        record = authority.pause(
            pause.actor,
            now,
            tenant=pause.tenant,
            application=pause.application,
            definition=pause.definition,
            concurrency_key=pause.concurrency_key,
            reason=pause.reason,
            request_id=pause.request_id,
        )
        return pause_reply(record).model_dump(mode="json")
    if op == "resume":
        resume: ResumeCommand = _parse(ResumeCommand, command)
        resumed = authority.resume(
            resume.actor,
            now,
            tenant=resume.tenant,
            application=resume.application,
            definition=resume.definition,
            concurrency_key=resume.concurrency_key,
            request_id=resume.request_id,
        )
        return ResumeReply(resumed=resumed).model_dump(mode="json")
    if op == "purge":
        purge: PurgeCommand = _parse(PurgeCommand, command)
        report = authority.purge(
            now,
            older_than_ms=purge.older_than_ms,
            tenant=purge.tenant,
            application=purge.application,
            actor=purge.actor,
            dry_run=purge.dry_run,
            limit=purge.limit,
        )
        return PurgeReply(
            purged=report.purged, kept=report.kept, young=report.young, changed=report.changed
        ).model_dump(mode="json")
    raise errors.WorkloadError(
        errors.INVALID,
        f"op {op!r} is not a scope-wide command: expected {', '.join(SCOPE_COMMAND_MODELS)}",
    )
