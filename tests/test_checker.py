"""The model checker: what it proves on the shipped spec, and that it has teeth."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from workwarden.cli import main
from workwarden.statemachine import default_spec, errors
from workwarden.statemachine.check.checker import CheckReport, check, policy_findings
from workwarden.statemachine.check.compiled_check import check_compiled
from workwarden.statemachine.check.mutants import MUTANTS
from workwarden.statemachine.check.replay import replay_trace
from workwarden.statemachine.check.scheduling import check_scheduling
from workwarden.statemachine.check.universe import Model, Universe
from workwarden.statemachine.diagram import diagram_dot, diagram_mermaid
from workwarden.statemachine.models import Workload
from workwarden.storage import MemoryStore, SQLiteStore

#: A small universe with the racing writer, where every mutant shows within a few steps.
TEETH = Universe(
    dependent=False,
    racer=True,
    operator_actions=0,
    first_timeouts={"claim_ms": 8, "execution_ms": 12},
)

#: Which property catches each mutant.
CAUGHT_BY = {
    "store_ignores_expected_version": "writes_extend_the_committed_history",
    "complete_skips_fence": "no_write_from_a_stale_fence",
    "recovery_skips_recheck": "recovered_only_after_lease_expiry",
    "deadline_one_ms_late": "no_write_after_a_deadline",
    "retry_past_budget": "ready_work_has_an_attempt_left",
}


DIAGRAMS = Path(__file__).resolve().parent.parent / "diagrams"


def test_the_default_universe_is_explored_completely_with_no_violation() -> None:
    spec = default_spec()
    report = check(spec)
    # The checked diagram in diagrams/ draws exactly these findings.
    shown = json.loads((DIAGRAMS / "workload-check.json").read_text(encoding="utf-8"))
    assert shown == {
        "edges_never_taken": report.edges_never_taken,
        "never_at_rest": report.never_at_rest,
    }, "diagrams/workload-check.json is stale: write the findings of `workwarden check`"
    assert report.complete
    assert report.violations == []
    assert report.policy_problems == []
    assert report.cannot_finish == 0
    # Edges that admission or a same-commit decision makes unreachable, by name.
    assert report.edges_never_taken == [
        "CREATED -> CANCELLED",
        "FAILED -> CANCELLED",
        "READY -> DEAD_LETTER",
    ]
    # The states that exist only inside one commit are exactly the transient ones.
    transient = sorted(n for n, s in spec.states.items() if s.kind == "transient")
    assert report.never_at_rest == transient
    assert report.terminal_unreached == []
    # Every rule of every policy decides some step, but the claim-time dead letter,
    # which only a document from outside the core (an import) can need.
    assert report.rules_never_taken == {
        "claim": ["attempt_budget_exhausted"],
        "deadline": [],
        "failure": [],
        "operator_timeout": [],
        "recovery": [],
    }


def test_the_racing_writer_universe_holds_every_property() -> None:
    report = check(default_spec(), TEETH)
    assert report.complete
    assert report.violations == []


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_each_mutant_is_found_with_a_short_trace_that_replay_reproduces(
    name: str, tmp_path: Path
) -> None:
    mutant = MUTANTS[name]
    spec = mutant.spec(default_spec())
    model = Model(
        spec,
        TEETH,
        decide_fn=mutant.decide_fn,
        authority_cls=mutant.authority_cls(),
        commit_checks_version=mutant.commit_checks_version,
    )
    report = check(spec, TEETH, model=model)
    assert report.violations, f"{name} was not found"
    finding = report.violations[0]
    assert finding.property == CAUGHT_BY[name]
    assert len(finding.trace) <= 8
    trace = {"universe": TEETH.to_dict(), "steps": list(finding.trace)}
    for store in (MemoryStore(), SQLiteStore(tmp_path / f"{name}.sqlite3")):
        wrapped = mutant.wrap_store(store) if mutant.wrap_store is not None else store
        result = replay_trace(spec, trace, wrapped, authority_cls=mutant.authority_cls())
        assert result.violation is not None
        assert result.violation[1] == CAUGHT_BY[name]
    # The same steps through the real core violate nothing.
    clean = replay_trace(default_spec(), trace, MemoryStore())
    assert clean.violation is None


def test_a_universe_of_more_workers_than_their_symmetry_reduces_is_refused_at_once() -> None:
    # Each state's key is the least over the workers renamed in every order: 9! orders
    # outgrow a machine's memory before the first state is explored.
    spec = default_spec()
    with pytest.raises(errors.WorkloadError) as refused:
        Model(spec, Universe.from_spec(spec, workers=9, dependent=False))
    assert refused.value.code == errors.INVALID
    assert refused.value.details["field"] == "workers"
    assert "at most 8 workers" in refused.value.message
    # Without the reduction (to check it against), more are kept as they are.
    assert len(Model(spec, Universe.from_spec(spec, workers=9), symmetry=False).worker_names) == 9


@pytest.mark.parametrize(
    ("bound", "value"),
    [("workers", 0), ("workers", -1), ("workers", "2"), ("workers", True), ("horizon_ms", -5)],
)
def test_a_universe_with_a_bound_below_its_least_is_refused_not_reported_clean(
    bound: str, value: Any
) -> None:
    # No worker, or a horizon before the start, explores next to nothing: reported
    # complete and clean, it would be a proof of nothing.
    spec = default_spec()
    universe = Universe.from_spec(spec, dependent=False, **{bound: value})
    with pytest.raises(errors.WorkloadError) as refused:
        check(spec, universe, max_states=20)
    assert refused.value.code == errors.INVALID
    assert refused.value.details["field"] == bound


@pytest.mark.parametrize("explore", [check, check_compiled, check_scheduling])
@pytest.mark.parametrize("max_states", [0, -5, 2.5, "10", True])
def test_a_state_limit_below_one_or_not_a_whole_number_is_refused_not_reported_incomplete(
    explore: Any, max_states: Any
) -> None:
    # A limit of 0 stopped every check before its first level, reported incomplete as if
    # the universe were too big; one of another type failed mid-check with a TypeError.
    with pytest.raises(errors.WorkloadError) as refused:
        explore(default_spec(), max_states=max_states)
    assert refused.value.code == errors.INVALID
    assert refused.value.details["field"] == "max_states"


def test_every_shipped_policy_is_total_and_deterministic() -> None:
    assert policy_findings(default_spec()) == []


def test_check_writes_a_trace_that_replay_reproduces_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        [
            "check",
            "--single",
            "--racer",
            "--operator-actions",
            "0",
            "--mutant",
            "complete_skips_fence",
            "--trace-dir",
            str(tmp_path),
            "--json",
            str(tmp_path / "report.json"),
        ]
    )
    assert status == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["violations"][0]["property"] == "no_write_from_a_stale_fence"
    trace = tmp_path / "trace-no_write_from_a_stale_fence.json"
    assert trace.exists()
    capsys.readouterr()
    store = f"sqlite:///{tmp_path / 'replay.sqlite3'}"
    assert main(["replay", str(trace), "--store", store]) == 1
    assert "reproduced at step" in capsys.readouterr().out


def test_a_trace_that_cannot_be_written_leaves_no_report_and_no_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A folder of the trace's name: refused before the report or any trace is written.
    (tmp_path / "trace-ready_work_has_an_attempt_left.json").mkdir()
    report = tmp_path / "report.json"
    small = ["--workers", "1", "--workloads", "1", "--mutant", "retry_past_budget"]
    args = ["check", *small, "--trace-dir", str(tmp_path), "--json", str(report)]
    assert main(args) == 1
    assert capsys.readouterr().err.startswith("WORKWARDEN_OUTPUT_UNWRITABLE: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "trace-ready_work_has_an_attempt_left.json"
    ]


def test_the_checked_diagram_in_the_repository_is_up_to_date() -> None:
    findings = json.loads((DIAGRAMS / "workload-check.json").read_text(encoding="utf-8"))
    edges = [(a, b) for a, b in (e.split(" -> ") for e in findings["edges_never_taken"])]
    expected = diagram_dot(
        default_spec(),
        unreachable_edges=edges,
        never_at_rest=findings["never_at_rest"],
        name="workload-checked",
    )
    hint = "run `workwarden diagram --report diagrams/workload-check.json --name workload-checked`"
    assert (DIAGRAMS / "workload-checked.dot").read_text(encoding="utf-8") == expected, hint
    mermaid = diagram_mermaid(
        default_spec(), unreachable_edges=edges, never_at_rest=findings["never_at_rest"]
    )
    assert (DIAGRAMS / "workload-checked.mmd").read_text(encoding="utf-8") == mermaid, hint


def _findings(report: CheckReport) -> dict[str, Any]:
    """Everything a report says but how long it took."""
    found = report.to_dict()
    del found["seconds"], found["states_per_second"]
    found["witnesses"] = report.witnesses
    return found


def test_the_models_caches_change_how_long_a_check_takes_and_nothing_else() -> None:
    spec = default_spec()
    universe = Universe.from_spec(spec, dependent=False)
    full = check(spec, universe, max_states=400)
    # Two entries a cache: almost every document is parsed again, every
    # decision and every projection worked out again.
    starved = check(spec, universe, model=Model(spec, universe, cache_limit=2), max_states=400)
    assert _findings(starved) == _findings(full)


def test_a_workload_the_core_decided_is_exactly_its_documents_parse() -> None:
    # The model keeps the core's decided workload beside the document it was
    # serialised to, rather than parsing that document again: sound only if
    # the two hold the same values in the same types.
    spec = default_spec()
    universe = Universe.from_spec(spec, dependent=False)
    model = Model(spec, universe)
    check(spec, universe, model=model, max_states=1500)
    kept = model.abstraction.docs  # document text -> what the model read of it
    assert len(kept) > 1000
    for document, read in kept.items():
        parsed = Workload.model_validate_json(document)
        assert parsed == read.workload
        assert repr(parsed) == repr(read.workload)
