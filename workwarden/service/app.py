"""`create_app(config)`: the service as one ASGI application.

FastAPI (on Starlette) was chosen because the API's contract is the
pydantic models the authority already has: FastAPI validates request bodies
with them and generates the OpenAPI document from them, where Starlette alone
would need both written by hand. Every refusal leaves through one handler as
a problem document (`workwarden.service.problems`): a `WorkloadError` from
the authority or the token check, a body that does not validate
(`WORKLOAD_INVALID`, each field path in `details.errors`), a route that does
not exist, a request refused under HTTP's own status (a method the route
does not take, 405 with `Allow`; a body too large, 413, or not JSON, 415:
`WORKLOAD_INVALID`), a store that fails under a console page or `/metrics`
(`WORKLOAD_STORAGE_FAILURE`, as the API's calls answer), and an unexpected
exception (`WORKWARDEN_INTERNAL`).
Every GET route answers HEAD too. Each `/v1` call is a span when the
OpenTelemetry API is installed (`workwarden.service.tracing`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.responses import RedirectResponse, Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from workwarden import __version__
from workwarden.service.api import api_router
from workwarden.service.console import console_router
from workwarden.service.problems import INTERNAL, Problem, problem
from workwarden.service.state import Service, ServiceConfig
from workwarden.service.tracing import TracingMiddleware
from workwarden.statemachine import errors
from workwarden.statemachine.diagram import DiagramError
from workwarden.storage.base import StoreError

__all__ = ["ServiceConfig", "create_app"]


def _not_json(exc: RequestValidationError, err: Mapping[str, Any]) -> dict[str, str]:
    """The problem of a body that does not parse, at the line and column the parser stopped."""
    loc = err.get("loc", ())
    at = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
    reason = str((err.get("ctx") or {}).get("error", "invalid"))
    where = ""
    if at is not None and isinstance(exc.body, str):
        line = exc.body.count("\n", 0, at) + 1
        column = at - exc.body.rfind("\n", 0, at)
        where = f" at line {line} column {column} (character {at})"
    elif at is not None:
        where = f" at character {at}"
    return {"field": "body", "message": f"not JSON: {reason}{where}"}


def _invalid(exc: RequestValidationError) -> errors.WorkloadError:
    problems = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            problems.append(_not_json(exc, err))
            continue
        loc = [str(part) for part in err.get("loc", ())]
        if loc and loc[0] in ("body", "query", "path", "header"):
            # A field of the body is named by its path; the body as a whole (a list
            # where an object belongs, or none at all) as `body`.
            loc = loc[1:] or loc[:1]
        problems.append({"field": ".".join(loc), "message": str(err.get("msg", "invalid"))})
    first = problems[0] if problems else {"field": "", "message": "invalid"}
    return errors.WorkloadError(
        errors.INVALID, f"{first['field']}: {first['message']}", {"errors": problems}
    )


class _HeadAsGet:
    """Answers a HEAD request as its GET, without the body (RFC 9110), on every route."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headless(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headless)


#: The methods a route of this service may take (`_allow` asks the routes about each).
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def _allow(headers: Mapping[str, str], request: Request) -> dict[str, str]:
    """`headers`, whose `Allow` names every method of every route at the request's path
    (Starlette names only the first route's: a path served by a GET route and a POST
    route, such as a console page and its form, would seem to take GET alone), with HEAD
    beside GET, sorted."""
    out = dict(headers)
    if "Allow" in out:
        methods = {m.strip() for m in out["Allow"].split(",") if m.strip()}
        for method in _METHODS:
            asked = {**request.scope, "method": method}
            if any(r.matches(asked)[0] is Match.FULL for r in request.app.router.routes):
                methods.add(method)
        if "GET" in methods:
            methods.add("HEAD")
        out["Allow"] = ", ".join(sorted(methods))
    return out


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, with every refusal described as the problem document it is."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    document = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        description=app.description,
        routes=app.routes,
    )
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas["Problem"] = Problem.model_json_schema(by_alias=True)
    refusal = {
        "description": "A refusal: the catalogue code, its class, the status of docs/service.md",
        "content": {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
        },
    }
    for item in document.get("paths", {}).values():
        for operation in item.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            responses["default"] = refusal
    app.openapi_schema = document
    return document


def create_app(config: ServiceConfig) -> FastAPI:
    """The ASGI application serving the API, the console and `/metrics` over `config`."""
    service = Service(config)
    app = FastAPI(
        title="workwarden",
        version=__version__,
        summary="The lifecycle authority for durable work, over HTTP.",
        description=(
            "Every operation of the authority. Bodies are the models of "
            "`workwarden.statemachine`; refusals are `application/problem+json` with the "
            "catalogue code and class. Authenticate with `Authorization: Bearer <token>`."
        ),
        # A path with a slash too many or too few is an unknown route (404, a problem
        # document), not a redirect built from the request's own Host header.
        redirect_slashes=False,
    )
    app.state.service = service

    @app.exception_handler(errors.WorkloadError)
    async def refused(request: Request, exc: errors.WorkloadError) -> Response:
        return problem(exc)

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError) -> Response:
        return problem(_invalid(exc))

    @app.exception_handler(DiagramError)
    async def diagram_failed(request: Request, exc: DiagramError) -> Response:
        return problem(errors.WorkloadError(exc.code, exc.message))

    @app.exception_handler(StoreError)
    async def store_failed(request: Request, exc: StoreError) -> Response:
        # What the console and /metrics read from the store itself (the authority turns its
        # own reads' failures into this code): the store failed, not the service.
        return problem(errors.WorkloadError(errors.STORAGE_FAILURE, f"store failure: {exc}"))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        code = errors.NOT_FOUND if exc.status_code == 404 else errors.INVALID
        headers = _allow(exc.headers or {}, request)
        message = str(exc.detail)
        if exc.status_code == 405:
            takes = headers.get("Allow", "-")
            message = f"{request.method} is not a method of this route; it takes {takes}"
        refusal = errors.WorkloadError(code, message, {"path": request.url.path})
        return problem(refusal, headers, status=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        return problem(
            errors.WorkloadError(
                INTERNAL,
                f"unexpected {type(exc).__name__}: {exc}; this is a bug in workwarden",
            )
        )

    app.add_middleware(_HeadAsGet)
    app.add_middleware(
        TracingMiddleware, tracer_provider=config.tracer_provider, version=__version__
    )
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.include_router(api_router(service))
    app.include_router(console_router(service))

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        # On a worker thread: the gauges read the store, which may be slow or locked.
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    async def root() -> Response:
        return RedirectResponse("/console/", status_code=307)

    @app.get("/console", include_in_schema=False)
    async def console_home() -> Response:
        return RedirectResponse("/console/", status_code=307)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "version": __version__}

    return app
