"""The spec's expected decision (`check/oracle.py`) against the core, step by step."""

from __future__ import annotations

import os

from workwarden.statemachine import default_spec
from workwarden.statemachine.check.checker import check
from workwarden.statemachine.check.compiled_check import check_compiled
from workwarden.statemachine.check.mutants import MUTANTS
from workwarden.statemachine.check.oracle import PROPERTY
from workwarden.statemachine.check.universe import Model, Universe
from workwarden.statemachine.commands import Command, HeartbeatCommand
from workwarden.statemachine.core import Decision, decide
from workwarden.statemachine.models import Workload
from workwarden.statemachine.properties.registry import named
from workwarden.statemachine.spec import Spec

#: One workload, one worker, a short horizon: every operation, within seconds.
SMALL = Universe(workers=1, dependent=False, horizon_ms=14)

#: The whole default universe takes minutes: the thorough profile explores it.
THOROUGH = os.environ.get("WORKWARDEN_HYPOTHESIS_PROFILE") == "thorough"


def _heartbeat_one_ms_short(
    spec: Spec, workload: Workload | None, command: Command, now: int
) -> Decision:
    """A core whose heartbeat extends the lease one millisecond less than asked."""
    decision = decide(spec, workload, command, now)
    written = decision.workload
    if isinstance(command, HeartbeatCommand) and written is not None and decision.refusal is None:
        claim = written.current_claim
        assert claim is not None
        short = claim.model_copy(update={"expires_at": claim.expires_at - 1})
        written = written.model_copy(update={"current_claim": short})
        return Decision(
            operation=decision.operation,
            workload=written,
            reply=decision.reply,
            events=decision.events,
            actor=decision.actor,
            worker_id=decision.worker_id,
        )
    return decision


def test_spec_refinement_is_a_registered_property_of_each_step() -> None:
    prop = named(PROPERTY)
    assert prop.kind == "always"
    assert prop.checked_by == ("checker",)


def test_the_core_agrees_with_the_spec_on_every_step_of_the_universe() -> None:
    """The default universe under the thorough profile; two workers, one workload otherwise."""
    universe = None if THOROUGH else Universe(workers=2, dependent=False, horizon_ms=14)
    report = check_compiled(default_spec(), universe)
    assert report.complete
    assert [v for v in report.violations if v.property == PROPERTY] == []
    assert report.ok


def test_the_reference_engine_compares_every_step_too() -> None:
    report = check(default_spec(), SMALL)
    assert report.complete
    assert report.violations == []


def test_a_heartbeat_that_extends_the_lease_short_is_reported_with_its_trace() -> None:
    spec = default_spec()
    for run in (check, check_compiled):
        model = Model(spec, SMALL, decide_fn=_heartbeat_one_ms_short)
        report = run(spec, SMALL, model=model)
        found = [v for v in report.violations if v.property == PROPERTY]
        assert found, f"{run.__name__} missed the short lease"
        finding = found[0]
        assert finding.trace[-1]["action"] == "heartbeat"
        assert "claim" in finding.message
        assert not report.ok


def test_a_deadline_enforced_one_ms_late_disagrees_with_the_deadline_table() -> None:
    spec = default_spec()
    mutant = MUTANTS["deadline_one_ms_late"]
    model = Model(spec, SMALL, decide_fn=mutant.decide_fn, authority_cls=mutant.authority_cls())
    report = check(spec, SMALL, model=model, stop_at_first=False)
    found = [v for v in report.violations if v.property == PROPERTY]
    assert found
    # The shortest trace ends at the deadline's instant, where the spec says it has fallen.
    assert "WORKLOAD_TIMED_OUT" in found[0].message or "deadline" in found[0].message
    assert found[0].trace
