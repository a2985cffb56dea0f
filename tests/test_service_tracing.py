"""The service's spans, recorded with the OpenTelemetry SDK's in-memory exporter.

The app runs under uvicorn in a thread of the test process, so that the test
owns the tracer provider its spans go to, and is called over real HTTP by
`HttpAuthority` and httpx. Each `/v1` call is one span named after its
operation, carrying its workload id and, when refused, its code; a call made
inside a caller's span continues the caller's trace; without the
OpenTelemetry API the service serves the same answers and records nothing.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from support import CAPS, KEY_ID, SECRET, request
from workwarden.service.app import ServiceConfig, create_app
from workwarden.service.auth import issue_token
from workwarden.service.client import HttpAuthority
from workwarden.service.testing import free_port
from workwarden.statemachine import GrantSigner, WorkloadError
from workwarden.statemachine.models import Fence
from workwarden.storage import MemoryStore

TOKEN_SECRET = bytes(range(50, 82))


@dataclass
class Traced:
    """The app under uvicorn, where it listens, and the spans it recorded."""

    url: str
    provider: TracerProvider
    exporter: InMemorySpanExporter

    def token(self, actor_class: Any, subject: str = "*") -> str:
        signer = GrantSigner("t", TOKEN_SECRET)
        return issue_token(signer, subject, actor_class, int(time.time() * 1000), 3_600_000)

    def client(self) -> HttpAuthority:
        return HttpAuthority(self.url, [self.token("worker"), self.token("operator")])

    def spans(self, count: int) -> list[ReadableSpan]:
        """The service's finished spans, waited for until `count` (each ends after its reply)."""
        deadline = time.monotonic() + 10
        while True:
            spans = [
                s for s in self.exporter.get_finished_spans() if s.name.startswith("workwarden.")
            ]
            if len(spans) >= count or time.monotonic() > deadline:
                return spans
            time.sleep(0.01)


@pytest.fixture
def traced() -> Iterator[Traced]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(
        ServiceConfig(
            store=MemoryStore(),
            token_keys={"t": TOKEN_SECRET},
            grant_keys={KEY_ID: SECRET},
            test_clock=True,
            tracer_provider=provider,
        )
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield Traced(f"http://127.0.0.1:{port}", provider, exporter)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_each_call_is_one_span_with_its_operation_workload_and_code(traced: Traced) -> None:
    with traced.client() as client:
        wid = client.admit(request(), 10_000).workload.workload_id
        claim = client.claim_next("t", "app", "w1", CAPS, 11_000, 5_000)
        assert claim is not None
        client.start(wid, claim.fence, 12_000)
        with pytest.raises(WorkloadError):
            client.start(wid, Fence(claim_id="c", worker_id="w1", token=9), 12_500)

    spans = traced.spans(4)
    assert [s.name for s in spans] == [
        "workwarden.admit",
        "workwarden.claim_next",
        "workwarden.start",
        "workwarden.start",
    ]
    admitted, claimed, started, refused = (_attributes(s) for s in spans)
    assert admitted["workwarden.workload_id"] == wid
    assert started["workwarden.workload_id"] == refused["workwarden.workload_id"] == wid
    assert claimed["workwarden.actor_class"] == "worker"
    assert "workwarden.code" not in started
    assert started["http.response.status_code"] == 200
    assert refused["workwarden.code"] == "WORKLOAD_STALE_FENCE"
    assert refused["workwarden.error_class"] == "attempt_over"
    assert refused["http.response.status_code"] == 409
    # A refusal is the API working, not a failure of the service.
    assert all(s.status.status_code != StatusCode.ERROR for s in spans)
    assert all(s.kind == SpanKind.SERVER for s in spans)


def test_a_refused_token_and_an_operate_call_are_spans_with_their_names_and_codes(
    traced: Traced,
) -> None:
    reply = httpx.post(traced.url + "/v1/claim", json={}, headers={"X-Workwarden-Now": "1"})
    assert reply.status_code == 401
    with traced.client() as client:
        wid = client.admit(request(), 10_000).workload.workload_id
        with pytest.raises(WorkloadError):
            client.operate(wid, "pause", "alice", 11_000)
    missing, _, operate = (_attributes(s) for s in traced.spans(3))
    assert missing["workwarden.code"] == "WORKWARDEN_UNAUTHENTICATED"
    assert missing["http.response.status_code"] == 401
    assert operate["workwarden.operation"] == "pause"
    assert operate["workwarden.workload_id"] == wid
    assert traced.spans(3)[2].name == "workwarden.pause"


def test_a_batch_span_names_its_workloads_and_the_codes_of_its_refused_slots(
    traced: Traced,
) -> None:
    with traced.client() as client:
        answers = client.admit_many(
            [
                request(idempotency_key="a"),
                request(idempotency_key="b"),
                request(idempotency_key="a", input={"id": 2}),
            ],
            10_000,
        )
        claims = client.claim_many("t", "app", "w1", CAPS, 11_000, 5_000, 5)
    admitted = [a.workload.workload_id for a in answers if not isinstance(a, WorkloadError)]
    admit, claim = traced.spans(2)
    assert admit.name == "workwarden.admit_many"
    assert _attributes(admit)["workwarden.batch.size"] == 3
    assert _attributes(admit)["workwarden.batch.refused"] == 1
    assert list(_attributes(admit)["workwarden.codes"]) == ["IDEMPOTENCY_KEY_REUSED"]
    assert list(_attributes(admit)["workwarden.workload_ids"]) == admitted
    assert claim.name == "workwarden.claim_many"
    assert list(_attributes(claim)["workwarden.workload_ids"]) == [c.workload_id for c in claims]


def test_a_call_made_inside_a_callers_span_continues_its_trace(traced: Traced) -> None:
    tracer = traced.provider.get_tracer("a worker")
    with traced.client() as client:
        wid = client.admit(request(), 10_000).workload.workload_id
        with tracer.start_as_current_span("handle one workload") as parent:
            client.get(wid)
    _, read = traced.spans(2)
    assert read.name == "workwarden.get"
    assert read.parent is not None
    assert read.parent.span_id == parent.get_span_context().span_id
    assert read.context.trace_id == parent.get_span_context().trace_id


_WITHOUT_OPENTELEMETRY = """
import sys
sys.modules["opentelemetry"] = None  # as if opentelemetry-api were not installed
from workwarden.service import tracing
from workwarden.service.problems import problem_body
from workwarden.service.tracing import TracingMiddleware
from workwarden.statemachine.errors import WorkloadError
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

async def claim(request):
    tracing.annotate(workload_id="w")
    tracing.rename("claim")
    return JSONResponse(problem_body(WorkloadError("WORKLOAD_NOT_FOUND", "no")), status_code=404)

app = Starlette(routes=[Route("/v1/claim", claim, methods=["POST"])])
app.add_middleware(TracingMiddleware)
headers = {}
tracing.inject(headers)
reply = TestClient(app).post("/v1/claim", headers=headers)
print(tracing.ENABLED, headers, reply.status_code, reply.json()["code"])
"""


def test_without_the_opentelemetry_api_the_service_answers_the_same_and_records_nothing() -> None:
    # FastAPI releases that ship their own telemetry import opentelemetry themselves,
    # so the middleware is exercised here in a plain Starlette app.
    run = subprocess.run(
        [sys.executable, "-c", _WITHOUT_OPENTELEMETRY],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "{}", "404", "WORKLOAD_NOT_FOUND"]
