"""Pauses and purge over the HTTP API of a real `workwarden serve` process.

A pause made over HTTP stops every claim of its scope (`claim_next`,
`claim_many`, `claim` by id) until it is resumed, and both are audited under
the operator's name; only an operator may pause, resume, list pauses or purge
(a worker's token is `WORKWARDEN_FORBIDDEN`, none `WORKWARDEN_UNAUTHENTICATED`,
and a refused call writes nothing); `HttpAuthority` answers and refuses as the
library does; the OpenAPI document lists the routes with their models.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from served import reset

from support import CAPS, KEY_ID, SECRET, request
from workwarden.service.client import HttpAuthority
from workwarden.service.problems import status_for
from workwarden.service.testing import RunningService, running_service
from workwarden.statemachine import Authority, GrantVerifier
from workwarden.statemachine.errors import WorkloadError
from workwarden.statemachine.ids import claim_id_for
from workwarden.storage import MemoryStore

NOW = 10_000
LEASE = 30_000


@pytest.fixture(scope="module")
def service() -> Iterator[RunningService]:
    with running_service(grant_keys={KEY_ID: SECRET}, startup_timeout_s=120) as running:
        yield running


@pytest.fixture
def fresh(service: RunningService) -> RunningService:
    """The service with an empty store, verifying the fixture key's grants."""
    return reset(service)


@pytest.fixture
def client(fresh: RunningService) -> Iterator[HttpAuthority]:
    with fresh.client(fresh.token("worker", "w1"), fresh.token("operator", "alice")) as made:
        yield made


def _everything(service: RunningService) -> tuple[Any, Any, Any]:
    """The documents, the audit log and the pauses in force, as the service holds them."""
    auth = {"Authorization": "Bearer " + service.token("operator")}
    docs = httpx.get(service.url + "/v1/test/store", headers=auth)
    audit = httpx.get(service.url + "/v1/test/audit", headers=auth)
    pauses = httpx.get(service.url + "/v1/pauses", headers=auth)
    assert docs.status_code == audit.status_code == pauses.status_code == 200
    return docs.json(), audit.json(), pauses.json()


def _audit(service: RunningService) -> list[tuple[str, str, str]]:
    return [(r["operation"], r["key"], r["actor"]) for r in _everything(service)[1]]


def _finished(client: HttpAuthority, key: str, *, dead: bool = False) -> str:
    """A workload admitted, claimed and started, then completed (or dead-lettered)."""
    wid = client.admit(request(idempotency_key=key), NOW).workload.workload_id
    claim = client.claim(wid, "w1", CAPS, NOW + 1, LEASE)
    client.start(wid, claim.fence, NOW + 2)
    if dead:
        client.fail(wid, claim.fence, "validation", "bad input", NOW + 3)
    else:
        client.complete(wid, claim.fence, f"r-{key}", {"ok": True}, NOW + 3)
    return wid


def test_a_scope_paused_over_http_is_not_claimed_until_resumed(
    fresh: RunningService, client: HttpAuthority
) -> None:
    first = client.admit(request(idempotency_key="a"), NOW).workload.workload_id
    second = client.admit(request(idempotency_key="b"), NOW).workload.workload_id
    record = client.pause("alice", NOW + 1, tenant="t", application="app", reason="deploy 7")
    assert record.scope.key == "pause/t/app/*"
    assert (record.since, record.actor, record.reason) == (NOW + 1, "alice", "deploy 7")
    assert client.pauses() == client.pauses("t") == [record]
    assert client.pauses("elsewhere") == []

    assert client.claim_next("t", "app", "w1", CAPS, NOW + 2, LEASE) is None
    assert client.claim_many("t", "app", "w1", CAPS, NOW + 2, LEASE, 5) == []
    with pytest.raises(WorkloadError) as refused:
        client.claim(first, "w1", CAPS, NOW + 2, LEASE)
    assert refused.value.code == "WORKLOAD_NOT_READY"
    assert refused.value.details is not None
    assert refused.value.details["paused"] == "pause/t/app/*"

    again = client.pause("alice", NOW + 3, tenant="t", application="app")
    assert again == record, "pausing a paused scope answers the pause in force"
    assert client.resume("alice", NOW + 4, tenant="t", application="app") is True
    assert client.resume("alice", NOW + 5, tenant="t", application="app") is False
    assert client.pauses() == []
    claim = client.claim_next("t", "app", "w1", CAPS, NOW + 6, LEASE)
    assert claim is not None
    assert claim.workload_id in {first, second}

    pauses = [entry for entry in _audit(fresh) if entry[1].startswith("pause/")]
    assert pauses == [("pause", "pause/t/app/*", "alice"), ("resume", "pause/t/app/*", "alice")]


def test_a_purge_over_http_reports_a_dry_run_then_deletes_finished_work_audited(
    fresh: RunningService, client: HttpAuthority
) -> None:
    done = _finished(client, "done")
    dead = _finished(client, "dead", dead=True)
    before = _everything(fresh)
    trial = client.purge(NOW + 10, older_than_ms=0, dry_run=True)
    assert (trial.purged, trial.kept, trial.young, trial.changed) == ([done], 1, 0, 0)
    assert _everything(fresh) == before, "a dry run writes nothing"

    assert client.purge(NOW + 10).purged == [], "younger than the spec's retention age"
    report = client.purge(NOW + 10, older_than_ms=0)
    assert report.purged == [done]
    assert report.kept == 1, "a dead letter is kept for an operator"
    with pytest.raises(WorkloadError) as gone:
        client.get(done)
    assert gone.value.code == "WORKLOAD_NOT_FOUND"
    assert client.get(dead).state == "DEAD_LETTER"
    assert ("purge", done, "alice") in _audit(fresh), "recorded under the token's subject"

    # Admitted again over HTTP, its fencing tokens continue past the purged one's,
    # so the first life's fence (token 1, worker w1) is stale for the new claim.
    again = client.admit(request(idempotency_key="done"), NOW + 20)
    assert again.created
    assert again.workload.workload_id == done
    assert again.workload.fencing_token > 1
    claim = client.claim(done, "w1", CAPS, NOW + 21, LEASE)
    assert claim.fence.token == again.workload.fencing_token + 1
    stale = claim.fence.model_copy(update={"token": 1, "claim_id": _first_claim_id(done)})
    with pytest.raises(WorkloadError) as refused:
        client.start(done, stale, NOW + 22)
    assert refused.value.code == "WORKLOAD_STALE_FENCE"


def _first_claim_id(workload_id: str) -> str:
    """The claim id of worker w1's claim under token 1: its fence in a workload's first life."""
    return claim_id_for(workload_id, 1, "w1")


def _library_script(authority: Any) -> list[Any]:
    """Pauses, resumes and purges, with refusals, through `authority`."""
    out: list[Any] = []

    def run(call: Callable[[], Any]) -> None:
        try:
            out.append(call())
        except WorkloadError as exc:
            out.append(("refused", exc.code))

    wid = authority.admit(request(idempotency_key="s"), NOW).workload.workload_id
    run(lambda: authority.pause("alice", NOW, tenant="t", reason="incident"))
    run(lambda: authority.pause("alice", NOW + 1, tenant="t"))
    run(lambda: authority.pause("alice", NOW + 1, tenant="t", application="app", definition="d"))
    run(lambda: authority.pause("alice", NOW + 1, tenant="t", definition="d"))
    run(lambda: authority.pause("alice", NOW + 1, tenant="", application="app"))
    run(lambda: authority.pause("alice", -1, tenant="t"))
    run(lambda: authority.pause("alice", NOW + 1, tenant="u", reason="sk-live-key"))
    run(lambda: authority.pauses())
    run(lambda: authority.pauses("t"))
    run(lambda: authority.claim_next("t", "app", "w1", CAPS, NOW + 2, LEASE))
    run(lambda: authority.resume("alice", NOW + 3, tenant="t"))
    run(lambda: authority.resume("alice", NOW + 3, tenant="t"))
    run(lambda: authority.resume("alice", NOW + 3, tenant="t", application="app", definition="d"))
    run(lambda: authority.pauses())
    claim = authority.claim_next("t", "app", "w1", CAPS, NOW + 4, LEASE)
    out.append(claim.workload_id == wid)
    authority.start(wid, claim.fence, NOW + 5)
    authority.complete(wid, claim.fence, "r", {"ok": True}, NOW + 6)
    run(lambda: authority.purge(NOW + 7, older_than_ms=0, actor="alice", dry_run=True))
    run(lambda: authority.purge(NOW + 7, older_than_ms=-1, actor="alice"))
    run(lambda: authority.purge(NOW + 7, older_than_ms=0, actor="alice", limit=0))
    run(lambda: authority.purge(NOW + 7, older_than_ms=0, actor="alice", tenant="other"))
    run(lambda: authority.purge(NOW + 7, older_than_ms=0, actor="alice"))
    run(lambda: authority.purge(NOW + 8, older_than_ms=0, actor="alice"))
    return out


def test_the_client_pauses_and_purges_exactly_as_the_library(client: HttpAuthority) -> None:
    library = Authority(MemoryStore(), grants=GrantVerifier({KEY_ID: SECRET}))
    assert _library_script(client) == _library_script(library)


def test_a_purge_with_an_export_is_refused_by_the_client_without_a_round_trip(
    fresh: RunningService, client: HttpAuthority
) -> None:
    _finished(client, "done")
    before = _everything(fresh)
    with pytest.raises(WorkloadError) as refused:
        client.purge(NOW + 10, older_than_ms=0, export=lambda doc: None)
    assert refused.value.code == "WORKLOAD_INVALID"
    assert refused.value.details is not None
    assert refused.value.details["field"] == "export"
    assert _everything(fresh) == before


_CALLS: dict[str, tuple[str, str, dict[str, Any] | None]] = {
    "pause": ("POST", "/v1/pause", {"tenant": "t", "actor": "w1", "reason": "x"}),
    "resume": ("POST", "/v1/resume", {"tenant": "t", "application": "app", "actor": "w1"}),
    "pauses": ("GET", "/v1/pauses", None),
    "purge": ("POST", "/v1/purge", {"older_than_ms": 0}),
}


def _refusal_cases() -> list[tuple[str, str, str]]:
    who = {"no token": "WORKWARDEN_UNAUTHENTICATED", "worker": "WORKWARDEN_FORBIDDEN"}
    cases = [(op, token, code) for op in _CALLS for token, code in who.items()]
    return [*cases, ("pause", "operator as another", "WORKWARDEN_FORBIDDEN")]


@pytest.mark.parametrize(
    ("op", "token", "code"), _refusal_cases(), ids=[f"{o}-{t}" for o, t, _ in _refusal_cases()]
)
def test_only_an_operator_may_pause_resume_list_or_purge_and_a_refusal_writes_nothing(
    fresh: RunningService, client: HttpAuthority, op: str, token: str, code: str
) -> None:
    _finished(client, "done")
    client.pause("alice", NOW + 5, tenant="t", application="app")
    before = _everything(fresh)
    method, path, body = _CALLS[op]
    headers = {"X-Workwarden-Now": str(NOW + 10)}
    if token == "worker":
        headers["Authorization"] = "Bearer " + fresh.token("worker", "w1")
    elif token == "operator as another":
        headers["Authorization"] = "Bearer " + fresh.token("operator", "bob")
    reply = httpx.request(method, fresh.url + path, json=body, headers=headers)
    assert reply.headers["content-type"].startswith("application/problem+json"), reply.text
    problem = reply.json()
    assert problem["code"] == code
    assert reply.status_code == problem["status"] == status_for(code)
    if token == "worker":
        assert problem["details"] == {
            "reason": "wrong_actor_class",
            "operation": op,
            "actor_class": "worker",
        }
    elif token == "operator as another":
        assert problem["details"]["reason"] == "subject_mismatch"
    else:
        assert reply.status_code == 401
        assert problem["details"]["reason"] == "missing_token"
    assert _everything(fresh) == before


def test_a_bad_pause_body_is_refused_as_invalid_and_writes_nothing(fresh: RunningService) -> None:
    operator = {"Authorization": "Bearer " + fresh.token("operator", "alice")}
    before = _everything(fresh)
    for body, field in (
        ({"tenant": "t"}, "actor"),
        ({"tenant": "t", "actor": "alice", "scope": "all"}, "scope"),
        ({"tenant": 7, "actor": "alice"}, "tenant"),
        ({"tenant": "t", "definition": "d", "actor": "alice"}, "definition"),
    ):
        reply = httpx.post(fresh.url + "/v1/pause", json=body, headers=operator)
        assert reply.status_code == 400, reply.text
        problem = reply.json()
        assert problem["code"] == "WORKLOAD_INVALID"
        assert field in str(problem["details"])
    assert _everything(fresh) == before


def test_the_openapi_document_lists_the_pause_and_purge_routes(fresh: RunningService) -> None:
    document = httpx.get(fresh.url + "/openapi.json").json()
    paths = document["paths"]
    for path, body in (
        ("/v1/pause", "PauseRequest"),
        ("/v1/resume", "ResumeRequest"),
        ("/v1/purge", "PurgeRequest"),
    ):
        schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body in str(schema), path
        assert "default" in paths[path]["post"]["responses"], "refusals are documented"
    listing = paths["/v1/pauses"]["get"]["responses"]["200"]["content"]["application/json"]
    assert listing["schema"]["items"]["$ref"].endswith("/PauseReply")
    schemas = document["components"]["schemas"]
    assert {"PauseReply", "ResumeReply", "PurgeReply"} <= set(schemas)
    assert set(schemas["PurgeRequest"]["properties"]) == {
        "older_than_ms", "tenant", "application", "actor", "dry_run", "limit",
    }  # fmt: skip
