"""Liveness under weak fairness: starved work and unrecovered leases are reported as lassos.

The compiled checker searches its graph for weakly fair cycles where a
claimable workload stays unclaimed while a worker keeps asking, or an
expired lease stays unrecovered while the sweeper runs. The shipped spec has
none; a core that refuses every claim, and one whose recovery never
recovers, are each reported with a lasso (a stem, then a loop free of clock
moves), and the lasso replays through the real `Authority` step for step,
twice round the loop.
"""

from __future__ import annotations

import io
from typing import Any

import pytest

from workwarden.statemachine import default_spec, errors
from workwarden.statemachine.authority import Authority
from workwarden.statemachine.check.checker import CheckReport, Finding
from workwarden.statemachine.check.compiled import CompiledModel
from workwarden.statemachine.check.compiled_check import check_compiled
from workwarden.statemachine.check.liveness import (
    CLAIMED,
    LIVENESS_PROPERTIES,
    RECOVERED,
    Lasso,
    replay_lasso,
)
from workwarden.statemachine.check.mutants import Mutant
from workwarden.statemachine.check.refinement import refine
from workwarden.statemachine.check.universe import Model, Universe
from workwarden.statemachine.commands import ClaimCommand, Command, RecoverCommand
from workwarden.statemachine.core import Decision, decide
from workwarden.statemachine.models import Workload
from workwarden.statemachine.properties.registry import named
from workwarden.statemachine.spec import Spec
from workwarden.storage import MemoryStore, SQLiteStore

#: One workload, a short horizon: the shipped spec's universe in seconds.
SMALL = Universe.from_spec(default_spec(), dependent=False, horizon_ms=16)


def _never_claims(spec: Spec, workload: Workload | None, command: Command, now: int) -> Decision:
    """A core that refuses every claim of READY work, forever."""
    if isinstance(command, ClaimCommand):
        raise errors.WorkloadError(errors.NOT_READY, "claims are refused")
    return decide(spec, workload, command, now)


def _never_recovers(spec: Spec, workload: Workload | None, command: Command, now: int) -> Decision:
    """A core whose recovery sweep never recovers an expired lease."""
    if isinstance(command, RecoverCommand):
        raise errors.WorkloadError(errors.NOT_READY, "recovery is refused")
    return decide(spec, workload, command, now)


STARVING = {
    "never_claims": Mutant("never_claims", "every claim is refused", decide_fn=_never_claims),
    "never_recovers": Mutant(
        "never_recovers", "recovery never recovers", decide_fn=_never_recovers
    ),
}


def _checked(name: str) -> tuple[CompiledModel, CheckReport, type[Authority]]:
    mutant = STARVING[name]
    authority_cls = mutant.authority_cls()
    compiled = CompiledModel(
        Model(default_spec(), SMALL, decide_fn=mutant.decide_fn, authority_cls=authority_cls)
    )
    # Past the safety findings (the spec's own answer differs), so the graph is complete.
    report = check_compiled(default_spec(), compiled=compiled, stop_at_first=False)
    return compiled, report, authority_cls


def _lasso_of(report: CheckReport, prop: str) -> Finding:
    found = [v for v in report.violations if v.property == prop]
    assert len(found) == 1, [v.property for v in report.violations]
    return found[0]


def _as_lasso(finding: Finding) -> Lasso:
    stem = tuple(
        {k: v for k, v in s.items() if k != "lasso"} for s in finding.trace if s["lasso"] == "stem"
    )
    loop = [
        {k: v for k, v in s.items() if k != "lasso"} for s in finding.trace if s["lasso"] == "loop"
    ]
    half = len(loop) // 2
    assert loop[:half] == loop[half:]
    slot = int(finding.message.split()[1])
    return Lasso(finding.property, slot, stem, tuple(loop[:half]))


@pytest.fixture(scope="module")
def never_claims() -> tuple[CompiledModel, CheckReport, type[Authority]]:
    return _checked("never_claims")


@pytest.fixture(scope="module")
def never_recovers() -> tuple[CompiledModel, CheckReport, type[Authority]]:
    return _checked("never_recovers")


def test_the_shipped_spec_has_no_liveness_counterexample() -> None:
    report = check_compiled(default_spec(), SMALL)
    assert report.complete
    assert report.ok
    assert "liveness_seconds" in report.tables
    assert not [v for v in report.violations if v.property in LIVENESS_PROPERTIES]


def test_both_liveness_properties_are_registered_as_eventually_over_the_graph() -> None:
    for name in LIVENESS_PROPERTIES:
        prop = named(name)
        assert prop.kind == "eventually"
        assert prop.over == ("graph",)


def test_a_core_that_refuses_every_claim_starves_work_and_is_reported_with_a_lasso(
    never_claims: tuple[CompiledModel, CheckReport, type[Authority]],
) -> None:
    _, report, _ = never_claims
    finding = _lasso_of(report, CLAIMED)
    assert not report.ok
    lasso = _as_lasso(finding)
    assert lasso.slot == 0
    actions = [s["action"] for s in lasso.loop]
    # The loop is weakly fair: both workers ask, and the sweeper runs.
    assert actions.count("claim_next") == 2
    assert "recover_expired" in actions
    assert "jump" not in actions
    assert "stem of 0 steps, then a loop of 3 steps" in finding.message


def test_a_sweeper_that_never_recovers_leaves_an_expired_lease_and_is_reported_with_a_lasso(
    never_recovers: tuple[CompiledModel, CheckReport, type[Authority]],
) -> None:
    _, report, _ = never_recovers
    finding = _lasso_of(report, RECOVERED)
    lasso = _as_lasso(finding)
    # The stem claims the work and moves the clock to the lease's expiry;
    # the loop moves no clock and runs the sweeper.
    assert lasso.stem[0]["action"] == "claim_next"
    assert lasso.stem[-1] == {**lasso.stem[-1], "action": "jump", "to": SMALL.lease_ms}
    loop = [s["action"] for s in lasso.loop]
    assert "recover_expired" in loop
    assert "jump" not in loop
    assert CLAIMED not in {v.property for v in report.violations}


@pytest.mark.parametrize(
    ("name", "prop"), [("never_claims", CLAIMED), ("never_recovers", RECOVERED)]
)
@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_lasso_replays_through_the_real_authority_twice_round_the_loop(
    name: str, prop: str, backend: str, request: pytest.FixtureRequest, tmp_path: Any
) -> None:
    compiled, report, authority_cls = request.getfixturevalue(name)
    lasso = _as_lasso(_lasso_of(report, prop))
    store = MemoryStore() if backend == "memory" else SQLiteStore(tmp_path / "replay.sqlite3")
    try:
        assert replay_lasso(compiled, lasso, store, authority_cls) is None
    finally:
        store.close()


def test_a_lasso_does_not_replay_against_a_core_that_claims(
    never_claims: tuple[CompiledModel, CheckReport, type[Authority]],
) -> None:
    compiled, report, _ = never_claims
    lasso = _as_lasso(_lasso_of(report, CLAIMED))
    store = MemoryStore()
    try:
        failure = replay_lasso(compiled, lasso, store, Authority)
    finally:
        store.close()
    assert failure is not None
    assert failure.property == "refinement"
    assert "claim_next" in failure.message


def test_a_lasso_is_written_in_the_json_report_with_its_parts_marked(
    never_claims: tuple[CompiledModel, CheckReport, type[Authority]],
) -> None:
    _, report, _ = never_claims
    shown = [v for v in report.to_dict()["violations"] if v["property"] == CLAIMED]
    assert len(shown) == 1
    parts = [step["lasso"] for step in shown[0]["trace"]]
    assert parts == ["loop"] * 6


def test_a_lasso_is_printed_by_workwarden_check_as_numbered_steps(
    never_claims: tuple[CompiledModel, CheckReport, type[Authority]],
) -> None:
    from workwarden.cli.check import _print_report

    _, report, _ = never_claims
    out = io.StringIO()
    _print_report(report, out)
    text = out.getvalue()
    assert f"    {CLAIMED}: workload 0 stays claimable and unclaimed" in text
    assert '"lasso": "loop"' in text
    assert "        6. " in text


def test_the_refinement_check_of_workwarden_check_replays_each_lasso_without_disagreement(
    never_claims: tuple[CompiledModel, CheckReport, type[Authority]],
    never_recovers: tuple[CompiledModel, CheckReport, type[Authority]],
) -> None:
    for compiled, report, authority_cls in (never_claims, never_recovers):
        assert refine(compiled, report, samples=0, authority_cls=authority_cls) == []
