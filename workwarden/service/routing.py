"""What every `/v1` route is built with: its guard, its caller, its instant, and its JSON reply.

`GuardedRoute` is the `/v1` router's route class: before FastAPI reads a
request's body it checks, in this order, the bearer token
(`WORKWARDEN_UNAUTHENTICATED`, or `WORKWARDEN_FORBIDDEN` for a token
scoped to a tenant), the query parameters (one the route does not declare,
or one given twice, is `WORKLOAD_INVALID`), and a body's content type (415 unless JSON) and
size (413 over `Service.max_body_bytes`, counted as it arrives, so a body
without a `Content-Length` is cut off too). So a call refused for its token
is answered without its body being read. `Authed` and `Now` are FastAPI
dependencies: the caller the guard found, and the call's instant, the
service's clock or, with a test clock, `X-Workwarden-Now`. `json_reply`
writes a model, a list of models or plain data as JSON, by the models'
aliases (the problem document's `class`).
"""

from __future__ import annotations

import email.message
import json
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import Message, Receive

from workwarden.service.auth import Caller
from workwarden.service.state import Service
from workwarden.statemachine import errors, safety

__all__ = ["Authed", "GuardedRoute", "Now", "json_reply"]

# Declares the scheme in the OpenAPI document; the guard reads the header itself, so a
# missing or malformed one is the service's own coded refusal, not FastAPI's.
_BEARER = HTTPBearer(auto_error=False, description="a token of `workwarden serve --issue-token`")


def _query_names(dependant: Dependant) -> set[str]:
    """The query parameters a route declares, its dependencies' included."""
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def _too_large(limit: int) -> HTTPException:
    # An HTTPException, the one kind FastAPI lets out of its body reading unchanged.
    return HTTPException(413, f"the request body is over the limit of {limit} bytes")


def _refuse_unknown_query(request: Request, allowed: set[str]) -> None:
    """`WORKLOAD_INVALID` naming each query parameter the route does not declare, or each
    given more than once (which would count, the first or the last?)."""
    unknown = sorted(set(request.query_params) - allowed)
    if unknown:
        takes = ", ".join(sorted(allowed)) or "none"
        raise errors.WorkloadError(
            errors.INVALID,
            f"unknown query parameter {', '.join(unknown)} (this route takes: {takes})",
            {"errors": [{"field": name, "message": "unknown query parameter"} for name in unknown]},
        )
    given = Counter(name for name, _ in request.query_params.multi_items())
    twice = sorted(name for name, count in given.items() if count > 1)
    if twice:
        message = "query parameter given more than once"
        raise errors.WorkloadError(
            errors.INVALID,
            f"{message}: {', '.join(twice)}",
            {"errors": [{"field": name, "message": message} for name in twice]},
        )


def _refuse_body(request: Request, takes_body: bool, limit: int) -> None:
    """415 for a body that is not JSON, 413 for one whose `Content-Length` is over `limit`."""
    length = request.headers.get("content-length")
    has_body = "transfer-encoding" in request.headers or length not in (None, "0")
    given = request.headers.get("content-type")
    if has_body and takes_body and not _is_json(given):
        sent = f"is {given}" if given else "has no Content-Type"
        raise HTTPException(415, f"the body {sent}; this route takes application/json")
    if length is not None and length.isdigit() and int(length) > limit:
        raise _too_large(limit)


def _limited(receive: Receive, limit: int) -> Receive:
    """`receive`, refusing (413) once the body's bytes pass `limit`."""
    seen = 0

    async def counted() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _too_large(limit)
        return message

    return counted


def _body_problem(message: str) -> errors.WorkloadError:
    return errors.WorkloadError(
        errors.INVALID,
        f"body: not JSON: {message}",
        {"errors": [{"field": "body", "message": f"not JSON: {message}"}]},
    )


def _no_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _body_problem(f"the key {json.dumps(key)} is given twice in one object")
        seen[key] = value
    return seen


class _Parsed(Request):
    """A request whose JSON body was parsed already: the route takes that value, not a
    second parse of the same bytes."""

    def __init__(self, request: Request, body: bytes, value: Any) -> None:
        super().__init__(request.scope, request.receive)
        self._read = body
        self._value = value

    async def body(self) -> bytes:
        """The bytes read when the body was checked."""
        return self._read

    async def json(self) -> Any:
        """The value parsed when the body was checked."""
        return self._value


def _parsed_json(body: bytes, max_depth: int) -> Any:
    """The body's JSON value, or `WORKLOAD_INVALID` (field `body`) for JSON a reader may
    take one way or another; `_NOT_PARSED` for a body that is not JSON at all.

    Text that is not UTF-8 (JSON over HTTP is UTF-8; Python's reader would guess
    UTF-16 or UTF-32), an object giving one key twice (which value counts?), a
    number too long to read, or nesting deeper than any value the spec takes
    (`[limits] max_json_depth`, with room for the call's own fields). A body that
    is not JSON at all is left to the route, which says where its parse stopped.
    """
    if not body:
        return _NOT_PARSED
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _body_problem(f"not UTF-8 text (byte {exc.start})") from None
    try:
        value = json.loads(text, object_pairs_hook=_no_twice)
    except json.JSONDecodeError:
        return _NOT_PARSED
    except RecursionError:
        raise _body_problem("nested too deeply to read") from None
    except ValueError as exc:
        raise _body_problem(f"a number too long to read ({exc})") from None
    limit = max_depth + _CALL_LEVELS
    if safety.json_depth(value) > limit:
        raise _body_problem(f"nested deeper than {limit} levels")
    return value


_NOT_PARSED = object()


#: How many levels a call's own fields add around the JSON values it carries (a batch of
#: reports: the body, the list, a report, its output).
_CALL_LEVELS = 8


class GuardedRoute(APIRoute):
    """A `/v1` route whose token, query and body are checked before its body is read."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler, behind the checks of the module docstring."""
        handler = super().get_route_handler()
        allowed = _query_names(self.dependant)
        takes_body = self.body_field is not None

        async def guarded(request: Request) -> Response:
            service: Service = request.app.state.service
            request.state.caller = service.caller(request.headers.get("authorization"))
            _refuse_unknown_query(request, allowed)
            limit = service.max_body_bytes
            _refuse_body(request, takes_body, limit)
            limited = Request(request.scope, _limited(request.receive, limit))
            if takes_body:
                # Read and parsed here, so that what JSON itself leaves open is refused
                # before the route sees it; the route then takes the value parsed here.
                body = await limited.body()
                value = _parsed_json(body, service.spec.limits.max_json_depth)
                if value is not _NOT_PARSED:
                    return await handler(_Parsed(limited, body, value))
            return await handler(limited)

        return guarded


async def _caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
) -> Caller:
    caller = getattr(request.state, "caller", None)
    if isinstance(caller, Caller):
        return caller
    service: Service = request.app.state.service
    return service.caller(request.headers.get("authorization"))


async def _now(request: Request) -> int:
    service: Service = request.app.state.service
    return service.now(request.headers)


Authed = Annotated[Caller, Depends(_caller)]
"""The authenticated caller of a route (the guard's, found before the body is read)."""

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
