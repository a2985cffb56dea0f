"""The compiled checker: it finds what the reference checker finds, and the real core holds it.

The compiled model explores tables made from the spec and the core; these
tests pin down that it finds the same states, transitions, coverage,
witnesses and violations as the reference checker (the core at every step),
on the shipped spec and on each mutant, and that its refinement check
reports a wrong compiled rule and a wrong core rule, each with a trace.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from workwarden.cli import main
from workwarden.statemachine import default_spec, errors
from workwarden.statemachine.authority import Authority
from workwarden.statemachine.check.checker import CheckReport, check
from workwarden.statemachine.check.compiled import DOCS, CompiledModel, Outcome
from workwarden.statemachine.check.compiled_check import check_compiled
from workwarden.statemachine.check.mutants import MUTANTS
from workwarden.statemachine.check.refinement import REFINEMENT, refine, refine_trace
from workwarden.statemachine.check.universe import Model, Universe
from workwarden.statemachine.spec import load_spec
from workwarden.storage import MemoryStore, SQLiteStore

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"

THOROUGH = os.environ.get("WORKWARDEN_HYPOTHESIS_PROFILE") == "thorough"

#: The shipped spec's universe cut down to run in seconds: one workload, a short horizon.
SMALL = {"dependent": False, "horizon_ms": 16}

#: A universe with the racing writer, where every mutant shows within a few steps.
TEETH = Universe(
    dependent=False,
    racer=True,
    operator_actions=0,
    first_timeouts={"claim_ms": 8, "execution_ms": 12},
)


def _findings(report: CheckReport) -> dict[str, Any]:
    """Everything a report says but how long it took and which engine said it."""
    found = report.to_dict()
    for key in ("seconds", "states_per_second", "engine", "tables"):
        del found[key]
    found["witnesses"] = report.witnesses
    return found


def _mutant_model(name: str, universe: Universe) -> Model:
    mutant = MUTANTS[name]
    return Model(
        mutant.spec(default_spec()),
        universe,
        decide_fn=mutant.decide_fn,
        authority_cls=mutant.authority_cls(),
        commit_checks_version=mutant.commit_checks_version,
    )


def test_the_compiled_checker_finds_what_the_reference_checker_finds_on_the_shipped_spec() -> None:
    spec = default_spec()
    universe = Universe.from_spec(spec) if THOROUGH else Universe.from_spec(spec, **SMALL)
    reference = check(spec, universe)
    compiled = check_compiled(spec, universe)
    assert compiled.complete
    assert compiled.refinement == []
    assert compiled.states == reference.states > 100
    assert _findings(compiled) == _findings(reference)
    assert compiled.engine == "compiled"
    assert reference.engine == "reference"


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_compiled_checker_finds_each_mutant_as_the_reference_checker_does(name: str) -> None:
    spec = MUTANTS[name].spec(default_spec())
    reference = check(spec, TEETH, model=_mutant_model(name, TEETH))
    # Every outcome shared between states is asked of the mutant core too.
    model = CompiledModel(_mutant_model(name, TEETH), verify_shared=True)
    compiled = check_compiled(spec, compiled=model)
    assert reference.violations, f"{name} was not found"
    assert compiled.refinement == []
    assert _findings(compiled) == _findings(reference)


@pytest.mark.parametrize(
    "bounds",
    [SMALL, {**SMALL, "request_ids": True}, {"workers": 1, "horizon_ms": 24}],
    ids=["small", "request-ids", "one-worker"],
)
def test_outcomes_shared_between_states_the_key_reads_alike_are_the_cores(
    bounds: dict[str, Any],
) -> None:
    # An inert outcome (one that writes nothing) is shared between states whose
    # reference keys read alike where its group reads; asked of the core at every
    # state as well, each shared one is what the core answers there.
    spec = default_spec()
    universe = Universe.from_spec(spec, **bounds)
    compiled = CompiledModel(Model(spec, universe), verify_shared=True)
    report = check_compiled(spec, compiled=compiled)
    assert report.complete
    assert report.refinement == []
    assert sum(compiled.shared) > 100
    assert compiled.shared_steps > 100
    # And sharing changes nothing the check reports.
    alone = check_compiled(spec, compiled=CompiledModel(Model(spec, universe), share_inert=False))
    assert sum(report.tables["misses"]) - sum(compiled.shared) < sum(alone.tables["misses"])
    assert _findings(report) == _findings(alone)


def test_an_outcome_shared_by_a_key_that_merges_too_much_fails_the_check() -> None:
    # A sharing key that reads none of the documents: the sweeps' inert entry of
    # the first state is offered to a state where a sweep writes.
    spec = default_spec()
    compiled = CompiledModel(Model(spec, Universe.from_spec(spec, **SMALL)), verify_shared=True)
    compiled._coarse = lambda group, key: (group,) if group == DOCS else None  # type: ignore[method-assign]
    report = check_compiled(spec, compiled=compiled)
    assert not report.complete
    (failure,) = report.refinement
    assert failure.property == REFINEMENT
    assert "shared between states" in failure.message
    assert failure.trace, "the failure names the state it was found at"


@pytest.mark.parametrize("name", ["pause", "approval", "claim_starts"])
def test_an_extended_spec_is_compiled_and_checked_as_the_reference_checks_it(name: str) -> None:
    spec = load_spec(EXAMPLES / f"{name}.toml")
    universe = Universe.from_spec(spec, dependent=False, workers=1, horizon_ms=16)
    compiled = CompiledModel(Model(spec, universe))
    report = check_compiled(spec, compiled=compiled)
    assert report.refinement == []
    assert _findings(report) == _findings(check(spec, universe))
    assert refine(compiled, report, samples=4) == []


def test_every_witness_and_random_trace_of_the_shipped_spec_agrees_with_the_real_core(
    tmp_path: Path,
) -> None:
    spec = default_spec()
    compiled = CompiledModel(Model(spec, Universe.from_spec(spec, **SMALL)))
    report = check_compiled(spec, compiled=compiled)
    assert len(report.witnesses) > 20
    assert refine(compiled, report, samples=8) == []
    # On a store that persists, too.
    trace = report.witnesses["edge:RUNNING -> SUCCEEDED"]
    store = SQLiteStore(tmp_path / "refine.sqlite3")
    try:
        assert refine_trace(compiled, trace, store) is None
    finally:
        store.close()


def _start_refused(outcome: Outcome) -> Outcome:
    """A wrong compiled rule: starting an attempt is refused, though it writes as before."""
    if outcome.action.label == "start" and outcome.refusal is None:
        return replace(outcome, refusal=errors.CLAIM_INVALID)
    return outcome


def test_a_wrong_compiled_rule_is_reported_by_the_refinement_check_with_a_trace() -> None:
    spec = default_spec()
    compiled = CompiledModel(Model(spec, Universe.from_spec(spec, **SMALL)), mistake=_start_refused)
    report = check_compiled(spec, compiled=compiled)
    failures = refine(compiled, report, samples=0)
    assert failures, "the wrong compiled rule went unnoticed"
    first = failures[0]
    assert first.property == REFINEMENT
    assert first.trace[-1]["action"] == "start"
    assert f"predicts refusal {errors.CLAIM_INVALID}" in first.message
    assert "real authority answered refusal None" in first.message


def test_a_wrong_core_rule_is_reported_by_the_refinement_check_with_a_trace() -> None:
    # Compiled from a core whose completion believes any fence, held to the real one.
    name = "complete_skips_fence"
    compiled = CompiledModel(_mutant_model(name, TEETH))
    report = check_compiled(compiled.spec, compiled=compiled)
    assert report.violations[0].property == "no_write_from_a_stale_fence"
    failures = refine(compiled, report, samples=0, authority_cls=Authority)
    assert failures, "the wrong core rule went unnoticed"
    first = failures[0]
    assert first.property == REFINEMENT
    assert first.trace[-1]["action"] == "stale_complete"
    assert "predicts refusal None" in first.message
    # Held to the core it was compiled from, the same model agrees.
    assert refine(compiled, report, samples=0) == []


def test_a_rebuilt_state_that_differs_from_the_compiled_one_fails_the_check() -> None:
    # A compiled rule that forgets what a claim writes: the next concrete
    # state rebuilt along the path is not the one the tables predicted.
    def claim_writes_nothing(outcome: Outcome) -> Outcome:
        if outcome.action.label == "claim_next" and outcome.patch:
            return replace(outcome, patch=outcome.patch[1:])
        return outcome

    spec = default_spec()
    compiled = CompiledModel(
        Model(spec, Universe.from_spec(spec, **SMALL)), mistake=claim_writes_nothing
    )
    report = check_compiled(spec, compiled=compiled)
    assert not report.ok
    assert not report.complete
    (failure,) = report.refinement
    assert failure.property == REFINEMENT
    assert any(step["action"] == "claim_next" for step in failure.trace)


def test_both_engines_report_the_same_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = {}
    for engine in ("reference", "compiled"):
        path = tmp_path / f"{engine}.json"
        args = ["check", "--single", "--horizon-ms", "8", "--engine", engine]
        assert main([*args, "--json", str(path)]) == 0
        reports[engine] = json.loads(path.read_text())
        out = capsys.readouterr().out
        assert f"engine        {engine}" in out
        if engine == "compiled":
            # How many table entries the core was asked for, and how many were shared.
            tables = reports[engine]["tables"]
            assert tables["asked"] > 0
            assert sum(tables["shared"]) > 0
            assert f"{tables['asked']:,} asked of the core, {sum(tables['shared']):,} shared" in out
    for report in reports.values():
        for key in ("seconds", "states_per_second", "engine", "tables"):
            del report[key]
    assert reports["reference"] == reports["compiled"]


def test_a_negative_sample_count_is_refused_before_any_work(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", "--samples", "-1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{errors.INVALID}: --samples")


def test_an_operators_call_leaves_the_workers_fence_alone_in_replay_as_in_the_model() -> None:
    # Found by the refinement check: replay let the last worker's fence go on an
    # operator's call (a call that names no worker), the model did not.
    spec = default_spec()
    compiled = CompiledModel(Model(spec, Universe.from_spec(spec, dependent=False, workers=1)))
    steps = (
        {"action": "claim_next", "actor": "worker-A", "now": 0, "worker": 0},
        {"action": "timeout", "actor": "operator", "now": 0, "slot": 0},
        {"action": "heartbeat", "actor": "worker-A", "now": 0, "slot": 0, "worker": 0},
    )
    assert refine_trace(compiled, steps, MemoryStore()) is None


def test_three_workers_and_three_workloads_in_a_chain_complete_and_refine() -> None:
    """Three workers, three workloads each depending on the one before: the exploration
    completes, finds nothing, and the real core agrees with the compiled model on every
    witness and on random walks. In CI with one checkpoint and one operator call (about
    57,000 states, the six orders of the workers being one state); under the thorough
    profile with every bound of the spec's `[check]` table."""
    spec = default_spec()
    bounds: dict[str, Any] = (
        {}
        if THOROUGH
        else {
            "checkpoints_per_attempt": 1,
            "operator_actions": 1,
            "rearms": 0,
        }
    )
    universe = Universe.from_spec(spec, workers=3, workloads=3, **bounds)
    compiled = CompiledModel(Model(spec, universe))
    report = check_compiled(spec, compiled=compiled)
    assert report.complete
    assert report.violations == []
    assert report.refinement == []
    # The chain runs to its end: the last workload is claimed, runs and succeeds.
    assert "SUCCEEDED" not in report.terminal_unreached
    assert report.states > (500_000 if THOROUGH else 50_000)
    assert refine(compiled, report, samples=8, length=60) == []
