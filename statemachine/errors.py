"""The one way the authority refuses: a `WorkloadError` with a stable code.

Every code is listed, with its meaning and what the caller should do, in the
error catalogue of the spec (`specs/workload.toml`, table `errors`). The
constants below are the names the code raises; a test checks that each one is
in the shipped catalogue and that the catalogue has no code the code never
raises without saying why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workwarden.statemachine.catalogue import error_class

__all__ = [
    "ATTEMPTS_EXHAUSTED",
    "CAPABILITY_DENIED",
    "CLAIM_INVALID",
    "CONFLICT",
    "IDEMPOTENCY_KEY_REUSED",
    "INVALID",
    "LEASE_EXPIRED",
    "MIGRATION_CONFLICT",
    "NOT_FOUND",
    "NOT_READY",
    "NOT_YET_ELIGIBLE",
    "OUTCOME_UNKNOWN",
    "RESULT_CONFLICT",
    "RESULT_DUPLICATE",
    "RETRY_EXHAUSTED",
    "SECRET_REJECTED",
    "SPEC_INVALID",
    "STALE_FENCE",
    "STORAGE_FAILURE",
    "TIMED_OUT",
    "TRANSITION_DENIED",
    "UNAUTHORIZED",
    "WorkloadError",
]

NOT_FOUND = "WORKLOAD_NOT_FOUND"
INVALID = "WORKLOAD_INVALID"
UNAUTHORIZED = "WORKLOAD_UNAUTHORIZED"
IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
CONFLICT = "WORKLOAD_CONFLICT"
TRANSITION_DENIED = "WORKLOAD_TRANSITION_DENIED"
ATTEMPTS_EXHAUSTED = "WORKLOAD_ATTEMPTS_EXHAUSTED"
NOT_READY = "WORKLOAD_NOT_READY"
NOT_YET_ELIGIBLE = "WORKLOAD_NOT_YET_ELIGIBLE"
CAPABILITY_DENIED = "WORKLOAD_CAPABILITY_DENIED"
CLAIM_INVALID = "WORKLOAD_CLAIM_INVALID"
STALE_FENCE = "WORKLOAD_STALE_FENCE"
LEASE_EXPIRED = "WORKLOAD_LEASE_EXPIRED"
SECRET_REJECTED = "WORKLOAD_SECRET_REJECTED"
RESULT_DUPLICATE = "WORKLOAD_RESULT_DUPLICATE"
RESULT_CONFLICT = "WORKLOAD_RESULT_CONFLICT"
RETRY_EXHAUSTED = "WORKLOAD_RETRY_EXHAUSTED"
TIMED_OUT = "WORKLOAD_TIMED_OUT"
STORAGE_FAILURE = "WORKLOAD_STORAGE_FAILURE"
OUTCOME_UNKNOWN = "WORKLOAD_OUTCOME_UNKNOWN"
MIGRATION_CONFLICT = "WORKLOAD_MIGRATION_CONFLICT"
SPEC_INVALID = "WORKLOAD_SPEC_INVALID"


class WorkloadError(Exception):
    """A refusal with a stable `code`, a human `message` and optional `details`.

    `details` is structured data for programs: for example the conflicting
    fields of a reused idempotency key, or the deadline that passed and when.
    Two errors are equal when code, message and details are.
    """

    def __init__(self, code: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details: dict[str, Any] | None = dict(details) if details is not None else None

    @property
    def error_class(self) -> str | None:
        """How a program sorts this refusal, from the catalogue (`[errors.CODE] class`).

        `attempt_over`: stop working on the attempt (its claim is gone);
        `conflict_retry_now`: read again and call again at once; `retry_later`:
        call again with the same arguments later; `fix_request`: the request is
        wrong; `give_up`: the call cannot succeed.
        """
        return error_class(self.code)

    def to_dict(self) -> dict[str, Any]:
        """The error object as JSON-ready data: `code`, `message` and `details` when set."""
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details is not None:
            out["details"] = self.details
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkloadError):
            return NotImplemented
        return (self.code, self.message, self.details) == (other.code, other.message, other.details)

    def __hash__(self) -> int:
        return hash((self.code, self.message))

    def __repr__(self) -> str:
        return f"WorkloadError({self.code!r}, {self.message!r}, details={self.details!r})"
