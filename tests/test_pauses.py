"""Pauses: an operator stops claiming for a tenant, an application, a definition or a key.

On every backend: no claim (`claim_next`, `claim_many`, `claim` by id) takes
work of a paused scope; in-flight work runs on and completes; resuming makes
the work claimable again; pauses and resumes are audited, and repeating one
writes nothing; the CLI does the same from the command line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import CAPS, VERIFIER, request, store_snapshot
from workwarden.cli import main
from workwarden.statemachine import Authority, WorkloadError, errors
from workwarden.statemachine.pauses import PauseReply, pause_reply
from workwarden.storage import SQLiteStore, Store

NOW = 10_000
LEASE = 30_000


def _admit(authority: Authority, key: str, **changes: object) -> str:
    return authority.admit(request(idempotency_key=key, **changes), NOW).workload.workload_id


def test_a_paused_tenant_is_not_claimed_until_resumed_and_in_flight_work_runs_on(
    authority: Authority, store: Store
) -> None:
    running = _admit(authority, "running")
    claim = authority.claim(running, "w", CAPS, NOW + 1, LEASE)
    authority.start(running, claim.fence, NOW + 2)
    waiting = _admit(authority, "waiting")
    other = _admit(authority, "other")
    record = authority.pause("ops", NOW + 3, tenant="t", reason="incident 12")
    assert record.scope.key == "pause/t/*/*"
    assert authority.claim_next("t", "app", "w", CAPS, NOW + 4, LEASE) is None
    assert authority.claim_many("t", "app", "w", CAPS, NOW + 4, LEASE, 5) == []
    with pytest.raises(WorkloadError) as refused:
        authority.claim(waiting, "w", CAPS, NOW + 4, LEASE)
    assert refused.value.code == errors.NOT_READY
    assert refused.value.details["paused"] == "pause/t/*/*"
    # In-flight work is not affected.
    authority.heartbeat(running, claim.fence, NOW + 5, LEASE)
    authority.complete(running, claim.fence, "r", {"ok": True}, NOW + 6)
    assert authority.get(running).state == "SUCCEEDED"
    assert authority.get(waiting).state == "READY"
    assert authority.resume("ops", NOW + 7, tenant="t") is True
    claimed = authority.claim_many("t", "app", "w", CAPS, NOW + 8, LEASE, 5)
    assert {c.workload_id for c in claimed} == {waiting, other}
    operations = [(r.operation, r.key, r.actor) for r in store.audit_log()]
    assert ("pause", "pause/t/*/*", "ops") in operations
    assert ("resume", "pause/t/*/*", "ops") in operations


def test_pausing_twice_or_resuming_what_is_not_paused_writes_nothing(
    authority: Authority, store: Store
) -> None:
    first = authority.pause("ops", NOW, tenant="t", application="app", request_id="p1")
    before = store_snapshot(store)
    again = authority.pause("someone-else", NOW + 5, tenant="t", application="app")
    assert again == first, "answered with the pause in force"
    assert store_snapshot(store) == before
    assert authority.pauses("t") == [first]
    assert authority.pauses("nobody") == []
    assert authority.resume("ops", NOW + 6, tenant="t", application="app") is True
    after = store_snapshot(store)
    assert authority.resume("ops", NOW + 7, tenant="t", application="app") is False
    assert store_snapshot(store) == after
    assert authority.pauses() == []


def test_an_application_pause_leaves_the_tenants_other_applications_claimable(
    authority: Authority,
) -> None:
    mine = _admit(authority, "mine")
    theirs = authority.admit(
        request(idempotency_key="theirs", application_id="billing"), NOW
    ).workload.workload_id
    authority.pause("ops", NOW, tenant="t", application="app")
    assert authority.claim_next("t", "app", "w", CAPS, NOW + 1, LEASE) is None
    claim = authority.claim_next("t", "billing", "w", CAPS, NOW + 1, LEASE)
    assert claim is not None
    assert claim.workload_id == theirs
    authority.resume("ops", NOW + 2, tenant="t", application="app")
    again = authority.claim_next("t", "app", "w", CAPS, NOW + 3, LEASE)
    assert again is not None
    assert again.workload_id == mine


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"tenant": ""}, "tenant"),
        ({"tenant": "t", "definition": "send"}, "definition"),
        ({"tenant": "t", "application": 7}, "application"),
    ],
)
def test_a_bad_scope_is_refused_and_nothing_is_written(
    authority: Authority, store: Store, fields: dict[str, object], field: str
) -> None:
    before = store_snapshot(store)
    with pytest.raises(WorkloadError) as refused:
        authority.pause("ops", NOW, **fields)  # type: ignore[arg-type]
    assert refused.value.code == errors.INVALID
    assert field in str(refused.value.details)
    assert store_snapshot(store) == before


def test_a_reason_with_a_secret_is_refused(authority: Authority, store: Store) -> None:
    before = store_snapshot(store)
    with pytest.raises(WorkloadError) as refused:
        authority.pause("ops", NOW, tenant="t", reason="sk-live-key")
    assert refused.value.code == "WORKLOAD_SECRET_REJECTED"
    assert store_snapshot(store) == before


def test_the_pause_commands_pause_list_and_resume_a_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "work.db"
    with SQLiteStore(db) as store:
        warden = Authority(store, grants=VERIFIER)
        workload_id = _admit(warden, "one")
    store_url = str(db)
    scope = ["--tenant", "t", "--application", "app", "--actor", "ops"]
    assert (
        main(["pause", "--store", store_url, *scope, "--reason", "deploy", "--now", "20000"]) == 0
    )
    assert "paused pause/t/app/*" in capsys.readouterr().out
    assert main(["pause", "--store", store_url, *scope]) == 0
    assert "already paused" in capsys.readouterr().out
    # The same call again, at the same instant by the same operator and request id:
    # nothing is written, and the command says so.
    again = [*scope, "--reason", "deploy", "--now", "20000", "--request-id", "r1"]
    with SQLiteStore(db) as store:
        records = len(store.audit_log())
    assert main(["pause", "--store", store_url, *again]) == 0
    assert "already paused pause/t/app/*" in capsys.readouterr().out
    with SQLiteStore(db) as store:
        assert len(store.audit_log()) == records
    assert main(["pauses", "--store", store_url, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(p["scope"], p["actor"], p["reason"]) for p in listed] == [
        ("pause/t/app/*", "ops", "deploy")
    ]
    # Listed as the API lists a pause (`PauseReply`), with the pause's own request id.
    with SQLiteStore(db) as store:
        [record] = Authority(store, grants=VERIFIER).pauses("t")
    assert listed == [pause_reply(record).model_dump(mode="json")]
    assert set(listed[0]) == set(PauseReply.model_fields)
    with SQLiteStore(db) as store:
        warden = Authority(store, grants=VERIFIER)
        assert warden.claim_next("t", "app", "w", CAPS, 30_000, LEASE) is None
    assert main(["resume", "--store", store_url, *scope]) == 0
    assert "resumed pause/t/app/*" in capsys.readouterr().out
    with SQLiteStore(db) as store:
        warden = Authority(store, grants=VERIFIER)
        claim = warden.claim_next("t", "app", "w", CAPS, 30_000, LEASE)
        assert claim is not None
        assert claim.workload_id == workload_id


def test_a_claim_command_executed_directly_is_refused_in_a_paused_scope(
    authority: Authority,
) -> None:
    workload_id = _admit(authority, "one")
    authority.pause("ops", NOW, tenant="t")
    command = {
        "op": "claim",
        "workload_id": workload_id,
        "worker_id": "w",
        "capabilities": list(CAPS),
        "lease_ms": LEASE,
    }
    for call in (authority.execute, lambda c, now: authority.prepare(c, now).commit()):
        with pytest.raises(WorkloadError) as refused:
            call(command, NOW + 1)
        assert refused.value.code == errors.NOT_READY
    assert authority.get(workload_id).state == "READY"


def test_names_that_look_like_the_wildcard_are_scopes_of_their_own(
    authority: Authority, store: Store
) -> None:
    star = authority.pause("ops", NOW, tenant="t", application="*")
    whole = authority.pause("ops", NOW + 1, tenant="t")
    assert star.scope.key != whole.scope.key
    assert whole.since == NOW + 1, "the tenant's pause was written, not answered by the other"
    assert len(authority.pauses("t")) == 2
    slash = authority.pause("ops", NOW + 2, tenant="t", application="a/b")
    assert slash.scope.key == "pause/t/a%2Fb/*"


# -- pauses of one concurrency key --------------------------------------------------------------


def test_a_concurrency_key_pause_holds_that_keys_work_and_no_other(
    authority: Authority, store: Store
) -> None:
    keyed = [_admit(authority, f"keyed{n}", concurrency_key="reports") for n in range(2)]
    other_key = _admit(authority, "mail", concurrency_key="mail")
    plain = _admit(authority, "plain")
    elsewhere = _admit(authority, "elsewhere", tenant_id="u", concurrency_key="reports")
    record = authority.pause("ops", NOW + 1, tenant="t", concurrency_key="reports")
    assert record.scope.key == "pause/t/*/*/reports"
    claimed = authority.claim_many("t", "app", "w", CAPS, NOW + 2, LEASE, 10)
    assert {c.workload_id for c in claimed} == {other_key, plain}
    assert authority.claim_next("t", "app", "w", CAPS, NOW + 2, LEASE) is None
    with pytest.raises(WorkloadError) as refused:
        authority.claim(keyed[0], "w", CAPS, NOW + 3, LEASE)
    assert refused.value.code == errors.NOT_READY
    assert refused.value.details["paused"] == "pause/t/*/*/reports"
    # The pause is the tenant's: another tenant's work of the same key is claimed.
    assert authority.claim(elsewhere, "w", CAPS, NOW + 3, LEASE).workload_id == elsewhere
    assert [p.scope.concurrency_key for p in authority.pauses("t")] == ["reports"]
    assert authority.resume("ops", NOW + 4, tenant="t", concurrency_key="reports") is True
    again = authority.claim_many("t", "app", "w", CAPS, NOW + 5, LEASE, 10)
    assert {c.workload_id for c in again} == set(keyed)
    operations = [(r.operation, r.key) for r in store.audit_log()]
    assert ("pause", "pause/t/*/*/reports") in operations
    assert ("resume", "pause/t/*/*/reports") in operations


def test_a_key_pause_narrowed_to_a_definition_leaves_the_keys_other_definitions(
    authority: Authority,
) -> None:
    send = _admit(authority, "send", concurrency_key="reports")
    render = _admit(authority, "render", concurrency_key="reports", definition_id="render")
    authority.pause(
        "ops", NOW + 1, tenant="t", application="app", definition="send", concurrency_key="reports"
    )
    claimed = authority.claim_many("t", "app", "w", CAPS, NOW + 2, LEASE, 10)
    assert [c.workload_id for c in claimed] == [render]
    assert authority.get(send).state == "READY"


def test_the_pause_command_takes_a_concurrency_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "work.db"
    with SQLiteStore(db) as store:
        warden = Authority(store, grants=VERIFIER)
        keyed = _admit(warden, "keyed", concurrency_key="reports")
        plain = _admit(warden, "plain")
    scope = ["--store", str(db), "--tenant", "t", "--concurrency-key", "reports", "--actor", "ops"]
    assert main(["pause", *scope, "--request-id", "change-7"]) == 0
    assert "paused pause/t/*/*/reports" in capsys.readouterr().out
    assert main(["pauses", "--store", str(db), "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["concurrency_key"] == "reports"
    assert listed["request_id"] == "change-7"
    with SQLiteStore(db) as store:
        warden = Authority(store, grants=VERIFIER)
        claim = warden.claim_next("t", "app", "w", CAPS, 30_000, LEASE)
        assert claim is not None
        assert claim.workload_id == plain
        assert warden.claim_next("t", "app", "w", CAPS, 30_000, LEASE) is None
    assert main(["resume", *scope]) == 0
    assert "resumed pause/t/*/*/reports" in capsys.readouterr().out
    with SQLiteStore(db) as store:
        claim = Authority(store, grants=VERIFIER).claim_next("t", "app", "w", CAPS, 30_000, LEASE)
        assert claim is not None
        assert claim.workload_id == keyed
