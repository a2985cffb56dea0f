"""Refusals over HTTP: one `application/problem+json` document per `WorkloadError`.

The HTTP status of a refusal is derived here and nowhere else, from its
catalogue code: a few codes have a status of their own (`STATUS_BY_CODE`),
every other code takes the status of its class (`STATUS_BY_CLASS`, the
`class` of its `[errors.*]` entry in the spec). `docs/service.md` has the
table for every code of the shipped catalogue, and a test holds the two
equal. A refusal of the HTTP request itself (a method the route does not
take, a body too large or not JSON) keeps HTTP's own status (405, 413, 415),
given as `status`, in the response and the document alike. The problem
document (RFC 9457) carries `type`, `title`, `status`, `detail` (the
message), `code`, `class` and, when the refusal has any, `details`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from workwarden.service.auth import FORBIDDEN, UNAUTHENTICATED
from workwarden.statemachine import errors
from workwarden.statemachine.catalogue import error_class

__all__ = [
    "INTERNAL",
    "PROBLEM_TYPE",
    "STATUS_BY_CLASS",
    "STATUS_BY_CODE",
    "Problem",
    "problem",
    "problem_body",
    "status_for",
]

#: The code of an unexpected failure inside the service (a bug), as the command line's.
INTERNAL = "WORKWARDEN_INTERNAL"

#: The `type` of every problem document: the code's entry in the catalogue.
PROBLEM_TYPE = "urn:workwarden:error:"

#: A refusal's status by its class, for every code without a status of its own.
STATUS_BY_CLASS: dict[str, int] = {
    "fix_request": 422,
    "give_up": 409,
    "attempt_over": 409,
    "conflict_retry_now": 409,
    "retry_later": 503,
}

#: The codes whose status is not their class's.
STATUS_BY_CODE: dict[str, int] = {
    errors.INVALID: 400,
    # An admission's own grant does not bind it (the core's refusal).
    errors.UNAUTHORIZED: 403,
    # No good bearer token (RFC 9110: 401 with WWW-Authenticate), or one that may not call.
    UNAUTHENTICATED: 401,
    FORBIDDEN: 403,
    errors.NOT_FOUND: 404,
    # READY work that is not eligible yet: come back later, but the service is fine.
    errors.NOT_YET_ELIGIBLE: 409,
    # A claim at its concurrency key's limit: the work waits for a place, the service is fine.
    errors.CONCURRENCY_LIMITED: 409,
    errors.RATE_LIMITED: 429,
    # What the server lacks, not what the caller did.
    errors.EXTRA_MISSING: 500,
    "GRAPHVIZ_NOT_FOUND": 500,
    "GRAPHVIZ_FAILED": 500,
    INTERNAL: 500,
}


class Problem(BaseModel):
    """A refusal as `application/problem+json` (RFC 9457), with the catalogue code and class."""

    model_config = ConfigDict(populate_by_name=True)

    type: str = Field(description="urn:workwarden:error: and the code")
    title: str = Field(description="the code")
    status: int = Field(description="the HTTP status, derived from the code (docs/service.md)")
    detail: str = Field(description="the message, for people")
    code: str = Field(description="the catalogue code (specs/workload.toml, [errors])")
    class_: str | None = Field(
        alias="class", description="the code's class: how a program sorts the refusal"
    )
    details: dict[str, Any] | None = Field(
        default=None, description="structured data for programs, when the refusal has any"
    )


def status_for(code: str) -> int:
    """The HTTP status of a refusal with catalogue code `code` (500: a code it lacks)."""
    status = STATUS_BY_CODE.get(code)
    if status is not None:
        return status
    cls = error_class(code)
    return STATUS_BY_CLASS.get(cls, 500) if cls is not None else 500


def problem_body(exc: errors.WorkloadError, status: int | None = None) -> dict[str, Any]:
    """The problem document of `exc`, as JSON-ready data (`status`: HTTP's own, if given)."""
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE + exc.code,
        "title": exc.code,
        "status": status_for(exc.code) if status is None else status,
        "detail": exc.message,
        "code": exc.code,
        "class": exc.error_class,
    }
    if exc.details is not None:
        body["details"] = json.loads(json.dumps(exc.details, default=str))
    return body


def problem(
    exc: errors.WorkloadError, headers: Mapping[str, str] | None = None, status: int | None = None
) -> Response:
    """The `application/problem+json` response refusing with `exc` (see `problem_body`)."""
    body = problem_body(exc, status)
    extra = dict(headers or {})
    if body["class"] == "retry_later":
        extra.setdefault("Retry-After", "1")
    if body["status"] == 401:
        extra.setdefault("WWW-Authenticate", 'Bearer realm="workwarden"')
    return Response(
        json.dumps(body, sort_keys=True, separators=(",", ":")),
        status_code=body["status"],
        media_type="application/problem+json",
        headers=extra,
    )
