"""What every `/v1` route is built with: its caller, its instant, and its JSON reply.

`Authed` and `Now` are FastAPI dependencies: the bearer token is checked
(`WORKWARDEN_UNAUTHENTICATED`) before the body is validated, and the call's
instant is the service's clock or, with a test clock, `X-Workwarden-Now`.
`json_reply` writes a model, a list of models or plain data as JSON, by
the models' aliases (the problem document's `class`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.responses import Response

from workwarden.service.auth import Caller
from workwarden.service.state import Service

__all__ = ["Authed", "Now", "json_reply"]

# Reads the header without refusing: a missing or malformed one is the
# service's own coded refusal (`WORKWARDEN_UNAUTHENTICATED`), not FastAPI's.
_BEARER = HTTPBearer(auto_error=False, description="a token of `workwarden serve --issue-token`")


async def _caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
) -> Caller:
    service: Service = request.app.state.service
    return service.caller(None if credentials is None else "Bearer " + credentials.credentials)


async def _now(request: Request) -> int:
    service: Service = request.app.state.service
    return service.now(request.headers)


Authed = Annotated[Caller, Depends(_caller)]
"""The authenticated caller of a route (`WORKWARDEN_UNAUTHENTICATED` before the body is read)."""

Now = Annotated[int, Depends(_now)]
"""The instant a route's call is decided at."""


def _data(value: Any) -> Any:
    return value.model_dump(mode="json", by_alias=True) if isinstance(value, BaseModel) else value


def json_reply(value: Any) -> Response:
    """`value` (a model, a list of models or JSON data) as an `application/json` response."""
    if isinstance(value, BaseModel):
        text = value.model_dump_json(by_alias=True)
    elif isinstance(value, list):
        text = json.dumps([_data(v) for v in value])
    else:
        text = json.dumps(value)
    return Response(text, media_type="application/json")
