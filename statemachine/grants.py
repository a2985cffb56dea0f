"""Who asked, and the signed grant that says they may.

An admission carries an authorization snapshot: a `Grant` signed with
HMAC-SHA256 under a named key. The authority checks that the grant binds the
requester, tenant and application, that it is active and unexpired at the
admission instant, and that its signature verifies under the keys it was built
with. A deployment that does not verify signatures says so when it builds the
authority, with `GrantVerifier.without_signatures()`: there is no silent
default.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from workwarden.statemachine import errors
from workwarden.statemachine.identity import ByIdentity

__all__ = ["Grant", "GrantSigner", "GrantVerifier", "ResourceScope", "SignedGrant", "Subject"]


_Name = Annotated[
    str, Field(strict=True, min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]*$")
]
_Instant = Annotated[int, Field(strict=True, ge=0, le=2**53 - 1)]
#: A grant's contract version or revision: a whole number up to the largest integer a JSON
#: number carries exactly (2**53 - 1), as every other number of a stored document.
_Number = Annotated[int, Field(strict=True, ge=1, le=2**53 - 1)]


def _sorted_names(value: Any) -> Any:
    if isinstance(value, (set, frozenset, list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(sorted(set(value)))
    return value


class _Frozen(errors.FrozenModel):
    pass


class Subject(_Frozen):
    """A principal: a human, an agent or a service, by kind and id."""

    kind: Literal["human", "agent", "service"]
    id: _Name


class ResourceScope(_Frozen):
    """A resource pattern a grant covers, for example `flow://app/workloads/*`."""

    kind: _Name
    uri: _Name


class Grant(_Frozen):
    """What `issuer` allowed `subject` to do in one tenant and application, and until when."""

    contract_version: _Number = 1
    id: _Name
    issuer: Subject
    subject: Subject
    tenant_id: _Name
    application_id: _Name
    capabilities: Annotated[tuple[_Name, ...], BeforeValidator(_sorted_names)] = ()
    resources: tuple[ResourceScope, ...] = ()
    issued_at: _Instant
    expires_at: _Instant
    revision: _Number = 1
    status: Literal["active", "revoked", "suspended"] = "active"


class SignedGrant(_Frozen):
    """A grant with the id of the key that signed it and the HMAC-SHA256 signature (hex)."""

    grant: Grant
    key_id: _Name
    signature: Annotated[str, Field(strict=True, pattern=r"^[0-9a-f]{64}$")]


def _canonical(grant: Grant) -> bytes:
    data = grant.model_dump(mode="json")
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _key_id(value: Any, field: str) -> str:
    """A key id: a name of 1 to 256 printable characters, or `WORKLOAD_INVALID` naming `field`."""
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= 256
        or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)
    ):
        raise errors.invalid(field, "a key id is a name of 1 to 256 printable characters")
    return value


def _secret(value: Any, field: str) -> bytes:
    """A signing secret: bytes, at least 16 of them, or `WORKLOAD_INVALID` naming `field`."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise errors.invalid(field, f"a signing secret is bytes, not {type(value).__name__}")
    secret = bytes(value)
    if len(secret) < 16:
        raise errors.invalid(field, "a signing secret must be at least 16 bytes")
    return secret


class GrantSigner:
    """Signs grants with one secret key, named `key_id`.

    `key_id` is a name; `secret` is bytes, at least 16 of them. Anything else
    is refused with `WORKLOAD_INVALID` naming the argument. Immutable once
    built: share one between threads freely.

    >>> signer = GrantSigner("key-1", b"a secret of at least 16 bytes")
    >>> GrantSigner("key-1", b"short")
    Traceback (most recent call last):
    ...
    workwarden.statemachine.errors.WorkloadError: WORKLOAD_INVALID: secret: a signing secret \
must be at least 16 bytes
    """

    def __init__(self, key_id: str, secret: bytes) -> None:
        self.key_id = _key_id(key_id, "key_id")
        self._secret = _secret(secret, "secret")

    def sign(self, grant: Grant) -> SignedGrant:
        """Return `grant` with this key's signature (`WORKLOAD_INVALID` unless it is a `Grant`)."""
        if not isinstance(grant, Grant):
            raise errors.invalid("grant", "grant must be a Grant")
        digest = hmac.new(self._secret, _canonical(grant), hashlib.sha256).hexdigest()
        return SignedGrant(grant=grant, key_id=self.key_id, signature=digest)


#: How many accepted signed grants a verifier keeps, so as not to verify them again.
_VERIFIED = 64


class GrantVerifier:
    """Verifies signatures against the keys an authority was built with.

    `GrantVerifier({"k1": secret})` verifies; `GrantVerifier.without_signatures()`
    is the explicit choice of a deployment that does not (binding, status and
    expiry are still checked by the core). `keys` maps key ids (names) to
    secrets (bytes, at least 16); an empty or malformed mapping is refused with
    `WORKLOAD_INVALID` naming the entry. Immutable once built: share one
    between threads freely.

    >>> GrantVerifier({})
    Traceback (most recent call last):
    ...
    workwarden.statemachine.errors.WorkloadError: WORKLOAD_INVALID: keys: needs at least one \
key; use GrantVerifier.without_signatures() to skip signature checks explicitly
    """

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        if not isinstance(keys, Mapping):
            raise errors.invalid("keys", "a mapping of key ids to secrets (bytes)")
        if not keys:
            raise errors.invalid(
                "keys",
                "needs at least one key; use GrantVerifier.without_signatures() "
                "to skip signature checks explicitly",
            )
        self._keys = {
            _key_id(key_id, "keys"): _secret(secret, f"keys[{key_id!r}]")
            for key_id, secret in keys.items()
        }
        self.checks_signatures = True
        # The signed grants accepted lately. A producer hands the same `SignedGrant`
        # with every request, and verifying it again (its canonical JSON, then the
        # HMAC) is a fair share of an admission; a `SignedGrant` is immutable all the
        # way down and the keys never change, so the same object verifies the same way.
        self._verified: ByIdentity[SignedGrant, bool] = ByIdentity(_VERIFIED)

    @classmethod
    def without_signatures(cls) -> GrantVerifier:
        """A verifier that accepts any signature: say so, do not default to it."""
        verifier = cls.__new__(cls)
        verifier._keys = {}
        verifier.checks_signatures = False
        verifier._verified = ByIdentity(_VERIFIED)
        return verifier

    def verify(self, signed: SignedGrant) -> None:
        """Raise `WORKLOAD_UNAUTHORIZED` unless the signature verifies under a known key.

        `signed` must be a `SignedGrant` (anything else is `WORKLOAD_INVALID`).
        """
        if not isinstance(signed, SignedGrant):
            raise errors.invalid("signed", "signed must be a SignedGrant (GrantSigner.sign)")
        if not self.checks_signatures or self._verified.get(signed) is not None:
            return
        secret = self._keys.get(signed.key_id)
        if secret is None:
            raise errors.WorkloadError(
                errors.UNAUTHORIZED,
                "the authorization snapshot is signed with an unknown key",
                {"key_id": signed.key_id},
            )
        expected = hmac.new(secret, _canonical(signed.grant), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, signed.signature):
            raise errors.WorkloadError(
                errors.UNAUTHORIZED, "the authorization snapshot's signature does not verify"
            )
        self._verified.put(signed, True)
