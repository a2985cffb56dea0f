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

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from workwarden.statemachine import errors

__all__ = ["Grant", "GrantSigner", "GrantVerifier", "ResourceScope", "SignedGrant", "Subject"]


_Name = Annotated[
    str, Field(strict=True, min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]*$")
]
_Instant = Annotated[int, Field(strict=True, ge=0, le=2**53 - 1)]


def _sorted_names(value: Any) -> Any:
    if isinstance(value, (set, frozenset, list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(sorted(set(value)))
    return value


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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

    contract_version: Annotated[int, Field(strict=True, ge=1)] = 1
    id: _Name
    issuer: Subject
    subject: Subject
    tenant_id: _Name
    application_id: _Name
    capabilities: Annotated[tuple[_Name, ...], BeforeValidator(_sorted_names)] = ()
    resources: tuple[ResourceScope, ...] = ()
    issued_at: _Instant
    expires_at: _Instant
    revision: Annotated[int, Field(strict=True, ge=1)] = 1
    status: Literal["active", "revoked", "suspended"] = "active"


class SignedGrant(_Frozen):
    """A grant with the id of the key that signed it and the HMAC-SHA256 signature (hex)."""

    grant: Grant
    key_id: _Name
    signature: Annotated[str, Field(strict=True, pattern=r"^[0-9a-f]{64}$")]


def _canonical(grant: Grant) -> bytes:
    data = grant.model_dump(mode="json")
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class GrantSigner:
    """Signs grants with one secret key, named `key_id`."""

    def __init__(self, key_id: str, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("a signing secret must be at least 16 bytes")
        self.key_id = key_id
        self._secret = bytes(secret)

    def sign(self, grant: Grant) -> SignedGrant:
        """Return `grant` with this key's signature."""
        digest = hmac.new(self._secret, _canonical(grant), hashlib.sha256).hexdigest()
        return SignedGrant(grant=grant, key_id=self.key_id, signature=digest)


class GrantVerifier:
    """Verifies signatures against the keys an authority was built with.

    `GrantVerifier({"k1": secret})` verifies; `GrantVerifier.without_signatures()`
    is the explicit choice of a deployment that does not (binding, status and
    expiry are still checked by the core).
    """

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        if not keys:
            raise ValueError(
                "GrantVerifier needs at least one key; use "
                "GrantVerifier.without_signatures() to skip signature checks explicitly"
            )
        self._keys = {key_id: bytes(secret) for key_id, secret in keys.items()}
        self.checks_signatures = True

    @classmethod
    def without_signatures(cls) -> GrantVerifier:
        """A verifier that accepts any signature: say so, do not default to it."""
        verifier = cls.__new__(cls)
        verifier._keys = {}
        verifier.checks_signatures = False
        return verifier

    def verify(self, signed: SignedGrant) -> None:
        """Raise `WORKLOAD_UNAUTHORIZED` unless the signature verifies under a known key."""
        if not self.checks_signatures:
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
