"""Security: no one reaches work where they do not belong, and no secret is kept or echoed.

- Tenant and application isolation, a test per path: the scoped read
  (`get(id, tenant=..., application=...)`), the list, the scheduler
  (`claim_next`, and its dependency gate), both sweeps, and the execution
  context. A scoped read of another scope's work answers exactly as for work
  that does not exist.
- Requester-scoped idempotency: another requester's key (same id of
  another kind, or another id) never returns, reveals or blocks the first
  requester's workload, and the same requester's key in another tenant is
  another workload.
- The authorization snapshot: a bad grant is refused the same way whether
  or not its idempotency key was admitted before, so a refusal is no oracle.
- Plaintext secrets: refused in input, checkpoint state, output, failure
  text and retry reasons, never echoed by the refusal, never stored; secret
  references only as `secret://NAME`.
- SQL built with parameters only: hostile tenant ids, application ids,
  requester ids and keys round-trip exactly on every backend and touch
  nothing else; on PostgreSQL the server's statement log shows they only
  ever travelled as bound parameters.

Most tests run once per backend (the `store` fixture). The properties the
other suites prove already are listed, with their tests, in
`docs/reliability.md`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pg import postgres_database, server
from support import CAPS, SIGNER, grant_for, request, store_snapshot
from support import authority as make_authority
from workwarden.statemachine import (
    Authority,
    CreateWorkload,
    Dependency,
    Fence,
    Subject,
    Timeouts,
    WorkloadError,
)
from workwarden.statemachine import errors as codes
from workwarden.storage import MemoryStore, Store, StoredDocument
from workwarden.storage.postgres import PostgresStore

ADMITTED = 10_000
CLAIMED = 20_000
LEASE_MS = 1_000
AFTER_LEASE = CLAIMED + LEASE_MS + 1

#: The three scopes of the isolation tests: ours, another tenant's, another application's.
OURS = ("t", "app")
OTHER_TENANT = ("u", "app")
OTHER_APPLICATION = ("t", "billing")
SCOPES = (OURS, OTHER_TENANT, OTHER_APPLICATION)


def _admit(authority: Authority, scope: tuple[str, str], **changes: Any) -> str:
    tenant, application = scope
    admitted = authority.admit(
        request(tenant_id=tenant, application_id=application, **changes), ADMITTED
    )
    return admitted.workload.workload_id


def _three_scopes(authority: Authority, **changes: Any) -> dict[tuple[str, str], str]:
    """One workload in each scope, by scope."""
    return {scope: _admit(authority, scope, **changes) for scope in SCOPES}


def _documents(store: Store, keys: Sequence[str]) -> list[StoredDocument | None]:
    return [store.read(key) for key in keys]


# -- isolation, path by path -----------------------------------------------------------


def test_a_scoped_read_of_another_scopes_work_answers_as_if_it_did_not_exist(
    authority: Authority,
) -> None:
    ids = _three_scopes(authority)
    ours = ids[OURS]

    assert authority.get(ours, tenant="t", application="app").workload_id == ours
    assert authority.get(ours, tenant="t").workload_id == ours
    assert authority.get(ours).workload_id == ours, "unscoped reads keep working"

    def refusal(workload_id: str, **scope: str) -> WorkloadError:
        with pytest.raises(WorkloadError) as caught:
            authority.get(workload_id, **scope)
        return caught.value

    missing = "workload_000000000000000000000000"
    for scope, theirs in ids.items():
        if scope == OURS:
            continue
        found = refusal(theirs, tenant="t", application="app")
        absent = refusal(missing, tenant="t", application="app")
        assert found.code == absent.code == codes.NOT_FOUND
        assert found.message == absent.message
        assert found.details == {"workload_id": theirs}
        assert absent.details == {"workload_id": missing}
    assert refusal(ids[OTHER_TENANT], tenant="t").code == codes.NOT_FOUND
    assert refusal(ids[OTHER_APPLICATION], application="app").code == codes.NOT_FOUND


def test_a_list_holds_exactly_its_own_tenant_and_application(authority: Authority) -> None:
    ids = _three_scopes(authority)

    for scope, workload_id in ids.items():
        assert [w.workload_id for w in authority.list(*scope)] == [workload_id]
    assert authority.list("T", "app") == [], "names are compared exactly, case included"
    assert authority.list("t", "ap") == []
    assert authority.list("t%", "app%") == [], "no pattern matching"


class _LeakyStore(MemoryStore):
    """A broken backend whose list ignores the application asked for."""

    def list(self, tenant: str, application: str) -> Sequence[StoredDocument]:
        return [doc for doc in self.scan() if doc.index.tenant == tenant]


def test_a_backend_that_lists_another_scope_is_a_storage_failure_not_a_leak() -> None:
    authority = make_authority(_LeakyStore())
    _three_scopes(authority)

    with pytest.raises(WorkloadError) as caught:
        authority.list(*OURS)

    assert caught.value.code == codes.STORAGE_FAILURE
    assert "billing" not in str(caught.value.to_dict())


def test_a_worker_claims_only_its_own_tenants_and_applications_work(
    authority: Authority,
) -> None:
    ids = _three_scopes(authority, priority=5)
    ours = authority.claim_next(*OURS, "ours", CAPS, CLAIMED, LEASE_MS)
    assert ours is not None
    assert ours.workload_id == ids[OURS]
    # Our queue is empty now, though two other scopes hold claimable work.
    assert authority.claim_next(*OURS, "ours", CAPS, CLAIMED, LEASE_MS) is None
    for scope in (OTHER_TENANT, OTHER_APPLICATION):
        claim = authority.claim_next(*scope, "theirs", CAPS, CLAIMED, LEASE_MS)
        assert claim is not None
        assert claim.workload_id == ids[scope]


def test_a_dependency_on_work_in_another_scope_never_lets_a_claim_through(
    authority: Authority,
) -> None:
    for scope in (OTHER_TENANT, OTHER_APPLICATION):
        parent = _admit(authority, scope, idempotency_key=f"parent-{scope}")
        claim = authority.claim(parent, "w", CAPS, CLAIMED, LEASE_MS)
        authority.start(parent, claim.fence, CLAIMED + 1)
        authority.complete(parent, claim.fence, f"r-{parent}", {}, CLAIMED + 2)
        _admit(
            authority,
            OURS,
            idempotency_key=f"child-{scope}",
            dependencies=(Dependency(workload_id=parent),),
        )
    assert authority.claim_next(*OURS, "ours", CAPS, CLAIMED + 3, LEASE_MS) is None


#: A sweep's scope, and the tenant and application that name it.
SCOPED_SWEEPS = pytest.mark.parametrize(
    ("scope", "tenant", "application"),
    [(OURS, "t", "app"), (OTHER_TENANT, "u", None), (OTHER_APPLICATION, None, "billing")],
    ids=["tenant-and-application", "tenant", "application"],
)


@SCOPED_SWEEPS
def test_a_scoped_recovery_sweep_touches_only_its_scope(
    authority: Authority,
    store: Store,
    scope: tuple[str, str],
    tenant: str | None,
    application: str | None,
) -> None:
    ids = _three_scopes(authority)
    for workload_id in ids.values():
        authority.claim(workload_id, "w", CAPS, CLAIMED, LEASE_MS)
    others = [workload_id for key, workload_id in ids.items() if key != scope]
    before = _documents(store, others)

    swept = authority.recover_expired(AFTER_LEASE, tenant=tenant, application=application)

    assert swept == [ids[scope]]
    assert _documents(store, others) == before


@SCOPED_SWEEPS
def test_a_scoped_deadline_sweep_touches_only_its_scope(
    authority: Authority,
    store: Store,
    scope: tuple[str, str],
    tenant: str | None,
    application: str | None,
) -> None:
    ids = _three_scopes(authority, timeouts=Timeouts(queue_ms=1_000))
    others = [workload_id for key, workload_id in ids.items() if key != scope]
    before = _documents(store, others)

    swept = authority.enforce_deadlines(ADMITTED + 1_000, tenant=tenant, application=application)

    assert swept == [ids[scope]]
    assert _documents(store, others) == before


def test_a_scoped_sweep_refuses_a_scope_that_is_not_a_name(authority: Authority) -> None:
    for scope in ({"tenant": ""}, {"application": 7}, {"tenant": "t\x00"}):
        for sweep in (authority.recover_expired, authority.enforce_deadlines):
            with pytest.raises(WorkloadError) as caught:
                sweep(AFTER_LEASE, **scope)
            assert caught.value.code == codes.INVALID


def test_the_execution_context_is_read_only_through_the_holders_fence(
    authority: Authority, store: Store
) -> None:
    ids = _three_scopes(authority, input={"marker": "ours-only"})
    ours = authority.claim(ids[OURS], "ours", CAPS, CLAIMED, 60_000)
    theirs = authority.claim(ids[OTHER_TENANT], "theirs", CAPS, CLAIMED, 60_000)
    before = store_snapshot(store)

    # Another tenant's worker, presenting its own fence, or a forged one.
    forged = Fence(claim_id=ours.claim_id, worker_id="theirs", token=ours.fencing_token)
    for fence in (theirs.fence, forged):
        with pytest.raises(WorkloadError) as caught:
            authority.execution_context(ids[OURS], fence, CLAIMED + 1)
        assert caught.value.code == codes.STALE_FENCE
        assert "ours-only" not in str(caught.value.to_dict())
    assert store_snapshot(store) == before


# -- requester-scoped idempotency ----------------------------------------------------------


def _as(kind: str, requester: str, tenant: str = "t", **changes: Any) -> CreateWorkload:
    """The fixture request made by `kind:requester` with a grant for exactly that."""
    grant = grant_for(requester, tenant=tenant, kind=kind)
    return request(
        requester,
        tenant_id=tenant,
        requested_by=Subject.model_validate({"kind": kind, "id": requester}),
        authorization_snapshot=SIGNER.sign(grant),
        **changes,
    )


@pytest.mark.parametrize(
    "other",
    [("agent", "a2"), ("service", "a1"), ("human", "a1")],
    ids=["another-id", "same-id-another-kind-service", "same-id-another-kind-human"],
)
def test_another_requesters_key_never_returns_reveals_or_blocks_the_first(
    authority: Authority, store: Store, other: tuple[str, str]
) -> None:
    # What the other requester gets when the key is unused, for comparison.
    alone = make_authority(MemoryStore()).admit(_as(*other, input={"theirs": 1}), ADMITTED).workload

    mine = authority.admit(_as("agent", "a1", input={"secret-ish": "mine"}), ADMITTED).workload
    theirs = authority.admit(_as(*other, input={"theirs": 1}), ADMITTED)

    # Created, not replayed or refused: the same answer as with the key unused.
    assert theirs.created
    assert theirs.workload == alone
    assert theirs.workload.workload_id != mine.workload_id
    assert "mine" not in theirs.workload.model_dump_json()
    # The first requester's key still replays its own workload.
    replay = authority.admit(_as("agent", "a1", input={"secret-ish": "mine"}), ADMITTED + 1)
    assert not replay.created
    assert replay.workload == mine
    assert len(list(store.scan())) == 2


def test_the_same_requesters_key_in_another_tenant_is_another_workload(
    authority: Authority,
) -> None:
    here = authority.admit(_as("agent", "a1", tenant="t"), ADMITTED)
    there = authority.admit(_as("agent", "a1", tenant="u"), ADMITTED)
    assert here.created
    assert there.created
    assert here.workload.workload_id != there.workload.workload_id


def test_a_reused_key_names_the_conflicting_fields_but_none_of_their_values(
    authority: Authority, store: Store
) -> None:
    authority.admit(_as("agent", "a1", input={"card": "4111-original"}), ADMITTED)
    before = store_snapshot(store)

    with pytest.raises(WorkloadError) as caught:
        authority.admit(_as("agent", "a1", input={"card": "4111-changed"}, priority=3), ADMITTED)

    assert caught.value.code == codes.IDEMPOTENCY_KEY_REUSED
    assert caught.value.details == {"fields": ["input", "priority"]}
    assert "4111" not in str(caught.value.to_dict())
    assert store_snapshot(store) == before


# -- the authorization snapshot --------------------------------------------------------


BAD_GRANTS: dict[str, Callable[[], CreateWorkload]] = {
    "expired": lambda: request(authorization_snapshot=SIGNER.sign(grant_for(expires_at=ADMITTED))),
    "another-tenant": lambda: request(authorization_snapshot=SIGNER.sign(grant_for(tenant="u"))),
    "another-subject": lambda: request(authorization_snapshot=SIGNER.sign(grant_for("a2"))),
    "tampered": lambda: request(
        authorization_snapshot=SIGNER.sign(grant_for()).model_copy(
            update={"grant": grant_for(expires_at=2**50)}
        )
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_GRANTS))
def test_a_bad_grant_is_refused_alike_whether_or_not_its_key_was_admitted(
    store: Store, case: str
) -> None:
    # Refused on an empty store ...
    fresh = make_authority(MemoryStore())
    with pytest.raises(WorkloadError) as unused:
        fresh.admit(BAD_GRANTS[case](), ADMITTED)
    # ... and refused identically once the key was admitted with a good grant:
    # the refusal tells nothing of whether the workload exists.
    authority = make_authority(store)
    authority.admit(request(), ADMITTED - 1)
    before = store_snapshot(store)
    with pytest.raises(WorkloadError) as used:
        authority.admit(BAD_GRANTS[case](), ADMITTED)

    assert used.value.code == codes.UNAUTHORIZED
    assert used.value == unused.value
    assert store_snapshot(store) == before


# -- plaintext secrets -----------------------------------------------------------------


MARK = "sk-live-0ddba11"
"""A plaintext secret (the `sk-` prefix pattern) planted in each refused call."""


def _deep(depth: int, leaf: Any) -> Any:
    """`leaf` wrapped in objects so that it sits at nesting level `depth`."""
    value = leaf
    for level in range(depth - 1):
        value = {f"l{level}": value}
    return value


#: Where a secret hides in caller JSON: as text, deep text, a key, a key deep down.
HIDDEN: dict[str, Any] = {
    "text": {"note": MARK},
    "deep-text": {"a": [{"b": [[{"c": MARK}]]}]},
    "key": {"a": {"Api_Key": "x"}},
    "key-at-depth-60": _deep(60, {"PASSWORD": MARK}),
}


def _nowhere(store: Store) -> None:
    """The secret is in no document and no audit record."""
    assert MARK not in repr(store_snapshot(store))


def _running(authority: Authority) -> tuple[str, Fence]:
    workload_id = authority.admit(request(), ADMITTED).workload.workload_id
    claim = authority.claim(workload_id, "w", CAPS, CLAIMED, 60_000)
    authority.start(workload_id, claim.fence, CLAIMED + 1)
    return workload_id, claim.fence


@pytest.mark.parametrize("where", sorted(HIDDEN))
def test_a_secret_is_refused_in_input_checkpoint_and_output_and_never_echoed_or_stored(
    authority: Authority, store: Store, where: str
) -> None:
    value = HIDDEN[where]
    workload_id, fence = _running(authority)
    before = store_snapshot(store)
    calls: list[Callable[[], object]] = [
        lambda: authority.admit(request(idempotency_key="other", input=value), ADMITTED),
        lambda: authority.checkpoint(workload_id, fence, value, CLAIMED + 2),
        lambda: authority.complete(workload_id, fence, "r-1", value, CLAIMED + 2),
    ]
    for call in calls:
        with pytest.raises(WorkloadError) as caught:
            call()
        assert caught.value.code == codes.SECRET_REJECTED
        assert MARK not in str(caught.value.to_dict()) + str(caught.value)
    assert store_snapshot(store) == before
    _nowhere(store)


#: Free text carrying a secret: a `prefix` pattern matches where the text
#: starts, a `contains` pattern anywhere in it.
FREE_TEXT = {
    "prefix": f"{MARK} was refused by the mail server",
    "contains": f"the key -----BEGIN PRIVATE KEY-----{MARK} was refused",
}


@pytest.mark.parametrize("pattern", sorted(FREE_TEXT))
def test_a_secret_is_refused_in_failure_text_and_retry_reasons_and_never_echoed_or_stored(
    authority: Authority, store: Store, pattern: str
) -> None:
    text = FREE_TEXT[pattern]
    workload_id, fence = _running(authority)
    before = store_snapshot(store)
    with pytest.raises(WorkloadError) as failed:
        authority.fail(workload_id, fence, "validation", text, CLAIMED + 2)
    assert store_snapshot(store) == before

    authority.fail(workload_id, fence, "validation", "bad input", CLAIMED + 3)
    assert authority.get(workload_id).state == "DEAD_LETTER"
    before = store_snapshot(store)
    with pytest.raises(WorkloadError) as retried:
        authority.retry(workload_id, "ops", CLAIMED + 4, reason=text)

    for caught in (failed, retried):
        assert caught.value.code == codes.SECRET_REJECTED
        assert MARK not in str(caught.value.to_dict()) + str(caught.value)
    assert store_snapshot(store) == before
    _nowhere(store)


@pytest.mark.parametrize(
    "reference",
    ["vault://db", "secret:/db", "secret://", " secret://db", "Secret://db", MARK, "db"],
)
def test_secret_references_are_only_secret_urls_naming_something(
    authority: Authority, store: Store, reference: str
) -> None:
    workload_id = authority.admit(request(), ADMITTED).workload.workload_id
    claim = authority.claim(workload_id, "w", CAPS, CLAIMED, 60_000)
    good = authority.execution_context(workload_id, claim.fence, CLAIMED + 1, ["secret://db"])
    assert good.secret_references == ("secret://db",)
    before = store_snapshot(store)

    with pytest.raises(WorkloadError) as caught:
        authority.execution_context(
            workload_id, claim.fence, CLAIMED + 1, ["secret://db", reference]
        )

    assert caught.value.code == codes.SECRET_REJECTED
    assert caught.value.details == {"rejected": 1}
    assert MARK not in str(caught.value.to_dict())
    assert store_snapshot(store) == before


# -- SQL built with parameters only ----------------------------------------------------


HOSTILE = (
    "hostile-1'; DROP TABLE documents; --",
    'hostile-2"; DROP TABLE workwarden_documents; --',
    "hostile-3' OR '1'='1",
    "hostile-4 %s %(key)s ? :key $1 \\'",
    "hostile-5 租户 🙂 \u202eRTL \u00e9\u0301",
    "hostile-6 Robert'); DELETE FROM audit WHERE ('1'='1",
    "hostile-7 " + "'" * 245,
)
"""Tenant ids, application ids, requester ids and keys no query may splice in (each <= 256)."""


def _hostile(authority: Authority, text: str) -> str:
    """Admit, claim and check a workload whose every name is `text`; returns its id."""
    requester = Subject(kind="service", id=text)
    grant = grant_for(text, tenant=text, application=text, kind="service")
    admitted = authority.admit(
        request(
            text,
            tenant_id=text,
            application_id=text,
            requested_by=requester,
            authorization_snapshot=SIGNER.sign(grant),
            idempotency_key=text,
            definition_id=text,
            input={text: text},
        ),
        ADMITTED,
    ).workload
    workload_id = admitted.workload_id
    got = authority.get(workload_id, tenant=text, application=text)
    assert (got.tenant_id, got.application_id, got.idempotency_key) == (text, text, text)
    assert got.requested_by == requester
    assert got.input == {text: text}
    assert [w.workload_id for w in authority.list(text, text)] == [workload_id]
    claim = authority.claim_next(text, text, text, CAPS, CLAIMED, LEASE_MS)
    assert claim is not None
    assert claim.workload_id == workload_id
    assert authority.recover_expired(AFTER_LEASE, tenant=text, application=text) == [workload_id]
    return workload_id


def _check_hostile_names(store: Store) -> None:
    authority = make_authority(store)
    bystander = authority.admit(request(), ADMITTED).workload.workload_id
    authority.claim(bystander, "w", CAPS, CLAIMED, LEASE_MS)  # its lease is expired too
    before = store.read(bystander)
    ids = {text: _hostile(authority, text) for text in HOSTILE}

    # Nothing else was touched, every table is still there and exact.
    assert store.read(bystander) == before
    assert [w.workload_id for w in authority.list("t", "app")] == [bystander]
    assert sorted(doc.key for doc in store.scan()) == sorted([bystander, *ids.values()])
    for text, workload_id in ids.items():
        records = [record for record in store.audit_log() if record.key == workload_id]
        assert [record.version for record in records] == [1, 2, 3]
        assert {(record.tenant, record.application) for record in records} == {(text, text)}
        assert records[0].actor == text
        assert authority.list(text, text)[0].tenant_id == text
    assert authority.list("hostile-3", "hostile-3") == []
    assert store.find_result(HOSTILE[0]) is None
    assert store.expired_leases(AFTER_LEASE, 100, None, None) == [bystander]
    for text in HOSTILE:
        assert store.expired_leases(AFTER_LEASE, 100, text, None) == []
        assert store.deadlines_due(AFTER_LEASE, 100, None, text) == []


def test_hostile_names_round_trip_exactly_and_touch_nothing_else(store: Store) -> None:
    _check_hostile_names(store)


@contextmanager
def _statement_log(dsn: str) -> Iterator[Callable[[], str]]:
    """Log every statement of `dsn`'s database; yields a reader of what was logged since."""
    running = server()
    name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET log_statement = 'all'").format(sql.Identifier(str(name)))
        )
    start = running.log_path.stat().st_size

    def read() -> str:
        with running.log_path.open("rb") as log:
            log.seek(start)
            return log.read().decode("utf-8", errors="replace")

    yield read


_ENTRY = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \S+ \[\d+\] ", re.MULTILINE)


@pytest.mark.postgres
def test_on_postgresql_hostile_names_travel_only_as_bound_parameters() -> None:
    # A database of its own (never reused), so that logging every statement
    # stays with this test.
    with postgres_database(schema=False) as dsn, _statement_log(dsn) as logged:
        with closing(PostgresStore(dsn)) as store:
            _check_hostile_names(store)
        entries = [entry for entry in _ENTRY.split(logged()) if entry.strip()]
    statements = [entry for entry in entries if entry.startswith("LOG:")]
    assert len(statements) > 100, "the server logged the statements"
    carrying = [entry for entry in entries if "hostile-" in entry]
    assert carrying, "the hostile names reached the server"
    spliced = [entry for entry in carrying if not entry.startswith("DETAIL:  parameters:")]
    assert spliced == []
