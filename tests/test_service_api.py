"""The HTTP API of `workwarden serve`, driven over real HTTP against a real process.

Every refusal is a problem document with its catalogue code, its class and
the status `docs/service.md` documents; an unauthenticated or wrong-role call
is refused (`WORKWARDEN_UNAUTHENTICATED` 401, `WORKWARDEN_FORBIDDEN` 403) and
writes nothing; `HttpAuthority` answers exactly what the library answers;
`/metrics` counts what the store holds.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import select
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from served import reset, stored

import workwarden
from support import KEY_ID, SECRET, request
from workwarden.service.auth import TOKEN_PREFIX, issue_token
from workwarden.service.problems import status_for
from workwarden.service.state import wall_clock_ms
from workwarden.service.testing import RunningService, running_service
from workwarden.statemachine import Authority, Grant, GrantSigner, GrantVerifier, Subject
from workwarden.statemachine.catalogue import shipped_classes
from workwarden.statemachine.conformance.scenarios import request as fixture_request
from workwarden.statemachine.errors import WorkloadError
from workwarden.statemachine.models import Fence
from workwarden.statemachine.spec import default_spec
from workwarden.storage import MemoryStore

DOCS = Path(__file__).resolve().parents[1] / "docs" / "service.md"
CAPS = ["email:send"]


@pytest.fixture(scope="module")
def service() -> Iterator[RunningService]:
    with running_service(grant_keys={KEY_ID: SECRET}) as running:
        yield running


@pytest.fixture
def fresh(service: RunningService) -> RunningService:
    """The service with an empty store, verifying the fixture key's grants."""
    return reset(service)


def _post(
    service: RunningService, op: str, body: Any, token: str | None, now: int = 20_000
) -> httpx.Response:
    headers = {"X-Workwarden-Now": str(now)}
    if token is not None:
        headers["Authorization"] = "Bearer " + token
    return httpx.post(f"{service.url}/v1/{op}", json=body, headers=headers)


def _documented_statuses() -> dict[str, int]:
    rows = re.findall(r"^\| `([A-Z_]+)` \| `?([a-z_]+)`? \| (\d{3}) \|", DOCS.read_text(), re.M)
    return {code: int(status) for code, _, status in rows}


def _assert_problem(reply: httpx.Response, code: str) -> dict[str, Any]:
    assert reply.headers["content-type"].startswith("application/problem+json"), reply.text
    body: dict[str, Any] = reply.json()
    assert body["code"] == code, body
    assert body["class"] == shipped_classes()[code]
    assert reply.status_code == body["status"] == status_for(code) == _documented_statuses()[code]
    return body


def test_every_catalogue_code_has_the_status_the_docs_table_gives() -> None:
    documented = _documented_statuses()
    classes = shipped_classes()
    assert set(documented) == set(classes)
    for code in classes:
        assert documented[code] == status_for(code), code
    table = re.findall(r"^\| `([A-Z_]+)` \| `?([a-z_]+)`? \|", DOCS.read_text(), re.M)
    assert dict(table) == classes


def test_refusals_over_http_carry_their_code_class_and_documented_status(
    fresh: RunningService,
) -> None:
    worker = fresh.token("worker", "w1")
    operator = fresh.token("operator", "alice")
    admitted = _post(fresh, "admit", request().model_dump(mode="json"), worker, 10_000)
    assert admitted.status_code == 200, admitted.text
    wid = admitted.json()["workload"]["workload_id"]

    _assert_problem(_post(fresh, "start", {}, worker), "WORKLOAD_INVALID")
    _assert_problem(
        httpx.get(f"{fresh.url}/v1/workloads/nope", headers={"Authorization": f"Bearer {worker}"}),
        "WORKLOAD_NOT_FOUND",
    )
    _assert_problem(_post(fresh, "admit", {}, None), "WORKWARDEN_UNAUTHENTICATED")
    forged = fixture_request("forged", signer=GrantSigner("other", bytes(range(100, 132))))
    _assert_problem(
        _post(fresh, "admit", forged.model_dump(mode="json"), worker), "WORKLOAD_UNAUTHORIZED"
    )
    reused = request(input={"id": 2}).model_dump(mode="json")
    _assert_problem(_post(fresh, "admit", reused, worker), "IDEMPOTENCY_KEY_REUSED")
    claim = {"workload_id": wid, "worker_id": "w1", "lease_ms": 5_000}
    _assert_problem(
        _post(fresh, "claim", {**claim, "capabilities": []}, worker), "WORKLOAD_CAPABILITY_DENIED"
    )
    held = _post(fresh, "claim", {**claim, "capabilities": CAPS}, worker, 20_000)
    assert held.status_code == 200, held.text
    fence = {"claim_id": held.json()["claim_id"], "worker_id": "w1", "token": 1}
    _assert_problem(
        _post(
            fresh,
            "claim",
            {**claim, "capabilities": CAPS, "worker_id": "w2"},
            fresh.token("worker"),
        ),
        "WORKLOAD_NOT_READY",
    )
    _assert_problem(
        _post(fresh, "start", {"workload_id": wid, "fence": {**fence, "token": 7}}, worker),
        "WORKLOAD_STALE_FENCE",
    )
    _assert_problem(
        _post(fresh, "retry", {"workload_id": wid, "actor": "alice"}, operator),
        "WORKLOAD_TRANSITION_DENIED",
    )
    assert _post(fresh, "start", {"workload_id": wid, "fence": fence}, worker, 21_000).is_success
    _assert_problem(
        _post(
            fresh,
            "checkpoint",
            {"workload_id": wid, "fence": fence, "state": {"password": "hunter2"}},
            worker,
            22_000,
        ),
        "WORKLOAD_SECRET_REJECTED",
    )
    _assert_problem(
        _post(
            fresh,
            "heartbeat",
            {"workload_id": wid, "fence": fence, "extend_ms": 10},
            worker,
            99_000,
        ),
        "WORKLOAD_LEASE_EXPIRED",
    )
    later = request(idempotency_key="later", not_before=50_000).model_dump(mode="json")
    later_id = _post(fresh, "admit", later, worker, 30_000).json()["workload"]["workload_id"]
    _assert_problem(
        _post(
            fresh,
            "claim",
            {"workload_id": later_id, "worker_id": "w1", "lease_ms": 5, "capabilities": CAPS},
            worker,
            31_000,
        ),
        "WORKLOAD_NOT_YET_ELIGIBLE",
    )
    missing = _post(fresh, "no-such-operation", {}, worker)
    assert missing.status_code == 404
    assert missing.json()["code"] == "WORKLOAD_NOT_FOUND"


def _refusals() -> list[tuple[str, Callable[[RunningService], tuple[str, Any, str | None]]]]:
    other = GrantSigner("other", bytes(range(100, 132)))

    def expired(s: RunningService) -> str:
        signer = GrantSigner("serve-test", s.token_secret)
        return issue_token(signer, "w1", "worker", 1_000, 1_000)

    def forged(s: RunningService) -> str:
        return issue_token(other, "*", "operator", 1_000, 2**40)

    def claim(worker: str) -> dict[str, Any]:
        return {"workload_id": "-", "worker_id": worker, "lease_ms": 10, "capabilities": CAPS}

    return [
        ("no token", lambda s: ("admit", request().model_dump(mode="json"), None)),
        ("not a token", lambda s: ("admit", request().model_dump(mode="json"), "wwt1.garbage")),
        ("another key", lambda s: ("retry", {"workload_id": "x", "actor": "a"}, forged(s))),
        ("expired", lambda s: ("claim", claim("w1"), expired(s))),
        (
            "worker calls retry",
            lambda s: ("retry", {"workload_id": "x", "actor": "w1"}, s.token("worker", "w1")),
        ),
        ("operator claims", lambda s: ("claim", claim("alice"), s.token("operator", "alice"))),
        (
            "operator confirms",
            lambda s: (
                "confirm_cancel",
                {"workload_id": "x", "fence": {"claim_id": "c", "worker_id": "alice", "token": 1}},
                s.token("operator", "alice"),
            ),
        ),
        ("worker as another", lambda s: ("claim", claim("w2"), s.token("worker", "w1"))),
        (
            "operator as another",
            lambda s: (
                "cancel",
                {"workload_id": "x", "actor": "bob"},
                s.token("operator", "alice"),
            ),
        ),
    ]


@pytest.mark.parametrize(("case", "make"), _refusals(), ids=[case for case, _ in _refusals()])
def test_an_unauthenticated_or_wrong_role_call_is_refused_and_writes_nothing(
    fresh: RunningService, case: str, make: Callable[[RunningService], tuple[str, Any, str | None]]
) -> None:
    seeded = _post(fresh, "admit", request().model_dump(mode="json"), fresh.token("worker"), 10_000)
    assert seeded.is_success
    before = stored(fresh)
    op, body, token = make(fresh)
    if "workload_id" in body:
        body["workload_id"] = seeded.json()["workload"]["workload_id"]
    reply = _post(fresh, op, body, token, 20_000)
    if case in {"no token", "not a token", "another key", "expired"}:
        problem = _assert_problem(reply, "WORKWARDEN_UNAUTHENTICATED")
        assert reply.status_code == 401
        assert reply.headers["www-authenticate"] == 'Bearer realm="workwarden"'
        assert problem["details"]["reason"] in {"missing_token", "invalid_token", "expired_token"}
    else:
        problem = _assert_problem(reply, "WORKWARDEN_FORBIDDEN")
        assert reply.status_code == 403
        assert problem["details"]["reason"] in {"wrong_actor_class", "subject_mismatch"}
        assert problem["details"]["operation"] == op
    assert stored(fresh) == before


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        reply = call()
    except WorkloadError as exc:
        return ("refused", exc.code, exc.details if exc.code != "WORKLOAD_INVALID" else None)
    if isinstance(reply, list):
        return [r.model_dump(mode="json") if hasattr(r, "model_dump") else r for r in reply]
    return reply.model_dump(mode="json") if hasattr(reply, "model_dump") else reply


def _script(authority: Any) -> list[Any]:
    """One life of a workload and a few refusals, through `authority`."""
    out: list[Any] = []
    run = out.append
    admitted = authority.admit(request(), 10_000)
    run(admitted.model_dump(mode="json"))
    wid = admitted.workload.workload_id
    run(_outcome(lambda: authority.admit(request(), 10_500)))
    run(_outcome(lambda: authority.claim_next("t", "app", "w1", ["other"], 11_000, 5_000)))
    claim = authority.claim_next("t", "app", "w1", CAPS, 11_000, 5_000)
    run(claim.model_dump(mode="json"))
    fence = claim.fence
    run(_outcome(lambda: authority.start(wid, fence, 12_000)))
    run(_outcome(lambda: authority.start(wid, fence, 12_100)))
    run(_outcome(lambda: authority.heartbeat(wid, fence, 13_000, 9_000)))
    run(_outcome(lambda: authority.checkpoint(wid, fence, {"step": 1}, 14_000, sequence=1)))
    run(_outcome(lambda: authority.execution_context(wid, fence, 14_500, ["secret://vault/x"])))
    run(_outcome(lambda: authority.execution_context(wid, fence, 14_500, ["plain"])))
    run(
        _outcome(lambda: authority.start(wid, Fence(claim_id="c", worker_id="w1", token=9), 15_000))
    )
    run(_outcome(lambda: authority.complete(wid, fence, "r1", {"ok": True}, 16_000)))
    run(_outcome(lambda: authority.complete(wid, fence, "r1", {"ok": True}, 16_500)))
    run(_outcome(lambda: authority.fail(wid, fence, "timeout", "late", 17_000)))
    run(_outcome(lambda: authority.retry(wid, "alice", 17_500, "again")))
    run(_outcome(lambda: authority.cancel(wid, "alice", 18_000)))
    run(_outcome(lambda: authority.timeout(wid, "alice", 18_000)))
    run(_outcome(lambda: authority.operate(wid, "pause", "alice", 18_000)))
    second = authority.admit(request(idempotency_key="two"), 19_000).workload.workload_id
    held = authority.claim(second, "w1", CAPS, 19_000, 100)
    run(_outcome(lambda: authority.recover_expired(19_050)))
    run(_outcome(lambda: authority.recover_expired(19_100, tenant="t")))
    run(_outcome(lambda: authority.fail(second, held.fence, "validation", "bad input", 19_200)))
    run(_outcome(lambda: authority.enforce_deadlines(20_000)))
    run(_outcome(lambda: authority.get(wid)))
    run(_outcome(lambda: authority.get(wid, tenant="other")))
    run(_outcome(lambda: authority.list("t", "app")))
    run(_outcome(lambda: authority.claim(wid, "", CAPS, 1, 1)))
    return out


def test_the_client_answers_and_refuses_exactly_as_the_library(fresh: RunningService) -> None:
    library = Authority(MemoryStore(), grants=GrantVerifier({KEY_ID: SECRET}))
    with fresh.client(fresh.token("worker", "w1"), fresh.token("operator", "alice")) as client:
        assert _script(client) == _script(library)


def _fields_of_too_many_names(warden: Any) -> list[tuple[str, list[str]]]:
    """Calls naming more capabilities than a claim takes: each refusal's code and fields."""
    admitted = warden.admit(request(idempotency_key="names"), 20_000).workload.workload_id
    names = [f"cap-{n}" for n in range(300)]
    answers = []
    for call in (
        lambda: warden.claim(admitted, "w1", names, 20_001, 1_000),
        lambda: warden.claim_next("t", "app", "w1", names, 20_001, 1_000),
    ):
        with pytest.raises(WorkloadError) as refused:
            call()
        details = refused.value.details or {}
        answers.append((refused.value.code, [e["field"] for e in details.get("errors", [])]))
    return answers


def test_the_client_names_a_list_of_names_too_long_as_the_library_does(
    fresh: RunningService,
) -> None:
    library = Authority(MemoryStore(), grants=GrantVerifier({KEY_ID: SECRET}))
    with fresh.client(fresh.token("worker", "w1"), fresh.token("operator", "alice")) as client:
        answered = _fields_of_too_many_names(client)
    assert answered == _fields_of_too_many_names(library)
    assert answered == [("WORKLOAD_INVALID", ["capabilities"])] * 2


def _bad_calls(warden: Any) -> list[tuple[str, Any]]:
    """Calls with bad arguments, each answered by the refusal's code (or "ok" and the answer)."""
    admitted = warden.admit(request(idempotency_key="base"), 20_000).workload.workload_id
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("admit now None", lambda: warden.admit(request(idempotency_key="n1"), None)),
        ("admit now text", lambda: warden.admit(request(idempotency_key="n2"), "1")),
        ("admit input nan", lambda: warden.admit(request(input={"x": float("nan")}), 20_000)),
        ("admit input inf", lambda: warden.admit(request(input={"x": float("inf")}), 20_000)),
        ("admit input surrogate", lambda: warden.admit(request(input={"x": "\udc80"}), 20_000)),
        ("recover now None", lambda: warden.recover_expired(None)),
        ("recover tenant bytes", lambda: warden.recover_expired(20_000, tenant=b"t")),
        ("get tenant empty", lambda: warden.get(admitted, tenant="")),
        ("get tenant number", lambda: warden.get(admitted, tenant=5)),
        ("get tenant surrogate", lambda: warden.get(admitted, tenant="a\udc80")),
        ("get tenant huge", lambda: warden.get(admitted, tenant="x" * 1_100_000)),
        ("list application bytes", lambda: warden.list("t", b"app")),
        ("list_page limit 0", lambda: warden.list_page("t", "app", 0)),
        ("list_page limit 1001", lambda: warden.list_page("t", "app", 1_001)),
        ("list_page limit True", lambda: warden.list_page("t", "app", True)),
        ("list_page after garbage", lambda: warden.list_page("t", "app", 5, "garbage!")),
        ("list_page after number", lambda: warden.list_page("t", "app", 5, 7)),
        ("purge older than 2**63", lambda: warden.purge(20_000, older_than_ms=2**63)),
    ]
    answers: list[tuple[str, Any]] = []
    for name, call in calls:
        try:
            call()
        except WorkloadError as exc:
            answers.append((name, exc.code))
        else:
            answers.append((name, "ok"))
    return answers


def test_the_client_refuses_bad_arguments_as_the_library_does_and_sends_nothing(
    fresh: RunningService,
) -> None:
    library = Authority(MemoryStore(), grants=GrantVerifier({KEY_ID: SECRET}))
    with fresh.client(fresh.token("worker", "w1"), fresh.token("operator", "alice")) as client:
        over_http = _bad_calls(client)
    assert over_http == _bad_calls(library)
    assert {code for _, code in over_http} == {"WORKLOAD_INVALID"}
    # Only the base admission was written: no bad call reached the store.
    assert len(stored(fresh)) == 1


def _pages(warden: Any, limit: int) -> list[tuple[list[str], bool]]:
    """Admissions at three priorities, then the scope walked by pages: ids and whether more."""
    for n in range(11):
        warden.admit(request(idempotency_key=f"page-{n}", priority=n % 3), 20_000 + n)
    pages, after = [], None
    while True:
        page = warden.list_page("t", "app", limit, after)
        pages.append(([w.idempotency_key for w in page.workloads], page.next is not None))
        if page.next is None:
            return pages
        after = page.next


def test_a_scope_is_listed_by_pages_alike_through_the_client_and_the_library(
    fresh: RunningService,
) -> None:
    library = Authority(MemoryStore(), grants=GrantVerifier({KEY_ID: SECRET}))
    with fresh.client(fresh.token("worker", "w1"), fresh.token("operator", "alice")) as client:
        over_http = _pages(client, 4)
        whole = [w.idempotency_key for w in client.list("t", "app")]
    assert over_http == _pages(library, 4)
    assert [len(ids) for ids, _ in over_http] == [4, 4, 3]
    assert [key for ids, _ in over_http for key in ids] == whole
    token = fresh.token("worker", "w1")
    for limit in ("+5", "5.0", "1_0", "", "99999999999"):
        reply = httpx.get(
            f"{fresh.url}/v1/list_page",
            params={"tenant": "t", "application": "app", "limit": limit},
            headers={"Authorization": "Bearer " + token},
        )
        body = _assert_problem(reply, "WORKLOAD_INVALID")
        assert "limit" in body["detail"], (limit, body)


def test_the_openapi_document_names_every_operation_and_its_models(fresh: RunningService) -> None:
    document = httpx.get(fresh.url + "/openapi.json").json()
    operations = {
        "admit", "claim", "claim_next", "start", "heartbeat", "execution_context", "checkpoint",
        "complete", "fail", "cancel", "confirm_cancel", "timeout", "retry", "operate",
        "recover_expired", "enforce_deadlines", "admit_many", "claim_many", "report_many",
        "list_page",
    }  # fmt: skip
    assert {f"/v1/{op}" for op in operations} <= set(document["paths"])
    paths = document["paths"]
    for op, body in (
        ("admit_many", "AdmitBatch"),
        ("claim_many", "ClaimBatch"),
        ("report_many", "ReportBatch"),
    ):
        request_body = paths[f"/v1/{op}"]["post"]["requestBody"]["content"]["application/json"]
        assert request_body["schema"]["$ref"].endswith("/" + body)
    slots = paths["/v1/report_many"]["post"]["responses"]["200"]["content"]["application/json"]
    assert slots["schema"]["items"]["$ref"].endswith("/ReportSlot")
    assert "/v1/workloads/{workload_id}" in document["paths"]
    start = document["paths"]["/v1/start"]["post"]
    assert start["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/StartCommand"
    )
    schemas = document["components"]["schemas"]
    assert {"CreateWorkload", "AdmitReply", "ClaimReply", "Workload", "Problem"} <= set(schemas)
    # A list's bound is a number of items (validators ignore maxLength on arrays).
    for model, field in (
        ("CreateWorkload", "capability_snapshot"),
        ("CreateWorkload", "connection_scopes"),
        ("ClaimCommand", "capabilities"),
    ):
        bounded = schemas[model]["properties"][field]
        assert (bounded["type"], bounded.get("maxItems"), "maxLength" in bounded) == (
            "array",
            256,
            False,
        ), (model, field, bounded)
    assert {"AdmitSlot", "ReportSlot", "AdmitBatch", "ClaimBatch", "ReportBatch"} <= set(schemas)


def _samples(text: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def test_metrics_parse_and_count_what_the_store_holds(fresh: RunningService) -> None:
    before = _samples(httpx.get(fresh.url + "/metrics").text)
    with fresh.client(fresh.token("worker", "w1"), fresh.token("operator", "alice")) as client:
        for n in range(4):
            client.admit(request(idempotency_key=f"k{n}"), 10_000 + n)
        client.admit(request(idempotency_key="other", tenant_id="t2"), 10_010)
        first = client.claim_next("t", "app", "w1", CAPS, 11_000, 60_000, request_id="c1")
        second = client.claim_next("t", "app", "w1", CAPS, 11_000, 60_000, request_id="c2")
        lost = client.claim_next("t", "app", "w1", CAPS, 11_000, 100, request_id="c3")
        assert first
        assert second
        assert lost
        client.start(first.workload_id, first.fence, 12_000)
        client.start(second.workload_id, second.fence, 12_500)
        client.complete(first.workload_id, first.fence, "r1", {"ok": 1}, 14_000)
        client.complete(first.workload_id, first.fence, "r1", {"ok": 1}, 14_100)  # a replay
        client.fail(second.workload_id, second.fence, "validation", "bad input", 15_000)
        assert client.recover_expired(16_000) == [lost.workload_id]
        with pytest.raises(WorkloadError):
            client.start(second.workload_id, second.fence, 16_500)

    samples = _samples(httpx.get(fresh.url + "/metrics").text)
    held = Counter(
        (d["document"]["tenant_id"], d["document"]["application_id"], d["document"]["state"])
        for d in stored(fresh)
    )
    gauge = {
        (s.labels["tenant"], s.labels["application"], s.labels["state"]): s.value
        for s in samples["workwarden_workloads"]
    }
    # Every state of the spec has its sample for each scope held, 0 when none is in it.
    states = default_spec().states
    scopes = {(tenant, application) for tenant, application, _ in held}
    assert gauge == {(*scope, state): held[(*scope, state)] for scope in scopes for state in states}
    assert 0 in gauge.values()

    def value(taken: dict[str, list[Any]], name: str, **labels: str) -> float:
        return sum(s.value for s in taken.get(name, []) if s.labels.items() >= labels.items())

    def grew(name: str, **labels: str) -> float:
        return value(samples, name, **labels) - value(before, name, **labels)

    assert grew("workwarden_claims_total") == 3
    assert grew("workwarden_completions_total") == 1
    assert grew("workwarden_failures_total", kind="validation") == 1
    assert grew("workwarden_recoveries_total") == 1
    assert grew("workwarden_admission_to_start_seconds_count") == 2
    assert grew("workwarden_claim_to_complete_seconds_count") == 1
    assert grew("workwarden_claim_to_complete_seconds_sum") == pytest.approx(3.0)


def test_claims_that_start_their_attempt_are_counted_and_timed_from_admission() -> None:
    # Under the claim-starts example a granted claim is in RUNNING, not CLAIMED, and no
    # `start` call follows: the claim is still a claim, and its start is still a start.
    claim_starts = DOCS.parents[1] / "specs" / "examples" / "claim_starts.toml"
    extra = ["--spec", str(claim_starts)]
    with running_service(grant_keys={KEY_ID: SECRET}, extra_args=extra) as served:
        with served.client(served.token("worker", "w1")) as client:
            for n in range(3):
                client.admit(request(idempotency_key=f"k{n}"), 10_000)
            one = client.claim_next("t", "app", "w1", CAPS, 11_000, 60_000)
            more = client.claim_many("t", "app", "w1", CAPS, 12_000, 60_000, 2)
            assert one is not None
            assert client.get(one.workload_id).state == "RUNNING"
            assert len(more) == 2
        samples = _samples(httpx.get(served.url + "/metrics").text)
    assert [s.value for s in samples["workwarden_claims_total"]] == [3]
    assert [s.value for s in samples["workwarden_admission_to_start_seconds_count"]] == [3]
    assert [s.value for s in samples["workwarden_admission_to_start_seconds_sum"]] == [5.0]


def test_a_failure_reported_through_execute_is_counted_as_through_fail(
    fresh: RunningService,
) -> None:
    def failures(kind: str) -> float:
        taken = _samples(httpx.get(fresh.url + "/metrics").text)
        found = taken.get("workwarden_failures_total", [])
        return sum(s.value for s in found if s.labels.get("kind") == kind)

    worker = fresh.token("worker", "w1")
    with fresh.client(worker, fresh.token("operator", "alice")) as client:
        for n in range(2):
            client.admit(request(idempotency_key=f"k{n}"), 10_000 + n)
        by_route = client.claim_next("t", "app", "w1", CAPS, 11_000, 60_000, request_id="c1")
        by_execute = client.claim_next("t", "app", "w1", CAPS, 11_000, 60_000, request_id="c2")
    assert by_route
    assert by_execute
    before = failures("validation")
    for op, claim in (("fail", by_route), ("execute", by_execute)):
        body = {
            "op": "fail",
            "workload_id": claim.workload_id,
            "fence": claim.fence.model_dump(),
            "kind": "validation",
            "error": "bad input",
        }
        reply = _post(fresh, op, body, worker, now=12_000)
        assert reply.status_code == 200, reply.text
    assert failures("validation") - before == 2


def test_serve_refuses_what_it_cannot_serve_with_one_coded_line(tmp_path: Path) -> None:
    keys = tmp_path / "tokens.json"
    keys.write_text('{"k": "' + SECRET.hex() + '"}')
    base = [sys.executable, "-m", "workwarden", "serve", "--token-keys", str(keys)]
    db = tmp_path / "work.db"
    cases = [
        ([], "WORKWARDEN_USAGE", 2),  # neither --grant-keys nor --no-grant-signatures
        (["--no-grant-signatures", "--store", f"sqlite:///{db}", "--create", "--allow-reset"],
         "WORKWARDEN_USAGE", 2),
        (["--no-grant-signatures", "--store", "bogus://x"], "WORKLOAD_STORE_URL_INVALID", 1),
        (["--issue-token", "root:x"], "WORKLOAD_INVALID", 1),
    ]  # fmt: skip
    for extra, code, status in cases:
        run = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60)
        assert run.returncode == status, run.stderr
        assert run.stderr.splitlines()[0].startswith(f"{code}: "), run.stderr
        assert "Traceback" not in run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens.json"]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        run = subprocess.run(
            [*base, "--no-grant-signatures", "--store", "memory:", "--port", port],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert run.returncode == 2
    assert run.stderr.startswith("WORKWARDEN_USAGE: serve: cannot listen on")


def test_issue_token_refuses_a_ttl_no_token_could_have(tmp_path: Path) -> None:
    # Under a millisecond the token would expire as it is issued; past 2**53 - 1 ms its
    # expiry is no instant at all.
    keys = tmp_path / "tokens.json"
    keys.write_text('{"k": "' + SECRET.hex() + '"}')
    base = [sys.executable, "-m", "workwarden", "serve", "--token-keys", str(keys)]
    for ttl in ("0.0001", "1e300"):
        run = subprocess.run(
            [*base, "--issue-token", "worker:w1", "--token-ttl", ttl],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 2, (ttl, run.stdout, run.stderr)
        assert run.stdout == ""
        first = run.stderr.splitlines()[0]
        assert first.startswith("WORKWARDEN_USAGE: "), run.stderr
        assert "--token-ttl" in first
    run = subprocess.run(
        [*base, "--issue-token", "worker:w1", "--token-ttl", "0.001"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(TOKEN_PREFIX)


def test_sigterm_stops_the_service_gracefully() -> None:
    with running_service() as service:
        assert httpx.get(service.url + "/healthz").json()["ok"] is True
        service.process.send_signal(signal.SIGTERM)
        # uvicorn shuts down; the command then exits 0, as a worker's clean stop does.
        assert service.process.wait(timeout=10) == 0
        assert "Traceback" not in service.stderr()


def _raw(
    service: RunningService, head: list[str], pieces: Iterator[bytes]
) -> tuple[int, dict[str, str], Any]:
    """POST over a plain socket, sending `pieces` of the body only until the reply comes.

    So a test sees whether the service answered before the body arrived: a
    reply that needed the whole body would never come (the socket times out).
    """
    host, port = service.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(("\r\n".join([*head, f"Host: {host}", "", ""])).encode("latin-1"))
        for piece in pieces:
            if select.select([conn], [], [], 0)[0]:
                break  # the reply is there: the rest of the body is never sent
            try:
                conn.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break  # the service answered and closed: its reply is waiting to be read
        reply = http.client.HTTPResponse(conn)
        reply.begin()
        headers = {name.lower(): value for name, value in reply.getheaders()}
        return reply.status, headers, json.loads(reply.read())


def test_a_call_without_a_token_is_refused_before_its_body_is_read(fresh: RunningService) -> None:
    before = stored(fresh)
    malformed = httpx.post(
        fresh.url + "/v1/admit", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert _assert_problem(malformed, "WORKWARDEN_UNAUTHENTICATED")["details"] == {
        "reason": "missing_token"
    }
    # 20 MB announced, one byte sent: the refusal cannot have waited for the body.
    head = ["POST /v1/admit HTTP/1.1", "Content-Type: application/json", "Content-Length: 20000000"]
    status, headers, body = _raw(fresh, head, iter([b"{"]))
    assert (status, body["status"], body["code"]) == (401, 401, "WORKWARDEN_UNAUTHENTICATED")
    assert headers["www-authenticate"].startswith("Bearer")
    assert stored(fresh) == before


def test_a_body_over_the_limit_is_refused_413_and_a_batch_of_big_json_fits(
    fresh: RunningService,
) -> None:
    limit = 32 * 1024 * 1024  # docs/service.md: 32 MiB with the shipped spec
    token = "Authorization: Bearer " + fresh.token("worker", "w1")
    before = stored(fresh)
    announced = ["POST /v1/admit HTTP/1.1", token, "Content-Type: application/json"]
    status, _, body = _raw(fresh, [*announced, f"Content-Length: {limit + 1}"], iter([b"{"]))
    assert (status, body["status"], body["code"]) == (413, 413, "WORKLOAD_INVALID")
    assert body["class"] == "fix_request"
    assert str(limit) in body["detail"]
    # Without a Content-Length the body is counted as it arrives, and cut off at the limit.
    chunk = b" " * (1024 * 1024)
    framed = (b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(64))
    status, _, body = _raw(fresh, [*announced, "Transfer-Encoding: chunked"], framed)
    assert (status, body["status"], body["code"]) == (413, 413, "WORKLOAD_INVALID")
    assert stored(fresh) == before

    # The largest input the spec takes (1 MiB), and a batch of 1,000 admissions, fit.
    worker = fresh.token("worker", "w1")
    biggest = request(idempotency_key="big", input={"blob": "x" * 1_000_000})
    assert _post(fresh, "admit", biggest.model_dump(mode="json"), worker).status_code == 200
    batch = [
        request(idempotency_key=f"k{n}", input={"blob": "y" * 8_000}).model_dump(mode="json")
        for n in range(1_000)
    ]
    admitted = _post(fresh, "admit_many", {"requests": batch}, worker)
    assert admitted.status_code == 200, admitted.text[:500]
    assert all("ok" in slot for slot in admitted.json())


def test_unknown_query_parameters_are_refused_naming_them_and_write_nothing(
    fresh: RunningService,
) -> None:
    worker = fresh.token("worker", "w1")
    auth = {"Authorization": "Bearer " + worker}
    _post(fresh, "admit", request().model_dump(mode="json"), worker, 10_000)
    before = stored(fresh)
    listed = httpx.get(
        fresh.url + "/v1/workloads",
        params={"tenant": "t", "application": "app", "state": "READY"},
        headers=auth,
    )
    problem = _assert_problem(listed, "WORKLOAD_INVALID")
    assert problem["details"]["errors"] == [
        {"field": "state", "message": "unknown query parameter"}
    ]
    assert "state" in problem["detail"]
    dry = httpx.post(
        fresh.url + "/v1/admit",
        params={"dry_run": "true"},
        json=request(idempotency_key="dry").model_dump(mode="json"),
        headers=auth,
    )
    assert [e["field"] for e in _assert_problem(dry, "WORKLOAD_INVALID")["details"]["errors"]] == [
        "dry_run"
    ]
    operator = {"Authorization": "Bearer " + fresh.token("operator", "alice")}
    pauses = httpx.get(
        fresh.url + "/v1/pauses", params={"tenant": "t", "all": "1"}, headers=operator
    )
    assert _assert_problem(pauses, "WORKLOAD_INVALID")["details"]["errors"][0]["field"] == "all"
    assert stored(fresh) == before
    # The parameters a route declares are still taken.
    known = httpx.get(
        fresh.url + "/v1/workloads", params={"tenant": "t", "application": "app"}, headers=auth
    )
    assert known.status_code == 200
    assert len(known.json()) == 1


def test_a_path_with_a_slash_too_many_is_an_unknown_route_not_a_redirect(
    fresh: RunningService,
) -> None:
    # Redirected, the Location was built from the Host header the caller sent.
    auth = {"Authorization": "Bearer " + fresh.token("worker"), "Host": "evil.example"}
    for method, path in (("POST", "/v1/admit/"), ("GET", "/metrics/"), ("GET", "/healthz/")):
        answer = httpx.request(method, fresh.url + path, headers=auth, json={})
        assert answer.status_code == 404, (path, answer.headers)
        assert "location" not in answer.headers
        assert _assert_problem(answer, "WORKLOAD_NOT_FOUND")["details"]["path"] == path
    # The console's home is still reached without its slash, on this host's own path.
    home = httpx.get(fresh.url + "/console", headers={"Host": "evil.example"})
    assert (home.status_code, home.headers["location"]) == (307, "/console/")


def test_a_wrong_method_is_405_with_allow_and_head_answers_as_get(fresh: RunningService) -> None:
    put = httpx.put(fresh.url + "/v1/admit", json={})
    assert put.status_code == put.json()["status"] == 405
    assert put.json()["code"] == "WORKLOAD_INVALID"
    assert put.headers["allow"] == "POST"
    posted = httpx.post(fresh.url + "/healthz")
    assert posted.status_code == posted.json()["status"] == 405
    assert posted.headers["allow"] == "GET, HEAD"
    # A console page and the form posted to it share a path: both methods are allowed.
    for path in ("/console/pauses", "/console/login"):
        put = httpx.put(fresh.url + path)
        assert put.status_code == put.json()["status"] == 405, path
        assert put.headers["allow"] == "GET, HEAD, POST", path
        assert put.json()["detail"].endswith("it takes GET, HEAD, POST"), path

    health = httpx.get(fresh.url + "/healthz")
    assert health.json() == {"ok": True, "version": workwarden.__version__}
    for path in ("/healthz", "/metrics", "/console/"):
        head = httpx.head(fresh.url + path)
        assert head.status_code == 200, path
        assert head.content == b""
        assert head.headers["content-type"] == httpx.get(fresh.url + path).headers["content-type"]
    auth = {"Authorization": "Bearer " + fresh.token("worker")}
    listed = httpx.head(
        fresh.url + "/v1/workloads", params={"tenant": "t", "application": "app"}, headers=auth
    )
    assert (listed.status_code, listed.content) == (200, b"")
    assert httpx.head(fresh.url + "/v1/workloads", params={"tenant": "t"}).status_code == 401


def _scoped_token(service: RunningService, **changes: Any) -> str:
    """A worker's token for `w1` with fields of its grant changed, signed with the service's key."""
    fields: dict[str, Any] = {
        "id": "token:scoped",
        "issuer": Subject(kind="service", id="workwarden.serve"),
        "subject": Subject(kind="service", id="w1"),
        "tenant_id": "*",
        "application_id": "*",
        "capabilities": ("workwarden:worker",),
        "issued_at": wall_clock_ms() - 1_000,
        "expires_at": wall_clock_ms() + 3_600_000,
    }
    signed = GrantSigner("serve-test", service.token_secret).sign(Grant(**{**fields, **changes}))
    text = base64.urlsafe_b64encode(signed.model_dump_json().encode()).rstrip(b"=").decode()
    return TOKEN_PREFIX + text


def test_each_bad_authorization_has_its_documented_reason_and_writes_nothing(
    fresh: RunningService,
) -> None:
    token = fresh.token("worker", "w1")
    body = request().model_dump(mode="json")
    before = stored(fresh)
    cases = [
        ("Basic " + token, 401, "invalid_token"),
        (token, 401, "invalid_token"),
        ("Bearer", 401, "invalid_token"),
        ("Bearer " + _scoped_token(fresh, issued_at=wall_clock_ms() + 600_000), 401,
         "not_yet_valid_token"),
        ("Bearer " + _scoped_token(fresh, expires_at=wall_clock_ms() - 1), 401, "expired_token"),
        ("Bearer " + _scoped_token(fresh, tenant_id="other"), 403, "scoped_token"),
        ("Bearer " + _scoped_token(fresh, tenant_id="t", application_id="app"), 403,
         "scoped_token"),
    ]  # fmt: skip
    documented = DOCS.read_text()
    for header, status, reason in cases:
        reply = httpx.post(fresh.url + "/v1/admit", json=body, headers={"Authorization": header})
        code = "WORKWARDEN_UNAUTHENTICATED" if status == 401 else "WORKWARDEN_FORBIDDEN"
        problem = _assert_problem(reply, code)
        assert problem["details"]["reason"] == reason, (header[:12], problem)
        assert f"`{reason}`" in documented
    assert _post(fresh, "admit", body, _scoped_token(fresh)).status_code == 200
    assert len(stored(fresh)) == len(before) + 1


def test_a_body_that_is_not_json_is_refused_naming_the_parse_error_or_content_type(
    fresh: RunningService,
) -> None:
    auth = {"Authorization": "Bearer " + fresh.token("worker", "w1")}
    before = stored(fresh)
    broken = httpx.post(
        fresh.url + "/v1/admit",
        content=b'{"tenant_id": "t",\n  oops}',
        headers={**auth, "Content-Type": "application/json"},
    )
    [error] = _assert_problem(broken, "WORKLOAD_INVALID")["details"]["errors"]
    assert error["field"] == "body"
    assert error["message"] == (
        "not JSON: Expecting property name enclosed in double quotes"
        " at line 2 column 3 (character 21)"
    )
    text = json.dumps(request().model_dump(mode="json")).encode()
    plain = httpx.post(
        fresh.url + "/v1/admit", content=text, headers={**auth, "Content-Type": "text/plain"}
    )
    assert plain.status_code == plain.json()["status"] == 415
    assert plain.json()["code"] == "WORKLOAD_INVALID"
    assert "text/plain" in plain.json()["detail"]
    assert "application/json" in plain.json()["detail"]
    assert stored(fresh) == before


@pytest.mark.parametrize(
    ("op", "body"),
    [("admit", [1]), ("start", [1]), ("admit", 5), ("execute", [1]), ("report_many", "x")],
    ids=str,
)
def test_a_body_of_the_wrong_shape_is_refused_naming_the_body(
    fresh: RunningService, op: str, body: Any
) -> None:
    # A body that is JSON but not an object was refused with an empty field path.
    before = stored(fresh)
    reply = _post(fresh, op, body, fresh.token("worker", "w1"))
    problem = _assert_problem(reply, "WORKLOAD_INVALID")
    [error] = problem["details"]["errors"]
    assert error["field"] == "body", error
    assert problem["detail"].startswith("body: "), problem
    assert stored(fresh) == before


def test_a_route_given_no_body_is_refused_naming_the_body(fresh: RunningService) -> None:
    before = stored(fresh)
    reply = httpx.post(
        f"{fresh.url}/v1/claim_many",
        headers={
            "Authorization": "Bearer " + fresh.token("worker", "w1"),
            "X-Workwarden-Now": "20000",
        },
    )
    [error] = _assert_problem(reply, "WORKLOAD_INVALID")["details"]["errors"]
    assert error["field"] == "body", error
    assert stored(fresh) == before


def _loose_bodies() -> list[tuple[str, bytes, str]]:
    good = json.dumps(request(idempotency_key="loose").model_dump(mode="json"))

    def with_input(extra: str) -> bytes:
        return good.replace('"input": {', '"input": {' + extra + ", ", 1).encode()

    twice = good.replace('{"tenant_id"', '{"trigger": "x", "tenant_id"', 1).encode()
    return [
        ("latin-1", good.replace('"loose"', '"l\u00f6ose"').encode("latin-1"), "not UTF-8"),
        ("utf-16", good.encode("utf-16"), "not UTF-8"),
        ("utf-32", good.encode("utf-32"), "not UTF-8"),
        ("a key twice", twice, "given twice"),
        ("nested deeply", with_input('"deep": ' + "[" * 1_000 + "]" * 1_000), "nested"),
        ("a number of 5,000 digits", with_input('"n": ' + "9" * 5_000), "number too long"),
    ]


@pytest.mark.parametrize(("name", "body", "said"), _loose_bodies(), ids=lambda v: str(v)[:20])
def test_json_a_reader_could_take_two_ways_is_refused_naming_the_body(
    fresh: RunningService, name: str, body: bytes, said: str
) -> None:
    assert body, name
    before = stored(fresh)
    reply = httpx.post(
        fresh.url + "/v1/admit",
        content=body,
        headers={
            "Authorization": "Bearer " + fresh.token("worker", "w1"),
            "Content-Type": "application/json",
            "X-Workwarden-Now": "20000",
        },
    )
    [error] = _assert_problem(reply, "WORKLOAD_INVALID")["details"]["errors"]
    assert error["field"] == "body", error
    assert said in error["message"], error
    assert stored(fresh) == before


def test_a_call_waiting_on_a_locked_store_holds_up_neither_health_nor_metrics(
    tmp_path: Path,
) -> None:
    import sqlite3
    import threading
    import time

    from workwarden.storage import SQLiteStore

    db = tmp_path / "work.db"
    SQLiteStore(db).close()
    with running_service(
        store=f"sqlite:///{db}", grant_keys={KEY_ID: SECRET}, allow_reset=False
    ) as service:
        lock = sqlite3.connect(db, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")  # another process holds the file: a backup, a CLI
        answered: dict[str, int] = {}
        try:
            admit = threading.Thread(
                target=lambda: answered.setdefault(
                    "admit",
                    httpx.post(
                        service.url + "/v1/admit",
                        content=request(idempotency_key="locked").model_dump_json(),
                        headers={
                            "Authorization": "Bearer " + service.token("worker", "w1"),
                            "Content-Type": "application/json",
                            "X-Workwarden-Now": "20000",
                        },
                        timeout=120,
                    ).status_code,
                )
            )
            admit.start()
            time.sleep(0.5)  # the admission is waiting on the lock
            started = time.monotonic()
            assert httpx.get(service.url + "/healthz", timeout=30).status_code == 200
            assert httpx.get(service.url + "/metrics", timeout=30).status_code == 200
            assert time.monotonic() - started < 2.0
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        admit.join(timeout=60)
        assert answered["admit"] == 200


@pytest.mark.parametrize("op", ["claim_next", "purge", "pause", "nothing"])
def test_execute_refuses_an_op_it_does_not_take_alike_for_every_token(
    fresh: RunningService, op: str
) -> None:
    body = {"op": op, "tenant_id": "t", "application_id": "app", "worker_id": "w1"}
    for token in (fresh.token("worker", "w1"), fresh.token("operator", "alice")):
        problem = _assert_problem(_post(fresh, "execute", body, token), "WORKLOAD_INVALID")
        assert problem["status"] == 400
    assert stored(fresh) == []


def test_a_query_parameter_given_twice_is_refused_naming_it_and_writes_nothing(
    fresh: RunningService,
) -> None:
    # Which of two tenants counts? A proxy checking the first while the service took the
    # last would let one scope's reader see another's.
    worker = fresh.token("worker", "w1")
    auth = {"Authorization": "Bearer " + worker}
    admitted = _post(fresh, "admit", request().model_dump(mode="json"), worker, 10_000)
    wid = admitted.json()["workload"]["workload_id"]
    before = stored(fresh)
    operator = {"Authorization": "Bearer " + fresh.token("operator", "alice")}
    for path, query, headers in (
        ("/v1/workloads", "tenant=t&tenant=other&application=app", auth),
        (f"/v1/workloads/{wid}", "tenant=other&tenant=t", auth),
        ("/v1/pauses", "tenant=t&tenant=t", operator),
    ):
        reply = httpx.get(f"{fresh.url}{path}?{query}", headers=headers)
        problem = _assert_problem(reply, "WORKLOAD_INVALID")
        assert problem["details"]["errors"] == [
            {"field": "tenant", "message": "query parameter given more than once"}
        ]
        assert "tenant" in problem["detail"]
    assert stored(fresh) == before


def test_a_refusal_for_the_wrong_actor_class_names_the_class_in_plain_words(
    fresh: RunningService,
) -> None:
    operator = fresh.token("operator", "alice")
    claim = {"tenant_id": "t", "application_id": "app", "worker_id": "w1", "lease_ms": 1_000}
    refused = _assert_problem(_post(fresh, "claim_next", claim, operator), "WORKWARDEN_FORBIDDEN")
    assert refused["detail"].endswith("this token is an operator's"), refused["detail"]
    worker = fresh.token("worker", "w1")
    cancel = {"workload_id": "w", "actor": "w1"}
    refused = _assert_problem(_post(fresh, "cancel", cancel, worker), "WORKWARDEN_FORBIDDEN")
    assert refused["detail"].endswith("this token is a worker's"), refused["detail"]


def test_an_instant_header_that_is_not_plain_digits_is_refused_and_writes_nothing(
    fresh: RunningService,
) -> None:
    admission = json.loads(request(idempotency_key="spelled").model_dump_json())
    token = fresh.token("worker", "w1")
    for spelled in ("20_000", "+20000", "2e4", "20000.0", ""):
        reply = httpx.post(
            fresh.url + "/v1/admit",
            json=admission,
            headers={"Authorization": "Bearer " + token, "X-Workwarden-Now": spelled},
        )
        body = _assert_problem(reply, "WORKLOAD_INVALID")
        assert body["details"]["field"] == "X-Workwarden-Now", spelled
        assert stored(fresh) == [], spelled
    reply = _post(fresh, "admit", admission, token, now=20_000)
    assert reply.status_code == 200, reply.text
