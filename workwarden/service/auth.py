"""Who is calling, and whether their actor class may call an operation.

A caller presents `Authorization: Bearer <token>`. A token is a grant of
`workwarden.statemachine.grants`, signed with the same HMAC-SHA256 machinery
the authority verifies admissions with (`GrantSigner`, `GrantVerifier`),
under keys given to `workwarden serve --token-keys FILE`:

- its `subject` names the caller (`id`), its one capability
  `workwarden:worker` or `workwarden:operator` its actor class;
- it is valid from `issued_at` until `expires_at` (milliseconds), while
  `status` is `active`; `tenant_id` and `application_id` are `*`: tokens
  are not scoped to a tenant, and a token that names one is refused on
  every call (`WORKWARDEN_FORBIDDEN`, `scoped_token`) rather than trusted
  beyond its scope;
- on the wire it is `wwt1.` and the URL-safe base64 (no padding) of the
  signed grant's JSON.

Tokens are self-contained: the service keeps no token list, and anyone who
holds the keys can mint one (`issue_token`, or `workwarden serve
--issue-token CLASS:SUBJECT`).

Which class may call what is read from the spec's operations table
(`Spec.operations[...].spec.actor`), never listed here: an operation whose
actor is `worker` is called with a worker's token, `operator` with an
operator's; an operation whose actor is `system` (admission, which carries
its own signed grant, and the sweeps, which act only on what the clock has
made due) and the reads (`get`, `list`) with either. A worker's `worker_id`
and an operator's `actor` must be the token's subject, so the audit log
records who acted; a token whose subject is `*` may act as any id (for a
trusted gateway, or a conformance run). A call without a good token is
`WORKWARDEN_UNAUTHENTICATED` (HTTP 401), a good token that may not make the
call `WORKWARDEN_FORBIDDEN` (HTTP 403), each with `details.reason`, before
the request's body or the store is read. (`WORKLOAD_UNAUTHORIZED` stays the
core's: an admission whose own grant does not bind it.)
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import ValidationError

from workwarden.statemachine import errors
from workwarden.statemachine.grants import (
    Grant,
    GrantSigner,
    GrantVerifier,
    SignedGrant,
    Subject,
)
from workwarden.statemachine.spec import Spec

__all__ = [
    "ACTOR_CLASSES",
    "ANY_SUBJECT",
    "FORBIDDEN",
    "TOKEN_PREFIX",
    "UNAUTHENTICATED",
    "ActorClass",
    "Caller",
    "TokenVerifier",
    "authorize",
    "forbidden",
    "issue_token",
    "peek_actor_class",
]

ActorClass = Literal["worker", "operator"]
"""The actor classes a token may name."""

#: The actor classes a token may name, in the order the docs list them.
ACTOR_CLASSES: tuple[ActorClass, ...] = ("worker", "operator")

#: The subject of a token that may act as any worker or operator id.
ANY_SUBJECT = "*"

#: What every token starts with (the format's version).
TOKEN_PREFIX = "wwt1."

#: The code of a call without a good token: none, malformed, unknown key, not active, not yet
#: valid, expired.
UNAUTHENTICATED = "WORKWARDEN_UNAUTHENTICATED"

#: The code of a good token that may not make the call: the wrong class, another subject, or
#: a token scoped to a tenant.
FORBIDDEN = "WORKWARDEN_FORBIDDEN"

_CAPABILITY = "workwarden:"
_ISSUER = Subject(kind="service", id="workwarden.serve")


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: its subject id and actor class."""

    subject: str
    actor_class: ActorClass

    def may_act_as(self, actor_id: str) -> bool:
        """May this caller name `actor_id` as the worker or operator acting?"""
        return self.subject in (ANY_SUBJECT, actor_id)


def _refuse(reason: str, message: str, **details: str) -> errors.WorkloadError:
    return errors.WorkloadError(UNAUTHENTICATED, message, {"reason": reason, **details})


def forbidden(reason: str, message: str, **details: str) -> errors.WorkloadError:
    """The `WORKWARDEN_FORBIDDEN` refusal of a good token, with `details.reason`."""
    return errors.WorkloadError(FORBIDDEN, message, {"reason": reason, **details})


def issue_token(
    signer: GrantSigner,
    subject: str,
    actor_class: ActorClass,
    now: int,
    ttl_ms: int,
    *,
    kind: Literal["human", "agent", "service"] = "service",
) -> str:
    """A token naming `subject` as `actor_class`, valid from `now` for `ttl_ms` milliseconds."""
    if actor_class not in ACTOR_CLASSES:
        raise errors.invalid("actor_class", f"must be one of {', '.join(ACTOR_CLASSES)}")
    grant = Grant(
        id=f"token:{actor_class}:{subject}:{now}",
        issuer=_ISSUER,
        subject=Subject(kind=kind, id=subject),
        tenant_id="*",
        application_id="*",
        capabilities=(_CAPABILITY + actor_class,),
        issued_at=now,
        expires_at=now + ttl_ms,
    )
    text = signer.sign(grant).model_dump_json().encode("utf-8")
    return TOKEN_PREFIX + base64.urlsafe_b64encode(text).rstrip(b"=").decode("ascii")


def _decode(token: str) -> SignedGrant:
    if not token.startswith(TOKEN_PREFIX):
        raise _refuse("invalid_token", f"a token starts with {TOKEN_PREFIX}")
    body = token[len(TOKEN_PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        return SignedGrant.model_validate_json(raw)
    except (binascii.Error, ValueError, ValidationError):
        raise _refuse("invalid_token", "the token does not decode") from None


def _actor_class(signed: SignedGrant) -> ActorClass:
    classes = [
        cap[len(_CAPABILITY) :] for cap in signed.grant.capabilities if cap.startswith(_CAPABILITY)
    ]
    if len(classes) != 1 or classes[0] not in ACTOR_CLASSES:
        raise _refuse("invalid_token", "the token names no actor class (worker or operator)")
    return "worker" if classes[0] == "worker" else "operator"


def peek_actor_class(token: str) -> ActorClass:
    """The actor class a token names, read without checking its signature.

    For a client choosing which of its tokens to send; only the service's
    `TokenVerifier` decides whether a token is good.
    """
    return _actor_class(_decode(token))


class TokenVerifier:
    """Checks bearer tokens against the keys the service was started with."""

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        self._grants = GrantVerifier(keys)

    def verify(self, authorization: str | None, now: int) -> Caller:
        """The caller an `Authorization` header names, or `WORKWARDEN_UNAUTHENTICATED`.

        A token scoped to a tenant or application is `WORKWARDEN_FORBIDDEN`
        (`scoped_token`): see the module docstring.
        """
        if not authorization:
            raise _refuse("missing_token", "this call needs a bearer token")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _refuse("invalid_token", "the Authorization header is not `Bearer <token>`")
        signed = _decode(token.strip())
        try:
            self._grants.verify(signed)
        except errors.WorkloadError:
            raise _refuse("invalid_token", "the token's signature does not verify") from None
        grant = signed.grant
        if grant.status != "active":
            raise _refuse("invalid_token", f"the token is {grant.status}")
        if now < grant.issued_at:
            raise _refuse("not_yet_valid_token", "the token is not valid yet (issued_at is later)")
        if now >= grant.expires_at:
            raise _refuse("expired_token", "the token has expired")
        caller = Caller(grant.subject.id, _actor_class(signed))
        if (grant.tenant_id, grant.application_id) != (ANY_SUBJECT, ANY_SUBJECT):
            # The service cannot tell every call's tenant before reading (a call by
            # workload id), so a scoped token is refused whole rather than let past it.
            raise forbidden(
                "scoped_token",
                "this service does not scope tokens: a token's tenant_id and application_id"
                " must be *",
                tenant_id=grant.tenant_id,
                application_id=grant.application_id,
            )
        return caller


def authorize(spec: Spec, operation: str, caller: Caller, acting_as: str | None = None) -> None:
    """Refuse `caller` unless its class may call `operation` (and act as `acting_as`).

    The class an operation needs is its `actor` in the spec's operations
    table; `system` operations are open to both classes. An operation the
    spec lacks is let through to the authority, which refuses it as
    `WORKLOAD_INVALID` and writes nothing.
    """
    row = spec.operations.get(operation)
    if row is None:
        return
    needed = row.spec.actor
    if needed != "system" and needed != caller.actor_class:
        raise forbidden(
            "wrong_actor_class",
            f"{operation} is an operation of the {needed} class; this token is"
            f" {'an' if caller.actor_class == 'operator' else 'a'} {caller.actor_class}'s",
            operation=operation,
            actor_class=caller.actor_class,
        )
    if acting_as is not None and not caller.may_act_as(acting_as):
        raise forbidden(
            "subject_mismatch",
            "the call names another actor than the token's subject",
            operation=operation,
        )
