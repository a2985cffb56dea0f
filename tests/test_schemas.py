"""The JSON Schemas: generated from the models, shipped fresh, and true of what the reference says.

An implementer in another language validates their documents, commands and
replies against `specs/schema/`; these tests hold the schemas to the vectors
the reference produced, with an independent validator.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from referencing import Registry, Resource

from workwarden.cli import main
from workwarden.statemachine.conformance.runner import (
    ReferenceImplementation,
    command_json,
    read_vectors,
)
from workwarden.statemachine.conformance.scenarios import Work, request
from workwarden.statemachine.conformance.schemas import SCHEMA_BASE, schema_documents

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "specs" / "schema"
VECTORS = ROOT / "specs" / "vectors" / "workload.jsonl"


def _schemas() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text("utf-8")) for path in SHIPPED.glob("*.json")}


def _validator(name: str, schemas: dict[str, dict[str, Any]]) -> jsonschema.Draft202012Validator:
    # As docs/conformance.md says to: a registry of the folder, each schema under its `$id`.
    resources = [Resource.from_contents(schema) for schema in schemas.values()]
    registry: Registry[Any] = Registry().with_resources((r.id(), r) for r in resources)
    return jsonschema.Draft202012Validator(schemas[name], registry=registry)


def test_the_shipped_schemas_are_exactly_what_the_schema_command_writes(tmp_path: Path) -> None:
    assert main(["schema", "--out", str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(p.name for p in SHIPPED.iterdir()), (
        "specs/schema/ is stale: run `workwarden schema --out specs/schema`"
    )
    for name in written:
        assert (tmp_path / name).read_bytes() == (SHIPPED / name).read_bytes(), (
            f"specs/schema/{name} is stale: run `workwarden schema --out specs/schema`"
        )


def test_there_is_a_schema_for_every_command_and_its_reply_the_spec_and_the_error() -> None:
    names = set(schema_documents())
    ops = [
        "admit", "claim", "claim_next", "start", "heartbeat", "execution_context", "checkpoint",
        "complete", "fail", "cancel", "confirm_cancel", "timeout", "retry", "recover_expired",
        "enforce_deadlines", "operator",
    ]  # fmt: skip
    for op in ops:
        assert f"command-{op}.schema.json" in names
        assert f"reply-{op}.schema.json" in names
    assert {"spec.schema.json", "workload.schema.json", "error.schema.json"} <= names


def test_every_schema_is_a_valid_draft_2020_12_schema_with_stable_text() -> None:
    for name, schema in _schemas().items():
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema", name
        jsonschema.Draft202012Validator.check_schema(schema)
        text = (SHIPPED / name).read_text("utf-8")
        assert text.endswith("}\n")
        assert text == json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def test_what_the_reference_sends_and_answers_in_the_vectors_satisfies_the_schemas() -> None:
    schemas = _schemas()
    request = _validator("conformance-request.schema.json", schemas)
    response = _validator("conformance-response.schema.json", schemas)
    workload = _validator("workload.schema.json", schemas)
    error = _validator("error.schema.json", schemas)
    vector = _validator("vector.schema.json", schemas)
    by_name: dict[str, jsonschema.Draft202012Validator] = {}

    def check(name: str, value: Any) -> None:
        if name not in by_name:
            by_name[name] = _validator(name, schemas)
        by_name[name].validate(value)

    refused_commands = 0
    for line in VECTORS.read_text("ascii").splitlines():
        scenario = json.loads(line)
        vector.validate(scenario)
        request.validate(
            {"type": "reset", "store": scenario["store"], "grant_keys": scenario["grant_keys"]}
        )
        for document in scenario["documents"].values():
            workload.validate(document)
        for step in scenario["steps"]:
            sent = {"type": "command", "command": step["command"], "now": step["now"]}
            answer = step["expect"]["response"]
            response.validate(answer)
            if not request.is_valid(sent):
                # Only deliberately malformed commands break the schema, and they are refused.
                assert answer["error"]["code"] == "WORKLOAD_INVALID"
                refused_commands += 1
                continue
            op = step["command"]["op"]
            check(f"command-{op}.schema.json", step["command"])
            if "ok" in answer:
                check(f"reply-{op}.schema.json", answer["ok"])
            else:
                error.validate(answer["error"])
    # Malformed on purpose: a missing tenant, an unknown effect, and five the schemas encode
    # since they carry those rules: a zero timeout, a blank key, a definition without its
    # application, and a purge's `dry_run` that is a string or a number, not a boolean.
    assert refused_commands == 7


def test_the_workload_schema_refuses_a_document_with_an_unknown_field() -> None:
    schemas = _schemas()
    line = VECTORS.read_text("ascii").splitlines()[0]
    document = next(iter(json.loads(line)["documents"].values()))
    assert _validator("workload.schema.json", schemas).is_valid(document)
    assert not _validator("workload.schema.json", schemas).is_valid({**document, "colour": "red"})
    assert not _validator("workload.schema.json", schemas).is_valid({**document, "state": 7})


def test_the_schema_command_prints_one_schema_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "command-fail"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == schema_documents()["command-fail.schema.json"]
    assert printed["properties"]["effect"]["anyOf"][0]["enum"] == ["none", "unknown"]
    assert "op" in printed["required"]


def test_the_schema_command_lists_the_names_and_refuses_an_unknown_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["schema"]) == 0
    assert "workload" in capsys.readouterr().out.split()
    assert main(["schema", "no-such"]) == 1
    assert capsys.readouterr().err.startswith("WORKLOAD_INVALID: no schema 'no-such'")


def test_every_schema_has_an_id_its_relative_refs_resolve_against() -> None:
    schemas = _schemas()
    for name, schema in schemas.items():
        assert schema["$id"] == SCHEMA_BASE + name
    line = VECTORS.read_text("ascii").splitlines()[0]
    scenario = json.loads(line)
    validator = _validator("conformance-request.schema.json", schemas)
    step = scenario["steps"][0]
    assert validator.is_valid({"type": "command", "command": step["command"], "now": step["now"]})
    reset = {"type": "reset", "store": [], "grant_keys": {}}
    assert validator.is_valid(reset)
    bad = {"type": "reset", "grant_keys": {}, "store": [{"key": "k", "document": {"state": 7}}]}
    assert not validator.is_valid(bad)


def _refused(command: dict[str, Any]) -> str | None:
    reference = ReferenceImplementation()
    reference.handle({"type": "reset", "store": [], "grant_keys": {}})
    answer = reference.handle({"type": "command", "command": command, "now": 10_000})
    error = answer.get("error")
    return error.get("code") if isinstance(error, dict) else None


def test_the_schemas_refuse_what_the_reference_refuses_as_invalid() -> None:
    schemas = _schemas()
    work = Work(request())
    admit = command_json(work.admit(10_000)[0])
    claim = command_json(work.claim("w", 11_000)[0])
    many = [f"c{i}" for i in range(257)]
    cases: list[tuple[str, dict[str, Any]]] = [
        ("command-claim.schema.json", {**claim, "capabilities": many}),
        (
            "command-claim_next.schema.json",
            {
                "op": "claim_next",
                "tenant_id": "t",
                "application_id": "app",
                "worker_id": "w",
                "lease_ms": 1_000,
                "capabilities": many,
            },
        ),
        (
            "command-admit.schema.json",
            {**admit, "request": {**admit["request"], "capability_snapshot": many}},
        ),
        (
            "command-admit.schema.json",
            {**admit, "request": {**admit["request"], "connection_scopes": many}},
        ),
        (
            "command-admit.schema.json",
            {**admit, "request": {**admit["request"], "timeouts": {"queue_ms": 0}}},
        ),
        (
            "command-admit.schema.json",
            {**admit, "request": {**admit["request"], "idempotency_key": " \u00a0 "}},
        ),
        (
            "command-pause.schema.json",
            {"op": "pause", "tenant": "t", "definition": "d", "actor": "o"},
        ),
        ("command-purge.schema.json", {"op": "purge", "dry_run": 1}),
        ("command-purge.schema.json", {"op": "purge", "dry_run": "false"}),
        (
            "command-resume.schema.json",
            {"op": "resume", "tenant": "t", "definition": "d", "actor": "o"},
        ),
    ]
    for name, command in cases:
        assert not _validator(name, schemas).is_valid(command), (name, command)
        assert not _validator("command.schema.json", schemas).is_valid(command) or name in {
            "command-claim_next.schema.json",
            "command-pause.schema.json",
            "command-resume.schema.json",
            "command-purge.schema.json",
        }
        assert _refused(command) == "WORKLOAD_INVALID", (name, command)
    # What is within the rules still passes.
    assert _validator("command-admit.schema.json", schemas).is_valid(
        {**admit, "request": {**admit["request"], "timeouts": {"queue_ms": 1}}}
    )
    assert _validator("command-claim.schema.json", schemas).is_valid(
        {**claim, "capabilities": many[:256]}
    )
    assert _validator("command-pause.schema.json", schemas).is_valid(
        {"op": "pause", "tenant": "t", "application": "a", "definition": "d", "actor": "o"}
    )


def test_the_vector_schema_refuses_an_initial_store_or_grant_key_the_reset_would_not_carry() -> (
    None
):
    schemas = _schemas()
    vector = _validator("vector.schema.json", schemas)
    request = _validator("conformance-request.schema.json", schemas)
    line = json.loads(VECTORS.read_text("ascii").splitlines()[0])
    for field, value in (
        ("store", [{"key": "k", "document": {"state": "READY"}}]),
        ("grant_keys", {"conformance": "not hex"}),
    ):
        bad = {**line, field: value}
        reset = {"type": "reset", "store": bad["store"], "grant_keys": bad["grant_keys"]}
        assert not request.is_valid(reset)
        assert not vector.is_valid(bad), field
        with pytest.raises(ValueError, match=f"line 1: {field}"):
            read_vectors(json.dumps(bad))


def test_an_operator_move_has_its_command_and_reply_schemas() -> None:
    schemas = _schemas()
    command = {
        "op": "operator", "operation": "approve", "workload_id": "w", "actor": "o",
        "request_id": "r1",
    }  # fmt: skip
    assert _validator("command-operator.schema.json", schemas).is_valid(command)
    assert _validator("command.schema.json", schemas).is_valid(command)
    assert not _validator("command-operator.schema.json", schemas).is_valid(
        {k: v for k, v in command.items() if k != "operation"}
    )
    reply = _validator("reply-operator.schema.json", schemas)
    assert reply.is_valid({"workload_id": "w", "state": "READY"})
    assert not reply.is_valid({"workload_id": "w"})


def test_the_schema_directory_is_made_only_when_its_parent_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["schema", "--out", str(tmp_path / "new")]) == 0
    assert (tmp_path / "new" / "workload.schema.json").is_file()
    capsys.readouterr()
    deeper = tmp_path / "nope" / "deeper"
    assert main(["schema", "--out", str(deeper)]) == 1
    assert capsys.readouterr().err.startswith(
        f"WORKWARDEN_OUTPUT_UNWRITABLE: cannot create schema directory {deeper}: its parent"
    )
    assert not (tmp_path / "nope").exists()


def test_a_schema_name_with_out_is_a_usage_error_not_a_silent_drop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["schema", "workload", "--out", str(tmp_path / "s")]) == 2
    assert capsys.readouterr().err.startswith("WORKWARDEN_USAGE: schema: give NAME")
    assert not (tmp_path / "s").exists()
