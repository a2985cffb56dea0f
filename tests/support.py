"""Shared builders for the tests: a signed request, an authority over a fresh store.

`overwrite` writes a workload straight into a store, past the authority, as
an older release might have left it.

The fixture request mirrors the seeds' fixture: agent `a1` in tenant `t`,
application `app`, definition `send`, input `{"id": 1}`, capability
`email:send`, key `one`. Instants are milliseconds: the seeds' second `11`
is `11_000` here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from workwarden.statemachine import (
    Authority,
    CreateWorkload,
    Grant,
    GrantSigner,
    GrantVerifier,
    Spec,
    Subject,
    Workload,
)
from workwarden.statemachine.conformance.scenarios import request as fixture_request
from workwarden.statemachine.index import index_fields
from workwarden.storage import (
    AuditRecord,
    ForwardingStore,
    IndexFields,
    Store,
    StoredDocument,
    StoreFailure,
    StoreOutcomeUnknown,
)
from workwarden.storage.base import CandidateCursor

KEY_ID = "k"
SECRET = bytes(range(32))
SIGNER = GrantSigner(KEY_ID, SECRET)
VERIFIER = GrantVerifier({KEY_ID: SECRET})
CAPS = ("email:send",)


def grant_for(
    agent: str = "a1",
    *,
    tenant: str = "t",
    application: str = "app",
    issued_at: int = 1_000,
    expires_at: int = 9_999_000_000,
    kind: str = "agent",
) -> Grant:
    """A grant for `agent` in one tenant and application."""
    return Grant(
        id="g",
        issuer=Subject(kind="human", id="h"),
        subject=Subject(kind=kind, id=agent),  # type: ignore[arg-type]
        tenant_id=tenant,
        application_id=application,
        capabilities=("workload:execute",),
        issued_at=issued_at,
        expires_at=expires_at,
    )


def request(agent: str = "a1", **changes: Any) -> CreateWorkload:
    """The fixture request made by `agent`, with `changes` applied (signed with `SIGNER`)."""
    key = changes.pop("idempotency_key", "one")
    return fixture_request(key, agent, signer=SIGNER, **changes)


def authority(store: Store, spec: Spec | None = None) -> Authority:
    """An authority over `store` that verifies the fixture key's signatures."""
    return Authority(store, grants=VERIFIER, spec=spec)


def store_snapshot(store: Store) -> tuple[Any, ...]:
    """Everything a store holds, for byte-for-byte comparisons."""
    docs = tuple((d.key, d.version, d.document, d.index) for d in store.scan())
    return docs, tuple(store.audit_log())


def overwrite(store: Store, authority: Authority, workload_id: str, **changes: Any) -> None:
    """Write the committed workload back with `changes`, as an older release might have left it."""
    doc = store.read(workload_id)
    assert doc is not None
    workload = Workload.model_validate_json(doc.document).model_copy(update=changes)
    document = workload.model_dump_json(by_alias=True)
    digest = hashlib.sha256(document.encode("utf-8")).hexdigest()
    audit = AuditRecord(
        transaction_id="tx_fixture_" + digest[:24],
        key=workload_id,
        version=0,
        actor="fixture.legacy",
        operation="fixture",
        tenant=workload.tenant_id,
        application=workload.application_id,
        at=workload.updated_at,
        digest=digest,
    )
    store.write(workload_id, document, index_fields(authority.spec, workload), doc.version, audit)


class SwitchedStore(ForwardingStore):
    """A store behind a switch: `down` (every read, write and query fails, counted in
    `refused`), or `lose_next_reply` (the next write commits, then its reply is lost)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.down = False
        self.lose_next_reply = False
        self.refused = 0

    def _check(self) -> None:
        if self.down:
            self.refused += 1
            raise StoreFailure("the store is down")

    def read(self, key: str) -> StoredDocument | None:
        self._check()
        return super().read(key)

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        self._check()
        version = super().write(key, document, index, expected_version, audit)
        if self.lose_next_reply:
            self.lose_next_reply = False
            raise StoreOutcomeUnknown("the reply was lost after the commit")
        return version

    def claim_candidates(
        self,
        tenant: str,
        application: str,
        now: int,
        limit: int,
        after: CandidateCursor | None = None,
    ) -> Sequence[StoredDocument]:
        self._check()
        return super().claim_candidates(tenant, application, now, limit, after)

    def expired_leases(
        self, now: int, limit: int, tenant: str | None = None, application: str | None = None
    ) -> Sequence[str]:
        self._check()
        return super().expired_leases(now, limit, tenant, application)

    def deadlines_due(
        self, now: int, limit: int, tenant: str | None = None, application: str | None = None
    ) -> Sequence[str]:
        self._check()
        return super().deadlines_due(now, limit, tenant, application)


#: How the tests hunt a deliberately broken store with the stateful suite: derandomised,
#: so a hunt that finds its bug always finds it.
HUNT = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.generate],
)


def failed_check(machine: type) -> str:
    """The name of the check the stateful `machine` fails under `HUNT` (it must fail one)."""
    from workwarden.testing.support import CheckFailed

    with pytest.raises(CheckFailed) as failed:
        run_state_machine_as_test(machine, settings=HUNT)  # type: ignore[no-untyped-call, unused-ignore]
    return failed.value.check
