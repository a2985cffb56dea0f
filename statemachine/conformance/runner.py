"""Running a conformance scenario through the reference, and the vector format it records.

A scenario is data: a name, the documents the store starts with (often none)
and a list of steps, each a command and its instant `now`. Running it through
the reference implementation (an `Authority` over a `MemoryStore`, exactly
what `python -m workwarden.adapter` serves) records, for every step, the
response (the reply or the error), the committed state of the command's
workload, the events the step appended (with their evidence), and the
version and digest of every document in the store. One scenario is one line
of the vector file (JSON Lines, sorted keys, ASCII): regenerating gives the
same bytes, because every input is fixed and nothing reads a clock or draws a
random number. `docs/conformance.md` describes the format and the protocol.

Which scenarios make the shipped vector file, and what they cover, is
`vectors.py`; this module needs neither the scenarios nor the model checker,
so both can build on it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
)

from workwarden.statemachine import errors
from workwarden.statemachine.admission import workload_id_for
from workwarden.statemachine.authority import Authority, serialise
from workwarden.statemachine.commands import ClaimNextCommand, Command
from workwarden.statemachine.conformance.scope_steps import (
    SCOPE_COMMAND_MODELS,
    run_scope_command,
)
from workwarden.statemachine.grants import GrantVerifier
from workwarden.statemachine.index import index_fields
from workwarden.statemachine.models import CreateWorkload, Workload
from workwarden.statemachine.safety import digest
from workwarden.statemachine.spec import Spec, default_spec
from workwarden.storage.base import AuditRecord
from workwarden.storage.memory import MemoryStore

__all__ = [
    "CONFORMANCE_KEY_ID",
    "CONFORMANCE_SECRET",
    "FORMAT",
    "DocumentState",
    "Expectation",
    "ReferenceImplementation",
    "Scenario",
    "Snapshot",
    "StepCommand",
    "StoreEntry",
    "VectorScenario",
    "VectorStep",
    "command_json",
    "document_digest",
    "normalise_document",
    "observe",
    "read_vectors",
    "render_vectors",
    "run_scenario",
    "snapshot",
    "target_key",
]

#: The version of the vector format (a field of every line; a reader refuses another).
FORMAT: Literal[1] = 1

#: The key the scenarios' grants are signed with, given to the implementation at reset.
CONFORMANCE_KEY_ID = "conformance"
CONFORMANCE_SECRET = bytes(range(32))

StepCommand = Command | ClaimNextCommand | Mapping[str, Any]
"""What a step sends: a command model, the scheduler's `claim_next`, or raw JSON.

Raw JSON carries what a model would normalise away (an unsorted set) or
refuse (a malformed command), for scenarios about exactly that.
"""


@dataclass(frozen=True)
class Scenario:
    """A conformance scenario as data: steps of (command, now), from an optional initial store.

    `ends`, when given, is what the last step must end in (an error code, or
    else the state of the command's workload); generation refuses a scenario
    that does not, so a scenario cannot silently stop exercising what its name
    says.
    """

    name: str
    steps: tuple[tuple[StepCommand, int], ...]
    store: tuple[Workload, ...] = ()
    about: str = ""
    ends: str | None = None
    grant_keys: Mapping[str, bytes] = field(
        default_factory=lambda: {CONFORMANCE_KEY_ID: CONFORMANCE_SECRET}
    )


# -- the vector format ---------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


#: A grant key as the reset request carries it: the secret's bytes in lowercase hex.
_GrantKeyHex = Annotated[str, Field(pattern="^([0-9a-f]{2})+$")]


class StoreEntry(_Strict):
    """A document the store holds before the first step (written at version 1).

    A workload document, as the reset request that carries it requires: a vector
    holding anything else is refused when read, not sent to the program.
    """

    key: str
    document: dict[str, JsonValue]  # its schema is `workload.schema.json` (`schemas.py`)

    @field_validator("document")
    @classmethod
    def _a_workload_document(cls, document: dict[str, JsonValue]) -> dict[str, JsonValue]:
        normalise_document(document)  # `ValueError` naming the field at fault
        return document


class DocumentState(_Strict):
    """A committed document as the vectors compare it: its version and its digest."""

    version: int = Field(ge=1)
    digest: str = Field(pattern="^sha256:[0-9a-f]{64}$")


class Expectation(_Strict):
    """What one step must produce.

    - `response`: `{"ok": reply}` or `{"error": {"code", "details"}}` (errors
      compare by `code` only; `details` are informative);
    - `state`: the committed state of the command's workload after the step
      (`null` when the store has none);
    - `events`: the events the step appended, by workload id (only the
      workloads it changed);
    - `store`: every document after the step, by key: version and digest.
    """

    response: dict[str, JsonValue]
    state: str | None
    events: dict[str, list[dict[str, JsonValue]]]
    store: dict[str, DocumentState]


class VectorStep(_Strict):
    """One step: the command (JSON, with its `op`), its instant, and what it must produce."""

    command: dict[str, JsonValue]
    now: int = Field(ge=0)
    expect: Expectation


class VectorScenario(_Strict):
    """One line of the vector file: a scenario and everything it must produce.

    `documents` are the documents after the last step, in full, by key, so a
    difference in a digest can be shown field by field.
    """

    format: Literal[1] = FORMAT  # a file of another format is refused, not misread
    name: str
    about: str = ""
    spec: str
    contract_version: int
    grant_keys: dict[str, _GrantKeyHex]
    store: list[StoreEntry]
    steps: list[VectorStep]
    documents: dict[str, dict[str, JsonValue]]


# -- what a step produced ----------------------------------------------------------------


def normalise_document(document: Any) -> dict[str, Any]:
    """A workload document with every field present, as the workload schema defines it.

    Raises `ValueError` when it is not a workload document, naming the first
    field at fault (`input_hash: Field required`).
    """
    try:
        workload = Workload.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(the document)"
        raise ValueError(f"not a workload document: {where}: {first['msg']}") from None
    return workload.model_dump(mode="json", by_alias=True)


def document_digest(document: Mapping[str, Any]) -> str:
    """`sha256:` and the SHA-256 of the canonical JSON of a normalised document."""
    return "sha256:" + digest(document)


def command_json(command: StepCommand) -> dict[str, Any]:
    """A step's command as the JSON the protocol sends."""
    if isinstance(command, BaseModel):
        out: dict[str, Any] = command.model_dump(mode="json", by_alias=True)
        return out
    return json.loads(json.dumps(dict(command)))  # type: ignore[no-any-return]


def target_key(command: Mapping[str, Any], response: Mapping[str, Any]) -> str | None:
    """The workload a command is about: named, derived from the admission, or the one claimed."""
    op = command.get("op")
    if op == "admit":
        try:
            return workload_id_for(CreateWorkload.model_validate(command.get("request")))
        except ValidationError:
            return None
    if op == "claim_next":
        reply = response.get("ok")
        if isinstance(reply, Mapping) and isinstance(reply.get("workload_id"), str):
            return str(reply["workload_id"])
        return None
    key = command.get("workload_id")
    return key if isinstance(key, str) else None


Snapshot = dict[str, tuple[int, dict[str, Any]]]
"""A store read back: key -> (version, normalised document)."""


def observe(
    command: Mapping[str, Any],
    response: Mapping[str, Any],
    before: Snapshot,
    after: Snapshot,
) -> Expectation:
    """What a step produced, from its response and the store before and after it."""
    events: dict[str, list[dict[str, Any]]] = {}
    for key, (version, document) in after.items():
        old = before.get(key)
        if old is not None and old[0] == version:
            continue
        history = document.get("execution_history") or []
        known = len(old[1].get("execution_history") or []) if old is not None else 0
        events[key] = list(history[known:])
    target = target_key(command, response)
    state = after[target][1].get("state") if target is not None and target in after else None
    return Expectation(
        response=dict(response),
        state=state if isinstance(state, str) else None,
        events=events,
        store={
            key: DocumentState(version=version, digest=document_digest(document))
            for key, (version, document) in sorted(after.items())
        },
    )


# -- the reference implementation ----------------------------------------------------


def _error(exc: errors.WorkloadError) -> dict[str, Any]:
    return {"error": json.loads(json.dumps(exc.to_dict(), default=str))}


class ReferenceImplementation:
    """The conformance protocol served by an `Authority` over a `MemoryStore`.

    `handle(request)` takes one request (`reset`, `command` or `store`; see
    `docs/conformance.md`) and returns its response. `python -m
    workwarden.adapter` serves it on standard input and output; the vectors
    are generated with it.
    """

    def __init__(self, spec: Spec | None = None) -> None:
        self.spec = spec if spec is not None else default_spec()
        self.store = MemoryStore()
        self.authority = Authority(
            self.store, grants=GrantVerifier.without_signatures(), spec=self.spec
        )

    def handle(self, request: Any) -> dict[str, Any]:
        """The response to one request."""
        kind = request.get("type") if isinstance(request, Mapping) else None
        try:
            if kind == "reset":
                return self._reset(request)
            if kind == "command":
                return self._command(request.get("command"), request.get("now"))
            if kind == "store":
                return {"ok": self._documents()}
        except errors.WorkloadError as exc:
            return _error(exc)
        return _error(
            errors.WorkloadError(
                errors.INVALID,
                f"unknown request type {kind!r}: expected reset, command or store",
            )
        )

    def _reset(self, request: Mapping[str, Any]) -> dict[str, Any]:
        keys = request.get("grant_keys") or {}
        try:
            secrets = {str(k): bytes.fromhex(v) for k, v in dict(keys).items()}
            documents = [
                (str(entry["key"]), Workload.model_validate(entry["document"]))
                for entry in request.get("store") or []
            ]
        except (ValueError, TypeError, KeyError) as exc:
            raise errors.WorkloadError(errors.INVALID, f"reset: {exc}") from None
        self.store = MemoryStore()
        grants = GrantVerifier(secrets) if secrets else GrantVerifier.without_signatures()
        self.authority = Authority(self.store, grants=grants, spec=self.spec)
        for key, workload in documents:
            document = serialise(workload)
            audit = AuditRecord(
                transaction_id="tx_reset_" + digest(document)[:24],
                key=key,
                version=0,
                actor="conformance.reset",
                operation="reset",
                tenant=workload.tenant_id,
                application=workload.application_id,
                at=workload.updated_at,
                digest=digest(document),
            )
            self.store.write(key, document, index_fields(self.spec, workload), None, audit)
        return {"ok": None}

    def _command(self, command: Any, now: Any) -> dict[str, Any]:
        # An `op` that is not a string (a list, an object) names no operation: the
        # authority refuses it, and it is never looked up among the scope-wide ones.
        op = command.get("op") if isinstance(command, Mapping) else None
        if isinstance(op, str) and op in SCOPE_COMMAND_MODELS:
            return {"ok": run_scope_command(self.authority, command, now)}
        if op == "claim_next":
            try:
                claim_next = ClaimNextCommand.model_validate(command)
            except ValidationError as exc:
                from workwarden.statemachine.authority import invalid_from_validation

                raise invalid_from_validation(exc) from None
            claim = self.authority.claim_next(
                claim_next.tenant_id,
                claim_next.application_id,
                claim_next.worker_id,
                claim_next.capabilities,
                now,
                claim_next.lease_ms,
                request_id=claim_next.request_id,
            )
            return {"ok": None if claim is None else claim.model_dump(mode="json")}
        if not isinstance(command, Mapping):
            raise errors.WorkloadError(errors.INVALID, "command must be a JSON object")
        reply = self.authority.execute(command, now)
        if isinstance(reply, BaseModel):
            return {"ok": reply.model_dump(mode="json", by_alias=True)}
        return {"ok": reply}

    def _documents(self) -> list[dict[str, Any]]:
        return [
            {"key": doc.key, "version": doc.version, "document": json.loads(doc.document)}
            for doc in self.store.scan()
        ]


def snapshot(entries: Iterable[Mapping[str, Any]]) -> Snapshot:
    """A store read back (`{"key", "version", "document"}` entries), normalised.

    Raises `ValueError` naming the entry and the field at fault.
    """
    out: Snapshot = {}
    seen: dict[str, int] = {}
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, Mapping):
            raise ValueError(f"entry {number} is not an object")
        missing = [field for field in ("key", "version", "document") if field not in entry]
        if missing:
            raise ValueError(f"entry {number} has no {', '.join(missing)}")
        key, version = entry["key"], entry["version"]
        if not isinstance(key, str):
            raise ValueError(f"entry {number}: key {key!r} is not a string")
        if key in seen:
            # A store holds one document a key: a second would hide the first.
            raise ValueError(f"entry {number} ({key}): the key of entry {seen[key]} again")
        seen[key] = number
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(
                f"entry {number} ({key}): version {version!r} is not a whole number of at least 1"
            )
        try:
            out[key] = (version, normalise_document(entry["document"]))
        except ValueError as exc:
            raise ValueError(f"entry {number} ({key}): {exc}") from None
    return out


# -- recording a scenario -------------------------------------------------------------


def _recorded(response: dict[str, Any]) -> dict[str, Any]:
    """A response as the vectors keep it: an error by its code and structured details.

    The message is prose, and the details of `WORKLOAD_INVALID` are the
    validator's words; neither is compared, so neither is kept.
    """
    error = response.get("error")
    if not isinstance(error, Mapping):
        return response
    kept: dict[str, Any] = {"code": error.get("code")}
    if error.get("details") is not None and error.get("code") != errors.INVALID:
        kept["details"] = error["details"]
    return {"error": kept}


def _ending(expect: Expectation) -> str | None:
    error = expect.response.get("error")
    if isinstance(error, Mapping):
        return str(error.get("code"))
    return expect.state


def run_scenario(spec: Spec, scenario: Scenario, *, check_ends: bool = True) -> VectorScenario:
    """Run `scenario` through the reference and record what each step produced.

    With `check_ends`, a scenario whose last step does not end as its `ends`
    says is refused with `ValueError` (turn it off under a changed spec).
    """
    keys = scenario.grant_keys
    store = [
        StoreEntry(key=w.workload_id, document=json.loads(serialise(w))) for w in scenario.store
    ]
    reference = ReferenceImplementation(spec)
    reset = reference.handle(
        {
            "type": "reset",
            "store": [entry.model_dump(mode="json") for entry in store],
            "grant_keys": {k: v.hex() for k, v in keys.items()},
        }
    )
    if "ok" not in reset:
        raise ValueError(f"scenario {scenario.name}: the initial store is refused: {reset}")
    before = snapshot(reference.handle({"type": "store"})["ok"])
    steps: list[VectorStep] = []
    for command, now in scenario.steps:
        sent = command_json(command)
        response = _recorded(reference.handle({"type": "command", "command": sent, "now": now}))
        after = snapshot(reference.handle({"type": "store"})["ok"])
        steps.append(
            VectorStep(command=sent, now=now, expect=observe(sent, response, before, after))
        )
        before = after
    ending = _ending(steps[-1].expect) if steps else None
    if check_ends and scenario.ends is not None and ending != scenario.ends:
        raise ValueError(f"scenario {scenario.name} ends in {ending}, not {scenario.ends}")
    return VectorScenario(
        name=scenario.name,
        about=scenario.about,
        spec=spec.data.spec.name,
        contract_version=spec.contract_version,
        grant_keys={k: v.hex() for k, v in sorted(keys.items())},
        store=store,
        steps=steps,
        documents={key: document for key, (_, document) in sorted(before.items())},
    )


def render_vectors(vectors: Iterable[VectorScenario]) -> str:
    """The vector file: one scenario a line, sorted keys, no spaces, ASCII."""
    return "".join(
        json.dumps(v.model_dump(mode="json"), sort_keys=True, separators=(",", ":")) + "\n"
        for v in vectors
    )


def read_vectors(text: str) -> list[VectorScenario]:
    """Parse a vector file; `ValueError` names the first bad line."""
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(VectorScenario.model_validate_json(line))
        except ValidationError as exc:
            first = exc.errors()[0]
            # Not JSON, or not an object, is the whole line's fault: no field to name.
            where = ".".join(str(part) for part in first["loc"]) + ": " if first["loc"] else ""
            raise ValueError(f"line {number}: {where}{first['msg']}") from None
    return out
