"""JSON Schemas (draft 2020-12) of everything an implementation reads or writes.

Derived from the pydantic models, never written by hand: the spec file, the
workload document a store keeps, every command and the reply it gets, the
error object, and the conformance protocol (`docs/conformance.md`): its
request and response lines and one line of the vector file.
`schema_documents()` returns them by file name; `write_schemas(DIR)` writes
them as stable JSON (sorted keys, indent 2, a trailing newline), so the copy
kept in `specs/schema/` diffs cleanly and a test can say when it is stale.

Each schema has an `$id`, `SCHEMA_BASE` and its file name, so the relative
`$ref`s between them (`"workload.schema.json"`) resolve against it: load the
folder into a registry (`docs/conformance.md`, "The schemas"). A few rules the
models check in code are written into the schemas here as well: the length
limits of arrays are `maxItems`, a timeout is at least 1 ms, an idempotency
key is not blank, and a pause or resume naming a definition names its
application.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter

from workwarden.statemachine.commands import (
    AdmitCommand,
    AdmitReply,
    CancelCommand,
    CheckpointCommand,
    ClaimCommand,
    ClaimNextCommand,
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
    StateReply,
    SweepReply,
    TimeoutCommand,
)
from workwarden.statemachine.conformance.runner import VectorScenario
from workwarden.statemachine.conformance.scope_steps import (
    SCOPE_COMMAND_MODELS,
    SCOPE_REPLY_MODELS,
)
from workwarden.statemachine.models import (
    Attempt,
    Checkpoint,
    Claim,
    ClaimReply,
    ExecutionContext,
    Result,
    Workload,
)
from workwarden.statemachine.spec import Spec, default_spec, spec_json_schema

__all__ = [
    "COMMAND_MODELS",
    "DRAFT",
    "REPLY_MODELS",
    "SCHEMA_BASE",
    # Defined in `commands` beside the other commands; still importable from here.
    "ClaimNextCommand",
    "ErrorObject",
    "render_schema",
    "schema_documents",
    "write_schemas",
]

#: The JSON Schema dialect of every schema written here.
DRAFT = "https://json-schema.org/draft/2020-12/schema"

#: The base of every schema's `$id` (`SCHEMA_BASE + file name`). An identifier, not an
#: address: nothing is served there (`.invalid` never resolves); the schemas are
#: found by their `$id` in a registry loaded from the folder.
SCHEMA_BASE = "https://workwarden.invalid/schema/"

#: A name (no control character) holding at least one character that is not a space.
_NOT_BLANK = r"^[^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f][^\x00-\x1f\x7f]*$"


class ErrorObject(BaseModel):
    """A refusal as data: its stable `code` from the catalogue, a message, optional details.

    Programs decide on `code` (and `details`); `message` is for people and may
    be worded differently by another implementation.
    """

    model_config = ConfigDict(extra="forbid")

    code: str = Field(pattern=r"^[A-Z][A-Z0-9_]*$")
    message: str = ""
    details: dict[str, JsonValue] | None = None
    #: How a program sorts the refusal (the catalogue's `class` of `code`); optional.
    error_class: (
        Literal["attempt_over", "conflict_retry_now", "retry_later", "fix_request", "give_up"]
        | None
    ) = Field(default=None, alias="class")


#: The model of each command, by its `op`.
COMMAND_MODELS: dict[str, type[BaseModel]] = {
    "admit": AdmitCommand,
    "claim": ClaimCommand,
    "claim_next": ClaimNextCommand,
    "start": StartCommand,
    "heartbeat": HeartbeatCommand,
    "execution_context": ExecutionContextCommand,
    "checkpoint": CheckpointCommand,
    "complete": CompleteCommand,
    "fail": FailCommand,
    "cancel": CancelCommand,
    "confirm_cancel": ConfirmCancelCommand,
    "timeout": TimeoutCommand,
    "retry": RetryCommand,
    "recover_expired": RecoverCommand,
    "enforce_deadlines": EnforceDeadlineCommand,
    "operator": OperatorCommand,
    **SCOPE_COMMAND_MODELS,
}

#: The model of the reply to each command, by its `op` (`claim_next` may also reply null).
REPLY_MODELS: dict[str, type[BaseModel]] = {
    "admit": AdmitReply,
    "claim": ClaimReply,
    "claim_next": ClaimReply,
    "start": Attempt,
    "heartbeat": Claim,
    "execution_context": ExecutionContext,
    "checkpoint": Checkpoint,
    "complete": Result,
    "fail": StateReply,
    "cancel": StateReply,
    "confirm_cancel": StateReply,
    "timeout": StateReply,
    "retry": StateReply,
    "recover_expired": SweepReply,
    "enforce_deadlines": SweepReply,
    "operator": StateReply,
    **SCOPE_REPLY_MODELS,
}


def _titled(schema: dict[str, Any], title: str, description: str | None = None) -> dict[str, Any]:
    schema["$schema"] = DRAFT
    schema["title"] = title
    if description is not None:
        schema["description"] = description
    return schema


def _require_op(schema: dict[str, Any]) -> dict[str, Any]:
    """Mark `op` required wherever a command model declares it: the protocol always sends it."""
    for model in [schema, *schema.get("$defs", {}).values()]:
        if "op" in model.get("properties", {}):
            required = model.setdefault("required", [])
            if "op" not in required:
                required.insert(0, "op")
    return schema


def _model(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(by_alias=True)


def _nodes(node: Any) -> Any:
    """Every object in a schema, depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _nodes(value)


def _checked_rules(schema: dict[str, Any]) -> dict[str, Any]:
    """Write in the rules the models check in code (see the module's docstring)."""
    for node in _nodes(schema):
        if node.get("type") == "array":
            # A length limit on a list is a number of items.
            for length, items in (("maxLength", "maxItems"), ("minLength", "minItems")):
                if length in node:
                    node[items] = node.pop(length)
    defs = schema.get("$defs", {})
    for timeouts in (defs.get("Timeouts"),):
        for field in (timeouts or {}).get("properties", {}).values():
            for branch in field.get("anyOf", [field]):
                if branch.get("type") == "integer":
                    branch["minimum"] = 1
    request = defs.get("CreateWorkload")
    if request is not None:
        request["properties"]["idempotency_key"]["pattern"] = _NOT_BLANK
    return schema


def _scope_rule(schema: dict[str, Any]) -> dict[str, Any]:
    """A scope naming a definition names its application."""
    schema["if"] = {
        "required": ["definition"],
        "properties": {"definition": {"type": "string"}},
    }
    schema["then"] = {
        "required": ["application"],
        "properties": {"application": {"type": "string"}},
    }
    return schema


def _vector_schema() -> dict[str, Any]:
    """One line of the vector file: its initial documents are workload documents (the reset
    request that carries them says so, and `read_vectors` refuses any other)."""
    schema = _model(VectorScenario)
    schema["$defs"]["StoreEntry"]["properties"]["document"] = {"$ref": "workload.schema.json"}
    return schema


def _error_schema(spec: Spec) -> dict[str, Any]:
    schema = _model(ErrorObject)
    schema["properties"]["code"]["enum"] = sorted(spec.errors)
    return _titled(schema, "workwarden error object")


def _protocol_schemas() -> dict[str, dict[str, Any]]:
    """The request and response lines of the conformance protocol."""
    document = {
        "type": "object",
        "additionalProperties": False,
        "required": ["key", "document"],
        "properties": {
            "key": {"type": "string"},
            "version": {"type": "integer", "minimum": 1},
            "document": {"$ref": "workload.schema.json"},
        },
    }
    request = {
        "oneOf": [
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["type", "store", "grant_keys"],
                "properties": {
                    "type": {"const": "reset"},
                    "store": {"type": "array", "items": document},
                    "grant_keys": {
                        "type": "object",
                        "additionalProperties": {"type": "string", "pattern": "^([0-9a-f]{2})+$"},
                    },
                },
            },
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["type", "command", "now"],
                "properties": {
                    "type": {"const": "command"},
                    "command": {
                        "anyOf": [
                            {"$ref": "command.schema.json"},
                            {"$ref": "command-claim_next.schema.json"},
                            *({"$ref": f"command-{op}.schema.json"} for op in SCOPE_COMMAND_MODELS),
                        ]
                    },
                    "now": {"type": "integer", "minimum": 0, "maximum": 2**53 - 1},
                },
            },
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["type"],
                "properties": {"type": {"const": "store"}},
            },
        ]
    }
    response = {
        "oneOf": [
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["ok"],
                "properties": {"ok": {}},
            },
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["error"],
                "properties": {"error": {"$ref": "error.schema.json"}},
            },
        ]
    }
    return {
        "conformance-request.schema.json": _titled(
            request, "workwarden conformance request (one line on the program's stdin)"
        ),
        "conformance-response.schema.json": _titled(
            response, "workwarden conformance response (one line on the program's stdout)"
        ),
    }


def schema_documents(spec: Spec | None = None) -> dict[str, dict[str, Any]]:
    """Every schema, by file name. The error codes listed are `spec`'s (the shipped spec's)."""
    spec = spec if spec is not None else default_spec()
    out: dict[str, dict[str, Any]] = {
        "spec.schema.json": spec_json_schema(),
        "workload.schema.json": _titled(
            _model(Workload), "workwarden workload document", Workload.__doc__
        ),
        "error.schema.json": _error_schema(spec),
        "command.schema.json": _titled(
            _require_op(TypeAdapter(Command).json_schema(by_alias=True)),
            "workwarden command (any, told apart by op)",
        ),
        "vector.schema.json": _titled(
            _vector_schema(), "workwarden conformance vector (one line of the vector file)"
        ),
    }
    for op, model in COMMAND_MODELS.items():
        schema = _require_op(_model(model))
        if op in ("pause", "resume"):
            schema = _scope_rule(schema)
        out[f"command-{op}.schema.json"] = _titled(schema, f"workwarden command {op}")
    for op, model in REPLY_MODELS.items():
        schema = _model(model)
        if op == "claim_next":
            schema = {"anyOf": [schema, {"type": "null"}], "$defs": schema.pop("$defs", {})}
            schema["anyOf"][0].pop("$defs", None)
            if not schema["$defs"]:
                del schema["$defs"]
        out[f"reply-{op}.schema.json"] = _titled(schema, f"workwarden reply to {op}")
    out.update(_protocol_schemas())
    for name, schema in out.items():
        _checked_rules(schema)
        schema["$id"] = SCHEMA_BASE + name
    return dict(sorted(out.items()))


def render_schema(schema: Mapping[str, Any]) -> str:
    """A schema as stable JSON text: sorted keys, indent 2, a trailing newline."""
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_schemas(directory: str | Path, spec: Spec | None = None) -> list[Path]:
    """Write every schema into `directory` (created if missing); the paths written, sorted.

    A file whose content is already the same is left untouched.
    """
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in schema_documents(spec).items():
        path = target / name
        text = render_schema(schema)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8", newline="\n")
        written.append(path)
    return written
