"""Admission: requester-scoped idempotency keys, the canonical replay, and its provenance.

A repeated key is answered with the original workload only for an equivalent
request; anything else is `IDEMPOTENCY_KEY_REUSED`, naming every conflicting
execution field, and nothing is created. The seeds' second `10` is `10_000`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from support import CAPS, SIGNER, grant_for, request, store_snapshot
from support import authority as authority_over
from workwarden.statemachine import (
    Authority,
    Dependency,
    RetryPolicy,
    Subject,
    Timeouts,
    WorkloadError,
)
from workwarden.statemachine.admission import EXECUTION_FIELDS
from workwarden.statemachine.models import DEFAULT_RETRY_ON
from workwarden.storage import Store

ADMITTED_AT = 10_000


def _dependencies(*ids: str) -> tuple[Dependency, ...]:
    return tuple(Dependency(workload_id=i) for i in ids)


def _original(**changes: Any) -> dict[str, Any]:
    """The request the canonical-replay tests admit first (as changes to the fixture)."""
    fields: dict[str, Any] = {
        "input": {"a": 1, "b": 2},
        "dependencies": _dependencies("w1", "w2"),
    }
    fields.update(changes)
    return fields


def _refusal(authority: Authority, now: int = ADMITTED_AT + 1_000, **changes: Any) -> WorkloadError:
    with pytest.raises(WorkloadError) as caught:
        authority.admit(request(**changes), now=now)
    return caught.value


# -- requester-scoped keys ---------------------------------------------------


def test_the_same_request_replays_the_original_without_creating_another(
    authority: Authority, store: Store
) -> None:
    original = authority.admit(request(), now=ADMITTED_AT)
    assert original.created
    assert original.workload.state == "READY"
    before = store_snapshot(store)

    replayed = authority.admit(request(), now=ADMITTED_AT + 5_000)

    assert not replayed.created
    assert replayed.workload == original.workload
    assert store_snapshot(store) == before, "a replay writes nothing"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"input": {"id": 2}}, "input"),
        ({"definition_id": "other"}, "definition_id"),
    ],
    ids=["different-input", "different-definition"],
)
def test_the_same_key_for_a_different_request_is_refused_and_creates_nothing(
    authority: Authority, store: Store, change: dict[str, Any], field: str
) -> None:
    authority.admit(request(), now=ADMITTED_AT)
    before = store_snapshot(store)

    refused = _refusal(authority, **change)

    assert refused.code == "IDEMPOTENCY_KEY_REUSED"
    assert refused.details == {"fields": [field]}
    assert store_snapshot(store) == before


def test_another_requesters_identical_key_is_its_own_workload(
    authority: Authority, store: Store
) -> None:
    mine = authority.admit(request("a1"), now=ADMITTED_AT).workload

    theirs = authority.admit(request("a2", input={"id": 99}), now=ADMITTED_AT)

    assert theirs.created, "another requester's key neither returns nor blocks the first's"
    assert theirs.workload.workload_id != mine.workload_id
    assert theirs.workload.requested_by == Subject(kind="agent", id="a2")
    assert [doc.key for doc in store.scan()] == sorted(
        [mine.workload_id, theirs.workload.workload_id]
    )
    # Each requester's replay finds only its own workload.
    assert authority.admit(request("a1"), now=ADMITTED_AT + 1).workload == mine


def test_a_snapshot_that_does_not_bind_the_requester_is_refused_before_any_replay(
    authority: Authority, store: Store
) -> None:
    authority.admit(request("a1"), now=ADMITTED_AT)
    before = store_snapshot(store)

    # A validly signed grant for a2, presented for a1's key: it cannot fetch a1's workload.
    borrowed = _refusal(authority, authorization_snapshot=SIGNER.sign(grant_for("a2")))
    # a1's grant presented by a2.
    impersonated = _refusal(authority, requested_by=Subject(kind="agent", id="a2"))

    assert borrowed.code == "WORKLOAD_UNAUTHORIZED"
    assert impersonated.code == "WORKLOAD_UNAUTHORIZED"
    assert store_snapshot(store) == before


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"agent": "x:k1", "idempotency_key": "k2"}, {"agent": "x", "idempotency_key": "k1:k2"}),
        (
            {"agent": 'x","k1', "idempotency_key": "k2"},
            {"agent": "x", "idempotency_key": 'k1","k2'},
        ),
        ({"tenant_id": "t", "application_id": "a:b"}, {"tenant_id": "t:a", "application_id": "b"}),
        (
            {"application_id": "app", "idempotency_key": "x:y"},
            {"application_id": "app:x", "idempotency_key": "y"},
        ),
    ],
    ids=["requester-and-key", "quoted-separator", "tenant-and-application", "application-and-key"],
)
def test_idempotency_scopes_cannot_be_made_to_coincide(
    authority: Authority, first: dict[str, Any], second: dict[str, Any]
) -> None:
    def admit(fields: dict[str, Any]) -> Any:
        fields = dict(fields)
        return authority.admit(request(fields.pop("agent", "a1"), **fields), now=ADMITTED_AT)

    one = admit(first)
    two = admit(second)

    assert one.created
    assert two.created, "a different scope is a different workload, not a replay or a refusal"
    assert one.workload.workload_id != two.workload.workload_id


# -- the canonical replay ---------------------------------------------------


def test_an_equivalent_request_replays_after_normalisation(
    authority: Authority, store: Store
) -> None:
    first = authority.admit(request(**_original()), now=ADMITTED_AT).workload
    before = store_snapshot(store)

    equivalent = _original(
        input={"b": 2, "a": 1},  # member order
        dependencies=(  # dependency order, the default required state written out
            Dependency(workload_id="w2", required_state="SUCCEEDED"),
            Dependency(workload_id="w1"),
        ),
        retry_policy=RetryPolicy(  # the defaults written out, the set in another order
            max_attempts=3,
            initial_delay_ms=1000,
            max_delay_ms=300_000,
            backoff="exponential",
            retry_on=("worker_failure", "transient_connection", "timeout", "timeout"),
        ),
        timeouts=Timeouts(),
        priority=0,
        connection_scopes=(),
        not_before=None,
        capability_snapshot=[*CAPS, *CAPS],
        trigger="retried-by-client",  # provenance that does not change what runs
        session_id="another-session",
    )
    replayed = authority.admit(request(**equivalent), now=ADMITTED_AT + 89_000)

    assert not replayed.created
    assert replayed.workload == first
    assert replayed.workload.trigger == "manual", "the original is answered, not the replay"
    assert store_snapshot(store) == before


EXECUTION_FIELD_CHANGES: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("definition_id", lambda r: r.update(definition_id="other")),
    ("definition_revision", lambda r: r.update(definition_revision="r2")),
    ("environment", lambda r: r.update(environment="staging")),
    ("input", lambda r: r.update(input={"a": 1, "b": 3})),
    ("capability_snapshot", lambda r: r.update(capability_snapshot=(*CAPS, "sms:send"))),
    ("connection_scopes", lambda r: r.update(connection_scopes=("crm",))),
    ("priority", lambda r: r.update(priority=5)),
    (
        "retry_policy",
        lambda r: r.update(retry_policy=RetryPolicy(max_attempts=9, retry_on=DEFAULT_RETRY_ON)),
    ),
    (
        "retry_policy",
        lambda r: r.update(retry_policy=RetryPolicy(retry_on=("timeout", "transient_connection"))),
    ),
    ("timeouts", lambda r: r.update(timeouts=Timeouts(execution_ms=60_000))),
    ("dependencies", lambda r: r.update(dependencies=_dependencies("w1"))),
    ("not_before", lambda r: r.update(not_before=5_000_000)),
]


@pytest.mark.parametrize(
    ("field", "change"),
    EXECUTION_FIELD_CHANGES,
    ids=[
        "definition_id",
        "definition_revision",
        "environment",
        "input",
        "capability_snapshot",
        "connection_scopes",
        "priority",
        "retry_policy-max_attempts",
        "retry_policy-retry_on",
        "timeouts",
        "dependencies",
        "not_before",
    ],
)
def test_each_execution_field_changed_alone_is_named_exactly(
    authority: Authority,
    store: Store,
    field: str,
    change: Callable[[dict[str, Any]], None],
) -> None:
    authority.admit(request(**_original()), now=ADMITTED_AT)
    before = store_snapshot(store)
    changed = _original()
    change(changed)

    refused = _refusal(authority, **changed)

    assert refused.code == "IDEMPOTENCY_KEY_REUSED"
    assert refused.details == {"fields": [field]}
    assert store_snapshot(store) == before


def test_every_execution_field_the_replay_compares_has_a_case_above() -> None:
    assert len(EXECUTION_FIELDS) == 11
    assert sorted({field for field, _ in EXECUTION_FIELD_CHANGES}) == sorted(EXECUTION_FIELDS)


def test_several_changed_fields_are_all_named_in_order(authority: Authority) -> None:
    authority.admit(request(**_original()), now=ADMITTED_AT)

    two = _refusal(authority, **_original(priority=1, environment="staging"))
    everything = _refusal(
        authority,
        **_original(
            not_before=7_000,
            input={"other": True},
            definition_id="other",
            timeouts=Timeouts(queue_ms=1),
        ),
    )

    assert two.details == {"fields": ["environment", "priority"]}
    assert everything.details == {"fields": ["definition_id", "input", "timeouts", "not_before"]}


def test_a_new_authority_answers_replays_from_the_committed_record(store: Store) -> None:
    authority_over(store).admit(request(**_original()), now=ADMITTED_AT)
    reopened = authority_over(store)

    assert not reopened.admit(request(**_original()), now=ADMITTED_AT + 1_000).created
    changed = _original(retry_policy=RetryPolicy(initial_delay_ms=5, retry_on=DEFAULT_RETRY_ON))
    refused = _refusal(reopened, **changed)

    assert refused.code == "IDEMPOTENCY_KEY_REUSED"
    assert refused.details == {"fields": ["retry_policy"]}
    assert len(list(store.scan())) == 1, "nothing was created"


def test_a_not_before_is_compared_as_admitted_not_as_retries_moved_it(
    authority: Authority,
) -> None:
    admitted = authority.admit(request(not_before=20_000), now=ADMITTED_AT).workload
    claim = authority.claim(admitted.workload_id, "w", CAPS, now=20_000, lease_ms=1_000)
    # A retried failure backs off: the eligibility instant moves past the admitted one.
    assert (
        authority.fail(admitted.workload_id, claim.fence, "timeout", "slow", now=20_500) == "READY"
    )
    assert authority.get(admitted.workload_id).next_attempt_at == 21_500

    assert not authority.admit(request(not_before=20_000), now=30_000).created
    assert _refusal(authority, now=30_000).details == {"fields": ["not_before"]}


# -- refused admissions --------------------------------------------------------


@pytest.mark.parametrize(
    "timeout", ["queue_ms", "claim_ms", "execution_ms", "heartbeat_ms", "overall_ms"]
)
def test_a_zero_timeout_is_refused(authority: Authority, store: Store, timeout: str) -> None:
    refused = _refusal(authority, timeouts=Timeouts.model_validate({timeout: 0}))

    assert refused.code == "WORKLOAD_INVALID"
    assert refused.details == {"fields": [f"timeouts.{timeout}"]}
    assert list(store.scan()) == []


def test_a_one_millisecond_timeout_is_accepted(authority: Authority) -> None:
    admitted = authority.admit(request(timeouts=Timeouts(queue_ms=1)), now=ADMITTED_AT)
    assert admitted.workload.timeouts.queue_ms == 1


@pytest.mark.parametrize(
    "value",
    [
        {"password": "hunter2"},
        {"Password": "hunter2"},
        {"outer": {"inner": {"API_KEY": "x"}}},
        {"items": [{"id": 1}, {"private_key": "x"}]},
        {"note": "sk-live-123"},
        {"keys": ["-----BEGIN PRIVATE KEY-----\nMII"]},
        {"nested": [["fdb_live_abc"]]},
    ],
    ids=["key", "key-any-case", "nested-key", "key-in-list", "text-prefix", "pem", "nested-text"],
)
def test_plaintext_secrets_in_the_input_are_refused(
    authority: Authority, store: Store, value: Any
) -> None:
    refused = _refusal(authority, input=value)

    assert refused.code == "WORKLOAD_SECRET_REJECTED"
    assert list(store.scan()) == []


def test_a_blank_idempotency_key_is_refused(authority: Authority, store: Store) -> None:
    refused = _refusal(authority, idempotency_key="   ")

    assert refused.code == "WORKLOAD_INVALID"
    assert list(store.scan()) == []


# -- provenance --------------------------------------------------------------------


def test_an_admission_is_recorded_with_its_provenance(authority: Authority, store: Store) -> None:
    workload = authority.admit(request(), now=ADMITTED_AT).workload

    (record,) = store.audit_log()
    assert record.key == workload.workload_id
    assert record.tenant == "t"
    assert record.application == "app"
    assert record.operation == "admit"
    assert record.actor == "a1"
    assert record.at == ADMITTED_AT
    assert record.version == 1
    assert record.worker is None
    assert record.result is None

    # The document records who asked, under which grant and session.
    assert workload.requested_by == Subject(kind="agent", id="a1")
    assert workload.session_id == "session-1"
    assert workload.authorization_snapshot.grant.issuer == Subject(kind="human", id="h")
    assert workload.created_at == ADMITTED_AT
    assert [(e.sequence, e.type, e.from_state, e.to) for e in workload.execution_history] == [
        (1, "workload.ready", "CREATED", "READY")
    ]


def test_each_committed_version_has_exactly_one_audit_record(
    authority: Authority, store: Store
) -> None:
    workload_id = authority.admit(request(), now=ADMITTED_AT).workload.workload_id
    authority.admit(request(), now=ADMITTED_AT + 1)  # a replay: no version, no record
    other = authority.admit(request("a2"), now=ADMITTED_AT + 2).workload.workload_id
    authority.cancel(other, "operator", now=ADMITTED_AT + 3)

    by_key = {
        key: [r.version for r in store.audit_log() if r.key == key] for key in (workload_id, other)
    }
    assert by_key == {workload_id: [1], other: [1, 2]}
    assert [r.sequence for r in store.audit_log()] == [1, 2, 3]
    committed = store.read(other)
    assert committed is not None
    assert committed.version == 2
