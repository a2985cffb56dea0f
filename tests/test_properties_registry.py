"""One registry of properties: declared once, documented, and the same name from every tool.

Every invariant and reachability property is declared in
`statemachine/properties/registry.py` with its kind, its subjects and its
meaning; `docs/testing.md` holds exactly its table. The model checker, the
stateful suite and the chaos audit check through the registry's functions:
handed the same broken document, each reports the same registered name. What
the checks need of the operations (which present a fence, which claim, which
policy an actor's decisions are recorded under) is read from the spec's
tables, so editing the table changes it.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support import CAPS, authority, overwrite, request
from workwarden.chaos.audit import audit_store
from workwarden.statemachine import Workload, default_spec
from workwarden.statemachine.check.checker import check, state_violations
from workwarden.statemachine.check.universe import Universe
from workwarden.statemachine.properties.coverage import Reached, unreached
from workwarden.statemachine.properties.operations import operation_roles
from workwarden.statemachine.properties.registry import (
    KINDS,
    PROPERTIES,
    SUBJECTS,
    Violation,
    markdown_table,
    named,
    properties,
)
from workwarden.statemachine.spec import Spec, load_spec_text, shipped_spec_text
from workwarden.storage import MemoryStore, Store
from workwarden.testing import CheckFailed, Coverage, authority_machine
from workwarden.testing.support import (
    ALLOWED,
    FENCED,
    HOLDER_CALLS,
    SWEEPS,
    WORKER_CALLS,
    allowed_refusals,
)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "testing.md"
SOMETIMES = [prop.name for prop in properties("sometimes")]


# -- declared once, documented --------------------------------------------------------------


def test_docs_testing_md_holds_the_registrys_table_exactly() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for prop in PROPERTIES.values():
        row = f"| `{prop.name}` | {prop.kind} | {', '.join(prop.over)} |"
        assert row in text, f"{prop.name} ({prop.kind}) is not documented in docs/testing.md"
    assert markdown_table() in text, (
        "the table of properties in docs/testing.md is stale: paste registry.markdown_table()"
    )


def test_every_property_documented_in_the_table_is_registered() -> None:
    text = DOCS.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    documented = [line.split("`")[1] for line in rows if line.count("|") == 6]
    assert documented == list(PROPERTIES)


def test_every_property_has_a_kind_subjects_a_meaning_and_a_tool_that_checks_it() -> None:
    for prop in PROPERTIES.values():
        assert prop.kind in KINDS
        assert prop.over
        assert all(subject in SUBJECTS for subject in prop.over)
        assert prop.meaning
        assert "\n" not in prop.meaning
        assert prop.checked_by, f"nothing checks {prop.name}"
    assert {prop.kind for prop in PROPERTIES.values()} == set(KINDS)


def test_a_violation_of_a_name_the_registry_does_not_hold_cannot_be_made() -> None:
    with pytest.raises(KeyError, match="no property 'lease_is_fine'"):
        Violation("lease_is_fine", None, "made up")
    with pytest.raises(KeyError, match="no property 'lease_is_fine'"):
        CheckFailed("lease_is_fine", "made up")
    assert named("shadow_model").kind == "always"


def _string_literals(paths: list[Path]) -> set[str]:
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    return found


#: Where the checks of each subject are written.
CHECKS = {
    # The registry itself spells every name: the checks are the other modules.
    "data": sorted(
        path
        for path in (ROOT / "statemachine" / "properties").glob("*.py")
        if path.name != "registry.py"
    ),
    "call": sorted((ROOT / "workwarden" / "testing").glob("*.py")),
    "graph": [
        ROOT / "statemachine" / "check" / "checker.py",
        ROOT / "statemachine" / "check" / "liveness.py",
    ],
}


def test_every_property_is_reported_by_name_by_some_check() -> None:
    literals = {where: _string_literals(paths) for where, paths in CHECKS.items()}
    unchecked = []
    for prop in PROPERTIES.values():
        where = "call" if prop.over == ("call",) else "graph" if prop.over == ("graph",) else "data"
        if prop.name not in literals[where] and prop.name not in literals["data"]:
            unchecked.append(prop.name)
    assert unchecked == []


# -- the same broken document, the same name from each tool -----------------------------------


def _completed(store: Store) -> str:
    writer = authority(store)
    wid = writer.admit(request(), 10_000).workload.workload_id
    claim = writer.claim(wid, "w1", CAPS, 20_000, 1_000)
    writer.start(wid, claim.fence, 20_001)
    writer.complete(wid, claim.fence, "r-1", {"ok": True}, 20_002)
    return wid


def _no_result(w: Workload) -> dict[str, Any]:
    return {"result": None}


def _two_successes(w: Workload) -> dict[str, Any]:
    first = w.attempts[0]
    return {"attempts": [first, first.model_copy(update={"attempt_id": "attempt-again"})]}


def _lost_claim(w: Workload) -> dict[str, Any]:
    return {"state": "RUNNING", "execution_history": w.execution_history[:3]}


BROKEN: dict[str, tuple[Callable[[Workload], dict[str, Any]], str]] = {
    "a succeeded workload without its result": (_no_result, "result_exactly_when_succeeded"),
    "a second succeeded attempt under the same fence": (_two_successes, "fencing_tokens_increase"),
    "running work that holds no claim": (_lost_claim, "claim_exactly_when_claimed"),
}


def _broken(store: Store, name: str) -> tuple[str, Workload]:
    wid = _completed(store)
    doc = store.read(wid)
    assert doc is not None
    workload = Workload.model_validate_json(doc.document)
    overwrite(store, authority(store), wid, **BROKEN[name][0](workload))
    doc = store.read(wid)
    assert doc is not None
    return wid, Workload.model_validate_json(doc.document)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_the_checker_the_suite_and_the_audit_report_a_broken_document_by_one_name(
    name: str,
) -> None:
    wanted = BROKEN[name][1]
    spec = default_spec()

    # The checker, on the document as a state of its own.
    wid, broken = _broken(MemoryStore(), name)
    assert wanted in [prop for prop, _ in state_violations(spec, broken)]

    # The stateful suite, at its check after a step.
    machine = authority_machine(MemoryStore)()
    _broken(machine.store, name)
    with pytest.raises(CheckFailed) as failed:
        machine.committed_store_keeps_every_invariant()
    machine.teardown()
    assert failed.value.check == wanted

    # The chaos audit, over the whole store.
    store = MemoryStore()
    wid, _ = _broken(store, name)
    _, violations = audit_store(store, spec, [wid])
    assert wanted in [violation.property for violation in violations]
    assert all(violation.property in PROPERTIES for violation in violations)


def test_every_name_the_audit_reports_is_registered() -> None:
    store = MemoryStore()
    wid = authority(store).admit(request(), 10_000).workload.workload_id
    _, violations = audit_store(store, default_spec(), [wid, "never-stored"], [(wid, 1, "r")])
    assert sorted(v.property or "" for v in violations) == [
        "acknowledged_completions_are_stored",
        "admitted_work_is_stored",
        "work_finishes_after_draining",
    ]


# -- the reachability properties --------------------------------------------------------------


def test_the_checker_reports_every_sometimes_property_by_name() -> None:
    spec = default_spec()
    report = check(spec, Universe.from_spec(spec, dependent=False), max_states=300)
    assert list(report.sometimes) == SOMETIMES
    assert report.sometimes["every_edge_is_taken"] == report.edges_never_taken
    assert report.to_dict()["sometimes"] == report.sometimes


def test_the_suites_coverage_reports_every_sometimes_property_by_name() -> None:
    spec = default_spec()
    nothing = Coverage().unreached(spec)
    assert list(nothing) == SOMETIMES
    assert len(nothing["every_edge_is_taken"]) == len(spec.edges)
    everything = Reached(
        edges=set(spec.edges),
        rules={name: {r.spec.decision for r in p.rules} for name, p in spec.policies.items()},
        at_rest=set(spec.states),
    )
    assert unreached(spec, everything) == {key: [] for key in SOMETIMES}


# -- the operations come from the table ------------------------------------------------------


def _edited(old: str, new: str) -> Spec:
    text = shipped_spec_text()
    assert old in text
    return load_spec_text(text.replace(old, new, 1), "edited")


def test_what_the_checks_know_of_the_operations_is_read_from_the_table() -> None:
    spec = default_spec()
    roles = operation_roles(spec)
    rows = spec.operations
    assert roles.fenced == {name for name, op in rows.items() if op.spec.fenced}
    assert roles.deadline_guarded == {name for name, op in rows.items() if op.spec.deadlines}
    assert roles.claiming == {"claim", "claim_next"}
    assert roles.policy_of_actor == {p.spec.actor: name for name, p in spec.policies.items()}
    assert roles.deadline_actor == rows[spec.deadline_operation].spec.acting_as

    guarded = _edited(
        'attempt_status = "CANCELLED"', 'deadlines = true\nattempt_status = "CANCELLED"'
    )
    assert "confirm_cancel" in operation_roles(guarded).deadline_guarded
    renamed = _edited('actor = "system.timeout"', 'actor = "system.operator_timeout"')
    assert operation_roles(renamed).policy_of_actor["system.operator_timeout"] == (
        "operator_timeout"
    )


def test_the_suites_lists_of_operations_are_the_shipped_tables() -> None:
    spec = default_spec()
    assert allowed_refusals(spec) == ALLOWED
    assert set(FENCED) == operation_roles(spec).fenced
    assert set(WORKER_CALLS) <= set(FENCED)
    assert set(HOLDER_CALLS) <= set(FENCED)
    assert SWEEPS == ("recover_expired", "enforce_deadlines")
