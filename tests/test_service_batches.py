"""The batch endpoints of `workwarden serve`, driven over real HTTP against a real process.

Each slot of a batch's reply is what the one-call endpoint answers for its
item (the reply, or the same problem document with the same status), and
the batch leaves the store and the metrics as the one calls would; the
client's batch calls answer exactly as the library's; a batch the token may
not make, whole or in one item, is refused and writes nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from served import reset, stored

from support import CAPS, KEY_ID, SECRET, request
from workwarden.service.auth import issue_token
from workwarden.service.problems import status_for
from workwarden.service.testing import RunningService, running_service
from workwarden.statemachine import Authority, GrantSigner, GrantVerifier, WorkloadError
from workwarden.statemachine.batches import MAX_BATCH
from workwarden.statemachine.conformance.scenarios import request as fixture_request
from workwarden.storage import MemoryStore

NOW = 20_000
LATER = NOW + 1_000
OTHER_SIGNER = GrantSigner("other", bytes(range(100, 132)))


@pytest.fixture(scope="module")
def service() -> Iterator[RunningService]:
    with running_service(grant_keys={KEY_ID: SECRET}) as running:
        yield running


def _post(
    service: RunningService, op: str, body: Any, token: str | None, now: int = NOW
) -> httpx.Response:
    headers = {"X-Workwarden-Now": str(now)}
    if token is not None:
        headers["Authorization"] = "Bearer " + token
    return httpx.post(f"{service.url}/v1/{op}", json=body, headers=headers)


def _counters(service: RunningService) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(service.url + "/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.endswith("_total") or sample.name.endswith("_count")
    }


def _grown(before: dict[Any, float], after: dict[Any, float]) -> dict[Any, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def _as_slot(reply: httpx.Response) -> dict[str, Any]:
    """The slot a one-call reply is in a batch: `{"ok": ...}`, or `{"problem": ...}`."""
    body: dict[str, Any] = reply.json()
    if reply.is_success:
        return {"ok": body}
    assert reply.status_code == body["status"] == status_for(body["code"])
    return {"problem": body}


def _admissions() -> list[dict[str, Any]]:
    return [
        request(idempotency_key="a").model_dump(mode="json"),
        request(idempotency_key="b", priority=5).model_dump(mode="json"),
        request(idempotency_key="a").model_dump(mode="json"),  # a replay of the first
        request(idempotency_key="a", input={"id": 2}).model_dump(mode="json"),  # key reused
        fixture_request("forged", signer=OTHER_SIGNER).model_dump(mode="json"),
        request(idempotency_key="c", input={"password": "hunter2"}).model_dump(mode="json"),
        request(idempotency_key="c").model_dump(mode="json"),
    ]


def test_each_admit_many_slot_is_what_the_admit_endpoint_answers(
    service: RunningService,
) -> None:
    worker = service.token("worker", "w1")
    bodies = _admissions()

    reset(service)
    before = _counters(service)
    singles = [_as_slot(_post(service, "admit", body, worker)) for body in bodies]
    single_store, single_counts = stored(service), _grown(before, _counters(service))

    reset(service)
    before = _counters(service)
    batch = _post(service, "admit_many", {"requests": bodies}, worker)
    assert batch.status_code == 200, batch.text
    assert batch.json() == singles
    assert stored(service) == single_store
    assert _grown(before, _counters(service)) == single_counts
    codes = [slot["problem"]["code"] for slot in singles if "problem" in slot]
    assert codes == [
        "IDEMPOTENCY_KEY_REUSED",
        "WORKLOAD_UNAUTHORIZED",
        "WORKLOAD_SECRET_REJECTED",
    ], "the batch covers a replay and refusals of three classes"


def _claimed(service: RunningService, worker: str) -> list[dict[str, Any]]:
    """Three admitted and claimed workloads (by the one-call endpoints), their claims."""
    for key in ("a", "b", "c"):
        admitted = _post(
            service, "admit", request(idempotency_key=key).model_dump(mode="json"), worker
        )
        assert admitted.is_success, admitted.text
    claims = []
    for n in range(3):
        body = {
            "tenant_id": "t",
            "application_id": "app",
            "worker_id": "w1",
            "capabilities": list(CAPS),
            "lease_ms": 5_000,
            "request_id": f"claim-{n}",
        }
        claim = _post(service, "claim_next", body, worker, NOW + n)
        assert claim.is_success, claim.text
        claims.append(claim.json())
    return claims


def _fence(claim: dict[str, Any]) -> dict[str, Any]:
    return {
        "claim_id": claim["claim_id"],
        "worker_id": claim["worker_id"],
        "token": claim["fencing_token"],
    }


def _reports(claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    a, b, c = ({"workload_id": cl["workload_id"], "fence": _fence(cl)} for cl in claims)
    stale = {**b, "fence": {**b["fence"], "token": 7}}
    return [
        {"op": "start", **a},
        {"op": "start", **stale},
        {"op": "heartbeat", **a, "extend_ms": 9_000},
        {"op": "checkpoint", **a, "state": {"password": "hunter2"}},
        {"op": "checkpoint", **a, "state": {"step": 1}, "sequence": 1},
        {"op": "complete", **a, "result_id": "r1", "output": {"ok": True}},
        {"op": "complete", **a, "result_id": "r1", "output": {"ok": True}},  # a replay
        {"op": "confirm_cancel", **a},
        {"op": "start", **c},
        {"op": "fail", **c, "kind": "validation", "error": "bad input"},
        {"op": "heartbeat", **b, "extend_ms": 1},
    ]


def test_each_report_many_slot_is_what_the_reports_endpoint_answers(
    service: RunningService,
) -> None:
    worker = service.token("worker", "w1")

    reset(service)
    reports = _reports(_claimed(service, worker))
    before = _counters(service)
    singles = [
        _as_slot(_post(service, r["op"], {k: v for k, v in r.items() if k != "op"}, worker, LATER))
        for r in reports
    ]
    single_store, single_counts = stored(service), _grown(before, _counters(service))

    reset(service)
    assert _reports(_claimed(service, worker)) == reports, "the claims are made alike"
    before = _counters(service)
    batch = _post(service, "report_many", {"reports": reports}, worker, LATER)
    assert batch.status_code == 200, batch.text
    assert batch.json() == singles
    assert stored(service) == single_store
    assert _grown(before, _counters(service)) == single_counts
    assert single_counts[("workwarden_completions_total", ())] == 1
    assert single_counts[("workwarden_failures_total", (("kind", "validation"),))] == 1
    assert [slot["problem"]["code"] for slot in singles if "problem" in slot] == [
        "WORKLOAD_STALE_FENCE",
        "WORKLOAD_SECRET_REJECTED",
        "WORKLOAD_CLAIM_INVALID",
    ], "the batch covers replays and refusals of three classes"


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        reply = call()
    except WorkloadError as exc:
        return ("raised", exc.code, exc.message, exc.details)
    if isinstance(reply, list):
        return [_shown(r) for r in reply]
    return _shown(reply)


def _shown(value: Any) -> Any:
    if isinstance(value, WorkloadError):
        return ("refused", value.code, value.message, value.details)
    return value.model_dump(mode="json")


def _batch_script(authority: Any) -> list[Any]:
    """Batches of every kind, with refusals in slots and of whole calls, through `authority`."""
    out: list[Any] = []
    run = out.append
    run(
        _outcome(
            lambda: authority.admit_many(
                [
                    request(idempotency_key="a"),
                    request(idempotency_key="b", priority=3).model_dump(mode="json"),
                    {"tenant_id": "t"},
                    request(idempotency_key="a", input={"id": 9}),
                    fixture_request("forged", signer=OTHER_SIGNER),
                    request(idempotency_key="c"),
                    request(idempotency_key="d", not_before=90_000),
                ],
                10_000,
            )
        )
    )
    run(_outcome(lambda: authority.admit_many([], 10_000)))
    run(_outcome(lambda: authority.admit_many("not a list", 10_000)))
    run(_outcome(lambda: authority.admit_many([request()] * (MAX_BATCH + 1), 10_000)))
    run(_outcome(lambda: authority.admit_many(bytearray(b"xy"), 10_000)))
    # An endless iterable is refused after one item past the most a batch takes.
    run(_outcome(lambda: authority.admit_many(itertools.repeat(request()), 10_000)))
    run(_outcome(lambda: authority.claim_many("t", "app", "w1", ["other"], 11_000, 5_000, 2)))
    claims = authority.claim_many("t", "app", "w1", CAPS, 11_000, 5_000, 2, request_id="r1")
    run([c.model_dump(mode="json") for c in claims])
    run(
        _outcome(
            lambda: authority.claim_many("t", "app", "w1", CAPS, 11_500, 5_000, 2, request_id="r1")
        )
    )
    run(_outcome(lambda: authority.claim_many("t", "app", "w1", CAPS, 11_000, 5_000, 0)))
    run(_outcome(lambda: authority.claim_many("t", "", "w1", CAPS, 11_000, 5_000, 1)))
    first, second = claims
    reports: list[Any] = [
        {"op": "start", "workload_id": first.workload_id, "fence": first.fence.model_dump()},
        {"op": "start", "workload_id": second.workload_id, "fence": second.fence.model_dump()},
        {"op": "cancel", "workload_id": first.workload_id, "actor": "w1"},
        {"op": "start", "workload_id": first.workload_id},
        {
            "op": "heartbeat",
            "workload_id": first.workload_id,
            "fence": {**first.fence.model_dump(), "token": 9},
            "extend_ms": 10,
        },
        {
            "op": "complete",
            "workload_id": first.workload_id,
            "fence": first.fence.model_dump(),
            "result_id": "r1",
            "output": {"ok": True},
        },
        {
            "op": "fail",
            "workload_id": second.workload_id,
            "fence": second.fence.model_dump(),
            "kind": "timeout",
            "error": "late",
        },
    ]
    run(_outcome(lambda: authority.report_many(reports, 12_000)))
    run(_outcome(lambda: authority.report_many(reports[-2:], 12_500)))  # replays
    run(_outcome(lambda: authority.report_many({"op": "start"}, 12_500)))
    run(_outcome(lambda: authority.report_many(memoryview(b"xy"), 12_500)))
    third = authority.claim_many("t", "app", "w1", CAPS, 13_000, 5_000, 5)
    run([c.model_dump(mode="json") for c in third])
    return out


def test_the_client_batches_answer_and_refuse_exactly_as_the_library(
    service: RunningService,
) -> None:
    reset(service)
    library = Authority(MemoryStore(), grants=GrantVerifier({KEY_ID: SECRET}))
    with service.client(
        service.token("worker", "w1"), service.token("operator", "alice")
    ) as client:
        assert _batch_script(client) == _batch_script(library)


def test_a_client_batch_larger_than_one_body_goes_in_several_and_is_answered_in_order(
    service: RunningService,
) -> None:
    # 40 inputs of about 1 MB each are more than the 32 MiB the service takes in
    # one body: the client sends them as consecutive batches, each slot answered.
    reset(service)
    requests = [
        request(idempotency_key=f"big-{i}", input={"n": i, "blob": "x" * 1_000_000})
        for i in range(40)
    ]
    with service.client(
        service.token("worker", "w1"), service.token("operator", "alice")
    ) as client:
        replies = client.admit_many(requests, NOW)
        assert [getattr(reply, "created", None) for reply in replies] == [True] * 40
        assert [reply.workload.input["n"] for reply in replies] == list(range(40))
        again = client.admit_many(requests, NOW)
        assert [reply.created for reply in again] == [False] * 40
    assert len(stored(service)) == 40


def _refusals() -> list[tuple[str, Callable[[RunningService, list[Any]], tuple[str, Any, Any]]]]:
    """Batch calls the token may not make: (case, make(service, claims) -> (op, body, token))."""

    def claim_body(worker: str) -> dict[str, Any]:
        return {
            "tenant_id": "t",
            "application_id": "app",
            "worker_id": worker,
            "capabilities": list(CAPS),
            "lease_ms": 5_000,
            "limit": 5,
        }

    def start(claim: dict[str, Any]) -> dict[str, Any]:
        return {"op": "start", "workload_id": claim["workload_id"], "fence": _fence(claim)}

    def expired(s: RunningService) -> str:
        return issue_token(GrantSigner("serve-test", s.token_secret), "w1", "worker", 1_000, 1_000)

    def as_other(claim: dict[str, Any]) -> dict[str, Any]:
        return {**start(claim), "fence": {**_fence(claim), "worker_id": "w2"}}

    return [
        (
            "admit without a token",
            lambda s, c: (
                "admit_many",
                {"requests": [request(idempotency_key="x").model_dump(mode="json")]},
                None,
            ),
        ),
        (
            "admit with a forged token",
            lambda s, c: (
                "admit_many",
                {"requests": [request(idempotency_key="x").model_dump(mode="json")]},
                "wwt1.garbage",
            ),
        ),
        ("claim without a token", lambda s, c: ("claim_many", claim_body("w1"), None)),
        (
            "operator claims",
            lambda s, c: ("claim_many", claim_body("alice"), s.token("operator", "alice")),
        ),
        (
            "worker claims as another",
            lambda s, c: ("claim_many", claim_body("w2"), s.token("worker", "w1")),
        ),
        (
            "operator reports",
            lambda s, c: ("report_many", {"reports": [start(c[0])]}, s.token("operator", "*")),
        ),
        (
            "one report as another worker",
            lambda s, c: (
                "report_many",
                {"reports": [start(c[0]), as_other(c[1])]},
                s.token("worker", "w1"),
            ),
        ),
        (
            "reports with an expired token",
            lambda s, c: ("report_many", {"reports": [start(c[0])]}, expired(s)),
        ),
    ]


@pytest.mark.parametrize(("case", "make"), _refusals(), ids=[case for case, _ in _refusals()])
def test_a_batch_the_token_may_not_make_is_refused_whole_and_writes_nothing(
    service: RunningService,
    case: str,
    make: Callable[[RunningService, list[Any]], tuple[str, Any, Any]],
) -> None:
    reset(service)
    claims = _claimed(service, service.token("worker", "w1"))
    before = stored(service)
    op, body, token = make(service, claims)
    reply = _post(service, op, body, token, NOW + 100)
    problem = reply.json()
    unauthenticated = token is None or case.endswith(("forged token", "expired token"))
    code = "WORKWARDEN_UNAUTHENTICATED" if unauthenticated else "WORKWARDEN_FORBIDDEN"
    assert problem["code"] == code, problem
    assert reply.status_code == problem["status"] == (401 if unauthenticated else 403)
    assert reply.headers["content-type"].startswith("application/problem+json")
    if unauthenticated:
        assert reply.headers["www-authenticate"].startswith("Bearer")
        assert problem["details"]["reason"] in {"missing_token", "invalid_token", "expired_token"}
    else:
        assert problem["details"]["reason"] in {"wrong_actor_class", "subject_mismatch"}
    assert stored(service) == before


def test_a_malformed_batch_body_is_refused_whole_naming_the_item(
    service: RunningService,
) -> None:
    reset(service)
    worker = service.token("worker", "w1")
    good = request(idempotency_key="a").model_dump(mode="json")
    reply = _post(service, "admit_many", {"requests": [good, {"tenant_id": "t"}]}, worker)
    assert reply.status_code == 400
    problem = reply.json()
    assert problem["code"] == "WORKLOAD_INVALID"
    assert any(e["field"].startswith("requests.1.") for e in problem["details"]["errors"])
    reply = _post(service, "report_many", {"reports": [{"op": "cancel"}]}, worker)
    assert reply.status_code == 400
    assert reply.json()["code"] == "WORKLOAD_INVALID"
    assert stored(service) == []


def test_a_remote_claimer_shares_its_claims_fairly_across_tenants(
    service: RunningService,
) -> None:
    reset(service)
    client = service.client()
    signer = GrantSigner(KEY_ID, SECRET)
    for tenant, count in (("flood", 6), ("calm", 2)):
        for n in range(count):
            grant = fixture_request(f"{tenant}-{n}").authorization_snapshot.grant
            snapshot = signer.sign(grant.model_copy(update={"tenant_id": tenant}))
            admitted = request(
                idempotency_key=f"{tenant}-{n}",
                tenant_id=tenant,
                authorization_snapshot=snapshot,
            )
            client.admit(admitted, NOW + n)
    share = client.fair_share([("flood", "app"), ("calm", "app")])
    tenants = []
    for _ in range(4):
        [claim] = client.claim_fair(share, "w1", CAPS, LATER, 5_000)
        tenants.append(client.get(claim.workload_id).tenant_id)
    # Round robin: the calm tenant's two between the flood's, not after them.
    assert tenants == ["flood", "calm", "flood", "calm"]
    batch = client.claim_fair(share, "w1", CAPS, LATER, 5_000, limit=10)
    assert len(batch) == 4
