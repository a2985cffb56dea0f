"""Traces of the API's calls, through the OpenTelemetry API when it is installed.

`TracingMiddleware` opens one server span per call under `/v1/`, named
`workwarden.<operation>` (`workwarden.claim`, `workwarden.pause` for an
`operate` call taking `pause`, `workwarden.report_many`), with attributes:

- `workwarden.operation`, and `workwarden.workload_id` when the call names
  one (a batch: `workwarden.workload_ids`, `workwarden.batch.size`,
  `workwarden.batch.refused` and the refused slots' `workwarden.codes`);
- `workwarden.code` and `workwarden.error_class` of a refusal, read from
  the problem document the call answered with, whichever handler wrote it;
- `workwarden.actor_class` of the caller, `http.request.method`,
  `url.path` and `http.response.status_code`.

A span's status is an error only for a 5xx answer: a refusal is the API
working. A `traceparent` header on the request makes the span a child of the
caller's (`HttpAuthority` sends one when its caller is inside a span); when
the server already opened a span for the request (FastAPI's own telemetry, or
the ASGI instrumentation), this one is an internal child of it.

Only `opentelemetry-api` is used, and only if it imports: without it every
function here does nothing. The spans go to the global tracer provider (set
by the deployment, for example `opentelemetry-instrument workwarden serve`),
or to the one given to `ServiceConfig(tracer_provider=...)`.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping, Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

try:
    from opentelemetry import propagate, trace
except ImportError:  # The API is optional: without it the service records no spans.
    propagate = None  # type: ignore[assignment]  # the module, or None when not installed
    trace = None  # type: ignore[assignment]  # the module, or None when not installed

__all__ = [
    "ENABLED",
    "TracingMiddleware",
    "annotate",
    "annotate_batch",
    "inject",
    "operation_of",
    "rename",
]

#: Whether `opentelemetry-api` imported (spans are recorded only then).
ENABLED = trace is not None

_PREFIX = "workwarden."
_PROBLEM = b"application/problem+json"
# A problem document is small; a longer body is not one of ours to read.
_MAX_PROBLEM = 64 * 1024

Attribute = str | bool | int | float | Sequence[str]
"""The attribute values this module sets."""


def operation_of(method: str, path: str) -> str:
    """The operation a `/v1` route names: its last segment, `get` or `list` for the reads."""
    rest = path.removeprefix("/v1/").strip("/")
    if rest == "workloads":
        return "list"
    if rest.startswith("workloads/"):
        return "get"
    return rest.replace("/", ".") or method.lower()


def annotate(**attributes: Attribute | None) -> None:
    """Set `workwarden.<name>` attributes on the current span (None values are left out)."""
    if trace is None:
        return
    span = trace.get_current_span()
    for name, value in attributes.items():
        if value is not None:
            span.set_attribute(_PREFIX + name, value)


def rename(operation: str) -> None:
    """Name the current span after `operation` (an `operate` call names its operation)."""
    if trace is None:
        return
    trace.get_current_span().update_name(_PREFIX + operation)
    annotate(operation=operation)


def annotate_batch(workload_ids: Sequence[str], codes: Sequence[str | None]) -> None:
    """Set a batch call's attributes: its workload ids, size, refused slots and their codes."""
    refused = [code for code in codes if code is not None]
    annotate(
        workload_ids=list(workload_ids),
        codes=sorted(set(refused)),
        **{"batch.size": len(codes), "batch.refused": len(refused)},
    )


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current span's `traceparent` (and baggage) to outgoing request headers."""
    if propagate is not None:
        propagate.inject(headers)


class _Answer:
    """What the middleware saw of the response: its status and, for a problem, its body."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.problem: bytearray | None = None

    def see(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            for name, value in message.get("headers", ()):
                if name.lower() == b"content-type" and value.startswith(_PROBLEM):
                    self.problem = bytearray()
        elif (
            message["type"] == "http.response.body"
            and self.problem is not None
            and len(self.problem) < _MAX_PROBLEM
        ):
            self.problem.extend(message.get("body", b""))

    def refusal(self) -> dict[str, Any] | None:
        if not self.problem:
            return None
        try:
            body = json.loads(bytes(self.problem))
        except ValueError:
            return None
        return body if isinstance(body, dict) else None


class TracingMiddleware:
    """The ASGI middleware that opens a span per `/v1` call (see the module docstring)."""

    def __init__(
        self, app: ASGIApp, tracer_provider: Any = None, version: str | None = None
    ) -> None:
        self.app = app
        self.tracer = (
            trace.get_tracer("workwarden.service", version, tracer_provider)
            if trace is not None
            else None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the call inside its span, or as it is when nothing is traced."""
        path = str(scope.get("path", ""))
        if (
            self.tracer is None
            or trace is None
            or propagate is None
            or scope["type"] != "http"
            or not path.startswith("/v1/")
        ):
            await self.app(scope, receive, send)
            return
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        method = str(scope["method"])
        operation = operation_of(method, path)
        answer = _Answer()

        async def watched(message: Message) -> None:
            answer.see(message)
            await send(message)

        # Under a span of the server's own (FastAPI's telemetry, ASGI instrumentation) this
        # one is its child; otherwise it is the server span, continuing the caller's trace.
        nested = trace.get_current_span().get_span_context().is_valid
        with self.tracer.start_as_current_span(
            _PREFIX + operation,
            context=None if nested else propagate.extract(carrier),
            kind=trace.SpanKind.INTERNAL if nested else trace.SpanKind.SERVER,
            attributes={
                _PREFIX + "operation": operation,
                "http.request.method": method,
                "url.path": path,
            },
        ) as span:
            try:
                await self.app(scope, receive, watched)
            except Exception:
                # The service's last-resort handler answers it as WORKWARDEN_INTERNAL (500).
                span.set_attribute(_PREFIX + "code", "WORKWARDEN_INTERNAL")
                raise
            if answer.status is not None:
                span.set_attribute("http.response.status_code", answer.status)
            refusal = answer.refusal()
            if refusal is not None:
                for key, name in (("code", "code"), ("class", "error_class")):
                    if isinstance(refusal.get(key), str):
                        span.set_attribute(_PREFIX + name, refusal[key])
            if answer.status is not None and answer.status >= 500:
                code = refusal.get("code") if refusal else None
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(code or answer.status)))
