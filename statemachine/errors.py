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

from pydantic import BaseModel, ConfigDict, ValidationError

from workwarden.statemachine.catalogue import error_class

__all__ = [
    "ATTEMPTS_EXHAUSTED",
    "CAPABILITY_DENIED",
    "CLAIM_INVALID",
    "CONCURRENCY_LIMITED",
    "CONFLICT",
    "EXTRA_MISSING",
    "IDEMPOTENCY_KEY_REUSED",
    "INVALID",
    "LEASE_EXPIRED",
    "MIGRATION_CONFLICT",
    "NOT_FOUND",
    "NOT_READY",
    "NOT_YET_ELIGIBLE",
    "OUTCOME_UNKNOWN",
    "RATE_LIMITED",
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
    "FrozenModel",
    "InvalidArgument",
    "ValidatedModel",
    "WorkloadError",
    "bad_argument",
    "invalid",
    "invalid_from_validation",
]

NOT_FOUND = "WORKLOAD_NOT_FOUND"
INVALID = "WORKLOAD_INVALID"
UNAUTHORIZED = "WORKLOAD_UNAUTHORIZED"
IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
CONFLICT = "WORKLOAD_CONFLICT"
CONCURRENCY_LIMITED = "WORKLOAD_CONCURRENCY_LIMITED"
RATE_LIMITED = "WORKLOAD_RATE_LIMITED"
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
EXTRA_MISSING = "WORKLOAD_EXTRA_MISSING"


class WorkloadError(Exception):
    """A refusal with a stable `code`, a human `message` and optional `details`.

    `details` is structured data for programs: for example the conflicting
    fields of a reused idempotency key, or the deadline that passed and when.
    Two errors are equal when code, message and details are.

    It derives from `Exception` alone, not `ValueError`: a refusal raised
    inside a pydantic validator is then never folded into a `ValidationError`,
    and `except ValueError` never catches a refusal by accident.

    >>> err = WorkloadError(INVALID, "kind: must be a name", {"field": "kind"})
    >>> err.code, err.error_class
    ('WORKLOAD_INVALID', 'fix_request')
    >>> err.to_dict()
    {'code': 'WORKLOAD_INVALID', 'message': 'kind: must be a name', 'details': {'field': 'kind'}}
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


def invalid(field: str, message: str, **details: Any) -> WorkloadError:
    """`WORKLOAD_INVALID` for one bad argument: `details` name the field and the problem.

    >>> invalid("remember", "must be a whole number of writes, 0 or more").to_dict()["details"]
    {'field': 'remember', 'errors': [{'field': 'remember', 'message': 'must be a whole number \
of writes, 0 or more'}]}
    """
    return WorkloadError(
        INVALID,
        f"{field}: {message}",
        {"field": field, **details, "errors": [{"field": field, "message": message}]},
    )


class InvalidArgument(WorkloadError, ValueError):
    """`WORKLOAD_INVALID` for a bad argument of a public constructor or call.

    Also a `ValueError`, so code that caught the `ValueError` such an argument
    raised before keeps working. Raised only outside pydantic validators (a
    `ValueError` raised inside one would be folded into its `ValidationError`).
    """


def bad_argument(field: str, message: str) -> InvalidArgument:
    """`InvalidArgument` with `message` as it is; `details` name `field` as `invalid(...)` does.

    >>> bad_argument("pool_size", "must be at least 1").code
    'WORKLOAD_INVALID'
    """
    return InvalidArgument(
        INVALID,
        message,
        {"field": field, "errors": [{"field": field, "message": message}]},
    )


def invalid_from_validation(exc: ValidationError, prefix: str = "") -> WorkloadError:
    """A pydantic `ValidationError` as `WORKLOAD_INVALID`, naming each field path.

    `details["errors"]` lists each field error as `{"field": "a.b.0", "message": ...}`;
    the message names the first. The refused value is never quoted back (it may
    be large, deeply nested or secret). `prefix` is put before each path.
    """
    problems = []
    for err in exc.errors(include_url=False, include_input=False):
        path = ".".join(str(part) for part in err["loc"])
        if not path and err["type"].startswith("union_tag"):
            path = "op"
        if prefix:
            path = f"{prefix}.{path}" if path else prefix
        problems.append({"field": path, "message": err["msg"]})
    first = problems[0] if problems else {"field": prefix, "message": "invalid"}
    return WorkloadError(INVALID, f"{first['field']}: {first['message']}", {"errors": problems})


class ValidatedModel(BaseModel):
    """A pydantic model whose constructor refuses bad input with `WORKLOAD_INVALID`.

    The base of every request, command and grant model: `Fence(token="1")`
    raises a `WorkloadError` whose `details["errors"]` name each field at
    fault, never pydantic's `ValidationError`. Only the constructor is
    wrapped; `model_validate` and `model_validate_json` are pydantic's and
    raise `ValidationError` (the library's own parsing of caller data turns
    that into `WORKLOAD_INVALID` too, with the field paths under the argument's
    name). The constructor runs the same validator as pydantic's own, so it
    costs nothing more.
    """

    def __init__(self, /, **data: Any) -> None:
        try:
            self.__pydantic_validator__.validate_python(data, self_instance=self)
        except ValidationError as exc:
            raise invalid_from_validation(exc) from None

    # Marked as pydantic marks its own constructor, so pydantic does not take this
    # one for a custom `__init__` it must call from validation: `model_validate` and
    # the validation of nested models keep raising `ValidationError`, with the full
    # field paths, at pydantic's speed (tests/test_bad_input.py holds both).
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]


class FrozenModel(ValidatedModel):
    """A `ValidatedModel` that cannot change once built: setting a field is `WORKLOAD_INVALID`.

    The base of what a caller hands in to be admitted or trusted (a request and
    its policies, a grant): every field was validated when it was built, so
    none may be set afterwards (`policy.max_attempts = 0` would reach a stored
    document unchecked). Build a new one instead:
    `RetryPolicy(**{**policy.model_dump(), "max_attempts": 5})`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    def __setattr__(self, name: str, value: Any) -> None:
        raise bad_argument(name, f"a {type(self).__name__} cannot change once built")

    def __delattr__(self, name: str) -> None:
        raise bad_argument(name, f"a {type(self).__name__} cannot change once built")
