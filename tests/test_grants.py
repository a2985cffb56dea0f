"""Grants: the signed authorization snapshot an admission carries.

An admission is refused with `WORKLOAD_UNAUTHORIZED` before anything is stored
or replayed unless its grant verifies under a key the authority was built with,
binds the requester, tenant and application, is active, and is valid at the
admission instant (`issued_at <= now < expires_at`). Skipping the signature
check is an explicit choice: `GrantVerifier.without_signatures()`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from support import KEY_ID, SECRET, SIGNER, grant_for, request, store_snapshot
from support import authority as authority_over
from workwarden.statemachine import (
    AdmitCommand,
    Authority,
    Grant,
    GrantSigner,
    GrantVerifier,
    SignedGrant,
    Subject,
    WorkloadError,
)
from workwarden.storage import Store

NOW = 10_000


def _with(grant: Grant, **changes: Any) -> Grant:
    return Grant.model_validate({**grant.model_dump(), **changes})


def _tampered() -> SignedGrant:
    signed = SIGNER.sign(grant_for())
    widened = _with(signed.grant, capabilities=("workload:execute", "workload:admin"))
    return SignedGrant(grant=widened, key_id=signed.key_id, signature=signed.signature)


#: Grants whose signature does not verify under the authority's keys.
BAD_SIGNATURES: dict[str, Callable[[], SignedGrant]] = {
    "tampered": _tampered,
    "wrong-key": lambda: GrantSigner(KEY_ID, b"another secret, 32 bytes long!!!").sign(grant_for()),
    "unknown-key-id": lambda: GrantSigner("k2", SECRET).sign(grant_for()),
}

#: Validly signed grants that do not authorise the fixture request at NOW.
BAD_GRANTS: dict[str, Callable[[], SignedGrant]] = {
    "expired": lambda: SIGNER.sign(grant_for(expires_at=NOW)),
    "not-yet-valid": lambda: SIGNER.sign(grant_for(issued_at=NOW + 1)),
    "revoked": lambda: SIGNER.sign(_with(grant_for(), status="revoked")),
    "suspended": lambda: SIGNER.sign(_with(grant_for(), status="suspended")),
    "another-tenant": lambda: SIGNER.sign(grant_for(tenant="t2")),
    "another-application": lambda: SIGNER.sign(grant_for(application="app2")),
    "another-subject": lambda: SIGNER.sign(grant_for("a2")),
    "another-subject-kind": lambda: SIGNER.sign(grant_for(kind="human")),
}

ALL_BAD = {**BAD_SIGNATURES, **BAD_GRANTS}


def _refused(authority: Authority, snapshot: SignedGrant) -> WorkloadError:
    with pytest.raises(WorkloadError) as caught:
        authority.admit(request(authorization_snapshot=snapshot), now=NOW)
    return caught.value


@pytest.mark.parametrize("case", sorted(ALL_BAD))
def test_a_bad_grant_is_refused_and_nothing_is_stored(
    authority: Authority, store: Store, case: str
) -> None:
    refused = _refused(authority, ALL_BAD[case]())

    assert refused.code == "WORKLOAD_UNAUTHORIZED"
    assert list(store.scan()) == []
    assert list(store.audit_log()) == []


@pytest.mark.parametrize("case", sorted(ALL_BAD))
def test_a_bad_grant_is_refused_before_any_replay(
    authority: Authority, store: Store, case: str
) -> None:
    authority.admit(request(), now=NOW - 1_000)
    before = store_snapshot(store)

    refused = _refused(authority, ALL_BAD[case]())

    assert refused.code == "WORKLOAD_UNAUTHORIZED", "a key cannot be used to fetch a workload"
    assert store_snapshot(store) == before


@pytest.mark.parametrize("case", sorted(ALL_BAD))
def test_a_bad_grant_is_refused_through_prepare_too(
    authority: Authority, store: Store, case: str
) -> None:
    command = AdmitCommand(request=request(authorization_snapshot=ALL_BAD[case]()))

    with pytest.raises(WorkloadError) as caught:
        authority.prepare(command, NOW)

    assert caught.value.code == "WORKLOAD_UNAUTHORIZED"
    assert list(store.scan()) == []


def test_a_grant_is_valid_from_its_issue_up_to_but_not_at_its_expiry(
    authority: Authority,
) -> None:
    window = SIGNER.sign(grant_for(issued_at=NOW, expires_at=NOW + 5_000))

    at_issue = authority.admit(
        request(authorization_snapshot=window, idempotency_key="at-issue"), now=NOW
    )
    last_instant = authority.admit(
        request(authorization_snapshot=window, idempotency_key="last"), now=NOW + 4_999
    )
    with pytest.raises(WorkloadError) as expired:
        authority.admit(
            request(authorization_snapshot=window, idempotency_key="expired"), now=NOW + 5_000
        )

    assert at_issue.created
    assert last_instant.created
    assert expired.value.code == "WORKLOAD_UNAUTHORIZED"


def test_the_grant_is_judged_at_the_admission_instant_of_each_call(
    authority: Authority, store: Store
) -> None:
    short = SIGNER.sign(grant_for(expires_at=NOW + 1_000))
    authority.admit(request(authorization_snapshot=short), now=NOW)
    before = store_snapshot(store)

    # The same request after the grant expired is refused, not replayed.
    with pytest.raises(WorkloadError) as caught:
        authority.admit(request(authorization_snapshot=short), now=NOW + 1_000)

    assert caught.value.code == "WORKLOAD_UNAUTHORIZED"
    assert store_snapshot(store) == before


def test_a_signed_grant_verifies_after_a_round_trip_through_json(authority: Authority) -> None:
    wire = json.loads(json.dumps(request().model_dump(mode="json"), sort_keys=True))

    assert authority.admit(wire, now=NOW).created


@pytest.mark.parametrize("case", sorted(BAD_SIGNATURES))
def test_without_signatures_skips_only_the_signature_check(store: Store, case: str) -> None:
    unverified = Authority(store, grants=GrantVerifier.without_signatures())

    admitted = unverified.admit(request(authorization_snapshot=BAD_SIGNATURES[case]()), now=NOW)

    assert admitted.created
    # The verifying authority over the same store still refuses the grant.
    refused = _refused(authority_over(store), BAD_SIGNATURES[case]())
    assert refused.code == "WORKLOAD_UNAUTHORIZED"


@pytest.mark.parametrize("case", sorted(BAD_GRANTS))
def test_without_signatures_still_checks_binding_status_and_validity(
    store: Store, case: str
) -> None:
    unverified = Authority(store, grants=GrantVerifier.without_signatures())

    refused = _refused(unverified, BAD_GRANTS[case]())

    assert refused.code == "WORKLOAD_UNAUTHORIZED"
    assert list(store.scan()) == []


def test_an_authority_needs_an_explicit_grant_verifier(store: Store) -> None:
    with pytest.raises(TypeError):
        Authority(store)  # type: ignore[call-arg]
    with pytest.raises(WorkloadError, match="GrantVerifier") as refused:
        Authority(store, grants=None)  # type: ignore[arg-type]
    assert refused.value.code == "WORKLOAD_INVALID"
    with pytest.raises(WorkloadError, match="GrantVerifier"):
        Authority(store, grants={KEY_ID: SECRET})  # type: ignore[arg-type]


def test_a_verifier_without_keys_must_say_so_explicitly() -> None:
    with pytest.raises(WorkloadError, match="without_signatures"):
        GrantVerifier({})
    assert not GrantVerifier.without_signatures().checks_signatures
    assert GrantVerifier({KEY_ID: SECRET}).checks_signatures


def test_a_signing_secret_must_not_be_short() -> None:
    with pytest.raises(WorkloadError, match="16 bytes"):
        GrantSigner(KEY_ID, b"short")


def test_any_of_several_keys_verifies(store: Store) -> None:
    rotated = GrantSigner("k2", b"the next signing key, 32 bytes!!")
    authority = Authority(
        store, grants=GrantVerifier({KEY_ID: SECRET, "k2": b"the next signing key, 32 bytes!!"})
    )

    old = authority.admit(request(idempotency_key="old"), now=NOW)
    new = authority.admit(
        request(idempotency_key="new", authorization_snapshot=rotated.sign(grant_for())), now=NOW
    )

    assert old.created
    assert new.created
    assert new.workload.authorization_snapshot.key_id == "k2"
    assert new.workload.requested_by == Subject(kind="agent", id="a1")


def test_a_grant_verified_once_is_still_judged_by_each_verifier_and_each_signature() -> None:
    # A verifier checks a signed grant object it accepted before without
    # computing its signature again; that must not let anything else through.
    good = SIGNER.sign(grant_for())
    ours = GrantVerifier({KEY_ID: SECRET})
    theirs = GrantVerifier({KEY_ID: b"another secret, 32 bytes long!!!"})
    for _ in range(3):
        ours.verify(good)
    with pytest.raises(WorkloadError) as caught:
        theirs.verify(good)
    assert caught.value.code == "WORKLOAD_UNAUTHORIZED"
    # An equal grant under a signature that does not verify, made after the
    # good one was accepted, is refused: the signature is checked, not the grant.
    forged = SignedGrant(grant=good.grant, key_id=good.key_id, signature="0" * 64)
    with pytest.raises(WorkloadError):
        ours.verify(forged)
    for factory in BAD_SIGNATURES.values():
        with pytest.raises(WorkloadError):
            ours.verify(factory())
