"""Runs one compiled check with one process and with helper processes; prints both reports.

`tests/test_checker_processes.py` runs this in a process of its own, so that
the helpers are forked from a process that holds nothing but the check:

    python tests/processes_driver.py SCENARIO
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from dataclasses import replace
from typing import Any

# The universes and the wrong compiled rule of the one-process tests (this file's folder
# is the first on the path when it runs).
from test_compiled_checker import SMALL, TEETH, _start_refused

from workwarden.statemachine import default_spec
from workwarden.statemachine.check import compiled as compiled_module
from workwarden.statemachine.check.checker import CheckReport
from workwarden.statemachine.check.compiled import CompiledModel, HelperStopped, Outcome
from workwarden.statemachine.check.compiled_check import check_compiled
from workwarden.statemachine.check.mutants import MUTANTS
from workwarden.statemachine.check.refinement import refine
from workwarden.statemachine.check.universe import Model, Universe


def _claim_writes_nothing(outcome: Outcome) -> Outcome:
    if outcome.action.label == "claim_next" and outcome.patch:
        return replace(outcome, patch=outcome.patch[1:])
    return outcome


def _compiled(scenario: str) -> CompiledModel:
    spec = default_spec()
    if scenario == "shipped":
        return CompiledModel(Model(spec, Universe.from_spec(spec, workers=1, **SMALL)))
    if scenario == "start_refused":
        return CompiledModel(Model(spec, Universe.from_spec(spec, **SMALL)), mistake=_start_refused)
    if scenario == "claim_writes_nothing":
        universe = Universe.from_spec(spec, **SMALL)
        return CompiledModel(Model(spec, universe), mistake=_claim_writes_nothing)
    mutant = MUTANTS[scenario]
    model = Model(
        mutant.spec(spec),
        TEETH,
        decide_fn=mutant.decide_fn,
        authority_cls=mutant.authority_cls(),
        commit_checks_version=mutant.commit_checks_version,
    )
    return CompiledModel(model)


def _found(report: CheckReport, compiled: CompiledModel) -> dict[str, Any]:
    found = report.to_dict()
    found["processes"] = found["tables"].pop("processes")
    for key in ("seconds", "states_per_second"):
        del found[key]
    found["tables"].pop("liveness_seconds", None)
    found["witnesses"] = report.witnesses
    found["refined"] = [
        # A class's number is this run's own: the order the classes were met in.
        {**failure.to_dict(), "message": re.sub(r"#\d+", "#N", failure.message)}
        for failure in (report.refinement or refine(compiled, report, samples=4))
    ]
    return found


_ANSWER = compiled_module._answer
_ASKED: list[int] = []


def _dying(tasks: Any) -> Any:
    """A helper's answer, but the third chunk a helper is asked kills it."""
    _ASKED.append(1)
    if len(_ASKED) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return _ANSWER(tasks)


def _helper_dies() -> None:
    """A helper process killed while the check runs: the check stops, it does not wait."""
    compiled_module._answer = _dying
    compiled = _compiled("shipped")
    try:
        check_compiled(compiled.spec, compiled=compiled, processes=2)
    except HelperStopped as stopped:
        json.dump({"stopped": str(stopped)}, sys.stdout)
    else:
        json.dump({"stopped": None}, sys.stdout)


def main(scenario: str) -> None:
    if scenario == "helper_dies":
        _helper_dies()
        return
    out = {}
    for processes in (1, 2):
        compiled = _compiled(scenario)
        report = check_compiled(compiled.spec, compiled=compiled, processes=processes)
        out[processes] = _found(report, compiled)
    json.dump(out, sys.stdout, default=str)


if __name__ == "__main__":
    main(sys.argv[1])
