"""What the authority accepts from a caller, turned into models or a `WorkloadError`.

A caller hands the authority plain data: a command as a mapping, an instant,
names, a tenant and application, an admission request. Each is turned into
its model here, or refused with `WORKLOAD_INVALID` naming the field at fault,
before anything is read or decided. A document the store hands back is
turned into a workload here too; one that does not parse is the store's
fault (`WORKLOAD_STORAGE_FAILURE`), not the caller's.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from workwarden.statemachine import errors
from workwarden.statemachine.commands import (
    AdmitCommand,
    CancelCommand,
    CheckpointCommand,
    ClaimCommand,
    Command,
    CompleteCommand,
    ConfirmCancelCommand,
    EnforceDeadlineCommand,
    ExecutionContextCommand,
    FailCommand,
    HeartbeatCommand,
    OperatorCommand,
    RecoverCommand,
    RetryCommand,
    StartCommand,
    TimeoutCommand,
)
from workwarden.statemachine.models import MAX_LIST, CreateWorkload, Name, Prose, Workload
from workwarden.storage.base import StoredDocument

__all__ = [
    "COMMAND_TYPES",
    "OPERATIONS",
    "as_command",
    "as_full_scope",
    "as_name",
    "as_names",
    "as_prose",
    "as_request",
    "as_scope",
    "build",
    "check_now",
    "invalid_from_validation",
    "parse_stored",
]

_Model = TypeVar("_Model", bound=BaseModel)

_COMMAND: TypeAdapter[Command] = TypeAdapter(Command)
_NAME: TypeAdapter[str] = TypeAdapter(Name)
_PROSE: TypeAdapter[str] = TypeAdapter(Prose)

#: Every command model `Authority.prepare` takes as it is, without parsing it.
COMMAND_TYPES = (
    AdmitCommand,
    ClaimCommand,
    StartCommand,
    HeartbeatCommand,
    ExecutionContextCommand,
    CheckpointCommand,
    CompleteCommand,
    FailCommand,
    CancelCommand,
    ConfirmCancelCommand,
    TimeoutCommand,
    RetryCommand,
    RecoverCommand,
    EnforceDeadlineCommand,
    OperatorCommand,
)

#: The `op` of every command `prepare` takes.
OPERATIONS: tuple[str, ...] = tuple(
    sorted(str(model.model_fields["op"].default) for model in COMMAND_TYPES)
)


#: A pydantic `ValidationError` as `WORKLOAD_INVALID`, naming each field path.
invalid_from_validation = errors.invalid_from_validation


def check_now(now: Any) -> None:
    """Refuse an instant that is not an integer number of milliseconds in range."""
    if isinstance(now, bool) or not isinstance(now, int) or not 0 <= now <= 2**53 - 1:
        message = "now must be an integer instant in milliseconds"
        raise errors.WorkloadError(
            errors.INVALID,
            message,
            {"field": "now", "errors": [{"field": "now", "message": message}]},
        )


def as_names(values: Any, field: str = "names") -> Any:
    """A caller's collection of names as a tuple; anything else is left for validation to refuse.

    At most `MAX_LIST` (256) names, read no further than one past it: a longer
    iterable (a generator that never ends) is `WORKLOAD_INVALID` naming `field`.
    """
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        return values
    names = tuple(itertools.islice(values, MAX_LIST + 1))
    if len(names) > MAX_LIST:
        raise errors.invalid(field, f"at most {MAX_LIST} entries")
    return names


def as_name(value: Any, field: str) -> str:
    """`value` as a name (1 to 256 printable characters), or `WORKLOAD_INVALID` naming `field`."""
    try:
        return _NAME.validate_python(value)
    except ValidationError as exc:
        raise invalid_from_validation(exc, field) from None


def as_prose(value: Any, field: str) -> str:
    """`value` as free text (`Prose`: no NUL, 4,096 characters at most), or `WORKLOAD_INVALID`."""
    try:
        return _PROSE.validate_python(value)
    except ValidationError as exc:
        raise invalid_from_validation(exc, field) from None


def as_scope(tenant: Any, application: Any) -> tuple[str | None, str | None]:
    """An optional tenant and application, each a name when given."""
    return (
        None if tenant is None else as_name(tenant, "tenant"),
        None if application is None else as_name(application, "application"),
    )


def as_full_scope(tenant: Any, application: Any) -> tuple[str, str]:
    """A tenant and application, both required, each a name."""
    return as_name(tenant, "tenant"), as_name(application, "application")


def as_command(command: Command | Mapping[str, Any]) -> Command:
    """A command model as it is; caller data parsed, or `WORKLOAD_INVALID` naming each field."""
    if isinstance(command, COMMAND_TYPES):
        return command
    if not isinstance(command, Mapping):
        message = "a command is a command model or a mapping of its fields with its op"
        raise errors.WorkloadError(
            errors.INVALID,
            f"command: {message}, not {type(command).__name__}",
            {"errors": [{"field": "command", "message": message}]},
        )
    op = command.get("op")
    if not isinstance(op, str) or op not in OPERATIONS:
        # Checked before pydantic, which would quote a bad `op` back in its
        # message, however large or deeply nested (or secret) it is.
        message = "must name one of the operations: " + ", ".join(OPERATIONS)
        raise errors.WorkloadError(
            errors.INVALID,
            f"op: {message}",
            {"errors": [{"field": "op", "message": message}]},
        )
    try:
        return _COMMAND.validate_python(command)
    except ValidationError as exc:
        raise invalid_from_validation(exc) from None


def as_request(request: CreateWorkload | Mapping[str, Any]) -> CreateWorkload:
    """An admission request as it is, or parsed; `WORKLOAD_INVALID` naming `request.<field>`."""
    if isinstance(request, CreateWorkload):
        return request
    try:
        return CreateWorkload.model_validate(request)
    except ValidationError as exc:
        raise invalid_from_validation(exc, "request") from None


def build(model: type[_Model], **fields: Any) -> _Model:
    """`model` made of a one-call method's arguments, or `WORKLOAD_INVALID` naming each field."""
    try:
        return model(**fields)
    except ValidationError as exc:
        raise invalid_from_validation(exc) from None


def parse_stored(doc: StoredDocument) -> Workload:
    """The workload a stored document holds; one that does not parse is a storage failure."""
    try:
        return Workload.model_validate_json(doc.document)
    except ValidationError as exc:
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE,
            f"stored document {doc.key} version {doc.version} does not parse",
            {"workload_id": doc.key},
        ) from exc
