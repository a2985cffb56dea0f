"""The words a user reads about refusals say what the code does.

The error catalogue (`specs/workload.toml`, `[errors]`) names every
`details.reason` the service gives for its two codes; the service's refusal
example carries the details the vectors record; the conformance page names
every field of the `pause` request and reply.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from workwarden.statemachine.conformance.runner import read_vectors
from workwarden.statemachine.conformance.scope_steps import SCOPE_COMMAND_MODELS
from workwarden.statemachine.pauses import PauseReply
from workwarden.statemachine.spec import default_spec

ROOT = Path(__file__).resolve().parent.parent
SERVICE = ROOT / "workwarden" / "service"


def _reasons(call: str) -> set[str]:
    """Every reason passed to `call(...)` in the service's modules."""
    found: set[str] = set()
    for path in SERVICE.glob("*.py"):
        text = path.read_text("utf-8")
        found |= set(re.findall(rf'\b{call}\(\s*"([a-z_]+)"', text))
    return found


def test_the_catalogue_names_every_reason_the_service_gives() -> None:
    errors = default_spec().errors
    unauthenticated = _reasons("_refuse")
    forbidden = _reasons("forbidden")
    assert {"not_yet_valid_token", "expired_token"} <= unauthenticated
    assert {"scoped_token", "wrong_actor_class"} <= forbidden
    for reason in unauthenticated:
        assert reason in errors["WORKWARDEN_UNAUTHENTICATED"].meaning, reason
    for reason in forbidden:
        assert reason in errors["WORKWARDEN_FORBIDDEN"].meaning, reason


def test_the_conflict_code_says_which_of_its_refusals_retrying_cannot_fix() -> None:
    meaning = default_spec().errors["WORKLOAD_CONFLICT"].meaning
    assert "retrying cannot fix" in meaning
    assert "checkpoint `sequence`" in meaning
    assert "request id" in meaning


def test_the_service_refusal_example_carries_the_details_the_vectors_record() -> None:
    text = (ROOT / "docs" / "service.md").read_text("utf-8")
    block = text.split("A refusal is `application/problem+json`", 1)[1]
    example = json.loads(block.split("```json", 1)[1].split("```", 1)[0])
    assert example["code"] == "WORKLOAD_STALE_FENCE"
    vectors = read_vectors((ROOT / "specs" / "vectors" / "workload.jsonl").read_text("ascii"))
    recorded = {
        key
        for vector in vectors
        for step in vector.steps
        if isinstance(error := step.expect.response.get("error"), dict)
        and error["code"] == "WORKLOAD_STALE_FENCE"
        and isinstance(error.get("details"), dict)
        for key in error["details"]
    }
    assert set(example["details"]) == recorded


def test_the_conformance_page_names_every_field_of_a_pause_and_its_reply() -> None:
    text = (ROOT / "docs" / "conformance.md").read_text("utf-8")
    paragraph = text.split("`pause` (`tenant`", 1)[1].split("`resume`", 1)[0]
    for field in [*SCOPE_COMMAND_MODELS["pause"].model_fields, *PauseReply.model_fields]:
        if field != "op":
            assert f"`{field}`" in paragraph, field
