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
from workwarden.statemachine.conformance.schemas import schema_documents

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "specs" / "schema"
VECTORS = ROOT / "specs" / "vectors" / "workload.jsonl"


def _schemas() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text("utf-8")) for path in SHIPPED.glob("*.json")}


def _validator(name: str, schemas: dict[str, dict[str, Any]]) -> jsonschema.Draft202012Validator:
    registry: Registry[Any] = Registry().with_resources(
        (file, Resource.from_contents(schema)) for file, schema in schemas.items()
    )
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
        "enforce_deadlines",
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
    assert refused_commands == 2


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
