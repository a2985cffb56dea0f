"""The operators' scope-wide calls over HTTP: pauses and retention, under `/v1`.

`POST /v1/pause`, `POST /v1/resume`, `GET /v1/pauses` and `POST /v1/purge` are
`Authority.pause`, `resume`, `pauses` and `purge`. They are not operations of
a workload, so the spec's operations table has no row for them: each is an
operator's call, refused to any other token with `WORKWARDEN_FORBIDDEN`
(`details.reason` `wrong_actor_class`) before anything is read or written, and
an operator's `actor` must be the token's subject (`subject_mismatch`). The
library writes each pause, resume and purge with its audit record. The
bodies and replies are in `workwarden.service.operator_models`.

A purge's `export` callable cannot cross the wire: a purge that must export
runs where the store is (`workwarden purge --export FILE`). A purge without
an `actor` is recorded under the token's subject (`system.retention` for a
token whose subject is `*`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from starlette.responses import Response

from workwarden.service.auth import ANY_SUBJECT
from workwarden.service.operator_models import (
    PauseReply,
    PauseRequest,
    PurgeReply,
    PurgeRequest,
    ResumeReply,
    ResumeRequest,
    authorize_operator,
    pause_reply,
    purge_reply,
)
from workwarden.service.routing import Authed, Now, json_reply
from workwarden.service.state import Service

__all__ = ["operator_routes"]


def operator_routes(router: APIRouter, service: Service) -> None:
    """Add the pause, resume, pauses and purge routes to the `/v1` `router`."""

    @router.post("/pause", response_model=PauseReply, summary="Pause claiming for a scope")
    def pause(body: PauseRequest, who: Authed, at: Now) -> Response:
        """`Authority.pause`: the pause in force (the earlier one if the scope was paused).

        No claim takes work of the scope until it is resumed; in-flight work
        runs on and deadlines keep running. Pausing a paused scope writes
        nothing.
        """
        authorize_operator(who, "pause", body.actor)
        record = service.call(
            "pause",
            who,
            lambda: service.authority.pause(
                body.actor,
                at,
                tenant=body.tenant,
                application=body.application,
                definition=body.definition,
                concurrency_key=body.concurrency_key,
                reason=body.reason,
                request_id=body.request_id,
            ),
            acting_as=body.actor,
        )
        return json_reply(pause_reply(record))

    @router.post("/resume", response_model=ResumeReply, summary="Resume claiming for a scope")
    def resume(body: ResumeRequest, who: Authed, at: Now) -> Response:
        """`Authority.resume`: `resumed` False when the scope was not paused (nothing written)."""
        authorize_operator(who, "resume", body.actor)
        resumed = service.call(
            "resume",
            who,
            lambda: service.authority.resume(
                body.actor,
                at,
                tenant=body.tenant,
                application=body.application,
                definition=body.definition,
                concurrency_key=body.concurrency_key,
                request_id=body.request_id,
            ),
            acting_as=body.actor,
        )
        return json_reply(ResumeReply(resumed=resumed))

    @router.get("/pauses", response_model=list[PauseReply], summary="The pauses in force")
    def pauses(who: Authed, tenant: Annotated[str | None, Query()] = None) -> Response:
        """`Authority.pauses`: the pauses in force, of `tenant` or of every tenant, by scope key."""
        authorize_operator(who, "pauses")
        records = service.call("pauses", who, lambda: service.authority.pauses(tenant))
        return json_reply([pause_reply(r) for r in records])

    @router.post("/purge", response_model=PurgeReply, summary="Purge finished work (retention)")
    def purge(who: Authed, at: Now, body: PurgeRequest | None = None) -> Response:
        """`Authority.purge`: delete terminal work older than the retention age, audited.

        Dead letters (the `[retention] keep` states) are kept; `dry_run`
        reports what would go and writes nothing.
        """
        asked = body or PurgeRequest()
        authorize_operator(who, "purge", asked.actor)
        actor = asked.actor
        if actor is None and who.subject != ANY_SUBJECT:
            actor = who.subject
        report = service.call(
            "purge",
            who,
            lambda: service.authority.purge(
                at,
                older_than_ms=asked.older_than_ms,
                tenant=asked.tenant,
                application=asked.application,
                actor=actor,
                dry_run=asked.dry_run,
                limit=asked.limit,
            ),
            acting_as=actor,
        )
        return json_reply(purge_reply(report))
