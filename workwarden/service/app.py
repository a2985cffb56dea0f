"""`create_app(config)`: the service as one ASGI application.

FastAPI (on Starlette) was chosen because the API's contract is the
pydantic models the authority already has: FastAPI validates request bodies
with them and generates the OpenAPI document from them, where Starlette alone
would need both written by hand. Every refusal leaves through one handler as
a problem document (`workwarden.service.problems`): a `WorkloadError` from
the authority or the token check, a body that does not validate
(`WORKLOAD_INVALID`, each field path in `details.errors`), a route that does
not exist, and an unexpected exception (`WORKWARDEN_INTERNAL`). Each `/v1`
call is a span when the OpenTelemetry API is installed
(`workwarden.service.tracing`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.responses import RedirectResponse, Response

from workwarden import __version__
from workwarden.service.api import api_router
from workwarden.service.console import console_router
from workwarden.service.problems import INTERNAL, Problem, problem
from workwarden.service.state import Service, ServiceConfig
from workwarden.service.tracing import TracingMiddleware
from workwarden.statemachine import errors
from workwarden.statemachine.diagram import DiagramError

__all__ = ["ServiceConfig", "create_app"]


def _invalid(exc: RequestValidationError) -> errors.WorkloadError:
    problems = []
    for err in exc.errors():
        loc = [str(part) for part in err.get("loc", ())]
        if loc and loc[0] in ("body", "query", "path", "header"):
            loc = loc[1:]
        problems.append({"field": ".".join(loc), "message": str(err.get("msg", "invalid"))})
    first = problems[0] if problems else {"field": "", "message": "invalid"}
    return errors.WorkloadError(
        errors.INVALID, f"{first['field']}: {first['message']}", {"errors": problems}
    )


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

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        code = errors.NOT_FOUND if exc.status_code == 404 else errors.INVALID
        response = problem(errors.WorkloadError(code, str(exc.detail), {"path": request.url.path}))
        response.status_code = exc.status_code
        return response

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        return problem(
            errors.WorkloadError(
                INTERNAL,
                f"unexpected {type(exc).__name__}: {exc}; this is a bug in workwarden",
            )
        )

    app.add_middleware(
        TracingMiddleware, tracer_provider=config.tracer_provider, version=__version__
    )
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.include_router(api_router(service))
    app.include_router(console_router(service))

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    async def root() -> Response:
        return RedirectResponse("/console/", status_code=307)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "version": __version__}

    return app
